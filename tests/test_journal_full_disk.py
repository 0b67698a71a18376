"""The journal on a full disk and with damage in it: a failed append leaves no partial record, a
torn last record is cut at start-up, and a damaged record is set aside (and said so) while every
other record is used.  The full disk is real: a 2 MiB tmpfs filled to the byte."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.errors import JournalError
from ftpbc.journal import Journal, journal_problems
from ftpbc.journal import store as store_module
from ftpbc.model.message import Message
from ftpbc.node.health import serve_metrics
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import IN_CI, wait_until

ENDPOINT = "ep"
#: what the filled disk leaves free: room for small records, not for a large reply
LEAVE = 12 * 1024
BIG = 40_000  # a reply's body: about 53 KB once base64 in its record


# --------------------------------------------------------------------------- a small real disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted at the end.  Locally a refused mount skips; under CI=true it fails."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mount = shutil.which("mount")
    result = subprocess.run([mount or "mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, check=False) if mount else None
    if result is None or result.returncode != 0:
        why = result.stderr.strip() if result is not None else "no mount command"
        message = f"cannot mount a tmpfs here (root with CAP_SYS_ADMIN needed): {why}"
        if IN_CI:
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)  # never left mounted
            pytest.fail(f"{mount_point} was still busy at the end of the test (a file left open)")


@pytest.fixture
def open_journal(small_disk: Path) -> Iterator[Callable[[], Journal]]:
    """Opens node ``n``'s journal on the small disk; every one opened is closed before the disk
    is unmounted, also when the test fails."""
    opened: list[Journal] = []

    def open_it() -> Journal:
        opened.append(Journal(small_disk / "journals", "n"))
        return opened[-1]

    yield open_it
    for journal in opened:
        journal.close()


def _free(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize


def _fill(disk: Path, leave: int = LEAVE) -> Path:
    """A file taking all of ``disk``'s free space but ``leave`` bytes (a whole number of pages)."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * (_free(disk) - leave))
    assert _free(disk) == leave
    return filler


def _big_reply(ep: store_module.EndpointJournal, op_id: str) -> dict[str, str]:
    """The fields of a ``served`` record carrying a BIG-byte reply inline."""
    return {"claim": f"/q/inselect/req.{op_id}~n", "commit": f"/q/inarchive/req.{op_id}",
            "target": f"/q/outbox/resp.{op_id}", "stage": f"/q/outstage/resp.{op_id}~n",
            **ep.save_result(op_id, b"r" * BIG)}


def _send(ep: store_module.EndpointJournal, op_id: str) -> None:
    ep.record(op_id, "send", durable=True, kind="request", stage=f"/q/instage/req.{op_id}~n",
              target=f"/q/inbox/req.{op_id}")


def _side_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".damaged-*"))


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= level and r.name.startswith("ftpbc.journal")]


# --------------------------------------------------------------------------- a failed append


def test_an_append_on_a_full_disk_leaves_no_partial_record(
        small_disk: Path, open_journal: Callable[[], Journal], caplog: pytest.LogCaptureFixture) -> None:
    journal = open_journal()
    ep = journal.endpoint(ENDPOINT)
    _send(ep, "u1.send")
    filler = _fill(small_disk)
    before = ep.path.read_bytes()
    with pytest.raises(JournalError, match="No space left on device"):
        ep.record("big.serve", "served", durable=True, **_big_reply(ep, "big.serve"))
    assert ep.path.read_bytes() == before  # cut back: not a byte of the failed record stays
    _send(ep, "u2.send")  # a small record still fits, and follows a whole one
    filler.unlink()
    ep.record("big.serve", "served", durable=True, **_big_reply(ep, "big.serve"))
    _send(ep, "u3.send")
    journal.close()

    reading = store_module.read_journal(ep.path)
    assert reading.damaged == [] and reading.torn is None
    caplog.clear()
    journal = open_journal()
    ops = journal.endpoint(ENDPOINT).pending()
    assert [o.op_id for o in ops] == ["u1.send", "u2.send", "big.serve", "u3.send"]
    assert journal.endpoint(ENDPOINT).load_result(ops[2].fields) == b"r" * BIG
    assert _messages(caplog) == [] and _side_files(ep.path) == []


