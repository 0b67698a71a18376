"""Bad input through the real command line: one clear line naming what is wrong, non-zero exit.

Every case runs ``ftpbc`` as a user would (a subprocess of ``ftpbc.cli.main``) and checks the
exit status, that stderr is exactly one line (no traceback), that the line names the file, key,
value or server a person has to fix, and that no password ever appears.
"""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ftpbc.cli import LAZY_COMMANDS, cli, main
from ftpbc.config.loader import load_config
from ftpbc.node.serve import Node
from tests.servers.handle import ServerHandle
from tests.support import free_port, ftpbc_env, popen_ftpbc, run_ftpbc, wait_until

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
node:
  state_dir: {tmp}/state
  journal_dir: {tmp}/journals
servers:
  files:
    url: file://{tmp}/exchange
endpoints:
  quote:
    server: files
    repository: /quote
    poll_interval: 0.05
    timeout: 5
"""


def write(tmp_path: Path, text: str, name: str = "ftpbc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.format(tmp=tmp_path), encoding="utf-8")
    return path


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (fails the test if there are more, or none)."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    return lines[0]


def main_in_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ftpbc ARGS`` through ``ftpbc.cli.main`` in this process (exit status, stdout, stderr).

    The same code path as the installed script, without a second of interpreter start-up per
    case; the cases that need a process of their own (serve, signals) use :func:`run_ftpbc`.
    """
    with CliRunner().isolation(env=env) as (out, err, _), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["ftpbc", *args])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return subprocess.CompletedProcess(list(args), code, out.getvalue().decode(), err.getvalue().decode())


def check(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return main_in_process("check", "-c", str(path), env=env)


# --------------------------------------------------------------------------- configuration files


def test_good_config_passes(tmp_path: Path) -> None:
    """The baseline every case below breaks in one place is itself accepted."""
    result = check(write(tmp_path, GOOD))
    assert result.returncode == 0, result.stderr
    assert "all ok" in result.stdout


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run_ftpbc("check", "-c", str(missing), env=ftpbc_env())  # once through the real script
    assert result.returncode == 2
    assert one_line(result) == f"ftpbc: error: {missing}: configuration file not found"


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    text = GOOD.replace("    repository: /quote\n", "    repository: [/quote\n")
    path = write(tmp_path, text)
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    # Line 11 is where the parser found the unclosed "[" of line 10 could not go on.
    assert line.startswith(f"ftpbc: error: {path}:11: malformed YAML: expected ',' or ']'")


def test_unknown_key_names_key_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    poll_interval:", "    pol_interval:"))
    result = check(path)
    assert result.returncode == 2
    assert one_line(result) == f"ftpbc: error: {path}:11: endpoints.quote.pol_interval: unknown key"


def test_wrong_type_names_key_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("poll_interval: 0.05", "poll_interval: fast"))
    result = check(path)
    assert result.returncode == 2
    assert one_line(result) == (f"ftpbc: error: {path}:11: endpoints.quote.poll_interval: "
                                "expected a number, got 'fast'")


def test_a_large_box_below_one_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    poll_interval: 0.05", "    poll_interval: 0.05\n"
                                                                  "    large_box: 0"))
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(f"ftpbc: error: {path}:12: endpoints.quote.large_box: "), line
    assert "1" in line.split("large_box:", 1)[1], line  # says what the least value is


@pytest.mark.parametrize("node_id", ['"node-a\\n"', '"node a"', '"../x"', '""'])
def test_a_node_id_outside_its_alphabet_is_refused(tmp_path: Path, node_id: str) -> None:
    # A trailing line break once passed: it made a node's server lock token unparsable.
    path = write(tmp_path, GOOD.replace("node:\n", f"node:\n  id: {node_id}\n"))
    result = check(path)
    assert result.returncode == 2
    assert re.fullmatch(rf"ftpbc: error: {re.escape(str(path))}:2: node\.id: .*must be 1-64 characters.*",
                        one_line(result)), result.stderr


def test_unknown_server_reference(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    server: files", "    server: partner"))
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert f"{path}:" in line
    assert "endpoints.quote.server: unknown server 'partner' (defined: files)" in line


def test_missing_password_env_var(tmp_path: Path) -> None:
    var = f"FTPBC_TEST_UNSET_{secrets.token_hex(4).upper()}"
    text = GOOD.replace("url: file://{tmp}/exchange",
                        f"url: ftp://app@127.0.0.1:{free_port()}/\n    password_env: {var}")
    path = write(tmp_path, text)
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert f"{path}:" in line and "servers.files" in line
    assert f"environment variable {var!r} is not set" in line


def test_url_with_password_is_refused_without_echoing_it(tmp_path: Path) -> None:
    secret = "Hunter2-" + secrets.token_hex(6)
    path = write(tmp_path, GOOD.replace("url: file://{tmp}/exchange", f"url: ftp://app:{secret}@127.0.0.1/"))
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert f"{path}:" in line and "servers.files" in line
    assert "carries a password; use password_env or password_file" in line
    assert secret not in result.stderr + result.stdout


def test_unknown_url_scheme(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("url: file://{tmp}/exchange", "url: http://127.0.0.1/x"))
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert f"{path}:" in line and "servers.files" in line
    assert "unknown URL scheme 'http'" in line


def test_unknown_pattern_letter_names_pattern_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("    timeout: 5\n", "    timeout: 5\n    message_name: '%u-%Q'\n"))
    result = check(path)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(f"ftpbc: error: {path}:13: endpoints.quote.message_name: "
                           "pattern '%u-%Q', column 5: unknown token '%Q'")


