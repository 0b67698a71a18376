"""Compaction's bounds: memory held whatever the bodies, reads cut at the listed size, hostile names.

All against ``file://`` areas under the test's temporary directory: the compactor lists, reads and
deletes through ftpbc's LocalTransport, the same code path as for any other transport.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from ftpbc.analytics.compact import Compactor, check_listed_name, compact
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import UnsafeNameError
from ftpbc.model.envelope import UnusableName
from ftpbc.transport import Entry, Transport, open_transport
from tests import test_aggregate

pytestmark = pytest.mark.slow

#: the one session-scoped SparkSession (Spark takes 5-8 s to start)
spark = test_aggregate.spark

MIB = 1 << 20
STAMP = "20260301T120000.000Z"

CHILD = """
import json, sys
from pathlib import Path
import pyarrow, pyarrow.parquet, tqdm  # imported before the baseline: they are not the bodies
from ftpbc.analytics.compact import compact
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.config.servers import ServerConfig

def hwm_mib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")

a = json.loads(sys.argv[1])
src = ArchiveSource("quote", ServerConfig.from_url(a["url"], name="local"), "/quote")
baseline = hwm_mib()
stats = compact([src], Path(a["dataset"]), Path(a["journal"]), progress=False)
print(json.dumps({"baseline_mib": baseline, "peak_mib": hwm_mib(), "files": stats.files,
                  "bytes": stats.bytes}))
