"""Per-message options: priority, ttl, properties, correlation id and type, from the Python
client and from ``ftpbc request|send``, carried in the file name to the handler; endpoint
defaults for priority and ttl."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ftpbc.cli.options import typed_value
from ftpbc.client import Client
from ftpbc.model.envelope import FtpbcCodec
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, ftpbc_env, run_ftpbc, wait_until

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}


def test_options_travel_from_client_to_handler(server: ServerHandle, tmp_path: Path,
                                               things: list[Any]) -> None:
    base = server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}}
    seen = Seen(reply=lambda body: b"re: " + body)
    node = Node(in_process_config(server, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    client = Client(in_process_config(server, tmp_path, "cli", endpoints))
    things.append(client)
    before = datetime.now(UTC)
    props = {"region": "eu / west; 50%", "n": 3, "big": 2**40, "ok": True, "ratio": 0.25}
    answer = client.request("ep", b"q", priority=8, ttl=120, properties=props, correlation_id="order 42/7",
                            type="quote")
    assert answer == b"re: q"
    path = client.send("ep", b"one-way", priority=1, properties={"k": "v"})
    wait_until(lambda: seen.count() == 2, what="the one-way message")
    req, oneway = seen.messages
    h = req.headers
    assert h is not None
    assert (h.kind, h.priority, h.correlation_id, h.type) == ("request", 8, "order 42/7", "quote")
    assert h.expiration is not None
    assert before + timedelta(seconds=119) <= h.expiration <= datetime.now(UTC) + timedelta(seconds=120)
    assert dict(req.properties) == props
    assert [type(v) for v in req.properties.values()] == [str, int, int, bool, float]
    h1 = oneway.headers
    assert h1 is not None and (h1.kind, h1.priority, h1.expiration) == ("oneway", 1, None)
    assert dict(oneway.properties) == {"k": "v"} and path.endswith(oneway.name)


def test_endpoint_defaults_for_priority_and_ttl(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                things: list[Any]) -> None:
    base = pyftpdlib_server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST, "priority": 7, "ttl": 30}}
    client = Client(in_process_config(pyftpdlib_server, tmp_path, "cli", endpoints))
    things.append(client)
    client.send("ep", b"a")
    client.send("ep", b"b", priority=2, ttl=3600)
    inbox = pyftpdlib_server.local(f"{base}/ep/inbox")
    codec = FtpbcCodec()
    envs = sorted((codec.decode(p.name, direction="in") for p in inbox.iterdir()),
                  key=lambda e: -e.headers.priority if e else 0)
    assert [e.headers.priority for e in envs if e] == [7, 2]
    now = datetime.now(UTC)
    a, b = (e.headers.expiration for e in envs if e)
    assert a is not None and now < a <= now + timedelta(seconds=30)
    assert b is not None and now + timedelta(seconds=3000) < b <= now + timedelta(seconds=3600)


def test_reserved_types_and_options_on_a_transfer_are_refused(pyftpdlib_server: ServerHandle,
                                                              tmp_path: Path, things: list[Any]) -> None:
    base = pyftpdlib_server.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep"}}
    client = Client(in_process_config(pyftpdlib_server, tmp_path, "cli", endpoints))
    things.append(client)
    with pytest.raises(ValueError, match="ftpbc's own"):
        client.send("ep", b"x", type="ftpbc.error")
    with pytest.raises(ValueError, match="ttl must be a positive"):
        client.send("ep", b"x", ttl=0)
    with pytest.raises(ValueError, match="priority must be an int from 0 to 9"):
        client.send("ep", b"x", priority=10)
    assert not list(pyftpdlib_server.local(f"{base}/ep/inbox").iterdir())


def test_cli_send_and_request_options(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                      things: list[Any]) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}, "idle": {"repository": f"{base}/idle", **FAST}}
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints)
    env = ftpbc_env()
    sent = run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "idle", "--data", "x", "--priority", "9",
                     "--ttl", "60", "--property", "region=eu", "--property", "n=3", "--property", "ok=TRUE",
                     "--property", "ratio=0.5", "--property", "zip=01234", "--property", "word=1e",
                     "--property", "empty=", "--type", "order", "--correlation-id", "c1", env=env)
    assert sent.returncode == 0, sent.stderr
    name = sent.stdout.strip().rsplit("/", 1)[1]
    env_ = FtpbcCodec().decode(name, direction="in")
    assert env_ is not None
    assert (env_.headers.priority, env_.headers.type, env_.headers.correlation_id) == (9, "order", "c1")
    assert env_.headers.expiration is not None
    assert dict(env_.properties) == {"region": "eu", "n": 3, "ok": True, "ratio": 0.5, "zip": 1234,
                                     "word": "1e", "empty": ""}
    seen = Seen(reply=lambda body: b"re: " + body)
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    got = run_ftpbc("request", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "q", "--priority", "0",
                    "--property", "flag=false", env=env)
    assert got.returncode == 0 and got.stdout == "re: q", got.stderr
    m = seen.messages[0]
    assert m.headers is not None and m.headers.priority == 0 and dict(m.properties) == {"flag": False}
    bad = run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "x", "--property", "novalue",
                    env=env)
    assert bad.returncode == 2 and "expected NAME=VALUE" in bad.stderr
    reserved = run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "x", "--type",
                         "ftpbc.expired", env=env)
    assert reserved.returncode == 2 and "ftpbc's own" in reserved.stderr
    out_of_range = run_ftpbc("send", "-c", str(cfg), "--node-id", "cli", "ep", "--data", "x", "--priority",
                             "10", env=env)
    assert out_of_range.returncode == 2 and "--priority" in out_of_range.stderr


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("FALSE", False), ("42", 42), ("-7", -7), ("+5", 5), ("01234", 1234),
    ("9223372036854775807", 2**63 - 1), ("9223372036854775808", "9223372036854775808"),
    ("0.5", 0.5), ("-1.5e3", -1500.0), (".5", 0.5), ("1e5", 100000.0), ("5.", 5.0),
    ("1e", "1e"), ("nan", "nan"), ("inf", "inf"), ("yes", "yes"), ("", ""), ("1 2", "1 2"),
])
def test_property_values_are_typed_as_dropboxmq_types_them(text: str, value: object) -> None:
    got = typed_value(text)
    assert got == value and type(got) is type(value)
