"""The exchange layer: a message's one lifecycle above the transport.

What a message is (its headers, the names that carry them, selectors, ``Message``) is the floor
below the configuration, ``ftpbc.model``.

``area``       an endpoint's exchange area and the names files take in it
``lifecycle``  stage, expose, claim, read, serve, commit, respond, archive, error, return
``recovery``   every pending journal operation decided from the journal plus the server
``sweeper``    leases: dead nodes' claims and stage files, uncollected responses
"""
