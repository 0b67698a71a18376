"""Diagnostics of the client commands: the log options every command shares (``--log-level``,
``-v``, ``--log-format``; that every command has them: tests/test_cli_corners.py), debug lines
for what ``ftpbc request`` does, the final error as a JSON record, and the quieter or clearer
messages a new user meets (an empty box, an id already collected, plain FTP against a
TLS-only server, journal directories of failed starts)."""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.config.loader import load_config
from ftpbc.errors import UnknownRequest
from ftpbc.exchange.backlog import BoxLister
from ftpbc.journal import Journal, discard_unused_made, forget_made
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import REPO_ROOT, in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import free_port, ftpbc_env, popen_ftpbc, run_ftpbc, wait_until
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


#: the servers that require TLS, and how each refuses a plain login (vsftpd, proftpd and
#: pure-ftpd: the daemons, configured for TLS only in tests/servers/)
TLS_ONLY = {"pyftpdlib_ftps": "550 SSL/TLS required on the control channel",
            "vsftpd_tls": "530 Non-anonymous sessions must use encryption",
            "proftpd_ftps": "550 SSL/TLS required on the control channel",
            "pureftpd_tls": "421-Sorry, cleartext sessions",  # the first line of a multi-line reply
            }


@dataclasses.dataclass
class PlainToTLS:
    config: Path
    #: the start of the server's refusal
    refusal: str


@pytest.fixture(params=sorted(TLS_ONLY))
def plain_to_tls(request: pytest.FixtureRequest, tmp_path: Path) -> PlainToTLS:
    """A configuration naming a TLS-only server with a plain ftp:// URL."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    plain = dataclasses.replace(handle, url=handle.url.replace("ftps://", "ftp://"), options={})
    repo = f"{handle.fresh_dir()}/quote"
    config = write_config(tmp_path / "ftpbc.yaml", plain, tmp_path, {"quote": {"repository": repo}})
    return PlainToTLS(config, TLS_ONLY[request.param])


def test_check_of_plain_ftp_against_a_tls_only_server_names_the_cause_once(plain_to_tls: PlainToTLS) -> None:
    result = run_ftpbc("check", "-c", str(plain_to_tls.config), env=clean_env())
    assert result.returncode == 1, result.stderr
    [failed] = [line for line in result.stderr.splitlines() if line.strip()]
    assert failed.startswith("ftpbc: check failed: server srv (ftp://"), failed
    assert f"TLS failed: the server requires TLS (an ftps:// URL): {plain_to_tls.refusal}" in failed, failed
    # refused at the login: no directory of the exchange area was tried
    assert "/quote" not in result.stderr and "inbox" not in result.stderr
    assert "not checked (server srv failed)" in result.stdout


def test_request_of_plain_ftp_against_a_tls_only_server_fails_at_the_first_refusal(
        plain_to_tls: PlainToTLS) -> None:
    result = run_ftpbc("request", "-c", str(plain_to_tls.config), "--node-id", "cli", "quote", "--data", "x",
                       "--log-format", "json", "--log-level", "debug", env=clean_env())
    assert result.returncode == 2, result.stderr
    *logged, last = json_records(result.stderr)
    assert last["error"] == "TLSFailed" and plain_to_tls.refusal in last["message"], last
    assert "requires TLS (an ftps:// URL)" in last["message"]
    # nothing was tried after the login's refusal: not a directory made, not a file sent
    code = plain_to_tls.refusal[:3]
    assert [r for r in logged if code in r["message"]] == [], logged


# --------------------------------------------------------------------------- journal directories


def node_dirs(journals: Path) -> dict[str, list[str]]:
    """Each node directory of ``journals`` with the names in it (none: ``journals`` is not there)."""
    if not journals.is_dir():
        return {}
    return {d.name: sorted(p.name for p in d.iterdir()) for d in sorted(journals.iterdir())}


@pytest.fixture
def wrong_password(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Path:
    """A configuration for the pyftpdlib server whose password is wrong."""
    handle = dataclasses.replace(pyftpdlib_server, password="not-the-password")
    repo = f"{pyftpdlib_server.fresh_dir()}/quote"
    return write_config(tmp_path / "ftpbc.yaml", handle, tmp_path,
                        {"quote": {"repository": repo, "handler": "examples.handlers:echo"}})


def test_a_command_that_cannot_log_in_leaves_no_journal_directory(wrong_password: Path,
                                                                  tmp_path: Path) -> None:
    """journal_dir and the client's node directory did not exist: neither does afterwards, and
    ``ftpbc journal`` knows no node id."""
    journals = tmp_path / "journals"
    sent = main_in_process("send", "-c", str(wrong_password), "--node-id", "failed", "quote", "--data", "x",
                           env={"FTPBC_LOG_FORMAT": None})
    assert sent.returncode == 2 and "login refused" in sent.stderr, sent.stderr
    assert not journals.exists(), node_dirs(journals)
    listed = main_in_process("journal", "-c", str(wrong_password), "--node-id", "failed.client0")
    assert "known node ids: none" in listed.stderr, listed.stderr


def test_a_journal_directory_that_was_there_before_is_untouched(wrong_password: Path, tmp_path: Path) -> None:
    """The client identity's directory is left by an earlier run (empty, as one that sent
    nothing leaves it), another node's holds a record: a failed command removes neither."""
    journals = tmp_path / "journals"
    with Client(load_config(wrong_password, node_id="failed.client0")):
        pass  # makes failed.client0's directory, writes nothing
    other = Journal(journals, "other")
    other.endpoint("quote").record("u1.send", "send", durable=True, stage="s", target="t")
    other.close()
    before = node_dirs(journals)
    assert set(before) == {"failed.client0", "other"}
    sent = main_in_process("send", "-c", str(wrong_password), "--node-id", "failed", "quote", "--data", "x")
    assert sent.returncode == 2 and "login refused" in sent.stderr, sent.stderr
    assert node_dirs(journals) == before


