"""The poll lock (T_LOCK + F_LOCK) and its dead-holder rule, with a real second process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.cluster.heartbeat import Heartbeat
from ftpbc.cluster.poll_lock import PollLock

HOLD = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1], thread_local=False)
lock.acquire()
print("held", flush=True)
sys.stdin.read()   # hold until the test closes our stdin
"""


@pytest.fixture
def other_process_holds(tmp_path: Path) -> Iterator[Path]:
    """Another process holds the endpoint's file lock until the test ends."""
    lock_file = tmp_path / "locks" / "quote.lock"
    lock_file.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_file)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield lock_file
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def test_busy_lock_of_a_live_holder_is_respected(tmp_path: Path, other_process_holds: Path) -> None:
    Heartbeat(tmp_path, "alive", 1.0).beat()
    other_process_holds.with_suffix(".holder").write_text("alive")
    lock = PollLock(tmp_path, "quote", "file", holder="me", lease=30)
    with lock.attempt() as held:
        assert held is False


def test_busy_lock_of_a_dead_holder_is_passed_by(tmp_path: Path, other_process_holds: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    other_process_holds.with_suffix(".holder").write_text("ghost")  # no heartbeat at all
    lock = PollLock(tmp_path, "quote", "file", holder="me", lease=30)
    with lock.attempt() as held:
        assert held is True
    assert "held by node ghost, which looks dead" in caplog.text
    # Without the holder/lease information the lock stays strict.
    with PollLock(tmp_path, "quote", "file").attempt() as held:
        assert held is False


def test_free_lock_records_its_holder_and_excludes_threads(tmp_path: Path) -> None:
    lock = PollLock(tmp_path, "quote", "file", holder="me", lease=30)
    with lock.attempt() as held:
        assert held is True
        assert (tmp_path / "locks" / "quote.holder").read_text() == "me"
        with PollLock(tmp_path, "quote", "file", holder="me", lease=30).attempt() as again:
            assert again is False  # the T_LOCK: one poller per endpoint in a process
    with lock.attempt() as held:
        assert held is True
