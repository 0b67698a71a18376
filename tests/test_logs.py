"""Logs: json lines that parse one by one, text lines, and names that cannot forge a line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftpbc.cli import logs
from ftpbc.client import Client
from tests.chaos import ENDPOINT, NodeProcess, load_client_config, make_cluster
from tests.servers.handle import ServerHandle
from tests.support import wait_until

EVIL = "req.evil\r2026-11-25 06:00:00 ERROR forged: \x1b[31mred\x1b[0m"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("ftpbc.test-logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream, handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logs.set_node(None)


def test_text_lines_escape_control_characters(captured: Any) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.formatter("text"))
    logger.warning("ep: handler failed on %s: %s", EVIL, "server said \x1b]0;title\x07\u2028next")
    out = stream.getvalue()
    assert out.count("\n") == 1 and "\r" not in out and "\x1b" not in out and "\u2028" not in out
    assert "req.evil\\r2026-11-25" in out and "\\x1b[31mred\\x1b[0m" in out and "\\x07\\u2028next" in out


def test_json_lines_parse_and_carry_node_endpoint_and_message_id(captured: Any) -> None:
    logger, stream, handler = captured
    handler.setFormatter(logs.formatter("json"))
    logs.set_node("node-a")
    logger.info("served %s", EVIL, extra={"endpoint": "quote", "message_id": "1234"})
    try:
        raise ValueError("bad \x1b[2J thing")
    except ValueError:
        logger.exception("with a traceback")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert set(first) == {"time", "level", "logger", "node", "message", "endpoint", "message_id"}
    assert first["level"] == "info" and first["logger"] == "ftpbc.test-logs" and first["node"] == "node-a"
    assert first["endpoint"] == "quote" and first["message_id"] == "1234"
    assert first["message"] == "served " + logs.escape(EVIL)
    assert "\r" not in first["message"] and "\x1b" not in first["message"]
    assert first["time"].endswith("+00:00")
    assert "ValueError: bad \\x1b[2J thing" in second["exc"] and "\x1b" not in second["exc"]


def test_serve_logs_json_and_escapes_a_planted_name(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """A real ``ftpbc serve`` with FTPBC_LOG_FORMAT=json: every line of its log is one JSON object,
    and a name with a carriage return and ANSI escapes in the inbox is logged escaped."""
    handle = pyftpdlib_server
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                           repository=handle.fresh_dir(), server_root=handle.root, drain_timeout=1.0)
    node = NodeProcess(cluster, "a")

    def records() -> list[dict[str, Any]]:
        raw = node.log.read_bytes()
        assert b"\r" not in raw and b"\x1b" not in raw
        text = raw.decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    try:
        node.start(FTPBC_LOG_FORMAT="json", FTPBC_LOG_LEVEL="info")
        wait_until(lambda: any(r["logger"] == "ftpbc.node" and r["message"].startswith("serving ")
                               for r in records()), timeout=30, what="the node serving")
        inbox = cluster.local("inbox")
        (inbox / EVIL).write_bytes(b"planted")
        (inbox / "req.\x1b[31mred").write_bytes(b"planted")
        with Client(load_client_config(cluster, "c0")) as client:
            assert client.request(ENDPOINT, b"hello") == b"re:hello"
        wait_until(lambda: any("\\x1b[31mred" in r["message"] for r in records()), timeout=30,
                   what="the planted names logged")
        found = [r for r in records() if "evil" in r["message"] or "\\x1b[31mred" in r["message"]]
        assert found and all(r["node"] == "a" for r in found)
        assert all(set(r) >= {"time", "level", "logger", "node", "message"} for r in records())
    finally:
        node.stop(timeout=30)
        for name in (EVIL, "req.\x1b[31mred"):
            (cluster.local("inbox") / name).unlink(missing_ok=True)


def _message_config(handle: ServerHandle, tmp_path: Path, node_id: str, repository: str) -> Any:
    from tests.cluster import in_process_config

    return in_process_config(handle, tmp_path, node_id,
                             {"ep": {"repository": repository, "poll_interval": 0.02, "timeout": 20}})


def _echo_or_fail(message: Any) -> bytes:
    if message.body.startswith(b"fail"):
        raise ValueError("asked to fail")
    return b"re:" + bytes(message.body)


def test_one_info_line_per_message_with_its_outcome_and_debug_lines_for_its_steps(
        pyftpdlib_server: ServerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from ftpbc.errors import RemoteHandlerError
    from ftpbc.node.serve import Node

    repo = pyftpdlib_server.fresh_dir() + "/ep"
    caplog.set_level(logging.DEBUG, logger="ftpbc")
    node = Node(_message_config(pyftpdlib_server, tmp_path, "srv-node", repo), handlers={"ep": _echo_or_fail})
    node.start()
    try:
        with Client(_message_config(pyftpdlib_server, tmp_path, "cli", repo)) as client:
            uids = {client.submit("ep", b"one"): "served", client.submit("ep", b"two"): "served",
                    client.submit("ep", b"fail"): "failed"}
            for uid, outcome in uids.items():
                if outcome == "failed":
                    with pytest.raises(RemoteHandlerError):
                        client.collect("ep", uid)
                else:
                    client.collect("ep", uid)

        def outcomes() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "ftpbc.provider" and r.levelno == logging.INFO
                    and getattr(r, "event", None) is not None]

        # a failed request's reply goes out before its line is logged
        wait_until(lambda: len(outcomes()) == 3, what="three outcome lines")
    finally:
        node.stop(drain_timeout=2)
    lines = outcomes()
    assert {r.message_id for r in lines} == set(uids)  # one line per message
    for r in lines:
        uid = r.message_id
        assert r.endpoint == "ep" and r.event == uids[uid]
        assert re.fullmatch(rf"ep: req\.{uid} {uids[uid]} in \d+\.\d{{3}} s", r.getMessage()), r.getMessage()
        steps = " | ".join(d.getMessage() for d in caplog.records
                           if d.levelno == logging.DEBUG and getattr(d, "message_id", None) == uid)
        for step in ("claimed", "read", "committed", "reply to"):
            assert step in steps, (step, steps)
    parsed = json.loads(logs.formatter("json").format(lines[0]))
    assert parsed["endpoint"] == "ep" and parsed["message_id"] in uids
    assert parsed["event"] in ("served", "failed")


def test_lines_are_not_built_when_their_level_is_off(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """At WARNING the per-message lines cost a level check: no record is even made."""
    from ftpbc.node.serve import Node

    made: list[str] = []
    real = logging.Logger.makeRecord

    def spy(self: logging.Logger, *args: Any, **kwargs: Any) -> logging.LogRecord:
        if self.name in ("ftpbc.provider", "ftpbc.lifecycle") and args[1] < logging.WARNING:
            made.append(str(args[3]))  # the unformatted message
        return real(self, *args, **kwargs)

    monkeypatch.setattr(logging.Logger, "makeRecord", spy)
    caplog.set_level(logging.WARNING, logger="ftpbc")
    repo = pyftpdlib_server.fresh_dir() + "/ep"
    node = Node(_message_config(pyftpdlib_server, tmp_path, "quiet", repo), handlers={"ep": _echo_or_fail})
    node.start()
    try:
        with Client(_message_config(pyftpdlib_server, tmp_path, "cli", repo)) as client:
            assert client.request("ep", b"x") == b"re:x"
    finally:
        node.stop(drain_timeout=2)
    assert made == []


def test_a_server_outage_is_logged_once_and_its_recovery_once(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A pyftpdlib server of this test's own, stopped under a serving node and started again on
    the same port: one ``cannot connect`` line, however many polls failed, then one
    ``reconnected`` line, and the node serves again."""
    import secrets

    from ftpbc.embedded import EmbeddedFTPServer
    from ftpbc.node.serve import Node
    from tests.servers.pyftpd import handle_for

    password = secrets.token_urlsafe(12)
    root = tmp_path / "root"
    root.mkdir()
    caplog.set_level(logging.DEBUG, logger="ftpbc")
    with EmbeddedFTPServer(root, password=password, auth_failed_delay=0) as srv:
        handle = handle_for(srv, "pyftpdlib", password)
        repo = handle.fresh_dir() + "/ep"
        cfg = _message_config(handle, tmp_path, "outage", repo)
        node = Node(cfg, handlers={"ep": _echo_or_fail})
        node.start()
        try:
            provider = node.providers["ep"]
            polls = provider.stats.polls
            wait_until(lambda: provider.stats.polls > polls + 2, what="the node polling")

            def pool_lines(text: str) -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.name == "ftpbc.pool" and r.levelno == logging.WARNING
                        and text in r.getMessage()]

            srv.stop()
            wait_until(lambda: pool_lines("cannot connect"), timeout=30, what="the outage logged")
            # the poller keeps failing meanwhile: its later connects are DEBUG lines only
            wait_until(lambda: any(r.name == "ftpbc.pool" and "cannot connect again" in r.getMessage()
                                   for r in caplog.records), timeout=30, what="a second failed connect")
            srv.start()
            wait_until(lambda: pool_lines("reconnected after"), timeout=30, what="the recovery logged")
            with Client(_message_config(handle, tmp_path, "cli", repo)) as client:
                assert client.request("ep", b"back") == b"re:back"
        finally:
            node.stop(drain_timeout=2)
    assert len(pool_lines("cannot connect")) == 1
    assert len(pool_lines("reconnected after")) == 1
    [down] = pool_lines("cannot connect")
    assert str(srv.port) in down.getMessage() and password not in down.getMessage()
