"""The Spark computations: raw listings in, figures per endpoint and time bucket out.

Definitions (docs/aggregate.md has the long form):

* a *request* is an archived request file (``inarchive``: served; ``inerror``: its handler failed);
  it is counted in the bucket of its submit time T0: the time in its name when the endpoint's
  message_name has one, otherwise its modification time (kept by every rename on the way);
* a *reply* is a response or an error reply in ``outarchive`` (or ``outerror`` when unreadable),
  paired with its request by UUID, in the endpoint its name's reply-to names when it has one
  (a reply to another endpoint's request, sent through that request's ``reply_to``), else in
  its own;
* ``responses``: requests with a normal response; ``errors``: requests that failed (in
  ``inerror`` or answered by an error reply); ``unanswered``: requests with no reply at all;
  ``uncollected``: replies archived by a provider's sweep (node ``uncollected``), never collected;
* round-trip latency = the collecting node's archive stamp - T0; service time = the serving
  node's archive stamp - T0.  Percentiles are exact (linear interpolation between the two
  nearest ranks, as ``numpy.percentile``).  Precision: ``t0_precision_ms`` (the coarsest T0 in
  the bucket) plus 1 ms for the stamp.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ftpbc.analytics.listing import Input
from ftpbc.analytics.plain import Window
from ftpbc.analytics.records import PARSED_FIELDS, RAW_FIELDS, REQUEST_SIDE, UNCOLLECTED, ddl

PERCENTILES = (0.5, 0.95, 0.99)


#: levels ``--log-level`` accepts for Spark's own log (log4j2 names, lower case)
LOG_LEVELS = ("error", "warn", "info", "debug")

_LOG4J2 = """rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def session(master: str = "local[*]", app: str = "ftpbc-aggregate",
            extra: Mapping[str, str] | None = None, log_level: str = "error") -> SparkSession:
    """A Spark session for the job: no UI, UTC, few shuffle partitions (the figures are small).

    Spark's own log goes to stderr at ``log_level`` from the JVM's first line on (a log4j2
    configuration given to the driver JVM at launch; ``setLogLevel`` alone would come after the
    start-up warnings).  Lines the JVM prints itself, outside log4j, are not covered.  An
    ``extra`` ``spark.driver.extraJavaOptions`` replaces that configuration with the rest.
    """
    import tempfile

    if log_level not in LOG_LEVELS:
        raise ValueError(f"log level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.ui.showConsoleProgress", "false")
               # Archive files are tiny; the default 4 MB "open cost" would make one task per
               # few dozen files on a direct listing read.
               .config("spark.sql.files.openCostInBytes", "4096")
               .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000"))
    # log4j2 reads its configuration once, when the driver JVM starts: the file is needed
    # only until the session exists.
    with tempfile.TemporaryDirectory(prefix="ftpbc-aggregate-") as tmp:
        log_conf = Path(tmp) / "log4j2.properties"
        log_conf.write_text(_LOG4J2.format(level=log_level))
        conf = {**defaults(master, os.environ, log_conf=log_conf), **(extra or {})}
        # PySpark sends its Python workers' interpreter from the driver's PYSPARK_PYTHON (read
        # when the context starts), not from spark.pyspark.python: the two are made to agree here.
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
        for k, v in conf.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level.upper())
    return spark