"""


def _name() -> str:
    return f"req.{uuid.uuid4()}~n1~{STAMP}"


def _area(tmp_path: Path) -> tuple[ArchiveSource, Path]:
    root = tmp_path / "area"
    inarchive = root / "quote" / "inarchive"
    inarchive.mkdir(parents=True)
    return ArchiveSource("quote", ServerConfig.from_url(f"file://{root}", name="local"), "/quote"), inarchive


def _bodies(dataset: Path) -> dict[str, list[bytes]]:
    """Every (name -> bodies) in the dataset, read one row group at a time."""
    import pyarrow.parquet as pq

    out: dict[str, list[bytes]] = {}
    for part in sorted(dataset.rglob("part-*.parquet")):
        f = pq.ParquetFile(part)
        for i in range(f.num_row_groups):
            for row in f.read_row_group(i, columns=["name", "size", "body"]).to_pylist():
                assert len(row["body"]) == row["size"]
                out.setdefault(row["name"], []).append(row["body"])
    return out


def test_compaction_memory_is_bounded_by_the_budget_not_the_bodies(tmp_path: Path) -> None:
    _, inarchive = _area(tmp_path)
    block = hashlib.shake_256(b"compaction").digest(MIB)  # incompressible, and quick to write
    expected: dict[str, str] = {}
    for i in range(3):
        name, digest = _name(), hashlib.sha256()
        with open(inarchive / name, "wb") as fh:
            for piece in (bytes([i]) * 7, *([block] * 80), b"tail %d" % i):
                fh.write(piece)
                digest.update(piece)
        expected[name] = digest.hexdigest()
    for i in range(5):  # small ones too: they go through pyarrow's writer in the same run
        name, body = _name(), os.urandom(1000 + i)
        (inarchive / name).write_bytes(body)
        expected[name] = hashlib.sha256(body).hexdigest()

    dataset, journal = tmp_path / "compacted", tmp_path / "journal"
    args = {"url": f"file://{tmp_path / 'area'}", "dataset": str(dataset), "journal": str(journal)}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], timeout=600, check=False,
                          capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    figures = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    print(f"\ncompaction of 3 x 80 MiB + 5 small files: {figures}")
    grown = figures["peak_mib"] - figures["baseline_mib"]
    # Holding even one body would take 80 MiB; the old compactor took 1.7 GB for these three.
    assert grown < 64, f"peak RSS grew by {grown:.0f} MiB over the baseline: {figures}"
    assert figures["files"] == 8

    got = _bodies(dataset)
    assert set(got) == set(expected)
    assert {n: [hashlib.sha256(b).hexdigest() for b in bodies] for n, bodies in got.items()} == \
        {n: [d] for n, d in expected.items()}
    assert list(inarchive.iterdir()) == []
    assert not [p for p in dataset.rglob("*") if p.name.startswith(".")]


def test_row_groups_stay_within_the_budget_and_spark_reads_every_part(tmp_path: Path, spark: Any) -> None:
    import pyarrow.parquet as pq

    src, inarchive = _area(tmp_path)
    budget = 4096
    bodies = {_name(): os.urandom(n) for n in (100, 1500, 1500, 1500, 4096, 4097, 9000, 0, 2000, 3000)}
    for name, body in bodies.items():
        (inarchive / name).write_bytes(body)
    dataset = tmp_path / "compacted"
    stats = compact([src], dataset, tmp_path / "journal", progress=False, row_group_bytes=budget)
    assert stats.files == len(bodies)
    assert stats.bytes == sum(map(len, bodies.values()))

    one_row_parts = 0
    for part in dataset.rglob("part-*.parquet"):
        f = pq.ParquetFile(part)
        for i in range(f.num_row_groups):
            sizes = f.read_row_group(i, columns=["size"]).column("size").to_pylist()
            assert len(sizes) == 1 or sum(sizes) <= budget, sizes
        if f.metadata.num_rows == 1 and f.read().column("size")[0].as_py() > budget:
            one_row_parts += 1
    assert one_row_parts == 2  # 4097 and 9000 bytes: each a part of its own

    rows = spark.read.parquet(str(dataset)).select("endpoint", "day", "folder", "name", "size",
                                                   "body").collect()
    assert sorted(r["name"] for r in rows) == sorted(bodies)
    assert all(bytes(r["body"]) == bodies[r["name"]] and r["size"] == len(bodies[r["name"]]) for r in rows)
    assert {(r["endpoint"], str(r["day"]), r["folder"]) for r in rows} == \
        {("quote", "2026-03-01", "inarchive")}


class Lying:
    """A transport that lists what the wrapped one lists, with ``extra`` entries added and sizes
    replaced by ``sizes``, and records every path anything asks it for."""

    def __init__(self, inner: Transport, extra: list[Entry], sizes: dict[str, int]) -> None:
        self.inner, self.extra, self.sizes = inner, extra, sizes
        self.server = inner.server
        self.asked: list[str] = []

    def list(self, path: str, *, timeout: float | None = None) -> list[Entry]:
        self.asked.append(path)
        listed = [Entry(e.name, self.sizes.get(e.name, e.size), e.mtime, e.is_dir)
                  for e in self.inner.list(path)]
        return listed + self.extra

    def get(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        self.asked.append(path)
        return self.inner.get(path, stream)

    def delete(self, path: str, *, timeout: float | None = None) -> None:
        self.asked.append(path)
        self.inner.delete(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # The rest of the interface is not used by compaction.
    def put(self, path: str, stream: BinaryIO, *, timeout: float | None = None) -> int:
        raise AssertionError("compaction never writes to the server")

    def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        raise AssertionError("compaction never renames on the server")


def _lying(inner_extra: list[Entry], sizes: dict[str, int]) -> tuple[list[Lying], Any]:
    made: list[Lying] = []

    def factory(cfg: ServerConfig) -> Transport:
        t = Lying(open_transport(cfg), inner_extra, sizes)
        made.append(t)
        return cast(Transport, t)
    return made, factory


def test_unusable_listed_names_are_skipped_once_and_never_become_paths(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src, inarchive = _area(tmp_path)
    good = [_name(), _name()]
    planted = ["back\\slash~n1~" + STAMP, "new\nline~n1~" + STAMP, "esc\x1b[31m~n1~" + STAMP]
    for name in good + planted:
        (inarchive / name).write_bytes(b"body of " + name.encode())
    long_name = "r" * 300  # longer than any file system allows: only a server can list it
    made, factory = _lying([Entry(long_name, 10, None, False), Entry("..", 10, None, False)], {})
    c = Compactor([src], tmp_path / "compacted", tmp_path / "journal", progress=False,
                  transport_factory=factory)
    try:
        with caplog.at_level(logging.WARNING):
            stats = c.run()
            c.run()  # the second run finds them again and says nothing more
    finally:
        c.close()
    assert stats.files == len(good)
    assert sorted(p.name for p in inarchive.iterdir()) == sorted(planted)
    assert set(_bodies(tmp_path / "compacted")) == set(good)
    asked = [p for t in made for p in t.asked]
    for bad in [*planted, long_name, ".."]:
        assert not [p for p in asked if p.endswith("/" + bad)], f"a path was built from {bad!r}"
    # A name that is no bare name (a backslash, a line break) is refused by the transport's
    # listing already, and said there; the rest by the compactor.  Either way, once.
    warnings = [r.getMessage() for r in caplog.records
                if r.name in ("ftpbc.analytics.compact", "ftpbc.transport.local")
                and r.levelno == logging.WARNING]
    for bad in [*planted, long_name, ".."]:
        assert sum(repr(bad) in w for w in warnings) == 1, (bad, warnings)
    assert not [w for w in warnings if "\n" in w or "\x1b" in w], "a raw control character was logged"


def test_a_read_past_the_listed_size_leaves_the_file(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    src, inarchive = _area(tmp_path)
    liar, honest = _name(), _name()
    (inarchive / liar).write_bytes(b"x" * (2 * MIB))  # listed as 5 bytes below
    (inarchive / honest).write_bytes(b"fine")
    _, factory = _lying([], {liar: 5})
    c = Compactor([src], tmp_path / "compacted", tmp_path / "journal", progress=False,
                  transport_factory=factory)
    try:
        with caplog.at_level(logging.WARNING, logger="ftpbc.analytics.compact"):
            stats = c.run()
    finally:
        c.close()
    assert stats.files == 1
    assert [p.name for p in inarchive.iterdir()] == [liar]
    assert set(_bodies(tmp_path / "compacted")) == {honest}
    assert any("listed with 5 bytes" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "a\\b", "a\nb", "a\rb", "a\0b", "a\tb", "a\x1bb",
                                  "a\x85b", "a\u2028b", "a\u202eb", "x" * 256, "é" * 128, "bad\udcff"])
def test_check_listed_name_refuses(name: str) -> None:
    with pytest.raises((UnsafeNameError, UnusableName)):
        check_listed_name(name)


@pytest.mark.parametrize("name", [f"req.{uuid.UUID(int=1)}~n1~{STAMP}", "resp.x.error~n~" + STAMP + ".reason",
                                  "x" * 255, "é" * 127, "名前 with spaces"])
def test_check_listed_name_accepts(name: str) -> None:
    assert check_listed_name(name) == name
