"""Logs: json lines that parse one by one, text lines, and names that cannot forge a line."""

from __future__ import annotations

import io
import json
import logging
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
