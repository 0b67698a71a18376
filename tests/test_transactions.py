"""Transacted sends (docs/queues.md, Transactions): all messages of a transaction visible after
its commit, none after an exception, and all or none after a process killed at any step and
``ftpbc recover``.

The commit and rollback run on every transport (pyftpdlib, vsftpd, OpenSSH, local); the crash
points sit above the transport, so they run on one FTP server and the local directory.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.journal import Journal
from ftpbc.model.envelope import FtpbcCodec
from tests.chaos import REPO
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, run_ftpbc

TX_SERVERS = ["pyftpdlib", "vsftpd", "sshd", "local"]
CRASH_SERVERS = ["pyftpdlib", "local"]


def endpoints(base: str) -> dict[str, dict[str, object]]:
    return {"a": {"repository": f"{base}/a", "poll_interval": 0.05},
            "b": {"repository": f"{base}/b", "poll_interval": 0.05}}


def files(handle: ServerHandle, base: str, endpoint: str, directory: str) -> list[str]:
    d = handle.local(f"{base}/{endpoint}/{directory}")
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def inboxes(handle: ServerHandle, base: str) -> dict[str, list[str]]:
    return {ep: files(handle, base, ep, "inbox") for ep in ("a", "b")}


def staged(handle: ServerHandle, base: str) -> list[str]:
    return files(handle, base, "a", "instage") + files(handle, base, "b", "instage")


@pytest.fixture(params=TX_SERVERS)
def handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


@pytest.fixture
def setup(handle: ServerHandle, tmp_path: Path) -> Iterator[tuple[Client, str]]:
    base = handle.fresh_dir()
    with Client(in_process_config(handle, tmp_path, "txc", endpoints(base)), connections=2) as client:
        yield client, base


def test_commit_exposes_every_message_and_none_before(handle: ServerHandle,
                                                      setup: tuple[Client, str]) -> None:
    client, base = setup
    with client.transaction() as tx:
        path_a = tx.send("a", b"one")
        path_b = tx.send("b", "two", priority=7, properties={"n": 1})
        uid = tx.submit("a", b"three")
        # Staged, journaled, not visible: a consumer listing the boxes sees nothing yet.
        assert inboxes(handle, base) == {"a": [], "b": []}
        assert len(staged(handle, base)) == 3
    boxes = inboxes(handle, base)
    assert sorted(boxes["a"]) == sorted([path_a.rsplit("/", 1)[1], f"req.{uid}"])
    assert boxes["b"] == [path_b.rsplit("/", 1)[1]]
    decoded = FtpbcCodec().decode(boxes["b"][0], direction="in")
    assert decoded is not None and decoded.headers.priority == 7 and dict(decoded.properties) == {"n": 1}
    assert handle.local(path_b).read_bytes() == b"two"
    assert staged(handle, base) == []
    assert client.runtime.journal.all_pending() == {}
    assert tx.state == "done"


def test_exception_rolls_every_message_back(handle: ServerHandle, setup: tuple[Client, str]) -> None:
    client, base = setup
    with pytest.raises(RuntimeError, match="changed my mind"), client.transaction() as tx:
        tx.send("a", b"one")
        tx.submit("b", b"two")
        assert len(staged(handle, base)) == 2
        raise RuntimeError("changed my mind")
    assert tx.state == "rolled back"
    assert inboxes(handle, base) == {"a": [], "b": []}
    assert staged(handle, base) == []
    assert client.runtime.journal.all_pending() == {}


def test_a_refused_member_rolls_back_the_ones_before(handle: ServerHandle,
                                                     setup: tuple[Client, str]) -> None:
    """A member that cannot be sent (an invalid option, refused before anything of it is
    written) is an exception in the block: the members staged before it go too."""
    client, base = setup
    with pytest.raises(ValueError, match="priority"), client.transaction() as tx:
        tx.send("a", b"one")
        tx.send("b", b"two", priority=12)
    assert inboxes(handle, base) == {"a": [], "b": []}
    assert staged(handle, base) == []
    assert client.runtime.journal.all_pending() == {}


def test_a_finished_transaction_takes_no_more(setup: tuple[Client, str]) -> None:
    client, _ = setup
    tx = client.transaction()
    tx.send("a", b"x")
    tx.commit()
    with pytest.raises(RuntimeError, match="done"):
        tx.send("a", b"y")
    with pytest.raises(RuntimeError, match="committed"):
        tx.rollback()
    empty = client.transaction()
    assert empty.commit() == []


# ---------------------------------------------------------------------- a process killed at each step

CHILD = """
import sys
from ftpbc.client import Client
with Client.from_config(sys.argv[1], node_id="txc") as client:
    with client.transaction() as tx:
        tx.send("a", b"first")
        tx.send("b", b"second")
        tx.submit("a", b"third")
