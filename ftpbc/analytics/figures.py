"""The Spark computations: raw listings in, figures per endpoint and time bucket out.

Definitions (docs/aggregate.md has the long form):

* a *request* is an archived request file (``inarchive``: served; ``inerror``: its handler failed);
  it is counted in the bucket of its submit time T0: the time in its name when the endpoint's
  message_name has one, otherwise its modification time (kept by every rename on the way);
* a *reply* is a response or an error reply in ``outarchive`` (or ``outerror`` when unreadable),
  paired with its request by UUID;
* ``responses``: requests with a normal response; ``errors``: requests that failed (in
  ``inerror`` or answered by an error reply); ``unanswered``: requests with no reply at all;
  ``uncollected``: replies archived by a provider's sweep (node ``uncollected``), never collected;
* round-trip latency = the collecting node's archive stamp - T0; service time = the serving
  node's archive stamp - T0.  Percentiles are exact (linear interpolation between the two
  nearest ranks, as ``numpy.percentile``).  Precision: ``t0_precision_ms`` (the coarsest T0 in
  the bucket) plus 1 ms for the stamp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ftpbc.analytics.records import PARSED_FIELDS, RAW_FIELDS, UNCOLLECTED, ddl, parse_rows

PERCENTILES = (0.5, 0.95, 0.99)
KEY = ["endpoint", "folder", "name"]


@dataclass(frozen=True)
class Window:
    bucket_us: int = 3_600_000_000
    since_us: int | None = None
    until_us: int | None = None


def session(master: str = "local[*]", app: str = "ftpbc-aggregate",
            extra: Mapping[str, str] | None = None) -> SparkSession:
    """A Spark session for the job: no UI, UTC, few shuffle partitions (the figures are small)."""
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.ui.showConsoleProgress", "false")
               # Archive files are tiny; the default 4 MB "open cost" would make one task per
               # few dozen files on a direct listing read.
               .config("spark.sql.files.openCostInBytes", "4096")
               .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000"))
    if master.startswith("local"):
        # Loopback only: a local run has no reason to listen on the machine's other interfaces.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress",
                                                                             "127.0.0.1")
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_local_folder(spark: SparkSession, path: str, endpoint: str, folder: str) -> DataFrame:
    """Raw records of a local archive folder, listed by Spark itself (no file is opened)."""
    df = spark.read.format("binaryFile").load(path)
    return df.select(
        F.lit(endpoint).alias("endpoint"), F.lit(folder).alias("folder"),
        F.element_at(F.split(F.col("path"), "/"), -1).alias("name"),
        F.col("length").alias("size"),
        F.unix_micros(F.col("modificationTime")).alias("mtime_us"),
        F.lit(1000).cast("long").alias("mtime_prec_us"))


def read_mirror(spark: SparkSession, parts: Sequence[str]) -> DataFrame | None:
    if not parts:
        return None
    return spark.read.schema(ddl(RAW_FIELDS)).json(list(parts))


def read_compacted(spark: SparkSession, path: Path, endpoints: Sequence[str]) -> DataFrame | None:
    """Metadata of compacted messages (never their bodies: Parquet reads only these columns)."""
    if not path.is_dir() or not any(path.glob("endpoint=*")):
        return None
    from ftpbc.analytics.compact import COMPACTED_FIELDS

    df = spark.read.schema(ddl(COMPACTED_FIELDS)).parquet(str(path))
    return df.filter(F.col("endpoint").isin(list(endpoints))).select(*[n for n, _ in RAW_FIELDS])


def parse(raw: DataFrame, namings: Mapping[str, Mapping[str, str]]) -> DataFrame:
    """Raw records, de-duplicated, parsed by ftpbc's own name parser in Spark's Python workers."""
    # mapPartitions rather than mapInArrow: the latter requires pandas, which ftpbc does not need.
    fn = partial(_parse_partition, namings={k: dict(v) for k, v in namings.items()})
    rdd = raw.dropDuplicates(KEY).rdd.mapPartitions(fn)
    return raw.sparkSession.createDataFrame(rdd, ddl(PARSED_FIELDS))


def _parse_partition(rows: Any, namings: Mapping[str, Mapping[str, str]]) -> Any:
    return parse_rows((r.asDict() for r in rows), namings)


def _pct(col: Column) -> Column:
    return F.percentile(col, list(PERCENTILES))


def pairs(parsed: DataFrame, window: Window) -> DataFrame:
    """One row per request, with its reply (if any), T0, bucket, latency and service time."""
    req = (parsed.filter((F.col("kind") == "request") & F.col("folder").isin("inarchive", "inerror"))
           .withColumn("t0_us", F.coalesce("name_time_us", "mtime_us"))
           .withColumn("t0_prec_us", F.when(F.col("name_time_us").isNotNull(), F.col("name_prec_us"))
                       .otherwise(F.col("mtime_prec_us")))
           .groupBy("endpoint", "uuid").agg(
               F.min("t0_us").alias("t0_us"), F.max("t0_prec_us").alias("t0_prec_us"),
               F.max(F.col("name_time_us").isNotNull()).alias("t0_from_name"),
               F.max(F.col("folder") == "inerror").alias("failed"),
               F.min("stamp_us").alias("served_us"), F.min_by("node", "stamp_us").alias("server_node"),
               F.min("name").alias("request_name"), F.sum("size").alias("request_bytes")))
    collected = (F.col("folder") == "outarchive") & (F.col("node") != UNCOLLECTED)
    rep = (parsed.filter(F.col("kind").isin("response", "error_reply")
                         & F.col("folder").isin("outarchive", "outerror"))
           .groupBy("endpoint", "uuid").agg(
               F.lit(True).alias("replied"),
               F.max((F.col("kind") == "response") & (F.col("folder") == "outarchive")).alias("has_response"),
               F.max(F.col("kind") == "error_reply").alias("has_error_reply"),
               F.max(F.col("folder") == "outerror").alias("unreadable"),
               F.max(F.col("node") == UNCOLLECTED).alias("swept"),
               F.min(F.when(collected, F.col("stamp_us"))).alias("collected_us"),
               F.min_by(F.when(collected, F.col("node")), F.when(collected, F.col("stamp_us")))
               .alias("collector_node"),
               F.sum("size").alias("response_bytes")))
    j = req.join(rep, ["endpoint", "uuid"], "left")
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
    """Figures per endpoint and bucket, ordered."""
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
        "t0_precision_ms").orderBy("endpoint", "bucket")


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
    ).orderBy("endpoint", "bucket", "node")


def unanswered(p: DataFrame) -> DataFrame:
    """The requests (partner files) that never got a reply."""
    return (p.filter(F.col("replied").isNull())
            .select("endpoint", "bucket", F.col("request_name").alias("name"), "uuid",
                    F.timestamp_micros("t0_us").alias("submitted"), F.col("server_node").alias("node"),
                    "failed")
            .orderBy("endpoint", "submitted"))


def to_rows(df: DataFrame) -> list[dict[str, Any]]:
    """A small result (figures) as Python rows on the driver."""
    return [r.asDict() for r in df.collect()]
