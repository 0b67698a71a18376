"""Group commit in the journal: concurrent durable writers share one fsync, none returns before an
fsync covering its record completed, a failed fsync fails every writer it covered, and a writer
waits for another's fsync only so long.  The fsyncs are real (a real file on the test's disk);
where a test must know when an fsync runs, a wrapper around ``os.fsync`` holds it."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ftpbc.errors import JournalError
from ftpbc.journal import Journal
from ftpbc.journal import store as store_module
from tests.support import wait_until

ENDPOINT = "ep"
WRITERS = 16


def _send(ep: store_module.EndpointJournal, op_id: str) -> None:
    ep.record(op_id, "send", durable=True, kind="request", stage=f"/q/instage/req.{op_id}~n",
              target=f"/q/inbox/req.{op_id}")


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


class HeldFsync:
    """``os.fsync`` wrapped: counts the fsyncs of one file, and holds the first of them until
    the test releases it (a condition, with a deadline), so writers pile up behind it."""

    def __init__(self, path: Path, *, fail: Callable[[int], OSError | None] = lambda n: None) -> None:
        self.path = path
        self.real = os.fsync
        self.fail = fail
        self.count = 0
        self.released = threading.Event()
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        if os.fstat(fd).st_ino != self.path.stat().st_ino:
            self.real(fd)
            return
        self.count += 1
        if self.count == 1:
            self.entered.set()
            assert self.released.wait(30), "the test never released the first fsync"
        error = self.fail(self.count)
        if error is not None:
            raise error
        self.real(fd)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journals", "n")
    try:
        yield opened
    finally:
        opened.close()


def _run_writers(ep: store_module.EndpointJournal, held: HeldFsync, before: int
                 ) -> tuple[list[str], dict[str, str]]:
    """WRITERS threads each write one durable record: the first alone, its fsync held until all
    the others have appended theirs; the op ids that returned, and the errors of those that raised."""
    done: list[str] = []
    failed: dict[str, str] = {}
    lock = threading.Lock()

    def writer(k: int) -> None:
        op_id = f"w{k}.send"
        try:
            _send(ep, op_id)
        except JournalError as exc:
            with lock:
                failed[op_id] = str(exc)
        else:
            with lock:
                done.append(op_id)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    threads[0].start()
    assert held.entered.wait(30), "the first writer never fsynced"
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: _lines(ep.path) == before + WRITERS, timeout=30,
               what="every writer's record appended")
    held.released.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return done, failed


def test_concurrent_durable_writers_share_one_fsync(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first writer's fsync is held until every other writer has appended: they all wait for
    an fsync of their own record, and one more fsync serves all of them."""
    ep = journal.endpoint(ENDPOINT)
    _send(ep, "u0.send")
    held = HeldFsync(ep.path)
    monkeypatch.setattr(os, "fsync", held)
    fsyncs_before = ep.fsyncs
    done, failed = _run_writers(ep, held, before=1)
    assert failed == {}
    assert sorted(done) == sorted(f"w{k}.send" for k in range(WRITERS))
    # the held one (its leader's record, perhaps a few more) and one for everybody else
    assert held.count == 2 and ep.fsyncs - fsyncs_before == 2
    assert set(store_module.read_journal(ep.path).pending) == {"u0.send", *done}


