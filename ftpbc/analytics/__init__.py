"""What went through the archives: figures per endpoint and time bucket, and archive compaction.

Modules, one job each:

``sources``   which directories of which endpoints are read (from a Config or plain arguments)
``records``   the listing schemas and the per-name parser shared by Spark and the plain pass
``nametime``  the submit time written in a request's name, when its message_name has one
``mirror``    incremental local mirror of remote archive listings (FTP, FTPS, SFTP)
``figures``   the Spark computations
``chart``     the PNG chart
``compact``   archive compaction into a Parquet dataset, journaled removals
``job``       the whole run; ``main()`` for ``spark-submit``

Nothing here imports pyspark at module level except ``figures`` and ``job``, which are only
imported when the ``aggregate`` command runs.
"""
