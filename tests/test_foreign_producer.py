"""A foreign producer (plain ftplib, paramiko or os calls: no ftpbc) sets priority and typed
properties through the file name alone, on every kind of server, and a serving node honours them:
the priority-9 message goes before the older priority-4 one, the properties reach the handler
with their types.

``server`` (tests/conftest.py) runs it once per server kind.
"""

from __future__ import annotations

import ftplib
import io
import os
import uuid
from pathlib import Path
from typing import Any

import paramiko

from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, wait_until


def _drop(handle: ServerHandle, repo: str, name: str, body: bytes) -> None:
    """Upload ``body`` to ``<repo>/instage/<name>`` and rename it into the inbox, as any careful
    producer does, with nothing but the protocol's own client library."""
    cfg = handle.config()
    # Remote paths below the URL's base directory, as a partner configured with that URL sees them.
    remote = cfg.base.rstrip("/") + repo
    stage, target = f"{remote}/instage/{name}", f"{remote}/inbox/{name}"
    if handle.kind == "local":
        handle.local(f"{repo}/instage/{name}").write_bytes(body)
        os.rename(handle.local(f"{repo}/instage/{name}"), handle.local(f"{repo}/inbox/{name}"))
    elif handle.kind == "sshd":
        transport = paramiko.Transport((cfg.host, cfg.port))
        try:
            key = paramiko.Ed25519Key.from_private_key_file(str(handle.options["key_file"]))
            transport.connect(username=cfg.user, pkey=key)  # the test's own loopback server
            sftp = paramiko.SFTPClient.from_transport(transport)
            assert sftp is not None
            sftp.putfo(io.BytesIO(body), stage)
            sftp.posix_rename(stage, target)
        finally:
            transport.close()
    else:
        ftp: ftplib.FTP
        if handle.kind == "pyftpdlib_ftps":
            tls = ftplib.FTP_TLS(context=_client_context(handle))
            tls.connect(cfg.host, cfg.port, timeout=20)
            tls.login(cfg.user, handle.password or "")
            tls.prot_p()
            ftp = tls
        else:
            ftp = ftplib.FTP()
            ftp.connect(cfg.host, cfg.port, timeout=20)
            ftp.login(cfg.user, handle.password or "")
        try:
            ftp.storbinary(f"STOR {stage}", io.BytesIO(body))
            ftp.rename(stage, target)
        finally:
            ftp.close()


def _client_context(handle: ServerHandle) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(handle.options["ca_file"]))


def test_priority_and_properties_set_by_a_foreign_producer_through_the_name(
        server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    base = server.fresh_dir()
    repo = f"{base}/ep"
    for d in ("", "/instage", "/inbox"):
        server.local(f"{repo}{d}").mkdir(exist_ok=True)
        server.local(f"{repo}{d}").chmod(0o777)  # servers that log in as another user write here
    old, urgent = uuid.uuid4(), uuid.uuid4()
    # The older message first, at the default priority; the urgent one after it, priority 9.
    _drop(server, repo, f"msg.{old};.regionS=emea;.retryI=2;.ratioD=0.25", b"routine")
    _drop(server, repo, f"msg.{urgent};p=9;c=order%2042;.urgentB=true;.noteS=a%20b%3Bc", b"urgent")
    os.utime(server.local(f"{repo}/inbox/msg.{old};.regionS=emea;.retryI=2;.ratioD=0.25"), (1, 1))

    order = Seen()
    endpoints = {"ep": {"repository": repo, "poll_interval": 0.05, "workers": 1, "max_per_poll": 1}}
    node = Node(in_process_config(server, tmp_path, "prov", endpoints), handlers={"ep": order.handler})
    things.append(node)
    node.start()
    wait_until(lambda: order.count() == 2, timeout=30, what="both messages to be served")

    assert order.bodies == [b"urgent", b"routine"]  # priority before arrival
    first, second = order.messages
    assert first.headers is not None and second.headers is not None
    assert (first.headers.id, first.headers.priority, first.headers.correlation_id) == (
        str(urgent), 9, "order 42")
    assert dict(first.properties) == {"urgent": True, "note": "a b;c"}
    assert (second.headers.id, second.headers.priority) == (str(old), 4)
    assert dict(second.properties) == {"region": "emea", "retry": 2, "ratio": 0.25}
