"""The aggregation run: list (or mirror) the archives, compute the figures, write every output.

Runnable as ``ftpbc aggregate ...`` or ``spark-submit ftpbc/analytics/job.py ...`` (same options;
``main()`` below).  Outputs under ``--out``::

    figures.parquet / figures.csv   per endpoint and bucket (figures.by_bucket)
    nodes.parquet / nodes.csv       per endpoint, bucket and node (figures.by_node)
    unanswered/ (Parquet), unanswered_csv/   the requests that never got a reply
    provenance/ (Parquet)           one row per request: its steps and outcome (``--provenance``)
    chart.png                       requests and latency percentiles over time
    mirror/                         the incremental listing mirror of FTP/SFTP areas (a cache)

Engines (:func:`choose_engine`): ``plain`` computes in this process (``plain``: no Spark, no
Java), ``spark`` with Spark; ``auto`` takes the plain engine up to :data:`PLAIN_MAX_FILES` listed
files, where a Spark start alone would cost more than the whole computation.  Every output is the
same whichever engine wrote it (the provenance table included).

Routes: a ``file://`` area is listed by the driver (into Parquet for Spark, ``listing``); FTP,
FTPS and SFTP areas are listed by ftpbc's transport into the mirror, whose parts either engine
reads.  With Spark, names are parsed in the JVM (``sqlnames``), and the session starts while the
driver lists.  Either way no server credential reaches Spark: it only ever sees local paths and
names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ftpbc.analytics.listing import Input
from ftpbc.analytics.plain import Window
from ftpbc.analytics.progress import Display, Phase, bar_wanted
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, TRAIL_FOLDERS, ArchiveSource
from ftpbc.errors import ConfigError

_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_UNIT_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}


def parse_bucket(text: str) -> int:
    """``15m`` -> microseconds; ConfigError naming the value otherwise."""
    m = _DURATION.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ConfigError(f"--bucket {text!r}: expected a duration like 30s, 15m, 1h or 1d")
    return int(m.group(1)) * _UNIT_US[m.group(2)]


def parse_time(text: str, option: str) -> int:
    """ISO 8601 (naive = UTC) -> microseconds since the epoch."""
    from ftpbc.analytics.records import EPOCH, US

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected an ISO 8601 time like 2026-03-01T12:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=EPOCH.tzinfo)
    return (when - EPOCH) // US


@dataclass
class Options:
    sources: list[ArchiveSource]
    out: Path
    bucket: str = "1h"
    since: str | None = None
    until: str | None = None
    master: str = "local[*]"
    #: "plain" (in this process, no Spark), "spark", or "auto": plain up to ``plain_max_files``
    #: listed files, Spark above (:func:`choose_engine`)
    engine: str = "auto"
    plain_max_files: int = 0  # 0: PLAIN_MAX_FILES
    #: "auto": Spark lists file:// areas itself, the mirror serves the others; "mirror": all mirrored
    route: str = "auto"
    mirror: Path | None = None
    compacted: Path | None = None
    #: a live progress line on stderr, when it is a terminal (never off one)
    progress: bool = True
    print_table: bool = True
    spark_conf: dict[str, str] = field(default_factory=dict)
    #: Spark's own log level on stderr (figures.LOG_LEVELS); "error" keeps its warnings out
    log_level: str = "error"
    #: told each phase as it ends (progress.PHASES: listing, engine, Spark start, parsing,
    #: figures, outputs, provenance), with its counts and the seconds since the start
    report: Callable[[Phase], None] | None = None
    #: also write the provenance table (figures.provenance, plain.Provenance), reading expired
    #: and dead letters too
    provenance: bool = False


#: what every run writes under ``--out`` (told by the ``outputs`` phase)
OUTPUTS = ("figures.parquet", "figures.csv", "nodes.parquet", "nodes.csv", "unanswered", "unanswered_csv",
           "chart.png")


@dataclass
class Result:
    figures: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    unanswered: int
    chart: Path
    mirrored_new: int
    #: the provenance table's directory (Parquet), when asked for
    provenance: Path | None = None
    #: the engine that computed the figures: "plain" or "spark"
    engine: str = "spark"


ENGINES = ("auto", "plain", "spark")
#: ``auto`` computes in this process (the plain engine) up to this many listed archive files
#: (about 2 per message), and with Spark above.  On the 2-core machine measured Spark was never
#: faster up to a million messages, so the bound is the plain engine's memory (about half a KiB
#: per file), not a crossover in time: docs/aggregate.md, "Engines" and "Performance"
PLAIN_MAX_FILES = 2_500_000


def count_files(inputs: Sequence[Input], limit: int) -> int:
    """How many records ``inputs`` hold, counted up to a little past ``limit`` (then it stops).

    Cheap: a folder's entries are counted without a ``stat`` (so a directory in it counts too),
    a mirror part's lines by its bytes, a compacted part from its Parquet footer.
    """
    total = 0
    for inp in inputs:
        if total > limit:
            break
        if inp.kind == "dir":
            with os.scandir(inp.path) as it:
                for _ in it:
                    total += 1
                    if total > limit:
                        break
        elif inp.kind == "mirror":
            with open(inp.path, "rb") as fh:
                while total <= limit and (block := fh.read(1 << 20)):
                    total += block.count(b"\n")
        else:
            import pyarrow.parquet as pq

            total += pq.ParquetFile(inp.path).metadata.num_rows
    return total


def choose_engine(opts: Options, inputs: Sequence[Input], spark: Any = None) -> tuple[str, str]:
    """The engine for this run and why, as told on stderr.

    ``auto`` takes Spark when a session was handed in or the master is not local, else counts
    the listed files: the plain engine up to ``plain_max_files``, Spark above.
    """
    if opts.engine not in ENGINES:
        raise ConfigError(f"--engine {opts.engine!r}: expected one of {', '.join(ENGINES)}")
    if opts.engine != "auto":
        return opts.engine, "as asked"
    if spark is not None:
        return "spark", "a Spark session is running"
    if not opts.master.startswith("local"):
        return "spark", f"master {opts.master}"
    limit = opts.plain_max_files or PLAIN_MAX_FILES
    n = count_files(inputs, limit)
    if n <= limit:
        return "plain", f"{n} files listed, at most {limit}"
    return "spark", f"over {limit} files listed"


def _has_entries(path: Path) -> bool:
    """Whether ``path`` is a directory with anything in it; it reads one entry (``iterdir`` lists
    the whole directory first: seconds for an archive folder of a million files)."""
    try:
        with os.scandir(path) as it:
            return next(it, None) is not None
    except (NotADirectoryError, FileNotFoundError):
        return False


def compacted_inputs(path: Path, endpoints: Sequence[str]) -> list[Input]:
    """The compacted dataset's parts of these endpoints (``<path>/endpoint=<e>/day=<d>/part-*``)."""
    return [Input("compacted", str(p), endpoint=e)
            for e in endpoints for p in sorted((path / f"endpoint={e}").glob("day=*/part-*.parquet"))]