def defaults(master: str, environ: Mapping[str, str], log_conf: Path | None = None) -> dict[str, str]:
    """Settings that depend on where the job runs (``--conf`` overrides any of them).

    * Executors run the driver's interpreter (``spark.pyspark.python`` = ``sys.executable``)
      unless ``PYSPARK_PYTHON`` says otherwise: left alone, Spark's Python workers start the
      first ``python3`` on each executor's PATH, which may lack ftpbc or be another version.
      On a cluster whose executors keep Python elsewhere, set ``PYSPARK_PYTHON`` or
      ``--conf spark.pyspark.python=/path``.
    * A local run, or a cluster master on loopback (``spark://127.0.0.1:7077``), binds the
      driver to 127.0.0.1: nothing outside this machine needs to reach it.
    * JVM options for the generated code (below) and, given ``log_conf``, the driver's log4j2
      configuration file; ``--conf spark.driver.extraJavaOptions=...`` replaces them.
    """
    out = {"spark.pyspark.python": environ.get("PYSPARK_PYTHON") or sys.executable,
           # The name parsing compiles to one large generated method per stage, over HotSpot's
           # 8,000-byte limit for JIT compilation, and left interpreted it runs far slower.  Both
           # tiers compile it: C2's slower start only cost small runs, which the plain engine
           # now takes (docs/aggregate.md, "Performance").
           "spark.driver.extraJavaOptions": "-XX:-DontCompileHugeMethods",
           "spark.executor.extraJavaOptions": "-XX:-DontCompileHugeMethods"}
    if log_conf is not None:
        out["spark.driver.extraJavaOptions"] += f" -Dlog4j2.configurationFile={log_conf.as_uri()}"
    host = urlsplit(master).hostname if "://" in master else None
    if master.startswith("local") or host in ("127.0.0.1", "localhost", "::1"):
        out["spark.driver.host"] = out["spark.driver.bindAddress"] = "127.0.0.1"
    return out


def read_inputs(spark: SparkSession, inputs: Sequence[Input], namings: Mapping[str, Mapping[str, str]],
                staging: Path, staged: Mapping[str, int] | None = None) -> DataFrame:
    """Parsed records of every input, as one DataFrame whose names are parsed in the JVM.

    ``dir`` inputs are listed by the driver into Parquet files under ``staging``
    (:func:`ftpbc.analytics.listing.stage_dirs`), here unless ``staged`` says that was done
    (its result); mirror parts (JSON lines) and compacted parts (Parquet, metadata columns only)
    are read by Spark as they are.  Each endpoint's raw rows are then parsed with its naming by
    Spark SQL functions (:func:`ftpbc.analytics.sqlnames.parse_names`): no Python runs on the
    executors.
    """
    from ftpbc.analytics.listing import stage_dirs, staging_dirs
    from ftpbc.analytics.sqlnames import parse_names

    raw_schema = ddl(RAW_FIELDS)
    by_endpoint: dict[str, list[DataFrame]] = {}
    if staged is None:
        staged = stage_dirs(inputs, namings, staging)
    where = staging_dirs(staging, namings)
    for endpoint in sorted(staged):
        frame = spark.read.schema(raw_schema).parquet(str(where[endpoint]))
        by_endpoint.setdefault(endpoint, []).append(frame)
    mirror: dict[str, list[str]] = {}
    compacted: dict[str, list[str]] = {}
    for inp in inputs:
        if inp.kind == "mirror":
            mirror.setdefault(inp.endpoint, []).append(inp.path)
        elif inp.kind == "compacted":
            compacted.setdefault(inp.endpoint, []).append(inp.path)
    for endpoint, paths in mirror.items():
        # Records carry their endpoint; one read per endpoint so that each is parsed with its naming.
        by_endpoint.setdefault(endpoint, []).append(
            spark.read.schema(raw_schema).json(paths).filter(F.col("endpoint") == endpoint))
    meta = [n for n, _ in RAW_FIELDS if n != "endpoint"]
    for endpoint, paths in compacted.items():
        part = (spark.read.schema(ddl((f, t) for f, t in RAW_FIELDS if f != "endpoint")).parquet(*paths)
                .select(F.lit(endpoint).alias("endpoint"), *meta))
        by_endpoint.setdefault(endpoint, []).append(part)
    parsed: DataFrame | None = None
    for endpoint in sorted(by_endpoint):
        frames = by_endpoint[endpoint]
        raw = frames[0]
        for other in frames[1:]:
            raw = raw.unionByName(other)
        one = parse_names(raw, namings[endpoint])
        parsed = one if parsed is None else parsed.unionByName(one)
    if parsed is None:
        return spark.createDataFrame([], ddl(PARSED_FIELDS))
    # Parsed once, by one job, into Parquet that the figures then read: the parsing plan is large
    # (dozens of projections per endpoint) and every later query would otherwise analyse, optimise
    # and run it again (the pairs, the node names, the unanswered names).  Not filtered here: Spark
    # pushes a filter on ``kind`` below the projections, inlining the whole parse into the filter,
    # and then runs it twice per row; ``relevant`` filters what it reads.
    out = staging / "parsed"
    parsed.write.mode("overwrite").parquet(str(out))
    return spark.read.schema(ddl(PARSED_FIELDS)).parquet(str(out))


