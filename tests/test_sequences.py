"""Persisted sequences: file format, operator edits, locking across threads and processes, crashes."""

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

from ftpbc.errors import SequenceError
from ftpbc.sequences import SequenceStore, endpoint_uuid
from tests.support import reaped, spawn_drawer, wait_until


@pytest.fixture
def store(tmp_path: Path) -> SequenceStore:
    return SequenceStore(tmp_path / "local", tmp_path / "shared")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    with reaped() as procs:
        yield procs


# ----------------------------------------------------------------------------- file format


def test_fresh_sequence_yields_zero_and_the_file_holds_the_next_value(store: SequenceStore) -> None:
    assert store.get("global", None, "orders") == 0
    assert [store.next("global", None, "orders") for _ in range(3)] == [0, 1, 2]
    path = store.shared_dir / "sequences" / "orders"
    assert path.read_text() == "3\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["orders", "orders~lock"]  # no tmp left


def test_operator_sets_a_start_value_by_editing_the_file(store: SequenceStore) -> None:
    store.next("global", None, "po")
    (store.shared_dir / "sequences" / "po").write_text("1056")  # an editor may omit the newline
    assert store.next("global", None, "po") == 1056
    (store.shared_dir / "sequences" / "po").write_text("  2000\n\n")
    assert store.next("global", None, "po") == 2000


@pytest.mark.parametrize("content", [b"", b"\n", b"abc", b"12a", b"-5", b"1.5", b"1 2", b"9" * 80,
                                     b"\xff\xfe1"])
def test_a_file_without_a_number_is_an_error_naming_it_never_a_reset(store: SequenceStore,
                                                                      content: bytes) -> None:
    path = store.path("shared", "quote", "4")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(SequenceError, match=str(path)):
        store.next("shared", "quote", "4")
    assert path.read_bytes() == content  # left for the operator to fix
    with pytest.raises(SequenceError, match="expected a decimal number"):
        store.list()


def test_set_get_and_list(store: SequenceStore) -> None:
    store.set("global", None, "myseq", 41)
    store.set("local", "quote", "1", 7)
    store.set("shared", "quote", "0", 3)
    assert store.next("global", None, "myseq") == 41
    assert store.get("global", None, "myseq") == 42
    listed = {(i.kind, i.endpoint, i.token, i.value) for i in store.list()}
    assert listed == {("local", "quote", "%1", 7), ("shared", "quote", "%{0}", 3),
                      ("global", None, "%{myseq}", 42)}
    with pytest.raises(SequenceError, match="0 or more"):
        store.set("global", None, "myseq", -1)


def test_endpoint_directory_is_named_by_a_stable_uuid5(store: SequenceStore) -> None:
    path = store.path("local", "quote", "0")
    assert path.parent.name == str(endpoint_uuid("quote")) == "a22c82df-ac3f-5405-8d6b-8a35af1181fe"
    store.next("local", "quote", "0")
    assert (path.parent / "endpoint").read_text() == "quote\n"


@pytest.mark.parametrize(("kind", "endpoint", "key", "message"), [
    ("global", None, "a/b", "sequence name"),
    ("global", None, "..", "sequence name"),
    ("local", "quote", "12", "expected a digit"),
    ("shared", None, "1", "needs an endpoint"),
])
def test_invalid_addresses_are_refused(store: SequenceStore, kind: str, endpoint: str | None, key: str,
                                       message: str) -> None:
    with pytest.raises(SequenceError, match=message):
        store.next(kind, endpoint, key)  # type: ignore[arg-type]


def test_a_held_lock_times_out_with_an_error_naming_the_file(tmp_path: Path) -> None:
    store = SequenceStore(tmp_path / "l", tmp_path / "s", lock_timeout=0.2)
    store.next("global", None, "busy")
    holder = FileLock(str(store.path("global", None, "busy")) + "~lock")
    holder.acquire()  # another open file description: conflicts like another process would
    try:
        with pytest.raises(SequenceError, match=r"busy~lock within 0.2 s"):
            store.next("global", None, "busy")
    finally:
        holder.release()
    assert store.next("global", None, "busy") == 1