def run(opts: Options, spark: Any = None) -> Result:
    """The whole aggregation; ``spark`` reuses a session (tests), else one is built from ``--master``
    when the Spark engine runs (:func:`choose_engine`).

    Its phases (:data:`ftpbc.analytics.progress.PHASES`) are told to ``opts.report`` as they
    end, each with its counts; ``opts.progress`` adds a live line on a terminal.
    """
    import sys

    with Display(opts.report, live=sys.stderr if bar_wanted(opts.progress) else None) as display:
        return _run(opts, spark, display)


def spark_status(spark: Any) -> Callable[[], str]:
    """What Spark is at, for the live line: tasks done of the running stages' tasks."""
    tracker = spark.sparkContext.statusTracker()

    def status() -> str:
        done = total = 0
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return f"{done}/{total} tasks" if total else ""

    return status


def _run(opts: Options, spark: Any, display: Display) -> Result:
    from ftpbc.analytics.mirror import part_files, update_mirror

    window = Window(parse_bucket(opts.bucket),
                    parse_time(opts.since, "--since") if opts.since else None,
                    parse_time(opts.until, "--until") if opts.until else None)
    # One source per endpoint: "--endpoint q --endpoint q" must not count q twice.
    sources = list({s.endpoint: s for s in opts.sources}.values())
    namings = {s.endpoint: s.naming() for s in sources}
    mirror_root = opts.mirror or opts.out / "mirror"
    direct = [s for s in sources if not s.server.has_host and opts.route == "auto"]
    mirrored = [s for s in sources if s not in direct]
    # Expired requests and dead letters end outside the archive folders: read for provenance only.
    folders = (*ARCHIVE_FOLDERS, *TRAIL_FOLDERS) if opts.provenance else ARCHIVE_FOLDERS
    display.begin("listing")
    stats_new = stats_listed = 0
    if mirrored:
        # The display's live line is the one progress display: no tqdm bar of the mirror's own.
        stats = update_mirror(mirror_root, mirrored, progress=False, folders=folders,
                              on_folder=lambda label: display.status(f"mirror {label}"))
        stats_new, stats_listed = stats.new, stats.listed
    inputs: list[Input] = []
    for s in direct:
        for folder in folders:
            local = Path(s.server.base) / s.folder_path(folder).lstrip("/")
            if _has_entries(local):
                inputs.append(Input("dir", str(local), endpoint=s.endpoint, folder=folder))
    inputs += [Input("mirror", p, endpoint=s.endpoint)
               for s in mirrored for p in part_files(mirror_root, [s], folders)]
    compacted = compacted_inputs(opts.compacted or opts.out / "compacted", [s.endpoint for s in sources])
    if not inputs and not compacted:
        raise ConfigError("no archive folder found for endpoints " + ", ".join(s.endpoint for s in sources))
    # Only the mirror (a crash between a part and its names) and a file both compacted and
    # still on the server can yield a record twice; a single listing of a folder cannot.
    dedupe = bool(compacted) or any(i.kind == "mirror" for i in inputs)
    engine, why = choose_engine(opts, [*inputs, *compacted], spark)
    found = (f"{sum(i.kind == 'dir' for i in inputs)} archive folders, "
             f"{sum(i.kind == 'mirror' for i in inputs)} mirror parts ({stats_new} new), "
             f"{len(compacted)} compacted parts of {len(sources)} endpoints")
    if engine == "plain":
        res = _run_plain(opts, [*inputs, *compacted], namings, window, dedupe, display, found, why)
    else:
        res = _run_spark(opts, spark, display, inputs, compacted, namings, window, dedupe, found, why,
                         stats_listed)
    res.mirrored_new = stats_new
    if opts.print_table:
        print(format_table(res.figures))
    return res


