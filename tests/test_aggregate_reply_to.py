"""``ftpbc aggregate`` over an archive a real node and client made: reply_to and provenance.

A node serves endpoints ``a`` and ``d`` on pyftpdlib; a client sends requests answered in a's
own outbox, one answered through ``reply_to="b"`` (its reply archived in b's ``outarchive``,
named ``resp.<id>;r=a``), one whose handler fails (an error reply), one through
``reply_to="b"`` that nobody collects (its reply stays in b's outbox: not archived, so
unanswered), and one each to ``a`` and ``d`` that expire in flight (``a`` files them in
``inexpired``, ``d``, with ``expired: dead_letter``, in ``indead``).  The job and the plain pass
(``tests/plain_figures.py``) then read the archive: both must count the reply_to request
answered, and agree row for row; the provenance table the job writes must give each request its
steps, nodes and outcome.  One server is enough: what is checked sits above the
transport (the names the exchange writes, and the job that reads them); the job reads the
server's directory as a ``file://`` area so that both engines see the same modification times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftpbc.analytics.job import OUTPUTS, Options, Result, run
from ftpbc.analytics.progress import PHASES, Phase
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.client import Client
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests import plain_figures, test_aggregate
from tests.cluster import Started, in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

pytestmark = pytest.mark.slow

#: the one session-scoped SparkSession
spark = test_aggregate.spark

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}


def handler(message: Message) -> bytes:
    if message.body == b"fail":
        raise RuntimeError("refused on purpose")
    return b"re:" + message.body


@dataclass
class Archive:
    sources: list[ArchiveSource]
    #: request ids by what happened to them
    ids: dict[str, str]
    root: Path
    base: str


def _files(root: Path, base: str, endpoint: str, folder: str) -> list[str]:
    d = root / base.lstrip("/") / endpoint / folder
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


@pytest.fixture(scope="module")
def archive(pyftpdlib_server: ServerHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archive]:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    work = tmp_path_factory.mktemp("reply-to-run")
    eps = {"a": {"repository": f"{base}/a", **FAST}, "b": {"repository": f"{base}/b", **FAST},
           "d": {"repository": f"{base}/d", "expired": "dead_letter", **FAST}}
    ids: dict[str, str] = {}
    with Started() as started:
        node = Node(in_process_config(handle, work, "prov", eps), handlers={"a": handler, "d": handler})
        started.things.append(node)
        node.start()
        client = Client(in_process_config(handle, work, "cli", eps))
        started.things.append(client)
        ids["own"] = client.submit("a", b"one", correlation_id="order 42/7")
        assert client.collect("a", ids["own"], timeout=20) == b"re:one"
        ids["reply_to"] = client.submit("a", b"two", reply_to="b")
        assert client.collect("b", ids["reply_to"], timeout=20) == b"re:two"
        ids["failed"] = client.submit("a", b"fail")
        with pytest.raises(RemoteHandlerError, match="RuntimeError"):
            client.collect("a", ids["failed"], timeout=20)
        ids["uncollected"] = client.submit("a", b"three", reply_to="b")
        wait_until(lambda: any(ids["uncollected"] in n for n in _files(handle.root, base, "b", "outbox")),
                   timeout=20, what="the uncollected reply in b's outbox")
        # A ttl shorter than a send takes expires in flight (docs/queues.md): filed, never served.
        ids["expired"] = client.submit("a", b"late", ttl=0.001)
        ids["dead"] = client.submit("d", b"late", ttl=0.001)
        for endpoint, folder, what in (("a", "inexpired", "expired"), ("d", "indead", "dead")):
            def filed(e: str = endpoint, f: str = folder, w: str = what) -> bool:
                return any(ids[w] in n for n in _files(handle.root, base, e, f))

            wait_until(filed, timeout=20, what=f"the request in {endpoint}/{folder}")
    root = handle.root
    # Every file the figures read is in place (the client archives a reply before it returns it).
    archived = _files(root, base, "a", "inarchive") + _files(root, base, "a", "inerror")
    assert all(any(ids[w] in n for n in archived) for w in ("own", "reply_to", "failed", "uncollected")), \
        archived
    assert any(ids["reply_to"] in n and ";r=a" in n for n in _files(root, base, "b", "outarchive"))
    srv = ServerConfig.from_url(f"file://{root}", name="site")
    yield Archive([ArchiveSource(e, srv, f"{base}/{e}") for e in ("a", "b", "d")], ids, root, base)


@pytest.fixture(scope="module")
def phases() -> list[Phase]:
    """The phases the run below reported, in order."""
    return []


@pytest.fixture(scope="module")
def result(archive: Archive, spark: Any, tmp_path_factory: pytest.TempPathFactory,
           phases: list[Phase]) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("agg-reply-to")
    # progress asked for, stderr no terminal (pytest captures it): phase lines only
    return run(Options(sources=archive.sources, out=out, bucket="1d", progress=True, print_table=False,
                       provenance=True, report=phases.append), spark=spark), out


def test_a_request_answered_through_reply_to_is_counted_answered(archive: Archive, result: Any) -> None:
    res, out = result
    totals = {k: sum(r[k] for r in res.figures if r["endpoint"] == "a")
              for k in ("requests", "responses", "errors", "unanswered")}
    assert totals == {"requests": 4, "responses": 2, "errors": 1, "unanswered": 1}
    assert {r["endpoint"] for r in res.figures} == {"a"}  # b served no request, d's expired
    import pyarrow.parquet as pq

    unanswered = pq.read_table(out / "unanswered").to_pylist()
    assert [r["uuid"] for r in unanswered] == [archive.ids["uncollected"]]
    # The reply_to reply's collector is counted for a, where its request was served.
    assert sum(r["collected"] for r in res.nodes if r["endpoint"] == "a" and r["node"] == "cli") == 3


def test_the_plain_pass_gives_the_same_figures(archive: Archive, result: Any) -> None:
    res, _ = result
    ref = plain_figures.run(archive.sources, bucket_us=86_400_000_000)
    assert res.figures == ref.figures
    assert res.nodes == ref.nodes
    assert [r["uuid"] for r in ref.unanswered] == [archive.ids["uncollected"]]


def test_provenance_gives_each_request_its_steps_and_outcome(archive: Archive, result: Any) -> None:
    res, out = result
    assert res.provenance == out / "provenance"
    import pyarrow.parquet as pq

    rows = {r["id"]: r for r in pq.read_table(res.provenance).to_pylist()}
    ids = archive.ids
    assert set(rows) == set(ids.values())
    got = {what: {k: rows[uid][k] for k in ("endpoint", "kind", "outcome", "archived_by", "response_by",
                                            "response_endpoint", "reply_to", "correlation_id")}
           for what, uid in ids.items()}
    common = {"kind": "request", "archived_by": "prov", "correlation_id": None}
    assert got == {
        "own": {**common, "endpoint": "a", "outcome": "answered", "response_by": "cli",
                "response_endpoint": "a", "reply_to": None, "correlation_id": "order 42/7"},
        "reply_to": {**common, "endpoint": "a", "outcome": "answered", "response_by": "cli",
                     "response_endpoint": "b", "reply_to": "b"},
        "failed": {**common, "endpoint": "a", "outcome": "error", "response_by": "cli",
                   "response_endpoint": "a", "reply_to": None},
        "uncollected": {**common, "endpoint": "a", "outcome": "unanswered", "response_by": None,
                        "response_endpoint": None, "reply_to": "b"},
        "expired": {**common, "endpoint": "a", "outcome": "expired", "response_by": None,
                    "response_endpoint": None, "reply_to": None},
        "dead": {**common, "endpoint": "d", "outcome": "dead-lettered", "response_by": None,
                 "response_endpoint": None, "reply_to": None},
    }
    for what, uid in ids.items():
        r = rows[uid]
        assert r["name"].startswith(f"req.{uid}") and r["sent_at"] is None, what  # %u: no date in names
        # written, then archived, then (when there is one) answered: each step after the one before
        assert r["modified_at"] is not None and r["archived_at"] is not None, what
        assert r["modified_at"] <= r["archived_at"], what
        if r["response_at"] is not None:
            assert r["archived_at"] <= r["response_at"], what


def test_every_phase_is_reported_with_its_counts(archive: Archive, result: Any, phases: list[Phase]) -> None:
    assert [p.name for p in phases] == list(PHASES)
    assert all(p.counts for p in phases)
    assert [p.elapsed_s for p in phases] == sorted(p.elapsed_s for p in phases)
    got = {p.name: p.counts for p in phases}
    # Every file of the folders read (archives, and with --provenance the expired and dead ones).
    files = sum(len(_files(archive.root, archive.base, e, f)) for e in ("a", "b", "d")
                for f in ("inarchive", "outarchive", "inerror", "outerror", "inexpired", "indead"))
    assert got["listing"]["files"] == got["parsing"]["records"] == files
    assert (got["listing"]["endpoints"], got["spark"]["cores"] > 0) == (3, True)
    # requests: 4 served or failed, 1 expired, 1 dead-lettered; replies: 3 archived
    assert {k: got["parsing"][k] for k in ("requests", "replies")} == {"requests": 6, "replies": 3}
    assert (got["figures"]["rows"], got["figures"]["requests"]) == (len(result[0].figures), 4)
    assert got["outputs"] == {"outputs": len(OUTPUTS), "unanswered": 1}
    assert got["provenance"] == {"requests": 6}


def test_the_plain_engine_writes_the_same_provenance_table(archive: Archive, result: Any,
                                                           tmp_path: Path) -> None:
    """``--engine plain --provenance``: no Spark, the same figures and the same table, row for
    row and type for type, read back from its Parquet files."""
    import pyarrow.parquet as pq

    res, _ = result
    seen: list[Phase] = []
    mine = run(Options(sources=archive.sources, out=tmp_path / "out", bucket="1d", engine="plain",
                       progress=False, print_table=False, provenance=True, report=seen.append))
    assert (mine.engine, mine.figures, mine.nodes) == ("plain", res.figures, res.nodes)
    assert [p.name for p in seen] == ["listing", "engine", "figures", "outputs", "provenance"]
    assert seen[-1].counts == {"requests": len(archive.ids)}
    assert mine.provenance is not None and res.provenance is not None
    ours, spark_table = pq.read_table(mine.provenance), pq.read_table(res.provenance)
    # the same columns, in the same order, of the same types (Spark adds metadata and non-nulls)
    assert [(f.name, f.type) for f in ours.schema] == [(f.name, f.type) for f in spark_table.schema]

    def rows(table: Any) -> list[dict[str, Any]]:
        return sorted(table.to_pylist(), key=lambda r: (r["endpoint"], r["id"]))

    assert rows(ours) == rows(spark_table)