def test_threads_of_one_process_never_share_a_value(store: SequenceStore) -> None:
    out: list[int] = []

    def work() -> None:
        out.extend(store.next("shared", "quote", "2") for _ in range(100))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(out) == list(range(800))


# ----------------------------------------------------------------------------- processes


@pytest.mark.timeout(120)
def test_four_processes_of_two_threads_draw_4000_consecutive_values(
        store: SequenceStore, children: list[subprocess.Popen[bytes]]) -> None:
    children.extend(spawn_drawer(store, "shared-seq", "burst", 2, 500) for _ in range(4))
    values: list[int] = []
    for proc in children:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err.decode()
        values.extend(json.loads(out))
    assert len(values) == 4000
    assert sorted(values) == list(range(4000))  # distinct, consecutive, no gap
    assert store.get("global", None, "shared-seq") == 4000


@pytest.mark.timeout(120)
def test_sigkill_while_incrementing_never_tears_the_file_nor_repeats_a_value(
        store: SequenceStore, tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    logs = [tmp_path / f"handed-{i}.log" for i in range(3)]

    def handed_out() -> list[int]:
        return [int(line) for log in logs if log.exists() for line in log.read_text().split()]

    for round_ in range(6):
        procs = [spawn_drawer(store, "crashy", "loop", 1, 0, str(log)) for log in logs]
        children.extend(procs)
        # Let every child hand out values (more each round), then kill them all mid-loop at once.
        target = len(handed_out()) + 30 + 37 * round_
        wait_until(lambda target=target: len(handed_out()) >= target,  # type: ignore[misc]
                   timeout=30, what="children drawing values")
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=10)
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""
        on_disk = store.get("global", None, "crashy")  # raises if empty or torn
        values = handed_out()
        assert len(values) == len(set(values)), "a value was handed out twice"
        assert max(values) < on_disk, f"handed out {max(values)} but the file holds {on_disk}"
    assert store.next("global", None, "crashy") == on_disk


# ----------------------------------------------------------------------------- ftpbc seq


def test_seq_command_sets_and_shows_what_the_nodes_draw(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ftpbc.cli import cli

    config = tmp_path / "ftpbc.yaml"
    config.write_text(
        f"node:\n  id: n1\n  state_dir: {tmp_path}/state\n  journal_dir: {tmp_path}/journal\n"
        f"servers:\n  files:\n    url: file://{tmp_path}/repo\n"
        "endpoints:\n  quote:\n    server: files\n    repository: /quote\n    message_name: '%u.%{myseq}'\n")
    store = SequenceStore(tmp_path / "journal" / "n1", tmp_path / "state")  # node n1's own
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["seq", "-c", str(config), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert "myseq: 0 -> 1056" in run("set", "myseq", "1056")
    run("set", "quote:%3", "7")
    run("set", "quote:%{0}", "2")
    assert store.next("global", None, "myseq") == 1056  # what a node then hands out
    assert store.next("local", "quote", "3") == 7
    assert store.next("shared", "quote", "0") == 2
    table = run("show").splitlines()
    assert table[0].split() == ["KIND", "SEQUENCE", "NEXT", "FILE"]
    assert [line.split()[:3] for line in table[1:]] == [
        ["local", "quote:%3", "8"], ["shared", "quote:%{0}", "3"], ["global", "%{myseq}", "1057"]]
    assert run("show", "%{myseq}").split()[:2] == ["%{myseq}", "1057"]

    bad = runner.invoke(cli, ["seq", "-c", str(config), "set", "other:%1", "5"])
    assert bad.exit_code == 2 and "unknown endpoint 'other' (defined: quote)" in bad.output
    bad = runner.invoke(cli, ["seq", "-c", str(config), "set", "%1", "5"])
    assert bad.exit_code == 2 and "write ENDPOINT:%1" in bad.output
    (tmp_path / "state" / "sequences" / "myseq").write_text("junk\n")
    with pytest.raises(SequenceError, match="myseq: expected a decimal number"):
        runner.invoke(cli, ["seq", "-c", str(config), "show"], catch_exceptions=False)
