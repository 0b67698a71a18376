"""A poll's claims go to the server as one batch (``Transport.rename_each``; FTP: every RNFR and
RNTO in one write), and each claim still has its own outcome: a message another node took
meanwhile is a lost race and only that one, a claim the server refuses for another reason is
not claimed and its journal operation ends, and the others are claimed all the same.  On every
server kind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.errors import SourceGone, TransportError
from ftpbc.exchange.lifecycle import Lifecycle
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle

EP = "q"


@pytest.fixture
def lifecycle(server: ServerHandle, tmp_path: Path) -> Iterator[tuple[Lifecycle, Client, str]]:
    repo = f"{server.fresh_dir()}/q"
    cfg = in_process_config(server, tmp_path, "node-a", {EP: {"repository": repo, "poll_interval": 0.05}})
    client = Client(cfg)
    try:
        lc = client.runtime.lifecycle(EP)
        lc.prepare()
        yield lc, client, repo
    finally:
        client.close()


def _pending_claims(lc: Lifecycle) -> set[str]:
    return {op.op_id for op in lc.journal.pending() if op.kind == "claim"}


def test_a_batch_claims_every_pick_and_loses_only_the_one_taken(
        server: ServerHandle, lifecycle: tuple[Lifecycle, Client, str]) -> None:
    lc, client, repo = lifecycle
    for i in range(5):
        client.send(EP, f"body {i}".encode())
    picks = lc.waiting()
    assert len(picks) == 5
    taken = picks[2]
    (server.local(f"{repo}/inbox") / taken.name).unlink()  # another node claimed it meanwhile

    claimed, lost = lc.claim(picks, "serve")

    assert lost == 1
    assert [c.name for c in claimed] == [c.name for c in picks if c is not taken]
    in_select = sorted(p.name.split("~")[0] for p in server.local(f"{repo}/inselect").iterdir())
    assert in_select == sorted(c.name for c in claimed)
    assert not list(server.local(f"{repo}/inbox").iterdir())
    # The lost claim's operation ended; each won claim's is pending until it is served.
    assert _pending_claims(lc) == {c.op_id for c in claimed}
    for c in claimed:
        lc.unclaim(c)
    assert len(lc.waiting()) == 4


def test_a_claim_the_server_refuses_leaves_the_others_claimed(
        server: ServerHandle, lifecycle: tuple[Lifecycle, Client, str],
        caplog: pytest.LogCaptureFixture) -> None:
    lc, client, repo = lifecycle
    for i in range(3):
        client.send(EP, f"body {i}".encode())
    picks = lc.waiting()
    blocked = picks[1]
    # A directory where this pick's claim would go: the server refuses to rename a file onto it.
    claim_name = lc.layout.claim_path(blocked.name, lc.node_id).rsplit("/", 1)[1]
    target = server.local(f"{repo}/inselect") / claim_name
    target.mkdir()
    (target / "keep").write_bytes(b"not empty")
    target.chmod(0o777)

    with caplog.at_level(logging.WARNING, logger="ftpbc.lifecycle"):
        claimed, lost = lc.claim(picks, "serve")

    assert [c.name for c in claimed] == [picks[0].name, picks[2].name]
    assert lost == 0  # refused is not a race lost
    assert (server.local(f"{repo}/inbox") / blocked.name).exists()  # left where it was
    assert _pending_claims(lc) == {c.op_id for c in claimed}
    assert any("claimed 2, one or more others failed" in r.getMessage() for r in caplog.records)
    for c in claimed:
        lc.unclaim(c)


def test_a_batch_that_claims_nothing_raises_the_refusal(
        server: ServerHandle, lifecycle: tuple[Lifecycle, Client, str]) -> None:
    lc, client, repo = lifecycle
    client.send(EP, b"only one")
    picks = lc.waiting()
    claim_name = lc.layout.claim_path(picks[0].name, lc.node_id).rsplit("/", 1)[1]
    target = server.local(f"{repo}/inselect") / claim_name
    target.mkdir()
    (target / "keep").write_bytes(b"not empty")

    with pytest.raises(TransportError) as err:
        lc.claim(picks, "serve")

    assert not isinstance(err.value, SourceGone)  # refused, not a race lost
    assert (server.local(f"{repo}/inbox") / picks[0].name).exists()
    assert not _pending_claims(lc)