# --------------------------------------------------------------------------- commands


def test_unknown_handler_module_stops_serve_at_start_up(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "    handler: no_such_module_xyz.handlers:quote\n")
    began = time.monotonic()
    result = run_ftpbc("serve", "-c", str(path), "--node-id", "n1", env=ftpbc_env(), timeout=30)
    assert time.monotonic() - began < 15
    assert result.returncode == 2
    line = one_line(result)
    assert "endpoints.quote.handler" in line
    assert "cannot import handler module 'no_such_module_xyz.handlers'" in line


def test_unreachable_server_fails_within_the_timeout(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    text = GOOD.replace("url: file://{tmp}/exchange",
                        f"url: ftp://app@127.0.0.1:{port}/\n    password_env: FTPBC_TEST_PW")
    path = write(tmp_path, text)
    env = ftpbc_env({"FTPBC_TEST_PW": "pw-" + secrets.token_hex(6)})
    began = time.monotonic()
    result = run_ftpbc("request", "-c", str(path), "quote", "--data", "x", "--timeout", "5",
                       env=env, timeout=30)
    assert time.monotonic() - began < 15
    assert result.returncode == 2
    line = one_line(result)
    assert f"ftp://app@127.0.0.1:{port}" in line
    assert env["FTPBC_TEST_PW"] not in result.stderr

    checked = check(path, env)
    assert checked.returncode == 1
    # One line for the server, naming what it left unchecked (not one per endpoint).
    assert one_line(checked) == (f"ftpbc: check failed: server files (ftp://app@127.0.0.1:{port}): "
                                 "unreachable: cannot connect: Connection refused; "
                                 "not checked: endpoint quote")


def ftp_config(tmp_path: Path, server: ServerHandle, handler: str | None = None) -> Path:
    text = GOOD.replace("url: file://{tmp}/exchange",
                        f"url: {server.url.rstrip('/')}{server.fresh_dir()}\n    password_env: FTPBC_TEST_PW")
    if handler:
        text += f"    handler: {handler}\n"
    return write(tmp_path, text)


def test_wrong_password_names_server_never_the_password(tmp_path: Path,
                                                         pyftpdlib_server: ServerHandle) -> None:
    path = ftp_config(tmp_path, pyftpdlib_server)
    wrong = "wrong-" + secrets.token_hex(6)
    env = ftpbc_env({"FTPBC_TEST_PW": wrong})
    result = run_ftpbc("request", "-c", str(path), "quote", "--data", "x", env=env, timeout=30)
    assert result.returncode == 2
    line = one_line(result)
    assert "ftp://ftpbc@127.0.0.1" in line
    assert "login" in line.lower() or "auth" in line.lower()
    checked = check(path, env)
    assert checked.returncode == 1
    assert "server files (ftp://ftpbc@127.0.0.1" in checked.stderr
    for out in (result, checked):
        assert wrong not in out.stdout + out.stderr
        assert str(pyftpdlib_server.password) not in out.stdout + out.stderr


@pytest.fixture
def failing_node(tmp_path: Path, pyftpdlib_server: ServerHandle) -> Iterator[tuple[Path, dict[str, str]]]:
    """A node serving ``quote`` with examples.handlers:fail, in this process."""
    path = ftp_config(tmp_path, pyftpdlib_server, handler="examples.handlers:fail")
    env = ftpbc_env({"FTPBC_TEST_PW": str(pyftpdlib_server.password)})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FTPBC_TEST_PW", str(pyftpdlib_server.password))
        mp.syspath_prepend(str(REPO))
        node = Node(load_config(path, node_id="provider"))
    node.start()
    try:
        yield path, env
    finally:
        assert node.stop(drain_timeout=5)


def test_handler_that_raises_gives_an_error_reply_and_exit_4(
        failing_node: tuple[Path, dict[str, str]]) -> None:
    path, env = failing_node
    result = run_ftpbc("request", "-c", str(path), "quote", "--data", "EURUSD", env=env, timeout=30)
    assert result.returncode == 4
    line = one_line(result)
    assert line.startswith("ftpbc: error reply: endpoint 'quote'")
    assert re.search(r": RuntimeError \(ref [0-9a-f]{8}\)$", line), line  # error_reply: type


def test_serve_stops_cleanly_on_sigterm_after_bad_requests(tmp_path: Path,
                                                          pyftpdlib_server: ServerHandle) -> None:
    """A served endpoint whose handler raises keeps serving; SIGTERM still ends the node with 0."""
    path = ftp_config(tmp_path, pyftpdlib_server, handler="examples.handlers:fail")
    env = ftpbc_env({"FTPBC_TEST_PW": str(pyftpdlib_server.password)}, cwd_imports=str(REPO))
    log = tmp_path / "serve.log"
    proc = popen_ftpbc("serve", "-c", str(path), "--node-id", "n1", log=log, env=env)
    try:
        wait_until(lambda: "serving quote" in log.read_text(), timeout=20, what="the node to serve")
        for _ in range(2):
            result = run_ftpbc("request", "-c", str(path), "quote", "--data", "x", env=env, timeout=30)
            assert result.returncode == 4, result.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert str(pyftpdlib_server.password) not in log.read_text()


# --------------------------------------------------------------------------- help


def test_top_level_help_through_the_real_command() -> None:
    result = run_ftpbc("--help", env=ftpbc_env())
    assert result.returncode == 0
    for name in LAZY_COMMANDS:
        assert name in result.stdout


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_every_subcommand_has_help(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: cli {name}" in result.output or f"Usage: ftpbc {name}" in result.output