def test_a_failed_batch_never_tears_another_writers_record(
        small_disk: Path, open_journal: Callable[[], Journal]) -> None:
    """A batch written before the failed one, not yet synced, stays whole and becomes durable."""
    ep = open_journal().endpoint(ENDPOINT)
    _send(ep, "u1.send")
    filler = _fill(small_disk)
    claim = {"src": "/q/inbox/req.u2", "dst": "/q/inselect/req.u2~n"}
    seq = ep.record_many([("u2.serve", "claim", claim)], durable=False)
    with pytest.raises(JournalError, match="No space left on device"):
        ep.record_many([("big.serve", "served", _big_reply(ep, "big.serve"))], durable=True)
    ep.wait_durable(seq)
    filler.unlink()
    assert [o.op_id for o in ep.pending()] == ["u1.send", "u2.serve"]
    reading = store_module.read_journal(ep.path)
    assert list(reading.pending) == ["u1.send", "u2.serve"]
    assert reading.damaged == [] and reading.torn is None


def test_concurrent_writers_on_a_full_disk_keep_exactly_what_they_were_told(
        small_disk: Path, open_journal: Callable[[], Journal]) -> None:
    """Threads appending small and large records durably (group commit) on a nearly full disk:
    whichever fail, the file holds exactly the records whose call returned, every one whole."""
    journal = open_journal()
    ep = journal.endpoint(ENDPOINT)
    _send(ep, "u0.send")
    filler = _fill(small_disk, leave=64 * 1024)
    done: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()

    def writer(k: int) -> None:
        for i in range(20):
            op_id = f"w{k}.{i}.serve"
            try:
                if i % 3 == 0:
                    ep.record(op_id, "served", durable=True, **_big_reply(ep, op_id))
                else:
                    _send(ep, op_id)
            except JournalError:
                with lock:
                    failed.append(op_id)
            else:
                with lock:
                    done.append(op_id)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert failed and done  # the disk did fill up, and records went on fitting
    filler.unlink()
    journal.close()
    reading = store_module.read_journal(ep.path)
    assert reading.damaged == [] and reading.torn is None
    assert set(reading.pending) == {"u0.send", *done}


