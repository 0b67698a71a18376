"""A failing handler's text stays in the node's log: partners see its class and a reference id
(``error_reply: type``, the default), the text (``message``) or nothing (``none``)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, node_section
from tests.servers.handle import ServerHandle
from tests.support import wait_until

SECRET = "postgresql://app:hunter2@db.internal/orders"
FAST = {"poll_interval": 0.02, "workers": 1, "timeout": 20}


def _leaky(message: Message) -> bytes:
    raise ValueError(f"cannot connect to {SECRET}: /srv/app/private/{len(message.body)}")


def _request(handle: ServerHandle, tmp_path: Path, mode: str | None) -> tuple[str, str]:
    """One request to a handler that raises; (the caller's reason, the .reason file's text)."""
    base = handle.fresh_dir()
    ep: dict[str, Any] = {"repository": f"{base}/leak", **FAST}
    if mode is not None:
        ep["error_reply"] = mode
    endpoints = {"leak": ep}
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"leak": _leaky})
    node.start()
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    try:
        with pytest.raises(RemoteHandlerError) as caught:
            client.request("leak", b"12345")
    finally:
        client.close()
        assert node.stop(drain_timeout=10)
    inerror = handle.local(f"{base}/leak/inerror")
    reason_file = wait_until(lambda: [p for p in inerror.iterdir() if p.name.endswith(".reason")],
                             what="the .reason file")[0]
    return caught.value.reason, reason_file.read_text("utf-8")


@pytest.mark.parametrize("kind", ["local", "pyftpdlib"])
def test_default_reply_names_the_class_and_a_reference_found_in_the_log(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    with caplog.at_level(logging.ERROR, logger="ftpbc.provider"):
        reply, reason = _request(handle, tmp_path, None)
    match = re.fullmatch(r"ValueError \(ref ([0-9a-f]{8})\)", reply)
    assert match, reply
    assert reason == reply + "\n"
    assert "hunter2" not in reply + reason and "/srv/app" not in reply + reason
    logged = [r for r in caplog.records if f"ref {match.group(1)}" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert SECRET in logged[0].getMessage() and logged[0].exc_info is not None
    assert logged[0].levelno == logging.ERROR


def test_message_keeps_the_text_and_none_sends_nothing(local_server: ServerHandle, tmp_path: Path) -> None:
    reply, reason = _request(local_server, tmp_path / "m", "message")
    assert reply == f"ValueError: cannot connect to {SECRET}: /srv/app/private/5"
    assert reason == reply + "\n"
    reply, reason = _request(local_server, tmp_path / "n", "none")
    assert reply == "" and reason == "\n"


def test_transfer_error_dir_reason_has_no_text(local_server: ServerHandle, tmp_path: Path) -> None:
    base = local_server.fresh_dir()
    out = local_server.local(base)
    (out / "bad.csv").write_bytes(b"1,2,x")
    config = Config.model_validate({
        "node": node_section(tmp_path, "n1"),
        "servers": {"srv": local_server.config(name="srv")},
        "transfers": {"csv": {"server": "srv", "receive_from": f"{base}/%*.csv", "poll_interval": 0.02,
                              "stable_for": 0}},
    })
    node = Node(config, {"csv": _leaky})
    node.start()
    try:
        found = wait_until(lambda: [p for p in (out / ".ftpbc-error").glob("*.reason")]
                           if (out / ".ftpbc-error").exists() else [], what="the .reason in error_dir")
    finally:
        assert node.stop(drain_timeout=10)
    assert re.fullmatch(r"ValueError \(ref [0-9a-f]{8}\)\n", found[0].read_text("utf-8"))
