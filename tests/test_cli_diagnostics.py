"""Diagnostics of the client commands: the log options every command shares (``--log-level``,
``-v``, ``--log-format``; that every command has them: tests/test_cli_corners.py), debug lines
for what ``ftpbc request`` does, the final error as a JSON record, and the quieter or clearer
messages a new user meets (an empty box, an id already collected, plain FTP against a
TLS-only server, journal directories of failed starts)."""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.config.loader import load_config
from ftpbc.errors import UnknownRequest
from ftpbc.exchange.backlog import BoxLister
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, run_ftpbc
from tests.test_bad_input import main_in_process
from tests.test_cli_corners import json_records


def echo(message: Message) -> bytes:
    return b"re:" + message.body


@pytest.fixture
def ftp_config(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Path:
    """A configuration on the pyftpdlib server: endpoint ``quote`` in a directory of its own."""
    repo = f"{pyftpdlib_server.fresh_dir()}/quote"
    return write_config(tmp_path / "ftpbc.yaml", pyftpdlib_server, tmp_path,
                        {"quote": {"repository": repo, "poll_interval": 0.05, "timeout": 20}})


@pytest.fixture
def serving(ftp_config: Path) -> Iterator[Path]:
    """A node serving ``quote`` with :func:`echo`, in this process."""
    with Node(load_config(ftp_config, node_id="provider"), handlers={"quote": echo}):
        yield ftp_config


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without FTPBC_LOG_LEVEL and FTPBC_LOG_FORMAT, plus ``extra``."""
    env = {k: v for k, v in ftpbc_env().items() if k not in ("FTPBC_LOG_LEVEL", "FTPBC_LOG_FORMAT")}
    return {**env, **(extra or {})}


# --------------------------------------------------------------------------- the log options


@pytest.mark.parametrize("flag", [["--log-level", "debug"], ["-v"]], ids=["log-level", "v"])
def test_request_at_debug_shows_its_steps(serving: Path, flag: list[str]) -> None:
    result = run_ftpbc("request", "-c", str(serving), "--node-id", "cli", "quote", "--data", "x", *flag,
                       env=clean_env({"FTPBC_LOG_LEVEL": "warning"}))  # the command line wins
    assert result.returncode == 0, result.stderr
    assert result.stdout == "re:x"
    debug = [line for line in result.stderr.splitlines() if " DEBUG ftpbc.client: " in line]
    steps = [next((line for line in debug if step in line), None)
             for step in ("quote: sent request ", "quote: claimed response ", "quote: collected response ")]
    assert all(steps), result.stderr
    assert steps == sorted(steps, key=debug.index)  # sent, claimed, collected, in that order


def test_request_logs_nothing_by_default(serving: Path) -> None:
    result = run_ftpbc("request", "-c", str(serving), "--node-id", "cli", "quote", "--data", "x",
                       env=clean_env())
    assert result.returncode == 0 and result.stdout == "re:x"
    assert result.stderr == ""


@pytest.mark.parametrize("before", [True, False], ids=["before-the-command", "after-it"])
def test_the_final_error_is_a_json_record(ftp_config: Path, before: bool) -> None:
    """Nobody serves: the request times out, and with --log-format json every stderr line, the
    timeout that ends the command included, is one JSON object."""
    args = ["request", "-c", str(ftp_config), "--node-id", "cli", "quote", "--data", "x", "--timeout", "0.3"]
    options = ["--log-format", "json", "--log-level", "info"]
    result = run_ftpbc(*(options + args if before else args + options), env=clean_env())
    assert result.returncode == 3, result.stderr
    lines = json_records(result.stderr)
    assert any("withdrawn" in r["message"] for r in lines[:-1])
    last = lines[-1]
    assert last["level"] == "error" and last["error"] == "RequestTimeout" and last["logger"] == "ftpbc.cli"
    assert last["message"].startswith("endpoint 'quote': no response to ") and "0.3 s" in last["message"]


def test_a_usage_error_is_a_json_record_too(ftp_config: Path) -> None:
    """The log options are taken first: an invalid option before --log-format is reported in JSON."""
    result = main_in_process("request", "-c", str(ftp_config), "quote", "--data", "x", "--timeout", "0",
                             "--log-format", "json")
    assert result.returncode == 2
    [line] = json_records(result.stderr)
    assert line["error"] == "BadParameter" and "--timeout" in line["message"]


def test_a_configuration_error_is_a_json_record_with_the_environment(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = main_in_process("send", "-c", str(missing), "quote", "--data", "x",
                             env={"FTPBC_LOG_FORMAT": "json"})
    assert result.returncode == 2
    [line] = json_records(result.stderr)
    assert line == {**line, "level": "error", "error": "ConfigError",
                    "message": f"{missing}: configuration file not found"}


def test_text_errors_are_unchanged(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = main_in_process("send", "-c", str(missing), "quote", "--data", "x",
                             env={"FTPBC_LOG_FORMAT": None})
    assert result.stderr == f"ftpbc: error: {missing}: configuration file not found\n"


# --------------------------------------------------------------------------- an empty box is quiet


def test_an_empty_box_on_a_server_without_globs_is_listed_quietly(
        pyftpdlib_server: ServerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """pyftpdlib refuses the glob of the first, sizing listing: the box is listed whole, with
    nothing above debug to say about it (no "large box" where there is none)."""
    repo = f"{pyftpdlib_server.fresh_dir()}/quote"
    caplog.set_level(logging.DEBUG, logger="ftpbc.backlog")
    with Client(in_process_config(pyftpdlib_server, tmp_path, "cli", {"quote": {"repository": repo}})) as c:
        lister = BoxLister(c.runtime.lifecycle("quote"), poll_interval=0.05)
        assert lister._sliced()  # the layout cuts by globs, and the server has not refused one yet
        assert lister.refill() == [] and lister.refill() == []
        assert not lister.is_large and not lister._sliced()  # refused: listed whole from now on
    said = [r for r in caplog.records if r.name == "ftpbc.backlog"]
    assert [r.levelno for r in said] == [logging.DEBUG], [r.getMessage() for r in said]
    assert "is listed whole" in said[0].getMessage()


# --------------------------------------------------------------------------- collected elsewhere


def test_collecting_what_another_client_collected_says_where_it_was_archived(serving: Path) -> None:
    with Client(load_config(serving, node_id="c1")) as one, Client(load_config(serving, node_id="c2")) as two:
        uid = one.submit("quote", b"x")
        assert one.collect("quote", uid, timeout=30) == b"re:x"
        with pytest.raises(UnknownRequest) as caught:
            two.collect("quote", uid, timeout=600)  # said at once, not after 600 s
        repo = one.config.endpoint("quote").repository
    message = str(caught.value)
    assert re.fullmatch(rf"endpoint 'quote': request {uid}: already collected \(archived as "
                        rf"{re.escape(repo)}/outarchive/resp\.{uid}~c1~\S+ by c1\)", message), message
    # an id nobody sent is still told apart
    with Client(load_config(serving, node_id="c2")) as two, \
            pytest.raises(UnknownRequest, match="neither the request nor a response"):
        two.collect("quote", str(uuidlib.uuid4()), timeout=600)


# --------------------------------------------------------------------------- plain FTP, TLS required


@pytest.fixture
def plain_to_tls(pyftpdlib_ftps_server: ServerHandle, tmp_path: Path) -> Path:
    """A configuration naming the TLS-only server with a plain ftp:// URL."""
    handle = pyftpdlib_ftps_server
    plain = dataclasses.replace(handle, url=handle.url.replace("ftps://", "ftp://"), options={})
    repo = f"{handle.fresh_dir()}/quote"
    return write_config(tmp_path / "ftpbc.yaml", plain, tmp_path, {"quote": {"repository": repo}})


def test_check_of_plain_ftp_against_a_tls_only_server_names_the_cause_once(plain_to_tls: Path) -> None:
    result = run_ftpbc("check", "-c", str(plain_to_tls), env=clean_env())
    assert result.returncode == 1, result.stderr
    [failed] = [line for line in result.stderr.splitlines() if line.strip()]
    assert failed.startswith("ftpbc: check failed: server srv (ftp://"), failed
    assert ("TLS failed: the server requires TLS (an ftps:// URL): 550 SSL/TLS required on the control "
            "channel") in failed, failed
    # refused at the login: no directory of the exchange area was tried
    assert "/quote" not in result.stderr and "inbox" not in result.stderr
    assert "not checked (server srv failed)" in result.stdout


def test_request_of_plain_ftp_against_a_tls_only_server_fails_at_the_first_refusal(
        plain_to_tls: Path) -> None:
    result = run_ftpbc("request", "-c", str(plain_to_tls), "--node-id", "cli", "quote", "--data", "x",
                       "--log-format", "json", "--log-level", "debug", env=clean_env())
    assert result.returncode == 2, result.stderr
    *logged, last = json_records(result.stderr)
    assert last["error"] == "TLSFailed" and "550 SSL/TLS required" in last["message"], last
    assert "requires TLS (an ftps:// URL)" in last["message"]
    # nothing was tried after the login's refusal: not a directory made, not a file sent
    assert [r for r in logged if "SSL/TLS" in r["message"]] == [], logged