def _pct(col: Column) -> Column:
    return F.percentile(col, list(PERCENTILES))


def is_request() -> Column:
    """A request as archived: served (``inarchive``) or failed (``inerror``)."""
    return (F.col("kind") == "request") & F.col("folder").isin("inarchive", "inerror")


def is_reply() -> Column:
    """A response or error reply as archived: collected or swept (``outarchive``), unreadable."""
    return F.col("kind").isin("response", "error_reply") & F.col("folder").isin("outarchive", "outerror")


def relevant(parsed: DataFrame, *, dedupe: bool = True) -> DataFrame:
    """Requests and replies only, each file once.

    ``dedupe`` drops records seen twice (the mirror after a crash, a file both compacted and
    still listed).  It groups on every string column (``kind``, ``node`` and the times in the
    name are functions of the name) and aggregates only numbers: Spark then hashes instead of
    sorting (an aggregate buffer holding a string, as ``dropDuplicates`` keeps, forces a sort of
    every record).

    Out: ``endpoint`` is the endpoint each record pairs in (:func:`pairing_endpoint`),
    ``archived_in`` the one whose folder holds it.
    """
    rel = parsed.filter(is_request() | is_reply()).withColumn("pair_endpoint", pairing_endpoint())
    if dedupe:
        # Partitioned on the pairing key first, so that this grouping and pairs' share one shuffle.
        keys = ["endpoint", "uuid", "folder", "name", "kind", "node", "reply_to", "correlation_id",
                "pair_endpoint"]
        rel = rel.repartition("pair_endpoint", "uuid").groupBy(*keys).agg(
            F.max("size").alias("size"), F.min("mtime_us").alias("mtime_us"),
            F.max("mtime_prec_us").alias("mtime_prec_us"), F.min("stamp_us").alias("stamp_us"),
            F.min("name_time_us").alias("name_time_us"), F.max("name_prec_us").alias("name_prec_us"))
    # The de-duplication keys both endpoints: a file is never merged with its twin in another.
    return rel.withColumnsRenamed({"endpoint": "archived_in", "pair_endpoint": "endpoint"})


def pairing_endpoint() -> Column:
    """The endpoint a record pairs in: a reply's reply-to when its name has one (the endpoint
    whose request it answers: the reply went to another endpoint's outbox), else its own.

    A reply-to naming an endpoint that is not aggregated, or none at all, leaves the reply with
    no request to pair with: it is not counted, as a reply to no archived request never is."""
    return F.when(is_reply() & F.col("reply_to").isNotNull(), F.col("reply_to")).otherwise(F.col("endpoint"))


