"""``ftpbc aggregate`` over an archive a real node and client made, replies through reply_to included.

A node serves endpoint ``a`` on pyftpdlib; a client sends requests answered in a's own outbox,
one answered through ``reply_to="b"`` (its reply archived in b's ``outarchive``, named
``resp.<id>;r=a``), one whose handler fails (an error reply) and one through ``reply_to="b"``
that nobody collects (its reply stays in b's outbox: not archived, so unanswered).  The job and
the plain pass (``tests/plain_figures.py``) then read the archive: both must count the reply_to
request answered, and agree row for row.  One server is enough: what is checked sits above the
transport (the names the exchange writes, and the job that reads them); the job reads the
server's directory as a ``file://`` area so that both engines see the same modification times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftpbc.analytics.job import Options, Result, run
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
    eps = {"a": {"repository": f"{base}/a", **FAST}, "b": {"repository": f"{base}/b", **FAST}}
    ids: dict[str, str] = {}
    with Started() as started:
        node = Node(in_process_config(handle, work, "prov", eps), handlers={"a": handler})
        started.things.append(node)
        node.start()
        client = Client(in_process_config(handle, work, "cli", eps))
        started.things.append(client)
        ids["own"] = client.submit("a", b"one")
        assert client.collect("a", ids["own"], timeout=20) == b"re:one"
        ids["reply_to"] = client.submit("a", b"two", reply_to="b")
        assert client.collect("b", ids["reply_to"], timeout=20) == b"re:two"
        ids["failed"] = client.submit("a", b"fail")
        with pytest.raises(RemoteHandlerError, match="RuntimeError"):
            client.collect("a", ids["failed"], timeout=20)
        ids["uncollected"] = client.submit("a", b"three", reply_to="b")
        wait_until(lambda: any(ids["uncollected"] in n for n in _files(handle.root, base, "b", "outbox")),
                   timeout=20, what="the uncollected reply in b's outbox")
    root = handle.root
    # Every file the figures read is in place (the client archives a reply before it returns it).
    archived = _files(root, base, "a", "inarchive") + _files(root, base, "a", "inerror")
    assert all(any(uid in n for n in archived) for uid in ids.values()), archived
    assert any(ids["reply_to"] in n and ";r=a" in n for n in _files(root, base, "b", "outarchive"))
    srv = ServerConfig.from_url(f"file://{root}", name="site")
    yield Archive([ArchiveSource("a", srv, f"{base}/a"), ArchiveSource("b", srv, f"{base}/b")], ids,
                  root, base)


@pytest.fixture(scope="module")
def result(archive: Archive, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("agg-reply-to")
    return run(Options(sources=archive.sources, out=out, bucket="1d", progress=False, print_table=False),
               spark=spark), out


def test_a_request_answered_through_reply_to_is_counted_answered(archive: Archive, result: Any) -> None:
    res, out = result
    totals = {k: sum(r[k] for r in res.figures if r["endpoint"] == "a")
              for k in ("requests", "responses", "errors", "unanswered")}
    assert totals == {"requests": 4, "responses": 2, "errors": 1, "unanswered": 1}
    assert not [r for r in res.figures if r["endpoint"] == "b"]  # b served no request
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
