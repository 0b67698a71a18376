"""``ftpbc aggregate``: figures from the archive directories (Spark), optional compaction."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("aggregate")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="configuration file")
@click.option("--endpoint", "endpoints", multiple=True, help="endpoint to include (repeatable; default all)")
@click.option("--since", help="first submit time included, ISO 8601 (naive = UTC)")
@click.option("--until", help="submit times before this are included, ISO 8601 (naive = UTC)")
@click.option("--bucket", default="1h", show_default=True, help="time bucket: 30s, 15m, 1h, 1d")
@click.option("--out", default="aggregate-out", show_default=True, type=click.Path(file_okay=False),
              help="output directory (figures, chart, listing mirror, compacted dataset)")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
              help="Spark setting, as spark-submit --conf (repeatable), e.g. "
                   "spark.executor.memory=2g or spark.pyspark.python=/opt/py311/bin/python3")
@click.option("--route", type=click.Choice(["auto", "mirror"]), default="auto", show_default=True,
              help="auto: Spark lists file:// areas itself; mirror: list every area through ftpbc")
@click.option("--compact", is_flag=True,
              help="first move archived messages into <out>/compacted (Parquet) and remove them "
                   "from the server, journaled under node.journal_dir")
@click.option("--no-progress", is_flag=True, help="no progress bars")
def aggregate(config_path: str, endpoints: tuple[str, ...], since: str | None, until: str | None,
              bucket: str, out: str, master: str, confs: tuple[str, ...], route: str, compact: bool,
              no_progress: bool) -> None:
    """Requests, responses, errors, unanswered requests and latency per endpoint and time bucket."""
    from ftpbc.analytics.job import Options, parse_bucket, run
    from ftpbc.analytics.sources import sources_from_config
    from ftpbc.config.loader import load_config

    parse_bucket(bucket)  # refuse a bad value before any listing or Spark start
    spark_conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
        spark_conf[key.strip()] = value
    config = load_config(config_path)
    sources = sources_from_config(config, endpoints)
    out_dir = Path(out)
    if compact:
        from ftpbc.analytics.compact import compact as run_compaction

        stats = run_compaction(sources, out_dir / "compacted", config.node.journal_dir,
                               progress=not no_progress)
        click.echo(f"compacted {stats.files} files ({stats.bytes} bytes) in {stats.batches} batches"
                   + (f", finished {stats.recovered} interrupted" if stats.recovered else ""))
    result = run(Options(sources=sources, out=out_dir, bucket=bucket, since=since, until=until,
                         master=master, route=route, progress=not no_progress,
                         spark_conf=spark_conf))
    click.echo(f"{len(result.figures)} rows; {result.unanswered} unanswered; chart: {result.chart}")


if __name__ == "__main__":
    # ``spark-submit ftpbc/cli/aggregate.py -c ftpbc.yaml ...``: the same command and options.
    aggregate(prog_name="ftpbc-aggregate")