def pairs(rel: DataFrame, window: Window) -> DataFrame:
    """One row per request, with its reply (if any), T0, bucket, latency and service time.

    ``rel`` is :func:`relevant`'s output, its ``endpoint`` the pairing one.  Requests and their
    replies share (endpoint, uuid), so
    one grouping on that key pairs them: one shuffle, where a group per side and a join would
    take three.  Reply columns are null for a request without a reply, as a left join would leave them.

    Every aggregate buffer is a number, so Spark aggregates in a hash map: string buffers (such
    as ``min_by(node, ...)`` or ``min(name)``) would make it sort every record, twice, and that
    would be most of the job.  Nodes are carried as ``xxhash64``
    keys and named again from a broadcast table of the few distinct nodes; the request's name is
    looked up only for the unanswered ones (:func:`unanswered`).
    """
    is_req, is_rep = is_request(), is_reply()

    def req(c: Column) -> Column:
        return F.when(is_req, c)

    def rep(c: Column) -> Column:
        return F.when(is_rep, c)

    collected = is_rep & (F.col("folder") == "outarchive") & (F.col("node") != UNCOLLECTED)
    node_key = F.xxhash64("node")
    j = (rel.groupBy("endpoint", "uuid").agg(
        F.max(is_req).alias("has_request"),
        F.min(req(F.coalesce("name_time_us", "mtime_us"))).alias("t0_us"),
        F.max(req(F.when(F.col("name_time_us").isNotNull(), F.col("name_prec_us"))
                  .otherwise(F.col("mtime_prec_us")))).alias("t0_prec_us"),
        F.max(req(F.col("name_time_us").isNotNull())).alias("t0_from_name"),
        F.max(req(F.col("folder") == "inerror")).alias("failed"),
        F.min(req(F.col("stamp_us"))).alias("served_us"),
        F.min_by(req(node_key), req(F.col("stamp_us"))).alias("server_key"),
        F.sum(req(F.col("size"))).alias("request_bytes"),
        F.when(F.max(is_rep), F.lit(True)).alias("replied"),
        F.max(rep((F.col("kind") == "response") & (F.col("folder") == "outarchive"))).alias("has_response"),
        F.max(rep(F.col("kind") == "error_reply")).alias("has_error_reply"),
        F.max(rep(F.col("folder") == "outerror")).alias("unreadable"),
        F.max(rep(F.col("node") == UNCOLLECTED)).alias("swept"),
        F.min(F.when(collected, F.col("stamp_us"))).alias("collected_us"),
        F.min_by(F.when(collected, node_key), F.when(collected, F.col("stamp_us"))).alias("collector_key"),
        F.sum(rep(F.col("size"))).alias("response_bytes"))
        .filter(F.col("has_request")).drop("has_request"))
    nodes = rel.select("node").where(F.col("node").isNotNull()).distinct() \
        .select(F.xxhash64("node").alias("key"), "node")
    for role in ("server", "collector"):
        named = nodes.select(F.col("key").alias(f"{role}_key"), F.col("node").alias(f"{role}_node"))
        j = j.join(F.broadcast(named), f"{role}_key", "left").drop(f"{role}_key")
    if window.since_us is not None:
        j = j.filter(F.col("t0_us") >= window.since_us)
    if window.until_us is not None:
        j = j.filter(F.col("t0_us") < window.until_us)
    b = window.bucket_us
    return j.select(
        "*",
        F.timestamp_micros(F.floor(F.col("t0_us") / b).cast("long") * b).alias("bucket"),
        ((F.col("collected_us") - F.col("t0_us")) / 1000.0).alias("latency_ms"),
        ((F.col("served_us") - F.col("t0_us")) / 1000.0).alias("service_ms"))


def _int(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0)).cast("long")


def by_bucket(p: DataFrame) -> DataFrame:
    """Figures per endpoint and bucket (unordered: :func:`to_rows` sorts the few rows on the driver)."""
    replied = F.coalesce(F.col("replied"), F.lit(False))
    g = p.groupBy("endpoint", "bucket").agg(
        F.count(F.lit(1)).alias("requests"),
        _int(F.col("has_response")).alias("responses"),
        _int(F.col("failed") | F.coalesce(F.col("has_error_reply"), F.lit(False))).alias("errors"),
        _int(~replied).alias("unanswered"),
        _int(F.col("swept")).alias("uncollected"),
        _int(F.col("unreadable")).alias("unreadable"),
        F.sum("request_bytes").alias("request_bytes"),
        F.coalesce(F.sum("response_bytes"), F.lit(0)).cast("long").alias("response_bytes"),
        _pct(F.col("latency_ms")).alias("lat"), F.max("latency_ms").alias("latency_max_ms"),
        _pct(F.col("service_ms")).alias("svc"), F.max("service_ms").alias("service_max_ms"),
        F.min("t0_from_name").alias("all_named"), F.max("t0_from_name").alias("any_named"),
        (F.max("t0_prec_us") / 1000.0).alias("t0_precision_ms"))
    pct = [("p50", 0), ("p95", 1), ("p99", 2)]
    return g.select(
        "endpoint", "bucket", "requests", "responses", "errors", "unanswered", "uncollected",
        "unreadable", "request_bytes", "response_bytes",
        *[F.col("lat")[i].alias(f"latency_{n}_ms") for n, i in pct], "latency_max_ms",
        *[F.col("svc")[i].alias(f"service_{n}_ms") for n, i in pct], "service_max_ms",
        F.when(F.col("all_named"), "name").when(F.col("any_named"), "name+mtime").otherwise("mtime")
        .alias("t0_source"),
        "t0_precision_ms")