def _outputs_written(opts: Options, display: Display, rows: Sequence[dict[str, Any]], window: Window,
                     n_un: int) -> Path:
    """The chart, then the ``outputs`` phase's line; the chart's path."""
    from ftpbc.analytics.chart import draw

    chart = draw(rows, opts.out / "chart.png", bucket_label=opts.bucket, bucket_us=window.bucket_us)
    written = [p for p in OUTPUTS if (opts.out / p).exists()]
    display.end("outputs", f"{len(written)} outputs written under {opts.out} ({', '.join(written)}), "
                f"{n_un} unanswered requests listed", outputs=len(written), unanswered=n_un)
    return chart


def _run_plain(opts: Options, inputs: Sequence[Input], namings: Mapping[str, Mapping[str, str]],
               window: Window, dedupe: bool, display: Display, found: str, why: str) -> Result:
    """The plain engine's phases: the listing found the inputs; reading, parsing and folding
    them are one pass, told as the figures phase."""
    from ftpbc.analytics import plain

    display.end("listing", found, folders=sum(i.kind == "dir" for i in inputs),
                mirror_parts=sum(i.kind == "mirror" for i in inputs),
                compacted_parts=sum(i.kind == "compacted" for i in inputs), endpoints=len(namings))
    display.end("engine", f"plain ({why})", plain_max_files=opts.plain_max_files or PLAIN_MAX_FILES)
    display.begin("figures")
    prov = plain.Provenance() if opts.provenance else None
    res = plain.compute(inputs, namings, bucket_us=window.bucket_us, since_us=window.since_us,
                        until_us=window.until_us, dedupe=dedupe, provenance=prov)
    rows, nodes = res.figures, res.nodes
    n_requests = sum(r["requests"] for r in rows)
    display.end("figures", f"{res.records} requests and replies read, {len(rows)} endpoint-bucket rows, "
                f"{len(nodes)} node rows, {n_requests} requests", records=res.records, rows=len(rows),
                node_rows=len(nodes), requests=n_requests)
    display.begin("outputs")
    opts.out.mkdir(parents=True, exist_ok=True)
    _write_small(rows, opts.out / "figures")
    _write_small(nodes, opts.out / "nodes")
    plain.write_unanswered(res.unanswered, opts.out / "unanswered", opts.out / "unanswered_csv")
    n_un = sum(r["unanswered"] for r in rows)
    chart = _outputs_written(opts, display, rows, window, n_un)
    provenance_dir: Path | None = None
    if prov is not None:
        display.begin("provenance")
        provenance_dir = opts.out / "provenance"
        table = prov.rows(window.since_us, window.until_us)
        plain.write_provenance(table, provenance_dir)
        display.end("provenance", f"{len(table)} requests written to {provenance_dir}", requests=len(table))
    return Result(rows, nodes, n_un, chart, 0, engine="plain", provenance=provenance_dir)