def test_a_failed_fsync_fails_every_writer_it_covered(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fsync after the held one covers every writer but its leader's; it fails (ENOSPC, as a
    full disk's writeback does): each of them gets JournalError, now and when asking again, and
    the records written after are made durable by the next fsync."""
    ep = journal.endpoint(ENDPOINT)
    _send(ep, "u0.send")

    def second_fails(n: int) -> OSError | None:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) if n == 2 else None

    held = HeldFsync(ep.path, fail=second_fails)
    monkeypatch.setattr(os, "fsync", held)
    done, failed = _run_writers(ep, held, before=1)
    # The held fsync covered the first writer's record only; each of the others waited for the
    # second, which failed: one of them ran it and says why, the rest say it covered them.
    assert done == ["w0.send"] and sorted(failed) == sorted(f"w{k}.send" for k in range(1, WRITERS))
    leader = [e for e in failed.values() if e.endswith("cannot sync journal: No space left on device")]
    followers = [e for e in failed.values()
                 if e.endswith("an fsync of this record failed (No space left on device)")]
    assert len(leader) == 1 and len(followers) == WRITERS - 2, failed
    assert held.count == 2 and ep.fsyncs == 3  # u0's own, the held one, the failed one
    seq = ep.record_many([("late.send", "send", {})], durable=False)
    ep.wait_durable(seq)  # written after the failure: the next fsync makes it durable
    assert held.count == 3
    # A batch the failed fsync covered (the last writer's, just before "late") still fails when
    # asked about again, though a later fsync succeeded.
    with pytest.raises(JournalError, match=r"an fsync of this record failed \(No space left on device\)"):
        ep.wait_durable(seq - 1)


def test_a_writer_waits_for_another_writers_fsync_only_so_long(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """An fsync that hangs (a wedged disk or mount) holds its own writer, not the others: they
    give up with JournalError after ``sync_wait``; their record is made durable by a later fsync."""
    ep = journal.endpoint(ENDPOINT)
    held = HeldFsync(ep.path)
    monkeypatch.setattr(os, "fsync", held)
    errors: list[BaseException] = []

    def leader() -> None:
        try:
            _send(ep, "slow.send")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=leader)
    thread.start()
    try:
        assert held.entered.wait(30)
        ep.sync_wait = 0.2
        with pytest.raises(JournalError, match=r"no fsync covering this record finished within 0\.2 s"):
            _send(ep, "waiting.send")
    finally:
        held.released.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    ep.sync_wait = store_module.SYNC_WAIT
    seq = ep.record_many([("after.send", "send", {})], durable=False)
    ep.wait_durable(seq)
    assert set(store_module.read_journal(ep.path).pending) == {"slow.send", "waiting.send", "after.send"}


# --------------------------------------------------------------------------- kill -9 under load

#: Writes durable records from 8 threads until killed.  Its fsync wrapper reports the size the
#: file had before each fsync of the journal ("S <size>") once it completed; a thread reports
#: "A <op id>" once its record() returned.  Lines are single os.write calls to a pipe (atomic).
CHILD = r"""
import os, sys, threading
from ftpbc.journal import Journal

journal = Journal(sys.argv[1], "n")
ep = journal.endpoint("ep")
real = os.fsync

def fsync(fd):
    size = os.fstat(fd).st_size
    real(fd)
    os.write(1, b"S %d\n" % size)

os.fsync = fsync

def writer(k):
    for i in range(10 ** 9):
        op_id = f"t{k}.{i}.send"
        ep.record(op_id, "send", durable=True, kind="request", stage=f"/q/instage/req.{op_id}~n",
                  target=f"/q/inbox/req.{op_id}")
        os.write(1, f"A {op_id}\n".encode())

threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(8)]
for t in threads:
    t.start()
os.write(1, b"R\n")
for t in threads:
    t.join()
"""


def test_every_record_whose_write_returned_survives_a_kill_and_a_power_loss(tmp_path: Path) -> None:
    """A process writing durably from 8 threads is killed (SIGKILL) under load; then the journal
    file is cut back to what its last completed fsync covered, as a power loss would leave it.
    Every record whose ``record()`` returned is there, whole, and the journal opens on it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "journals")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = b""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while out.count(b"\nA ") < 400:
            assert time.monotonic() < deadline, f"the writer did not get going: {out[-500:]!r}"
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            assert chunk or not ready, f"the writer died: {proc.stderr.read() if proc.stderr else b''!r}"
            out += chunk
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
        out += rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    lines = out.split(b"\n")[:-1]  # the last piece may be cut
    acked = {line[2:].decode() for line in lines if line.startswith(b"A ")}
    synced = max((int(line[2:]) for line in lines if line.startswith(b"S ")), default=0)
    path = next((tmp_path / "journals" / "n").glob("*.journal"))
    assert path.stat().st_size >= synced
    with open(path, "r+b") as fh:
        fh.truncate(synced)  # what the disk is known to hold: the rest may not survive a power loss
    reading = store_module.read_journal(path)
    assert reading.damaged == []
    missing = acked - set(reading.pending)
    assert not missing, f"{len(missing)} record(s) acknowledged as durable but not covered by an fsync"
    reopened = Journal(tmp_path / "journals", "n")
    try:
        assert {o.op_id for o in reopened.endpoint(ENDPOINT).pending()} == set(reading.pending)
    finally:
        reopened.close()
