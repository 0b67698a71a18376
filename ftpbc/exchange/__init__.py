"""The exchange layer: a message's envelope and its one lifecycle above the transport.

``area``       an endpoint's exchange area and the names files take in it
``headers``    the header table: every header, declared once
``envelope``   a message's headers and properties <-> file names (codecs)
``lifecycle``  stage, expose, claim, read, serve, commit, respond, archive, error, return
``recovery``   every pending journal operation decided from the journal plus the server
``sweeper``    leases: dead nodes' claims and stage files, uncollected responses
"""