def test_an_append_that_cannot_be_cut_back_makes_the_journal_refuse_records(
        small_disk: Path, open_journal: Callable[[], Journal], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    journal = open_journal()
    ep = journal.endpoint(ENDPOINT)
    _send(ep, "u1.send")
    filler = _fill(small_disk)

    def broken(fd: int, length: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "ftruncate", broken)
    with pytest.raises(JournalError, match="No space left on device"):
        ep.record("big.serve", "served", durable=True, **_big_reply(ep, "big.serve"))
    monkeypatch.undo()
    filler.unlink()
    with pytest.raises(JournalError, match="refuses records: a failed append could not be cut back"):
        _send(ep, "u2.send")  # room again, but the file ends in part of a record
    [problem] = journal_problems(small_disk / "journals", "n")
    assert problem.startswith(f"journal {ep.path}: refuses records: ") and "Input/output error" in problem
    journal.close()

    caplog.clear()
    journal = open_journal()  # start-up cuts what the writer could not
    assert [o.op_id for o in journal.endpoint(ENDPOINT).pending()] == ["u1.send"]
    [warning] = _messages(caplog)
    assert f"{ep.path}: torn last record (line 2 at offset " in warning, warning
    _send(journal.endpoint(ENDPOINT), "u2.send")
    assert journal_problems(small_disk / "journals", "n") == []


def test_a_failed_fsync_leaves_every_batch_it_covered_not_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux may report a failed writeback once: a later fsync that succeeds must not make the
    batches of the failed one durable after all."""
    journal = Journal(tmp_path, "n")
    try:
        ep = journal.endpoint(ENDPOINT)
        first = ep.record_many([("u1.send", "send", {})], durable=False)
        second = ep.record_many([("u2.send", "send", {})], durable=False)
        real = os.fsync
        calls = {"n": 0}

        def fails_once(fd: int) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        monkeypatch.setattr(os, "fsync", fails_once)
        with pytest.raises(JournalError, match="Input/output error"):
            ep.wait_durable(second)
        with pytest.raises(JournalError, match="an fsync of this record failed"):
            ep.wait_durable(first)  # covered by that fsync too, though it asks after
        third = ep.record_many([("u3.send", "send", {})], durable=False)
        ep.wait_durable(third)  # written after: the next fsync makes it durable
        with pytest.raises(JournalError, match="an fsync of this record failed"):
            ep.wait_durable(second)
        assert calls["n"] == 2
    finally:
        journal.close()


# --------------------------------------------------------------------------- start-up


def _journal_with_sends(directory: Path, *op_ids: str) -> Path:
    journal = Journal(directory, "n")
    ep = journal.endpoint(ENDPOINT)
    for op_id in op_ids:
        _send(ep, op_id)
    journal.close()
    return ep.path


def _crc(text: bytes) -> bytes:
    return b"%s #%08x" % (text, zlib.crc32(text))


def test_a_torn_last_record_is_cut_at_start_up_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whole lines, the last one failing its checksum (cut short, then a newline): cut off."""
    path = _journal_with_sends(tmp_path, "u1.send", "u2.send")
    whole = path.read_bytes()
    first_end = whole.index(b"\n") + 1
    path.write_bytes(whole[:-20] + b"\n")  # the second record lost its last bytes
    caplog.clear()
    journal = Journal(tmp_path, "n")
    try:
        assert [o.op_id for o in journal.endpoint(ENDPOINT).pending()] == ["u1.send"]
    finally:
        journal.close()
    [warning] = _messages(caplog)
    assert warning.startswith(f"{path}: torn last record (line 2 at offset {first_end}, ") \
        and "checksum" in warning and "unrecorded" in warning, warning
    assert path.read_bytes() == whole[:first_end] and _side_files(path) == []


def test_a_damaged_middle_record_is_set_aside_and_the_rest_replayed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _journal_with_sends(tmp_path, "u1.send", "u2.send", "u3.send")
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"req.u2", b"req.X2")
    path.write_bytes(b"\n".join(lines))
    caplog.clear()
    journal = Journal(tmp_path, "n")
    try:
        assert [o.op_id for o in journal.endpoint(ENDPOINT).pending()] == ["u1.send", "u3.send"]
        [side] = _side_files(path)
        assert side.read_bytes() == lines[1] + b"\n" and side.stat().st_mode & 0o777 == 0o600
        [error] = _messages(caplog)
        assert error.startswith(f"{path}: 1 damaged record(s) (line 2 at offset {len(lines[0]) + 1}: ") \
            and str(side) in error, error
        assert journal_problems(tmp_path, "n") == [f"journal {path}: 1 damaged record(s) set aside in {side}"]
    finally:
        journal.close()
    side.unlink()
    assert journal_problems(tmp_path, "n") == []


