"""``ftpbc aggregate``: figures from the archive directories (Spark), optional compaction."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from ftpbc.analytics.progress import Phase
from ftpbc.cli import logs
from ftpbc.errors import ConfigError


@click.command("aggregate")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Read the configuration from this YAML file.")
@click.option("--endpoint", "endpoints", multiple=True,
              help="Include this endpoint (repeatable; default: every endpoint).")
@click.option("--since", help="Include submit times from this one on, ISO 8601 (naive: UTC).")
@click.option("--until", help="Include submit times before this one, ISO 8601 (naive: UTC).")
@click.option("--bucket", default="1h", show_default=True,
              help="Count per time bucket of this length: 30s, 15m, 1h, 1d.")
@click.option("--out", default="aggregate-out", show_default=True, type=click.Path(file_okay=False),
              help="Write figures, chart, listing mirror and compacted dataset into this directory.")
@click.option("--engine", type=click.Choice(["auto", "plain", "spark"]), default="auto", show_default=True,
              help="Compute in this process (plain), with Spark (spark), or by size (auto: plain up to "
                   "2,500,000 listed files, Spark above; --master means Spark).")
@click.option("--master", default=None, help="Run on this Spark master URL (default local[*]); implies "
                                             "--engine spark.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
              help="Pass a Spark setting, as spark-submit --conf (repeatable), e.g. "
                   "spark.executor.memory=2g or spark.pyspark.python=/opt/py311/bin/python3.")
@click.option("--route", type=click.Choice(["auto", "mirror"]), default="auto", show_default=True,
              help="List file:// areas by Spark itself (auto) or every area through ftpbc (mirror).")
@click.option("--compact", is_flag=True,
              help="First move archived messages into <out>/compacted (Parquet) and remove them "
                   "from the server, journaled under node.journal_dir.")
@click.option("--provenance", is_flag=True,
              help="Also write <out>/provenance (Parquet): one row per request with its steps, nodes "
                   "and outcome, expired and dead-lettered requests included.")
@click.option("--no-progress", is_flag=True,
              help="Draw no live progress line or bars (none are drawn off a terminal, nor under "
                   "--log-format json); each phase's line is written all the same.")
def aggregate(config_path: str, endpoints: tuple[str, ...], since: str | None, until: str | None,
              bucket: str, out: str, engine: str, master: str | None, confs: tuple[str, ...], route: str,
              compact: bool, provenance: bool, no_progress: bool) -> None:
    """Count requests, responses, errors, unanswered requests and latency per endpoint and time bucket.

    Small archives are computed in this process; large ones, or any run given --master, with
    Spark (the ``spark`` extra and Java 17).  See docs/aggregate.md.
    """
    from ftpbc.analytics.job import Options, parse_bucket, parse_time, run
    from ftpbc.analytics.requirements import PLAIN_MODULES, require_java, require_modules
    from ftpbc.analytics.sources import sources_from_config
    from ftpbc.config.loader import load_config

    # Every option, then what Spark needs here, are checked before any listing or Spark start.
    parse_bucket(bucket)
    first = parse_time(since, "--since") if since else None
    last = parse_time(until, "--until") if until else None
    if first is not None and last is not None and first >= last:
        raise ConfigError(f"--since {since!r} is not before --until {until!r}: no submit time is in between")
    spark_conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
        spark_conf[key.strip()] = value
    if master is not None:
        if engine == "plain":
            raise ConfigError(f"--master {master!r} runs Spark: it cannot go with --engine plain")
        engine = "spark"
    if engine == "spark":
        require_modules()
        require_java()
    else:  # Spark's own needs are checked if and when auto picks it
        require_modules(PLAIN_MODULES)
    config = load_config(config_path)
    sources = sources_from_config(config, endpoints)
    out_dir = Path(out)
    if compact:
        from ftpbc.analytics.compact import compact as run_compaction

        stats = run_compaction(sources, out_dir / "compacted", config.node.journal_dir,
                               progress=not no_progress)
        click.echo(f"compacted {stats.files} files ({stats.bytes} bytes) in {stats.batches} batches"
                   + (f", finished {stats.recovered} interrupted" if stats.recovered else ""))
    fmt = logs.current_format()
    result = run(Options(sources=sources, out=out_dir, bucket=bucket, since=since, until=until,
                         master=master or "local[*]", engine=engine, route=route,
                         progress=not no_progress and fmt == "text",
                         spark_conf=spark_conf,
                         log_level=spark_log_level(), provenance=provenance,
                         report=lambda phase: click.echo(phase_line(phase, fmt), err=True)))
    click.echo(f"{len(result.figures)} rows; {result.unanswered} unanswered; chart: {result.chart}"
               + (f"; provenance: {result.provenance}" if result.provenance is not None else ""))


def phase_line(phase: Phase, fmt: str) -> str:
    """A finished phase as the command writes it on stderr: ``aggregate [  1.2 s] listing: ...``,
    or under ``--log-format json`` one JSON object as the log lines are (logger
    ``ftpbc.aggregate``, event ``phase``) with ``phase``, ``elapsed_s`` and ``counts`` besides."""
    if fmt != "json":
        return f"aggregate {phase.line()}"
    record = logging.LogRecord("ftpbc.aggregate", logging.INFO, "", 0, "%s", (phase.line(),), None)
    record.event = "phase"
    out = json.loads(logs.JsonFormatter().format(record))
    out.update(phase=phase.name, elapsed_s=phase.elapsed_s, counts=dict(phase.counts))
    return json.dumps(out, ensure_ascii=False)


def spark_log_level() -> str:
    """Spark's own log level, from ftpbc's (the common ``--log-level`` / ``-v`` / FTPBC_LOG_LEVEL):
    errors only unless ftpbc logs at info (Spark's warnings too) or debug (its info too).  Spark
    at debug would bury ftpbc's own lines."""
    level = logging.getLogger().getEffectiveLevel()
    return "info" if level <= logging.DEBUG else "warn" if level <= logging.INFO else "error"


if __name__ == "__main__":
    # ``spark-submit ftpbc/cli/aggregate.py -c ftpbc.yaml ...``: the same command and options.
    aggregate(prog_name="ftpbc-aggregate")