def by_node(p: DataFrame) -> DataFrame:
    """Per endpoint, bucket and node: requests served and failed there, replies collected there."""
    served = p.groupBy("endpoint", "bucket", F.col("server_node").alias("node")).agg(
        _int(~F.col("failed")).alias("served"), _int(F.col("failed")).alias("failed"),
        _pct(F.col("service_ms")).alias("svc"))
    coll = (p.filter(F.col("collector_node").isNotNull())
            .groupBy("endpoint", "bucket", F.col("collector_node").alias("node"))
            .agg(F.count(F.lit(1)).alias("collected"), _pct(F.col("latency_ms")).alias("lat")))
    j = served.join(coll, ["endpoint", "bucket", "node"], "full")
    return j.select(
        "endpoint", "bucket", "node",
        F.coalesce("served", F.lit(0)).cast("long").alias("served"),
        F.coalesce("failed", F.lit(0)).cast("long").alias("failed"),
        F.coalesce("collected", F.lit(0)).cast("long").alias("collected"),
        F.col("svc")[0].alias("service_p50_ms"), F.col("svc")[1].alias("service_p95_ms"),
        F.col("lat")[0].alias("latency_p50_ms"), F.col("lat")[1].alias("latency_p95_ms"),
    )


def unanswered(p: DataFrame, rel: DataFrame) -> DataFrame:
    """The requests (partner files) that never got a reply, in one partition, by endpoint, time,
    name and uuid (a total order: the plain engine writes the same file).

    Their archived names are joined back from ``rel`` (:func:`relevant`) for these few requests
    only.  One sorted partition rather than ``orderBy``: a global sort costs a sampling job of its
    own, and the unanswered requests are a small part of the archive.
    """
    un = p.filter(F.col("replied").isNull()).select(
        "endpoint", "uuid", "bucket", "t0_us", F.col("server_node").alias("node"), "failed")
    names = (rel.filter(is_request()).select("endpoint", "uuid", "name")
             .join(un.select("endpoint", "uuid"), ["endpoint", "uuid"], "left_semi")
             .groupBy("endpoint", "uuid").agg(F.min("name").alias("name")))
    return (un.join(names, ["endpoint", "uuid"], "left")
            .select("endpoint", "bucket", "name", "uuid", F.timestamp_micros("t0_us").alias("submitted"),
                    "node", "failed")
            .coalesce(1).sortWithinPartitions("endpoint", "submitted", "name", "uuid"))


#: what happened to a request, as the provenance table says it
OUTCOMES = ("answered", "unanswered", "error", "expired", "dead-lettered")