print("committed", flush=True)
"""


@pytest.fixture(params=CRASH_SERVERS)
def crash_handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


def run_child(config: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = ftpbc_env({"FTPBC_CRASH_AT": crash_at} if crash_at else {})
    return subprocess.run([sys.executable, "-c", CHILD, str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def pending(journal_dir: Path) -> dict[str, list[str]]:
    journal = Journal(journal_dir, "txc")
    try:
        return {key: [f"{op.op_id} {'>'.join(op.events)}" for op in ops]
                for key, ops in journal.all_pending().items()}
    finally:
        journal.close()


def assert_all_or_none(handle: ServerHandle, base: str, expect_all: bool) -> None:
    boxes = inboxes(handle, base)
    bodies = sorted(handle.local(f"{base}/{ep}/inbox/{n}").read_bytes() for ep, names in boxes.items()
                    for n in names)
    assert bodies == ([b"first", b"second", b"third"] if expect_all else []), boxes
    assert staged(handle, base) == []


@pytest.mark.parametrize(("point", "expect_all"), [
    ("tx.after-stage", False),            # one member staged, no commit record
    ("tx.after-stage@3", False),          # every member staged, no commit record
    ("tx.after-commit-record", True),     # committed, nothing exposed yet
    ("tx.after-first-expose", True),      # committed, one member out, two still staged
])
def test_killed_transaction_ends_all_or_none(crash_handle: ServerHandle, tmp_path: Path, point: str,
                                             expect_all: bool) -> None:
    handle = crash_handle
    base = handle.fresh_dir()
    config = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints(base))
    r = run_child(config, point)
    assert r.returncode == -9, f"the client should have been SIGKILLed at {point}: {r.stdout}{r.stderr}"
    before = pending(tmp_path / "journals")
    assert any(".send" in op and "send" in op for ops in before.values() for op in ops), before
    assert ("transactions:" in before) == expect_all, before
    if point == "tx.after-first-expose":
        assert sum(len(v) for v in inboxes(handle, base).values()) == 1  # partial until recovered
    out = run_ftpbc("recover", "-c", str(config), "--node-id", "txc", env=ftpbc_env())
    assert out.returncode == 0, out.stderr
    if expect_all:
        assert "committed: rolled forward" in out.stdout, out.stdout
    else:
        assert "rolled back: staged file removed, never exposed" in out.stdout, out.stdout
    assert_all_or_none(handle, base, expect_all)
    assert pending(tmp_path / "journals") == {}


@pytest.mark.parametrize("recover_point", ["recover.before-op", "recover.after-op"])
def test_recovery_killed_while_rolling_forward_is_finished_by_the_next(
        crash_handle: ServerHandle, tmp_path: Path, recover_point: str) -> None:
    handle = crash_handle
    base = handle.fresh_dir()
    config = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints(base))
    assert run_child(config, "tx.after-first-expose").returncode == -9
    killed = run_ftpbc("recover", "-c", str(config), "--node-id", "txc",
                       env=ftpbc_env({"FTPBC_CRASH_AT": recover_point}))
    assert killed.returncode == -9, killed.stderr
    out = run_ftpbc("recover", "-c", str(config), "--node-id", "txc", env=ftpbc_env())
    assert out.returncode == 0, out.stderr
    assert_all_or_none(handle, base, True)
    assert pending(tmp_path / "journals") == {}


def test_uncrashed_child_commits(crash_handle: ServerHandle, tmp_path: Path) -> None:
    """The child above, not killed: the baseline the crash tests depart from."""
    base = crash_handle.fresh_dir()
    config = write_config(tmp_path / "ftpbc.yaml", crash_handle, tmp_path, endpoints(base))
    r = run_child(config, None)
    assert r.returncode == 0 and r.stdout.strip() == "committed", r.stderr
    assert_all_or_none(crash_handle, base, True)
    assert pending(tmp_path / "journals") == {}


def test_every_transaction_point_has_a_test() -> None:
    from ftpbc.faults import POINTS

    source = Path(__file__).read_text()
    assert [p for p in POINTS if p.startswith("tx.") and f'"{p}' not in source] == []
