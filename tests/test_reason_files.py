"""Reason files appear whole or not at all.

A filed message's ``<name>.reason`` is uploaded to a stage name (``reason.<digest>~<node>`` in
``instage``) and renamed beside the message (:func:`ftpbc.exchange.steps.write_reason`), so a
reader of the error directory never reads an empty or cut-off reason.  Checked on pyftpdlib,
vsftpd and OpenSSH's sshd, the three ways a rename reaches a disk (pyftpdlib's and vsftpd's
RNFR/RNTO, SFTP's posix-rename): a reader polling the directory while reasons are written from
another thread; a node SIGKILLed between a reason's upload and its rename, whose restart leaves
the whole reason in place and nothing staged; and a staged reason no operation accounts for,
removed by the node's orphan search.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.exchange.area import REASON_SUFFIX, is_staged_reason, staged_reason_name
from ftpbc.exchange.lifecycle import DUPLICATE_REASON
from ftpbc.exchange.steps import MAX_REASON_BYTES, reason_bytes, write_reason
from ftpbc.transport import open_transport
from tests.chaos import ENDPOINT, Cluster, NodeProcess, load_client_config, make_cluster
from tests.servers.handle import ServerHandle
from tests.support import wait_until
from tests.test_duplicate_ids import plant

SERVERS = ["pyftpdlib", "vsftpd", "sshd"]


@pytest.fixture(params=SERVERS)
def handle(request: pytest.FixtureRequest) -> ServerHandle:
    server: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return server


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def test_a_reader_polling_the_directory_never_sees_a_partial_reason(handle: ServerHandle) -> None:
    """Reasons of the largest size written one after the other from a thread while this one
    lists the directory and reads every reason it sees: each read is the whole text."""
    top = handle.fresh_dir()
    error, stage = f"{top}/inerror", f"{top}/instage"
    local = handle.local(error)
    texts = {f"req.{uuid.uuid4()}~n1~20261128T000000.000Z": f"{i}: " + "x" * MAX_REASON_BYTES
             for i in range(12)}
    transport = open_transport(handle.config())
    failures: list[BaseException] = []
    try:
        transport.mkdir(error)
        transport.mkdir(stage)

        def file_all() -> None:
            try:
                for name, text in texts.items():
                    write_reason(transport, f"{error}/{name}", text, stage=stage, node_id="n1")
            except BaseException as exc:  # reported by the test's thread
                failures.append(exc)

        writer = threading.Thread(target=file_all, name="reason-writer")
        writer.start()
        reads = 0
        try:
            while True:
                done = not writer.is_alive()  # before the listing: a last full one after the end
                for name in _files(local):
                    assert name.endswith(REASON_SUFFIX), f"{name} in the error directory"
                    data = (local / name).read_bytes()
                    assert data == reason_bytes(texts[name.removesuffix(REASON_SUFFIX)]), \
                        f"{name}: read {len(data)} bytes of a partial reason"
                    reads += 1
                if done:
                    break
        finally:
            writer.join(timeout=120)
        assert not writer.is_alive() and not failures, failures
    finally:
        transport.close()
    assert sorted(_files(local)) == sorted(n + REASON_SUFFIX for n in texts)
    assert reads >= len(texts)
    assert _files(handle.local(stage)) == [], "a staged reason was left behind"


def test_a_retry_replaces_a_cut_off_reason_and_keeps_a_whole_one(handle: ServerHandle) -> None:
    """With ``keep_whole`` (recovery) an empty reason, as an upload in place cut short leaves,
    is replaced by the whole one; a whole one is left as it is."""
    top = handle.fresh_dir()
    error, stage = f"{top}/inerror", f"{top}/instage"
    filed = f"{error}/req.{uuid.uuid4()}~n1~20261128T000000.000Z"
    transport = open_transport(handle.config())
    try:
        transport.mkdir(error)
        transport.mkdir(stage)
        reason = handle.local(filed + REASON_SUFFIX)
        reason.write_bytes(b"")
        reason.chmod(0o666)
        write_reason(transport, filed, "the handler failed", stage=stage, node_id="n1", keep_whole=True)
        assert reason.read_bytes() == b"the handler failed\n"
        before = reason.stat().st_ino
        write_reason(transport, filed, "the handler failed", stage=stage, node_id="n1", keep_whole=True)
        assert reason.stat().st_ino == before, "a whole reason was written again"
    finally:
        transport.close()
    assert _files(handle.local(stage)) == []


@pytest.fixture
def cluster(handle: ServerHandle, tmp_path: Path) -> Cluster:
    # One worker: the duplicate is filed after the first message is claimed, by the same thread.
    return make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                        repository=f"{handle.fresh_dir()}/echo", server_root=handle.root, workers=1)


@pytest.mark.slow
def test_a_crash_between_upload_and_rename_leaves_a_whole_reason(cluster: Cluster) -> None:
    """The node dies with a duplicate's reason staged and not yet in place: nothing in the
    error directory reads as a reason meanwhile.  After its restart the reason is whole beside
    the filed duplicate, and no staged file is left anywhere."""
    with Client(load_client_config(cluster, "checker")) as checker:
        uid = checker.submit(ENDPOINT, b"first")
        duplicate = f"req.{uid};p=9"
        plant(cluster.local(), duplicate, b"second")
        crashing = NodeProcess(cluster, "n1")
        crashing.start(crash_at="reason.after-stage")
        try:
            code = crashing.wait(60)
        finally:
            crashing.kill()
        assert code == -9, f"the node should have been SIGKILLed with a reason staged; it exited {code}"
        staged = [n for n in cluster.files("instage") if is_staged_reason(n)]
        assert len(staged) == 1, cluster.files("instage")
        assert [n for n in cluster.files("inerror") if n.endswith(REASON_SUFFIX)] == []
        node = NodeProcess(cluster, "n1")
        node.start()
        try:
            wait_until(node.ready, timeout=30, what="the node to serve")
            checker.collect(ENDPOINT, uid, timeout=30)
            wait_until(lambda: len(cluster.files("inerror")) == 2 and not cluster.files("instage")
                       and not cluster.files("inbox") and not cluster.files("inselect"),
                       timeout=30, what="the duplicate's reason to be in place")
        finally:
            assert node.stop() == 0
    [filed] = [n for n in cluster.files("inerror") if not n.endswith(REASON_SUFFIX)]
    reason = cluster.local("inerror", filed + REASON_SUFFIX).read_bytes().decode()
    assert reason.startswith(DUPLICATE_REASON) and reason.endswith("\n"), reason
    assert cluster.leftovers() == {} and cluster.pending() == {}


@pytest.mark.slow
def test_a_staged_reason_nobody_accounts_for_is_removed_at_start(cluster: Cluster) -> None:
    """A staged reason of this node with no pending operation (a refused entry's, whose filing
    is not journaled) is an orphan: the node's recovery removes it before it serves."""
    instage = cluster.local("instage")
    for made in (instage.parent, instage):  # writable by a server that runs as another user
        made.mkdir(exist_ok=True)
        made.chmod(0o777)
    mine = staged_reason_name("/echo/inerror/req.x~n1~20261128T000000.000Z.reason", "n1")
    (instage / mine).write_bytes(b"cut")
    (instage / mine).chmod(0o666)
    node = NodeProcess(cluster, "n1")
    node.start()
    try:
        wait_until(node.ready, timeout=30, what="the node to serve")
        assert cluster.files("instage") == []
    finally:
        assert node.stop() == 0
    assert cluster.files("inerror") == []


def test_a_reason_of_any_length_is_cut_to_the_bound_as_valid_utf8() -> None:
    """A handler's exception text can be of any length and any characters: its reason file is
    at most MAX_REASON_BYTES, valid UTF-8, and ends with a newline."""
    data = reason_bytes("é" * MAX_REASON_BYTES + "\udcff")
    assert len(data) <= MAX_REASON_BYTES and data.endswith(b"\n")
    assert data.decode("utf-8").rstrip("\n") == "é" * ((MAX_REASON_BYTES - 1) // 2)
    assert reason_bytes("bad \udcff byte") == b"bad \\udcff byte\n"
