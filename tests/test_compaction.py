"""Compaction killed (SIGKILL) mid-way: after one more run every file is in the dataset exactly once.

The compacting process kills itself from the compactor's hook, so the kill lands at a known step:
after a part is written but not committed, right after a commit, and in the middle of the
removals.  Runs against pyftpdlib (listing, reads and deletes through FTP).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ftpbc.analytics.compact import compact
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.transport.local import LocalTransport
from tests import synthetic, test_aggregate
from tests.servers.handle import ServerHandle

pytestmark = pytest.mark.slow

#: the one session-scoped SparkSession (Spark takes 5-8 s to start)
spark = test_aggregate.spark

CHILD = """
import json, os, signal, sys
from pathlib import Path
from ftpbc.analytics.compact import compact
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.config.servers import ServerConfig
a = json.loads(sys.argv[1])
srv = ServerConfig.from_url(a["url"], password=a["password"], name="ftp")
src = ArchiveSource("quote", srv, a["repo"])
seen = {"batches": 0}
def hook(stage, batch, n):
    if stage == "written":
        seen["batches"] += 1
    if seen["batches"] == 2 and stage == a["stage"] and a["n"] in (None, n):
        os.kill(os.getpid(), signal.SIGKILL)
compact([src], Path(a["dataset"]), Path(a["journal"]), batch_size=40, hook=hook, progress=False)
"""


def _remote_files(handle: ServerHandle, src: ArchiveSource) -> set[tuple[str, str]]:
    out = set()
    for folder in ARCHIVE_FOLDERS:
        d = handle.local(src.folder_path(folder))
        out |= {(folder, p.name) for p in d.iterdir()} if d.is_dir() else set()
    return out


@pytest.mark.parametrize(("stage", "n"), [("written", None), ("committed", None), ("deleted", 17)])
def test_killed_compaction_loses_nothing_and_duplicates_nothing(
        pyftpdlib_server: ServerHandle, tmp_path: Path, stage: str, n: int | None, spark: Any) -> None:
    base = pyftpdlib_server.fresh_dir()
    src = ArchiveSource("quote", pyftpdlib_server.config("ftp"), f"{base}/quote")
    messages = synthetic.plan([src], 120, datetime(2026, 3, 1, tzinfo=UTC), timedelta(days=2), seed=3)
    synthetic.write(LocalTransport(pyftpdlib_server.root, durable=False), [src], messages)
    before = _remote_files(pyftpdlib_server, src)
    dataset, journal = tmp_path / "compacted", tmp_path / "journal"
    args = {"url": pyftpdlib_server.url, "password": pyftpdlib_server.password, "repo": src.repository,
            "dataset": str(dataset), "journal": str(journal), "stage": stage, "n": n}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], timeout=120, check=False,
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    manifests = list((journal / "compaction").glob("*.json"))
    assert manifests, "the kill left no manifest to finish"
    # Manifests name remote paths: private to the node's user, as the journal is, whatever the umask.
    assert {stat.S_IMODE(m.stat().st_mode) for m in manifests} == {0o600}
    assert stat.S_IMODE((journal / "compaction").stat().st_mode) == 0o700

    stats = compact([src], dataset, journal, batch_size=40, progress=False)
    assert stats.recovered == 1
    assert _remote_files(pyftpdlib_server, src) == set()
    assert not list((journal / "compaction").glob("*.json"))
    rows = spark.read.parquet(str(dataset)).select("folder", "name", "size", "body").collect()
    counts = Counter((r["folder"], r["name"]) for r in rows)
    assert set(counts) == before
    assert max(counts.values()) == 1
    assert all(len(r["body"]) == r["size"] for r in rows)
    assert not [p for p in dataset.rglob("*") if p.name.startswith(".")], "temporary part left behind"


def test_aggregate_reads_compacted_and_uncompacted_alike(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spark: Any) -> None:
    from ftpbc.analytics.job import Options, run

    base = pyftpdlib_server.fresh_dir()
    src = ArchiveSource("quote", pyftpdlib_server.config("ftp"), f"{base}/quote")
    start = datetime(2026, 3, 1, tzinfo=UTC)
    old = synthetic.plan([src], 60, start, timedelta(hours=1), seed=4)
    local = LocalTransport(pyftpdlib_server.root, durable=False)
    synthetic.write(local, [src], old)
    compact([src], tmp_path / "out" / "compacted", tmp_path / "journal", progress=False)
    new = synthetic.plan([src], 25, start, timedelta(hours=1), seed=5)
    synthetic.write(local, [src], new)
    res = run(Options(sources=[src], out=tmp_path / "out", progress=False, print_table=False,
                      engine="spark"), spark=spark)
    assert sum(r["requests"] for r in res.figures) == 85
    assert sum(r["unanswered"] for r in res.figures) == sum(m.fate == "unanswered" for m in old + new)
    # The plain engine reads the compacted parts and the mirror the same way.
    alike = run(Options(sources=[src], out=tmp_path / "out-plain", progress=False, print_table=False,
                        engine="plain", mirror=tmp_path / "out" / "mirror",
                        compacted=tmp_path / "out" / "compacted"))
    assert (alike.figures, alike.nodes) == (res.figures, res.nodes)
