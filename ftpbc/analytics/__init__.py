"""What went through the archives: figures per endpoint and time bucket, and archive compaction.

Modules, one job each:

``sources``   which directories of which endpoints are read (from a Config or plain arguments)
``records``   the listing schemas and the reference per-name parser (Python)
``nametime``  the submit time written in a request's name, when its message_name has one
``nameplan``  a message_name as a Java regular expression and where each value is in it
``sqlnames``  the same parser as Spark SQL columns: names parsed in the JVM
``listing``   local archive folders listed by the driver into Parquet for Spark
``mirror``    incremental local mirror of remote archive listings (FTP, FTPS, SFTP)
``plain``     the same computations in this process: the engine for small archives
``figures``   the Spark computations
``chart``     the PNG chart
``compact``   archive compaction into a Parquet dataset, journaled removals
``progress``  the one progress display over a run's phases (phase lines, a live line on a terminal)
``job``       the whole run; ``main()`` for ``spark-submit``

``plain`` is also the reference the Spark computations are checked against; synthetic archives
are test code (``tests/synthetic.py``), not shipped.

Nothing here imports pyspark at module level except ``figures`` and ``sqlnames``, which are
only imported when the ``aggregate`` command runs.
"""