def _session(opts: Options) -> Any:
    from ftpbc.analytics import figures as fg

    return fg.session(opts.master, extra=opts.spark_conf, log_level=opts.log_level)


def _run_spark(opts: Options, spark: Any, display: Display, inputs: Sequence[Input],
               compacted: Sequence[Input], namings: Mapping[str, Mapping[str, str]], window: Window,
               dedupe: bool, found: str, why: str, stats_listed: int) -> Result:
    from concurrent.futures import ThreadPoolExecutor

    from ftpbc.analytics.listing import stage_dirs

    if spark is None:
        from ftpbc.analytics.requirements import require_java, require_modules

        require_modules()
        require_java()
    staging = opts.out / ".listing" / uuidlib.uuid4().hex[:12]
    provenance_dir: Path | None = None
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as pool:
            # The JVM takes seconds to start, and the driver's listing as long again on a large
            # archive: the two overlap.
            starting = pool.submit(_session, opts) if spark is None else None
            staged = stage_dirs(inputs, namings, staging,
                                on_folder=lambda label, total: display.status(f"{label}, {total} files"))
            n_dirs = sum(i.kind == "dir" for i in inputs)
            n_parts = sum(i.kind == "mirror" for i in inputs)
            listed = sum(staged.values()) + stats_listed
            display.end("listing", f"{listed} files listed: {found}",
                        files=listed, folders=n_dirs, mirror_parts=n_parts, compacted_parts=len(compacted),
                        endpoints=len(namings))
            display.end("engine", f"spark ({why})", plain_max_files=opts.plain_max_files or PLAIN_MAX_FILES)
            if starting is not None:
                display.begin("spark")
                spark = starting.result()
                how = f"started ({opts.master}) while listing"
            else:
                how = "running session reused"
        from ftpbc.analytics import figures as fg

        cores = int(spark.sparkContext.defaultParallelism)
        display.end("spark", f"{how}, {cores} cores", cores=cores)
        status = spark_status(spark)
        display.begin("parsing", status)
        parsed = fg.read_inputs(spark, [*inputs, *compacted], namings, staging, staged)
        kinds = {r["kind"]: int(r["count"]) for r in parsed.groupBy("kind").count().collect()}
        replies = kinds.get("response", 0) + kinds.get("error_reply", 0)
        others = sum(kinds.values()) - kinds.get("request", 0) - replies
        display.end("parsing", f"{sum(kinds.values())} records: {kinds.get('request', 0)} requests, "
                    f"{replies} replies, {others} other", records=sum(kinds.values()),
                    requests=kinds.get("request", 0), replies=replies, other=others)
        display.begin("figures", status)
        rel = fg.relevant(parsed, dedupe=dedupe)
        pairs = fg.pairs(rel, window).cache()
        try:
            rows = fg.to_rows(fg.by_bucket(pairs), ["endpoint", "bucket"])
            nodes = fg.to_rows(fg.by_node(pairs), ["endpoint", "bucket", "node"])
            n_requests = sum(r["requests"] for r in rows)
            display.end("figures", f"{len(rows)} endpoint-bucket rows, {len(nodes)} node rows, "
                        f"{n_requests} requests", rows=len(rows), node_rows=len(nodes), requests=n_requests)
            display.begin("outputs", status)
            opts.out.mkdir(parents=True, exist_ok=True)
            _write_small(rows, opts.out / "figures")
            _write_small(nodes, opts.out / "nodes")
            fg.unanswered(pairs, rel).write.mode("overwrite").parquet(str(opts.out / "unanswered"))
            # The CSV from the Parquet just written (one sorted file): no second pass over pairs.
            (spark.read.parquet(str(opts.out / "unanswered")).write.mode("overwrite")
             .option("header", True).csv(str(opts.out / "unanswered_csv")))
            n_un = sum(r["unanswered"] for r in rows)
        finally:
            pairs.unpersist()
        chart = _outputs_written(opts, display, rows, window, n_un)
        if opts.provenance:
            display.begin("provenance", status)
            provenance_dir = opts.out / "provenance"
            fg.provenance(parsed, window).write.mode("overwrite").parquet(str(provenance_dir))
            n_prov = spark.read.parquet(str(provenance_dir)).count()  # from the files' footers
            display.end("provenance", f"{n_prov} requests written to {provenance_dir}", requests=n_prov)
    finally:
        # The staging dataset is this run's listing, read by the steps above; nothing later needs it.
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run's staging may still be there: leave it
            staging.parent.rmdir()
    return Result(rows, nodes, n_un, chart, 0, provenance=provenance_dir, engine="spark")


def _write_small(rows: Sequence[dict[str, Any]], stem: Path) -> None:
    """Parquet and CSV of a driver-side result (figures are endpoints x buckets: small)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows))
    pq.write_table(table, stem.with_suffix(".parquet"))
    pcsv.write_csv(table, stem.with_suffix(".csv"))


_COLUMNS = (("endpoint", "endpoint", "{}"), ("bucket", "bucket (UTC)", "{:%Y-%m-%d %H:%M}"),
            ("requests", "req", "{}"), ("responses", "resp", "{}"), ("errors", "err", "{}"),
            ("unanswered", "unans", "{}"), ("uncollected", "uncoll", "{}"),
            ("latency_p50_ms", "p50 ms", "{:.0f}"), ("latency_p95_ms", "p95 ms", "{:.0f}"),
            ("latency_p99_ms", "p99 ms", "{:.0f}"), ("latency_max_ms", "max ms", "{:.0f}"),
            ("t0_source", "T0 from", "{}"), ("t0_precision_ms", "T0 prec ms", "{:g}"))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    cells = [[h for _, h, _ in _COLUMNS]]
    for r in rows:
        cells.append([fmt.format(r[k]) if r[k] is not None else "-" for k, _, fmt in _COLUMNS])
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))) for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
