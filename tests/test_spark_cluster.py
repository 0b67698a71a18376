"""``ftpbc aggregate --master spark://...`` on a real standalone cluster gives the local figures.

The cluster (``tests.spark_cluster``): a master and two one-core workers on 127.0.0.1, started
from the installed pyspark's ``spark-class``, whose PATH leads to a ``python3`` that fails.  The
cluster run also names an interpreter that does not exist (``spark.pyspark.python``): names are
parsed by Spark SQL functions in the JVM, so no Python may start on an executor at all.  The
archive: a few hundred messages of two endpoints in a ``file://`` area (one dated by its names to
the millisecond in Europe/Paris, one by its files' modification times), written with ftpbc's own
write path.  The same command runs twice, as a user runs it (a process of its own, so that each
run builds its own Spark driver): ``--master local[*]`` and ``--master spark://127.0.0.1:P``.
Every output row must be the same: figures, per-node figures and the unanswered list.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ftpbc.analytics.sources import sources_from_config
from ftpbc.config.loader import load_config
from ftpbc.transport.local import LocalTransport
from tests import synthetic
from tests.spark_cluster import SparkCluster, spark_cluster
from tests.support import ftpbc_env, run_ftpbc

__all__ = ["spark_cluster"]  # the fixture, imported for pytest

# Two whole runs (local, cluster) of up to 240 s each: 141 s alone here, over 300 s at a load of 10.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CONFIG = """\
node:
  state_dir: {tmp}/state
  journal_dir: {tmp}/journals
servers:
  site:
    url: file://{tmp}/exchange
endpoints:
  quote:
    server: site
    repository: /quote
  order:
    server: site
    repository: /order
    timezone: Europe/Paris
    message_name: "%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S"
"""
MESSAGES_PER_ENDPOINT = 150


def _rows(path: Path, order: list[str]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    rows.sort(key=lambda r: tuple((r[k] is not None, r[k]) for k in order))
    return rows


def test_cluster_run_gives_the_local_figures(spark_cluster: SparkCluster, tmp_path: Path) -> None:
    config = tmp_path / "ftpbc.yaml"
    config.write_text(CONFIG.format(tmp=tmp_path), encoding="utf-8")
    root = tmp_path / "exchange"
    root.mkdir()
    sources = sources_from_config(load_config(config))
    messages = synthetic.plan(sources, MESSAGES_PER_ENDPOINT, datetime(2026, 3, 1, tzinfo=UTC),
                              timedelta(hours=3), seed=5)
    synthetic.write(LocalTransport(root, durable=False), sources, messages,
                    synthetic.local_mtime_setter(str(root)))
    # The driver's environment names no interpreter: the job itself must send sys.executable.
    env = ftpbc_env()
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)

    outs = {}
    for label, master in (("local", "local[*]"), ("cluster", spark_cluster.master_url)):
        out = tmp_path / f"out-{label}"
        no_python = ["--conf", "spark.pyspark.python=/nonexistent/python3"] if label == "cluster" else []
        result = run_ftpbc("aggregate", "-c", str(config), "--master", master, "--out", str(out),
                           "--no-progress", *no_python, env=env, timeout=240)
        assert result.returncode == 0, f"{label}:\n{result.stderr[-4000:]}\n{spark_cluster.logs()}"
        outs[label] = (out, result.stdout)

    # The cluster did run it: the master lists one finished application, which had executors.
    apps = spark_cluster.status()["completedapps"]
    assert isinstance(apps, list) and [a["name"] for a in apps] == ["ftpbc-aggregate"], apps
    assert list((spark_cluster.workdir).glob("work-*/app-*/*/stderr")), "no executor ran on a worker"

    (local, local_stdout), (cluster, cluster_stdout) = outs["local"], outs["cluster"]
    # The printed table and the summary line, whose chart path names each run's own --out.
    assert local_stdout.replace(str(local), "OUT") == cluster_stdout.replace(str(cluster), "OUT")
    assert "chart: OUT/chart.png" in local_stdout.replace(str(local), "OUT")
    figures = _rows(local / "figures.parquet", ["endpoint", "bucket"])
    assert sum(r["requests"] for r in figures) == len(messages)
    assert {r["endpoint"] for r in figures} == {"quote", "order"}
    assert sum(r["unanswered"] for r in figures) == sum(m.fate == "unanswered" for m in messages)
    assert figures == _rows(cluster / "figures.parquet", ["endpoint", "bucket"])
    assert _rows(local / "nodes.parquet", ["endpoint", "bucket", "node"]) == \
        _rows(cluster / "nodes.parquet", ["endpoint", "bucket", "node"])
    unanswered = _rows(local / "unanswered", ["endpoint", "submitted", "name"])
    assert len(unanswered) == sum(m.fate == "unanswered" for m in messages)
    assert unanswered == _rows(cluster / "unanswered", ["endpoint", "submitted", "name"])
