"""The aggregation job against a 20,000-message archive on pyftpdlib, figures checked one by one.

The archive is written with ftpbc's write path (stage, then rename to the archived name) through
a LocalTransport on the FTP server's own directory: 40,000 uploads through FTP would take about
a minute here.  The job then reads it the way it reads any remote area: listing through FTP
(MLSD) into the mirror.  Expected figures are computed below from the plan, without Spark.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ftpbc.analytics.job import Options, Result, run
from ftpbc.analytics.mirror import update_mirror
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.exchange.area import parse_archive_name
from ftpbc.transport.local import LocalTransport
from tests import synthetic
from tests.servers.handle import ServerHandle

pytestmark = pytest.mark.slow

START = datetime(2026, 3, 1, tzinfo=UTC)
SPAN = timedelta(hours=5)
HOUR_US = 3_600_000_000


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from ftpbc.analytics.figures import session

    s = session("local[2]")
    yield s
    s.stop()


def _sources(handle: ServerHandle, base: str) -> list[ArchiveSource]:
    srv = handle.config("ftp")
    return [
        ArchiveSource("quote", srv, f"{base}/quote"),
        ArchiveSource("order", srv, f"{base}/order", timezone="Europe/Paris",
                      message_name="%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S"),
        ArchiveSource("stock", srv, f"{base}/stock", request_prefix="q-", response_prefix="a-",
                      message_name="%u_%y%y%y%y%M%M%d%d%H%H%m%m%s%s"),
    ]


def _us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _t0_us(m: synthetic.Message) -> int:
    # quote: file mtime through MLSD, whole seconds; stock: name to the second; order: name to the ms
    t = _us(m.t0)
    return t if m.endpoint == "order" else t - t % 1_000_000


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def expected(messages: list[synthetic.Message]) -> dict[tuple[str, datetime], dict[str, Any]]:
    groups: dict[tuple[str, datetime], list[synthetic.Message]] = defaultdict(list)
    for m in messages:
        t0 = _t0_us(m)
        bucket = datetime(1970, 1, 1) + timedelta(microseconds=t0 - t0 % HOUR_US)
        groups[(m.endpoint, bucket)].append(m)
    out = {}
    for key, ms in groups.items():
        lat = [(_us(m.collected_at) - _t0_us(m)) / 1000 for m in ms
               if m.collected_at is not None and m.fate in ("answered", "failed")]
        svc = [(_us(m.served_at) - _t0_us(m)) / 1000 for m in ms]
        out[key] = {
            "requests": len(ms),
            "responses": sum(m.fate in ("answered", "uncollected") for m in ms),
            "errors": sum(m.fate == "failed" for m in ms),
            "unanswered": sum(m.fate == "unanswered" for m in ms),
            "uncollected": sum(m.fate == "uncollected" for m in ms),
            "unreadable": sum(m.fate == "unreadable" for m in ms),
            "request_bytes": sum(m.request_size for m in ms),
            "response_bytes": sum(m.response_size for m in ms if m.fate != "unanswered"),
            "latency_p50_ms": _pct(lat, 0.5), "latency_p95_ms": _pct(lat, 0.95),
            "latency_p99_ms": _pct(lat, 0.99), "latency_max_ms": max(lat) if lat else None,
            "service_p50_ms": _pct(svc, 0.5), "service_p95_ms": _pct(svc, 0.95),
            "service_p99_ms": _pct(svc, 0.99), "service_max_ms": max(svc),
            "t0_source": "mtime" if key[0] == "quote" else "name",
            "t0_precision_ms": 1.0 if key[0] == "order" else 1000.0,
        }
    return out


@pytest.fixture(scope="module")
def archive(pyftpdlib_server: ServerHandle) -> tuple[list[ArchiveSource], list[synthetic.Message]]:
    base = pyftpdlib_server.fresh_dir()
    sources = _sources(pyftpdlib_server, base)
    messages = synthetic.plan(sources, 20_000 // 3 + 1, START, SPAN, seed=7)[:20_000]
    root = str(pyftpdlib_server.root)
    synthetic.write(LocalTransport(root, durable=False), sources, messages,
                    synthetic.local_mtime_setter(root))
    return sources, messages


@pytest.fixture(scope="module")
def result(archive: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("agg-out")
    return run(Options(sources=archive[0], out=out, progress=False, print_table=False, engine="spark"),
               spark=spark), out


def test_every_figure_matches_an_independent_count(archive: Any, result: Any) -> None:
    _, messages = archive
    res, _ = result
    want = expected(messages)
    got = {(r["endpoint"], r["bucket"]): r for r in res.figures}
    assert set(got) == set(want)
    assert sum(r["requests"] for r in res.figures) == 20_000
    for key, w in want.items():
        for col, value in w.items():
            g = got[key][col]
            if isinstance(value, float):
                assert g == pytest.approx(value, abs=1e-6), (key, col)
            else:
                assert g == value, (key, col)


def test_per_node_counts_and_unanswered_list(archive: Any, result: Any, spark: Any) -> None:
    _, messages = archive
    res, out = result
    served: dict[tuple[str, str], int] = defaultdict(int)
    collected: dict[tuple[str, str], int] = defaultdict(int)
    for m in messages:
        if m.fate != "failed":
            served[(m.endpoint, m.server_node)] += 1
        if m.fate in ("answered", "failed"):
            assert m.collector is not None
            collected[(m.endpoint, m.collector)] += 1
    got_served: dict[tuple[str, str], int] = defaultdict(int)
    got_collected: dict[tuple[str, str], int] = defaultdict(int)
    for r in res.nodes:
        got_served[(r["endpoint"], r["node"])] += r["served"]
        got_collected[(r["endpoint"], r["node"])] += r["collected"]
    assert {k: v for k, v in got_served.items() if v} == served
    assert {k: v for k, v in got_collected.items() if v} == collected
    # The list names the archived files, whose first part is the partner's request name.
    names = {parse_archive_name(r["name"])[0] for r in spark.read.parquet(str(out / "unanswered")).collect()}
    assert names == {m.request_name for m in messages if m.fate == "unanswered"}


def test_outputs_are_written_and_carry_no_secret(result: Any, pyftpdlib_server: ServerHandle) -> None:
    res, out = result
    import pyarrow.parquet as pq

    assert pq.read_table(out / "figures.parquet").num_rows == len(res.figures)
    assert (out / "figures.csv").read_text().startswith('"endpoint","bucket","requests"')
    assert res.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res.chart.stat().st_size > 20_000  # a drawn chart, not an empty canvas
    secret = (pyftpdlib_server.password or "").encode()
    assert secret
    for f in out.rglob("*"):
        if f.is_file():
            assert secret not in f.read_bytes(), f


def test_plain_engine_reads_the_mirror_as_spark_does(archive: Any, result: Any, tmp_path: Path) -> None:
    """The plain engine on the same FTP area (its listing mirror, records de-duplicated) gives
    every figure, node figure and unanswered request the Spark run gave."""
    import pyarrow.parquet as pq

    from tests.test_aggregate_names import assert_same_outputs

    res, out = result
    plain_out = tmp_path / "out"
    alike = run(Options(sources=archive[0], out=plain_out, progress=False, print_table=False,
                        engine="plain", mirror=out / "mirror"))
    assert alike.engine == "plain" and alike.mirrored_new == 0  # the Spark run's mirror, as it was
    assert alike.figures == res.figures and alike.nodes == res.nodes
    assert pq.read_table(plain_out / "unanswered").num_rows == alike.unanswered
    assert_same_outputs(out, plain_out)


def test_mirror_fetches_only_what_is_new(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    base = pyftpdlib_server.fresh_dir()
    sources = _sources(pyftpdlib_server, base)[:1]
    root = str(pyftpdlib_server.root)
    local = LocalTransport(root, durable=False)
    first = synthetic.plan(sources, 30, START, SPAN, seed=1)
    synthetic.write(local, sources, first)
    files = lambda ms: sum(1 + (m.fate == "failed") + (m.collector is not None) for m in ms)  # noqa: E731
    assert update_mirror(tmp_path, sources, progress=False).new == files(first)
    assert update_mirror(tmp_path, sources, progress=False).new == 0
    more = synthetic.plan(sources, 7, START, SPAN, seed=2)
    synthetic.write(local, sources, more)
    stats = update_mirror(tmp_path, sources, progress=False)
    assert (stats.new, stats.listed) == (files(more), files(first) + files(more))
