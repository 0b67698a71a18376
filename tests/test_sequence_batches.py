"""Sequence draws of one process carried out together: draws waiting at the same moment share one
lock take and one write with its fsyncs, every value stays unique (across threads, processes and
a kill -9), a failed batch fails every draw in it, and a draw waits for other threads only so
long.  The files and fsyncs are real; where a test must know when a batch runs, a wrapper around
``os.fsync`` holds it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from ftpbc import sequences as sequences_module
from ftpbc.errors import SequenceError
from ftpbc.sequences import SequenceStore
from tests.support import reaped, spawn_drawer, wait_until

NAME = "batched"
THREADS = 12

@pytest.fixture
def store(tmp_path: Path) -> SequenceStore:
    return SequenceStore(tmp_path / "local", tmp_path / "shared")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    with reaped() as procs:
        yield procs


class HeldWrites:
    """``os.fsync`` wrapped: counts the fsyncs of the sequence's temporary file (one per batch)
    and holds the first until the test releases it."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.count = 0
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"{NAME}~tmp"):
            self.count += 1
            if self.count == 1:
                self.entered.set()
                assert self.released.wait(30), "the test never released the first batch"
        self.real(fd)


def _queued(store: SequenceStore) -> int:
    """Draws of NAME waiting in this process for a batch to carry them."""
    group, _ = sequences_module._LOCKS.get(Path(store.path("global", None, NAME)), store.lock_timeout)
    with group.cond:
        return len(group.queue)


def _draw_together(store: SequenceStore, held: HeldWrites) -> tuple[list[int], list[BaseException]]:
    """THREADS threads draw one value each: the first alone, its batch held at its fsync until
    every other thread waits in the queue behind it."""
    values: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def draw() -> None:
        try:
            value = store.next("global", None, NAME)
        except BaseException as exc:
            with lock:
                errors.append(exc)
        else:
            with lock:
                values.append(value)

    threads = [threading.Thread(target=draw) for _ in range(THREADS)]
    threads[0].start()
    assert held.entered.wait(30), "the first draw never wrote"
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: _queued(store) == THREADS - 1, timeout=30, what="every other draw queued")
    held.released.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return values, errors


def test_draws_waiting_together_share_one_lock_take_and_write(
        store: SequenceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.set("global", None, NAME, 100)
    held = HeldWrites()
    monkeypatch.setattr(os, "fsync", held)
    values, errors = _draw_together(store, held)
    assert errors == []
    assert sorted(values) == list(range(100, 100 + THREADS))  # unique, consecutive, no gap
    assert held.count == 2  # the first draw's batch, and one for the eleven queued behind it
    assert store.get("global", None, NAME) == 100 + THREADS


def test_a_failed_batch_fails_every_draw_in_it_and_uses_no_value(
        store: SequenceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch of queued draws cannot write (the file turned into garbage meanwhile): each of
    them gets the error naming the file; none is handed a value, and nothing is skipped."""
    store.set("global", None, NAME, 7)
    path = Path(store.path("global", None, NAME))
    held = HeldWrites()

    def first_then_garbage(fd: int) -> None:
        held(fd)
        if held.count == 1:
            # The first batch renames after this; the file the next batch reads is garbage.
            path.with_name(path.name + "~garbage").write_text("not a number\n")
            monkeypatch.setattr(os, "replace", replace_then_spoil)

    real_replace = os.replace

    def replace_then_spoil(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        monkeypatch.setattr(os, "replace", real_replace)
        real_replace(path.with_name(path.name + "~garbage"), path)

    monkeypatch.setattr(os, "fsync", first_then_garbage)
    values, errors = _draw_together(store, held)
    assert values == [7]
    assert len(errors) == THREADS - 1
    assert all(isinstance(e, SequenceError) and str(e).startswith(f"{path}: expected a decimal number")
               for e in errors), errors
    path.write_text("8\n")  # the operator puts it right
    assert store.next("global", None, NAME) == 8


def test_draws_blocked_by_another_process_fail_with_the_lock_named(tmp_path: Path) -> None:
    store = SequenceStore(tmp_path / "l", tmp_path / "s", lock_timeout=0.3)
    store.next("global", None, NAME)
    holder = FileLock(str(store.path("global", None, NAME)) + "~lock")
    holder.acquire()  # another open file description: conflicts like another process would
    errors: list[BaseException] = []

    def draw() -> None:
        try:
            store.next("global", None, NAME)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=draw) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        holder.release()
    assert len(errors) == 6
    assert all(f"{NAME}~lock within 0.3 s" in str(e) for e in errors), errors
    assert store.next("global", None, NAME) == 1  # nothing was drawn meanwhile


def test_a_draw_waits_for_another_threads_batch_only_so_long(
        store: SequenceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch stuck in its write (a hung disk or mount) holds its own thread; a draw queued
    behind it gives up with SequenceError and draws nothing."""
    held = HeldWrites()
    monkeypatch.setattr(os, "fsync", held)
    first: list[int] = []
    thread = threading.Thread(target=lambda: first.append(store.next("global", None, NAME)))
    thread.start()
    try:
        assert held.entered.wait(30)
        monkeypatch.setattr(sequences_module, "_IO_ALLOWANCE", 0.2)
        quick = SequenceStore(store.local_dir, store.shared_dir, lock_timeout=0.1)
        with pytest.raises(SequenceError, match=r"no draw finished within 0\.4 s \(another thread"):
            quick.next("global", None, NAME)
        assert _queued(store) == 0
    finally:
        held.released.set()
        thread.join(timeout=30)
    assert first == [0]
    assert store.next("global", None, NAME) == 1


# --------------------------------------------------------------------------- processes


@pytest.mark.timeout(180)
def test_four_processes_of_many_threads_draw_unique_consecutive_values(
        store: SequenceStore, children: list[subprocess.Popen[bytes]]) -> None:
    children.extend(spawn_drawer(store, NAME, "burst", 8, 60) for _ in range(4))
    values: list[int] = []
    for proc in children:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err.decode()
        values.extend(json.loads(out))
    assert sorted(values) == list(range(4 * 8 * 60))  # distinct, consecutive, no gap
    assert store.get("global", None, NAME) == 4 * 8 * 60


@pytest.mark.timeout(180)
def test_kill_9_of_processes_drawing_in_batches_never_repeats_a_value(
        store: SequenceStore, tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    """Four processes of six threads draw until killed with SIGKILL, three times over, each time
    restarted on the same file: no value is ever handed out twice, and the file always holds
    more than any value handed out (gaps allowed)."""
    logs = [tmp_path / f"handed-{i}.log" for i in range(4)]

    def handed_out() -> list[int]:
        return [int(line) for log in logs if log.exists()
                for line in log.read_text().split("\n")[:-1]]  # a line being written is left out

    for round_ in range(3):
        procs = [spawn_drawer(store, NAME, "loop", 6, 0, str(log)) for log in logs]
        children.extend(procs)
        target = len(handed_out()) + 150 + 50 * round_
        wait_until(lambda target=target: len(handed_out()) >= target,  # type: ignore[misc]
                   timeout=60, what="children drawing values")
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=30)
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""
        values = handed_out()
        assert len(values) == len(set(values)), "a value was handed out twice"
        on_disk = store.get("global", None, NAME)  # raises if empty or torn
        assert max(values) < on_disk, f"handed out {max(values)} but the file holds {on_disk}"
    assert store.next("global", None, NAME) == on_disk