def test_what_a_failed_start_made_is_removed_only_if_it_holds_no_record(tmp_path: Path) -> None:
    """Only directories made since forget_made, holding no record and not in use, go."""
    journals = tmp_path / "journals"
    forget_made()
    empty, pending, held = Journal(journals, "empty"), Journal(journals, "pending"), Journal(journals, "held")
    empty.endpoint("quote")  # a registry and an empty journal file, no record
    empty.endpoint("other").record("u1.send", "send", durable=True, stage="s", target="t")
    empty.endpoint("other").end("u1.send")  # ended: compacted away, nothing for recovery
    pending.endpoint("quote").record("u2.send", "send", durable=True, stage="s", target="t")
    empty.close()
    pending.close()
    assert discard_unused_made() == [journals / "empty"]
    assert sorted(node_dirs(journals)) == ["held", "pending"]
    held.close()
    assert discard_unused_made() == []  # asked once: held was in use when it was asked
    assert sorted(node_dirs(journals)) == ["held", "pending"]
    again = Journal(journals, "empty")  # made afresh after its removal, and locked as before
    try:
        assert (journals / "empty" / ".lock").is_file()
        result = subprocess.run(
            [sys.executable, "-c", "import sys; from ftpbc.journal import Journal; "
                                   "Journal(sys.argv[1], 'empty')", str(journals)],
            capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode != 0 and "in use by another process" in result.stderr, result.stderr
    finally:
        again.close()
        forget_made()


def test_serve_stopped_before_it_ever_served_leaves_no_journal_directory(tmp_path: Path) -> None:
    """Nothing listens at the server's address: the start-up is tried again and again until
    SIGTERM, and the node's journal directory goes with it."""
    handle = ServerHandle(kind="pyftpdlib", root=tmp_path, url=f"ftp://ftpbc@127.0.0.1:{free_port()}/",
                          password="secret")
    config = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path,
                          {"quote": {"repository": "/quote", "handler": "examples.handlers:echo"}})
    log = tmp_path / "serve.log"
    proc = popen_ftpbc("serve", "-c", str(config), "--node-id", "down", log=log,
                       env=ftpbc_env(cwd_imports=str(REPO_ROOT)))
    try:
        wait_until(lambda: "ConnectFailed" in log.read_text() or proc.poll() is not None, timeout=60,
                   what="the start-up to fail")
        assert proc.poll() is None, log.read_text()
        assert "down" in node_dirs(tmp_path / "journals")  # made, while it tries
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "journals").exists(), node_dirs(tmp_path / "journals")