def provenance(parsed: DataFrame, window: Window) -> DataFrame:
    """One row per request found on the request side (archived, failed, expired or dead-lettered),
    with what its reply says: the provenance table (docs/aggregate.md, "Provenance").

    Columns: ``endpoint``, ``id``, ``kind`` (``request``), ``name`` (the archived request file),
    ``sent_at`` (the time in the name, when the endpoint's message_name carries a date; else
    null), ``modified_at`` (the request file's modification time: when it was written, every
    rename keeps it), ``archived_at`` and ``archived_by`` (the stamp and node in the request's
    archived name: when and where it was served, filed, expired or dead-lettered),
    ``response_at``, ``response_by`` and ``response_endpoint`` (the reply's stamp, the node that
    archived it, ``uncollected`` for a provider's sweep, and the endpoint whose folder holds it:
    another one for a reply sent through ``reply_to``), ``outcome`` (:data:`OUTCOMES`: the first
    of dead-lettered, expired, error (``inerror`` or an error reply), answered, unanswered that
    holds), ``correlation_id`` and ``reply_to`` (the request's, from its name).

    Requests and replies pair as in the figures (:func:`pairing_endpoint`); the window filters
    on the submit time the figures use (the name's time, else the file's).  A request found in
    several folders (a dead letter sent again, with a mirror that keeps history) takes each
    column's earliest value.  Built from Spark's own column functions (no Python UDF); its
    aggregates hold strings, so Spark sorts the records here, which the figures avoid: this
    table is written only when asked for (``--provenance``).
    """
    req = (F.col("kind") == "request") & F.col("folder").isin(*REQUEST_SIDE)
    rel = parsed.filter(req | is_reply()).select("*", pairing_endpoint().alias("_pair"), req.alias("_req"))

    def r(c: Column) -> Column:
        return F.when(F.col("_req"), c)

    def p(c: Column) -> Column:
        return F.when(~F.col("_req"), c)

    g = rel.groupBy(F.col("_pair").alias("endpoint"), F.col("uuid").alias("id")).agg(
        F.max("_req").alias("_has_request"),
        F.min(r(F.col("name"))).alias("name"),
        F.min(r(F.col("name_time_us"))).alias("_sent"),
        F.min(r(F.col("mtime_us"))).alias("_modified"),
        F.min(r(F.col("stamp_us"))).alias("_archived"),
        F.min_by(r(F.col("node")), r(F.col("stamp_us"))).alias("archived_by"),
        F.min(r(F.col("correlation_id"))).alias("correlation_id"),
        F.min(r(F.col("reply_to"))).alias("reply_to"),
        F.max(r(F.col("folder") == "indead")).alias("_dead"),
        F.max(r(F.col("folder") == "inexpired")).alias("_expired"),
        F.max(r(F.col("folder") == "inerror")).alias("_failed"),
        F.max(p(F.col("kind") == "error_reply")).alias("_error_reply"),
        F.max(p(F.lit(True))).alias("_replied"),
        F.min(p(F.col("stamp_us"))).alias("_response"),
        F.min_by(p(F.col("node")), p(F.col("stamp_us"))).alias("response_by"),
        F.min(p(F.col("endpoint"))).alias("response_endpoint"),
    ).filter(F.col("_has_request"))
    t0 = F.coalesce(F.col("_sent"), F.col("_modified"))
    if window.since_us is not None:
        g = g.filter(t0 >= window.since_us)
    if window.until_us is not None:
        g = g.filter(t0 < window.until_us)
    def flag(c: str) -> Column:  # null (no record of that side) is false
        return F.coalesce(F.col(c), F.lit(False))

    outcome = (F.when(flag("_dead"), "dead-lettered").when(flag("_expired"), "expired")
               .when(flag("_failed") | flag("_error_reply"), "error")
               .when(flag("_replied"), "answered").otherwise("unanswered"))
    return g.select(
        "endpoint", "id", F.lit("request").alias("kind"), "name",
        F.timestamp_micros("_sent").alias("sent_at"), F.timestamp_micros("_modified").alias("modified_at"),
        F.timestamp_micros("_archived").alias("archived_at"), "archived_by",
        F.timestamp_micros("_response").alias("response_at"), "response_by", "response_endpoint",
        outcome.alias("outcome"), "correlation_id", "reply_to")


def to_rows(df: DataFrame, order: Sequence[str]) -> list[dict[str, Any]]:
    """A small result (figures) as Python rows on the driver, sorted on ``order`` (nulls first).

    Sorted here, not by Spark: a Spark sort is one more job, for a few hundred rows.
    """
    rows = [r.asDict() for r in df.collect()]
    rows.sort(key=lambda r: tuple((r[k] is not None, r[k]) for k in order))
    return rows
