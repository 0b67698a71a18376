"""What a message is, below the configuration: pure data and pure functions, no I/O.

``headers``         THE header table: every header, declared once (``Headers``)
``names``           the envelope and what the file-name codecs share
``ftpbc_names``     ftpbc names: ``req.<uuid>;p=9;.regionS=emea``
``dropboxmq_names`` DropboxMQ's default names
``envelope``        ``codec_for(naming)`` and the names above, where the rest of ftpbc gets them
``selector``        JMS message selectors over headers and properties
``message``         what a handler receives (``Message``), what it may return

The configuration (``ftpbc.config``) compiles endpoints' selectors with ``selector``, so this
floor sits below it; it imports nothing of ftpbc but ``ftpbc.errors``.
"""
