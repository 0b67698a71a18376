"""The one exchange layer: envelopes in names, poison messages, partners that upload in place,
and names that cannot be used, on real servers."""

from __future__ import annotations

import ftplib
import hashlib
import io
import logging
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.model.envelope import DropboxmqCodec
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, wait_until

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}
#: DropboxMQ's documented example, its expiration moved from 2006 to 2100: an expired message is
#: never delivered (docs/queues.md)
DROPBOXMQ_NAME = "4.1140429201295000-9262574723.T.4102444800000.corr1283.TestQueue1.XYZType.prop1S=hello"


@pytest.fixture
def node_and_client(request: pytest.FixtureRequest) -> Iterator[list[Any]]:
    """Started nodes and clients to stop at the end, whatever happened."""
    started: list[Any] = []
    yield started
    for thing in reversed(started):
        if isinstance(thing, Node):
            thing.stop(drain_timeout=5)
        else:
            thing.close()


def _ftp_login(handle: ServerHandle) -> ftplib.FTP:
    cfg = handle.config()
    ftp = ftplib.FTP()
    ftp.connect(cfg.host, cfg.port, timeout=10)
    ftp.login(cfg.user or "anonymous", handle.password or "")
    return ftp


# --------------------------------------------------------------------------- envelopes


def test_dropboxmq_name_uploaded_with_curl_reaches_the_handler_with_its_headers(
        pyftpdlib_server: ServerHandle, tmp_path: Path, node_and_client: list[Any]) -> None:
    """A DropboxMQ-style producer (curl: upload to the stage, rename into the inbox) is understood
    by an endpoint with ``naming: dropboxmq``, and the reply correlates with the request's id."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/dq"
    endpoints = {"dq": {"repository": repo, "naming": "dropboxmq", **FAST}}
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"dq": seen.handler})
    node_and_client.append(node)
    node.start()
    body = tmp_path / "body.txt"
    body.write_bytes(b"hello from a JMS producer")
    cfg = handle.config()
    url = f"ftp://{cfg.host}:{cfg.port}{repo}/instage/{DROPBOXMQ_NAME}"
    subprocess.run(["curl", "--silent", "--show-error", "--user", f"{cfg.user}:{handle.password}",
                    "-T", str(body), url, "-Q", f"-RNFR {repo}/instage/{DROPBOXMQ_NAME}",
                    "-Q", f"-RNTO {repo}/inbox/{DROPBOXMQ_NAME}"], check=True, timeout=30)
    wait_until(lambda: seen.count() == 1, timeout=20, what="the handler to get the message")
    h = seen.messages[0].headers
    assert h is not None
    assert (h.priority, h.type, h.correlation_id, h.reply_to, h.message_class) == (
        4, "XYZType", "corr1283", "TestQueue1", "T")
    assert h.id == "1140429201295000-9262574723" and h.kind == "request"
    assert dict(seen.messages[0].properties) == {"prop1": "hello"}
    assert seen.bodies == [b"hello from a JMS producer"]
    # The reply is a DropboxMQ name too, correlated with the request's id.
    outbox = handle.local(f"{repo}/outbox")
    wait_until(lambda: any(outbox.iterdir()), timeout=20, what="the reply")
    reply_name = next(outbox.iterdir()).name
    env = DropboxmqCodec().decode(reply_name, direction="out")
    assert env is not None and env.headers.correlation_id == "1140429201295000-9262574723"
    assert (outbox / reply_name).read_bytes() == b"hello from a JMS producer"


def test_priority_and_properties_travel_from_client_to_handler(
        pyftpdlib_server: ServerHandle, tmp_path: Path, node_and_client: list[Any]) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}}
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    node_and_client.append(node)
    node.start()
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    node_and_client.append(client)
    name, uid = client.runtime.new_message("ep", "oneway", priority=9, properties={"region": "eu", "n": 3})
    lc = client.runtime.lifecycle("ep")
    lc.send(lc.layout.outbound(name, "cli", lc.clock()), b"x", op_id=f"{uid}.send",  # type: ignore[attr-defined]
            kind="oneway")
    wait_until(lambda: seen.count() == 1, timeout=20, what="the message")
    m = seen.messages[0]
    assert m.headers is not None and m.headers.priority == 9 and m.headers.id == uid
    assert dict(m.properties) == {"region": "eu", "n": 3}
    assert m.name == name and name.startswith(f"msg.{uid};")


# --------------------------------------------------------------------------- poison messages


def test_unreadable_request_goes_to_inerror_after_max_deliveries_while_others_are_served(
        vsftpd_server: ServerHandle, tmp_path: Path, node_and_client: list[Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """A foreign producer's 0600 upload (vsftpd's user cannot read it) is tried max_deliveries
    times, its count raised in its name each time, then filed in inerror with the reason; the
    node answers every other request meanwhile and never loops on the bad file."""
    handle = vsftpd_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "max_deliveries": 3, "redelivery_delay": 0.05}}
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    node_and_client.append(node)
    node.start()
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    node_and_client.append(client)
    bad = f"req.{uuid.uuid4()}"
    inbox = handle.local(f"{repo}/inbox")
    wait_until(inbox.exists, timeout=10, what="the inbox")
    fd = os.open(inbox / bad, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"secret")
    os.close(fd)
    caplog.set_level(logging.WARNING)
    answers = [client.request("ep", f"good {i}".encode()) for i in range(40)]
    assert answers == [f"good {i}".encode() for i in range(40)]
    inerror = handle.local(f"{repo}/inerror")
    wait_until(lambda: any(p.name.endswith(".reason") for p in inerror.iterdir()), timeout=20,
               what="the unreadable request in inerror")
    filed = sorted(p.name for p in inerror.iterdir())
    assert len(filed) == 2 and filed[0].startswith(f"{bad};n=2~prov~"), filed
    reason = (inerror / filed[1]).read_text()
    assert "delivery 3 of 3 failed" in reason and "PermissionDenied" in reason
    tries = [r for r in caplog.records if bad in r.getMessage() and "cannot read" in r.getMessage()]
    assert len(tries) == 3  # one read per delivery: no hot loop
    assert not list(inbox.iterdir()) and not list(handle.local(f"{repo}/inselect").iterdir())
    assert all(b"secret" not in b for b in seen.bodies)


# --------------------------------------------------------------------------- partners


class _SlowUpload(io.RawIOBase):
    """A partner's upload: ``chunks`` pieces of ``data``, each after ``pause`` seconds."""

    def __init__(self, data: bytes, chunks: int, pause: float, stop: threading.Event) -> None:
        self.data, self.size, self.pause, self.stop = data, len(data) // chunks, pause, stop
        self.pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.pos >= len(self.data):
            return b""
        if self.pos and self.stop.wait(self.pause):  # the scenario's pacing, not synchronisation
            return b""
        piece = self.data[self.pos:self.pos + self.size]
        self.pos += len(piece)
        return piece


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_partner_uploading_in_chunks_is_delivered_once_whole(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path, node_and_client: list[Any]) -> None:
    """A partner writes 1 MB into the receive directory in 10 chunks 0.5 s apart: the transfer
    waits until the file is stable (``stable_for``, default 1 s) and delivers it once, whole."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    handle.local(base).joinpath("drop").mkdir()
    handle.local(f"{base}/drop").chmod(0o777)
    config = Config.model_validate({
        "node": {"id": "prov", "state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "j")},
        "servers": {"srv": handle.config(name="srv")},
        "transfers": {"in": {"server": "srv", "receive_from": f"{base}/drop/%*.dat", "poll_interval": 0.05}},
    })
    seen = Seen()
    node = Node(config, handlers={"in": lambda m: (seen.handler(m), None)[1]})
    node_and_client.append(node)
    node.start()
    data = os.urandom(1_000_000)
    stop = threading.Event()
    ftp = _ftp_login(handle)
    try:
        ftp.storbinary(f"STOR {base}/drop/big.dat", _SlowUpload(data, 10, 0.5, stop))  # type: ignore[arg-type]
    finally:
        stop.set()
        ftp.close()
    wait_until(lambda: seen.count() >= 1, timeout=20, what="the file to be received")
    archive = handle.local(f"{base}/drop/.ftpbc-archive")
    wait_until(lambda: archive.exists() and any(archive.iterdir()), timeout=20, what="the archive")
    node.stop(drain_timeout=5)
    node_and_client.remove(node)
    assert seen.count() == 1
    assert hashlib.sha256(seen.bodies[0]).digest() == hashlib.sha256(data).digest()


# --------------------------------------------------------------------------- one bad entry


def test_odd_names_are_skipped_and_never_stop_the_good_files(
        pyftpdlib_server: ServerHandle, tmp_path: Path, node_and_client: list[Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """A backslash, a 250-character name and a header suffix that does not parse sit beside good
    files in a transfer's receive directory, an endpoint's inbox and a select directory: the good
    files are all served, each bad one is logged once and left where it is."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    drop = handle.local(base) / "drop"
    drop.mkdir(mode=0o777)
    repo = f"{base}/ep"
    config = Config.model_validate({
        "node": {"id": "prov", "state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "j"),
                 "heartbeat_interval": 0.2, "lease": 1.0},
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {"ep": {"server": "srv", "repository": repo, **FAST}},
        "transfers": {"in": {"server": "srv", "receive_from": f"{base}/drop/%*.txt", "poll_interval": 0.02,
                             "stable_for": 0}},
    })
    caplog.set_level(logging.WARNING)
    odd = ["back\\slash.txt", "F" * 246 + ".txt"]
    for name in odd:
        (drop / name).write_bytes(b"odd")
    inbox = handle.local(repo) / "inbox"
    inbox.mkdir(parents=True)
    bad_suffix = f"req.{uuid.uuid4()};p=12"
    (inbox / bad_suffix).write_bytes(b"bad header")
    inselect = handle.local(repo) / "inselect"
    inselect.mkdir()
    (inselect / "req.back\\slash~deadnode").write_bytes(b"odd claim")
    seen_ep, seen_in = Seen(), Seen()
    node = Node(config, handlers={"ep": seen_ep.handler, "in": lambda m: (seen_in.handler(m), None)[1]})
    node_and_client.append(node)
    node.start()
    for i in range(5):
        (drop / f"good{i}.txt").write_bytes(f"good {i}".encode())
    client = Client(in_process_config(handle, tmp_path, "cli", {"ep": {"repository": repo, **FAST}}))
    node_and_client.append(client)
    assert [client.request("ep", f"r{i}") for i in range(5)] == [f"r{i}".encode() for i in range(5)]
    wait_until(lambda: seen_in.count() == 5, timeout=20, what="every good file")
    # Several polls and at least one sweep went by: each odd name is still logged only once.
    done = node.sweeps
    wait_until(lambda: node.sweeps >= done + 2, timeout=20, what="two more sweeps")
    for name in [*odd, bad_suffix]:
        assert (drop / name).exists() if name in odd else (inbox / name).exists()
        lines = [r for r in caplog.records if repr(name) in r.getMessage() or name in r.getMessage()]
        assert len(lines) == 1, (name, [r.getMessage() for r in lines])
    assert sorted(seen_in.bodies) == [f"good {i}".encode() for i in range(5)]