def test_a_record_glued_behind_a_cut_one_is_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What an append that failed on a full disk left before this release: part of a record, and
    the next record written right behind it on the same line.  Only the part is set aside."""
    path = _journal_with_sends(tmp_path, "u1.send")
    cut = _crc(b"2026-11-22T01:02:03.123Z big.serve served claim=/q/inselect/req.big~n body=cnJy")[:-30]
    glued = _crc(b"2026-11-22T01:02:04.000Z u2.send send stage=/q/instage/req.u2~n target=/q/inbox/req.u2")
    last = _crc(b"2026-11-22T01:02:05.000Z u3.send send stage=/q/instage/req.u3~n target=/q/inbox/req.u3")
    with open(path, "ab") as fh:
        fh.write(cut + glued + b"\n" + last + b"\n")
    caplog.clear()
    journal = Journal(tmp_path, "n")
    try:
        assert [o.op_id for o in journal.endpoint(ENDPOINT).pending()] == ["u1.send", "u2.send", "u3.send"]
    finally:
        journal.close()
    [side] = _side_files(path)
    assert side.read_bytes() == cut + b"\n"
    [error] = _messages(caplog)
    assert f"{path}: 1 damaged record(s) (line 2 at offset " in error and str(side) in error, error


# --------------------------------------------------------------------------- a node


def _node_config(handle: ServerHandle, tmp_path: Path, node_id: str, journal_dir: Path) -> Any:
    marker = tmp_path / "area"
    if not marker.exists():
        marker.write_text(handle.fresh_dir())
    cfg = in_process_config(handle, tmp_path, node_id, {ENDPOINT: {
        "repository": f"{marker.read_text()}/ep", "poll_interval": 0.02, "timeout": 20,
        "redelivery_delay": 0.0}})
    return cfg.model_copy(update={"node": cfg.node.model_copy(update={
        "journal_dir": journal_dir, "heartbeat_interval": 0.2, "lease": 10.0})})


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_node_whose_reply_finds_the_disk_full_keeps_serving_and_restarts_cleanly(
        pyftpdlib_server: ServerHandle, tmp_path: Path, small_disk: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    journals = small_disk / "journals"
    cfg = _node_config(pyftpdlib_server, tmp_path, "prov", journals)
    freed = threading.Event()
    calls: list[bytes] = []

    def handler(message: Message) -> bytes:
        calls.append(message.body)
        if message.body != b"big":
            return b"re:" + message.body
        if len(calls) > 2:  # the big one again, after its result could not be recorded
            assert freed.wait(30), "the test never freed the disk"
        return b"b" * BIG

    client = Client(_node_config(pyftpdlib_server, tmp_path, "cli", tmp_path / "client-journals"))
    running: list[Node] = []
    pool = ThreadPoolExecutor(1)
    try:
        node = Node(cfg, handlers={ENDPOINT: handler})
        running.append(node)
        node.start()
        assert client.request(ENDPOINT, b"first", timeout=20) == b"re:first"
        [journal_file] = (journals / "prov").glob("*.journal")
        filler = _fill(small_disk)
        reply = pool.submit(client.request, ENDPOINT, b"big", 60)
        # Its result failed to record (the claim went back), and it is being handled again.
        wait_until(lambda: len(calls) == 3, timeout=30, what="the big request handled a second time")
        assert any("No space left on device" in r.getMessage() for r in caplog.records)
        reading = store_module.read_journal(journal_file)
        assert reading.torn is None and reading.damaged == []  # no partial record left behind
        filler.unlink()
        freed.set()
        assert reply.result(timeout=60) == b"b" * BIG
        assert client.request(ENDPOINT, b"after", timeout=20) == b"re:after"
        running.remove(node)
        node.stop(drain_timeout=5)

        caplog.clear()
        node = Node(cfg, handlers={ENDPOINT: handler})
        running.append(node)
        node.start()
        metrics = serve_metrics(node, "127.0.0.1", 0)
        try:
            assert client.request(ENDPOINT, b"restarted", timeout=20) == b"re:restarted"
            assert _messages(caplog) == [], "the restart found nothing to cut or set aside"
            assert _get(metrics.url + "/readyz") == (200, "ready\n")
        finally:
            metrics.close()
        assert _side_files(journal_file) == []
    finally:
        freed.set()
        pool.shutdown(wait=True)
        client.close()
        for node in running:
            node.stop(drain_timeout=5)


def test_a_node_with_a_damaged_record_serves_and_says_so_on_readyz(
        pyftpdlib_server: ServerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not ready (503, the reason named) while the side file is there; serving all the same."""
    journals = tmp_path / "node-journals"
    journal = Journal(journals, "prov")
    ep = journal.endpoint(ENDPOINT)
    ep.record("u1.send", "send", durable=True, kind="request", stage="/nowhere/instage/req.u1~prov",
              target="/nowhere/inbox/req.u1")
    ep.record("u2.send", "send", durable=True, kind="request", stage="/nowhere/instage/req.u2~prov",
              target="/nowhere/inbox/req.u2")
    journal.close()
    lines = ep.path.read_bytes().split(b"\n")
    ep.path.write_bytes(b"\n".join([lines[0].replace(b"u1", b"x1"), *lines[1:]]))

    client = Client(_node_config(pyftpdlib_server, tmp_path, "cli", tmp_path / "client-journals"))
    node = Node(_node_config(pyftpdlib_server, tmp_path, "prov", journals),
                handlers={ENDPOINT: lambda m: b"ok"})
    try:
        node.start()
        metrics = serve_metrics(node, "127.0.0.1", 0)
        try:
            assert client.request(ENDPOINT, b"x", timeout=20) == b"ok"
            [side] = _side_files(ep.path)
            status, body = _get(metrics.url + "/readyz")
            reason = f"journal {ep.path}: 1 damaged record(s) set aside in {side}"
            assert status == 503 and reason in body, body
            side.unlink()  # inspected: ready again, no restart needed
            assert _get(metrics.url + "/readyz") == (200, "ready\n")
        finally:
            metrics.close()
    finally:
        client.close()
        node.stop(drain_timeout=5)
