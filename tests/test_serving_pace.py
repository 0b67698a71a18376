"""One node at the floor's pace: what keeps a serving node's workers busy.

* A handled message whose ``served`` record's fsync and commit take long (a slow disk) waits
  for them without holding its worker's slot (after ``LEAVE_SLOT_AFTER``): the next claim is
  handled meanwhile, while handlers still never run more than ``workers`` at once, and nothing
  is committed before its record is durable.
* One fsync covers every record written before it began (the journal's group commit), also
  records written without waiting (``record_many(durable=False)``, then ``wait_durable``).
* Under request/response load on several workers, served records written while an fsync runs
  share the next one: fewer fsyncs of the node's journal than requests answered.

One server (pyftpdlib) is enough: what is tested is the node's journal, above the transport.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.journal import Journal
from ftpbc.journal.store import EndpointJournal
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

#: how long each fsync of the node's journal takes in the first test (a slow disk)
SLOW_FSYNC = 0.4


def test_the_next_message_is_handled_while_the_last_result_is_made_durable(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """workers: 1 and a journal whose fsync takes 0.4 s: the second message's handler runs while
    the first one's record is still being synced (the one worker no longer waits for it), the
    handlers never overlap, and each message is archived only once its record is on disk."""
    server = pyftpdlib_server
    repo = f"{server.fresh_dir()}/ep"
    endpoint = {"ep": {"repository": repo, "poll_interval": 0.02, "workers": 1}}
    lock = threading.Lock()
    syncs: list[tuple[float, float]] = []  # (began, ended) of each fsync wait of a served record
    handled: list[tuple[float, float]] = []  # (began, returned) of each handler call
    running = [0, 0]  # handlers running now, most at once
    real_sync = EndpointJournal._sync_through

    def slow_sync(self: EndpointJournal, seq: int) -> None:
        began = time.monotonic()
        time.sleep(SLOW_FSYNC)  # the disk's time, not a synchronisation
        real_sync(self, seq)
        with lock:
            syncs.append((began, time.monotonic()))

    def handler(message: Any) -> None:
        began = time.monotonic()
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.05)  # the handler's own work
        with lock:
            running[0] -= 1
            handled.append((began, time.monotonic()))

    client = Client(in_process_config(server, tmp_path, "cli", endpoint))
    things.append(client)
    for body in (b"one", b"two", b"three"):
        client.send("ep", body)
    monkeypatch.setattr(EndpointJournal, "_sync_through", slow_sync)
    node = Node(in_process_config(server, tmp_path, "prov", endpoint), handlers={"ep": handler})
    things.append(node)
    node.start()
    archive = server.local(f"{repo}/inarchive")
    wait_until(lambda: len(list(archive.iterdir())) == 3, timeout=30, what="three messages archived")
    assert not list(server.local(f"{repo}/inselect").iterdir())
    with lock:
        first_sync_ended = min(end for _, end in syncs)
        starts = sorted(began for began, _ in handled)
        most_at_once = running[1]
    assert len(starts) == 3 and most_at_once == 1  # workers: 1 still bounds the handlers
    # The second handler began before the first record was on disk: its worker did not wait.
    assert starts[1] < first_sync_ended, (starts, syncs)


def test_one_fsync_covers_the_records_written_before_it(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three record batches written without waiting, then waited for: one fsync makes all three
    durable, and waiting for one already covered costs none."""
    calls: list[int] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    journal = Journal(tmp_path, "n")
    try:
        ep = journal.endpoint("ep")
        monkeypatch.setattr(os, "fsync", counted)
        seqs = [ep.record_many([(f"u{i}.serve", "served", {"commit": f"/a/{i}"})], durable=False)
                for i in range(3)]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert calls == []  # nothing synced yet
        ep.wait_durable(seqs[-1])
        assert len(calls) == 1
        ep.wait_durable(seqs[0])  # written before that fsync began: covered by it
        assert len(calls) == 1
        assert sorted(op.op_id for op in ep.pending()) == ["u0.serve", "u1.serve", "u2.serve"]
    finally:
        journal.close()



#: workers of the node in the next test, and requests each caller makes
WORKERS = 5
REQUESTS_EACH = 3


def test_the_served_records_of_concurrent_workers_share_fsyncs(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten callers keep a five-worker node busy.  The first fsync of the node's journal is held
    (as a slow disk holds it) until two more workers have written their served records: the next
    fsync makes both durable at once.  Every request is answered with its own body, and the
    node's journal took fewer fsyncs than it wrote served records (each of which is durable
    before its reply is staged)."""
    server = pyftpdlib_server
    repo = f"{server.fresh_dir()}/ep"
    endpoint = {"ep": {"repository": repo, "poll_interval": 0.02, "workers": WORKERS}}
    node = Node(in_process_config(server, tmp_path, "prov", endpoint),
                handlers={"ep": lambda m: bytes(m.body)})
    things.append(node)
    client = Client(in_process_config(server, tmp_path, "cli", endpoint), connections=2 * WORKERS + 1)
    things.append(client)
    journal = node.runtime.journal.endpoint("ep")
    real_fsync = os.fsync
    held = [False]

    def served_waiting() -> int:
        return sum(1 for op in journal.pending() if "served" in op.events)

    def fsync(fd: int) -> None:
        if not held[0] and os.fstat(fd).st_ino == journal.path.stat().st_ino:
            held[0] = True
            wait_until(lambda: served_waiting() >= 3, timeout=30, what="two more served records")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    node.start()
    fsyncs_before = journal.fsyncs
    bodies = [f"request {i}".encode() for i in range(2 * WORKERS * REQUESTS_EACH)]
    replies: dict[bytes, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def caller(mine: list[bytes]) -> None:
        for body in mine:
            try:
                reply = client.request("ep", body, timeout=60)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                replies[body] = reply

    callers = [threading.Thread(target=caller, args=(bodies[k::2 * WORKERS],)) for k in range(2 * WORKERS)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in callers)
    assert errors == [] and replies == {b: b for b in bodies}
    assert held[0]
    fsyncs = journal.fsyncs - fsyncs_before
    assert 0 < fsyncs < len(bodies), f"{fsyncs} fsyncs for {len(bodies)} served records"