# --------------------------------------------------------------------------- settings that work


def test_protect_moves_an_existing_target_aside_before_the_response_takes_its_name(
        pyftpdlib_server: ServerHandle, tmp_path: Path, node_and_client: list[Any]) -> None:
    """``protect: true``: a file already at the response's name (left by a partner) is moved to
    outprotect as <name>~<node>~<stamp> before the new response is exposed, not overwritten."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "protect": True}}
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    node_and_client.append(client)
    uid = client.submit("ep", b"new")
    (handle.local(repo) / "outbox" / f"resp.{uid}").write_bytes(b"stale")
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    node_and_client.append(node)
    node.start()
    protected = handle.local(repo) / "outprotect"
    wait_until(lambda: any(protected.iterdir()), timeout=20, what="the stale file moved aside")
    [aside] = list(protected.iterdir())
    assert aside.name.startswith(f"resp.{uid}~prov~") and aside.read_bytes() == b"stale"
    assert client.collect("ep", uid, timeout=20) == b"new"


def test_unreadable_response_goes_to_outerror_after_max_deliveries(
        vsftpd_server: ServerHandle, tmp_path: Path, node_and_client: list[Any]) -> None:
    """A response the client cannot read (a 0600 file vsftpd's user may not open) is tried
    max_deliveries times, then filed in outerror with its reason; the caller times out."""
    handle = vsftpd_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "max_deliveries": 3, "redelivery_delay": 0.05}}
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    node_and_client.append(client)
    uid = client.submit("ep", b"q")
    fd = os.open(handle.local(repo) / "outbox" / f"resp.{uid}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"unreadable")
    os.close(fd)
    from ftpbc.errors import RequestTimeout

    with pytest.raises(RequestTimeout):
        client.collect("ep", uid, timeout=3)
    outerror = handle.local(repo) / "outerror"
    wait_until(lambda: len(list(outerror.iterdir())) == 2, timeout=10, what="the response in outerror")
    reason = next(p for p in outerror.iterdir() if p.name.endswith(".reason")).read_text()
    assert "delivery 3 of 3 failed" in reason
    assert not list((handle.local(repo) / "outbox").iterdir())


def test_a_name_over_the_limit_is_refused_at_send_naming_the_limit(
        pyftpdlib_server: ServerHandle, tmp_path: Path, node_and_client: list[Any]) -> None:
    from ftpbc.model.envelope import NameTooLong

    base = pyftpdlib_server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}}
    client = Client(in_process_config(pyftpdlib_server, tmp_path, "cli", endpoints))
    node_and_client.append(client)
    with pytest.raises(NameTooLong, match=r"over the limit of \d+ bytes; made long by properties"):
        client.runtime.new_message("ep", "oneway", properties={"note": "x" * 300})
