"""``ftpbc check`` against every real server kind: it logs in, creates what is missing, reports,
and warns about an FTP server that cannot rename onto an existing file."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
import yaml

from ftpbc.exchange.area import ExchangeArea
from tests.conftest import CONFORMANCE_SERVERS
from tests.servers.handle import ServerHandle
from tests.support import free_port, ftpbc_env, run_ftpbc, server_yaml

REPO = Path(__file__).resolve().parent.parent
PW_VAR = "FTPBC_CHECK_PW"


def write_config(tmp_path: Path, servers: dict[str, object], endpoints: dict[str, object]) -> Path:
    path = tmp_path / "check.yaml"
    doc = {"node": {"state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "journals")},
           "servers": servers, "endpoints": endpoints}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture(params=CONFORMANCE_SERVERS)
def server(request: pytest.FixtureRequest) -> ServerHandle:
    """Each test runs once per server kind, ProFTPD and pure-ftpd included."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle


def exchange_dir_names(repo: str) -> set[str]:
    return {d.rsplit("/", 1)[-1] for d in ExchangeArea(repo).all_dirs()}


def test_check_creates_missing_directories_then_finds_them(tmp_path: Path, server: ServerHandle) -> None:
    base = server.fresh_dir()
    path = write_config(tmp_path, {"main": server_yaml(server, PW_VAR)}, {
        "quote": {"server": "main", "repository": f"{base}/quote", "handler": "examples.handlers:quote"},
        "audit": {"server": "main", "repository": f"{base}/deep/audit"},
    })
    env = ftpbc_env({PW_VAR: server.password or ""}, cwd_imports=str(REPO))

    first = run_ftpbc("check", "-c", str(path), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    n = len(ExchangeArea("/").all_dirs())
    assert f"ok, {n} dirs ({n} created)" in first.stdout
    assert "examples.handlers:quote: ok" in first.stdout
    assert "- (client only)" in first.stdout
    for repo in (f"{base}/quote", f"{base}/deep/audit"):
        for d in ExchangeArea(repo).all_dirs():
            assert server.local(d).is_dir(), d
        # the rename probe's files are gone again
        assert {p.name for p in server.local(repo).iterdir()} == exchange_dir_names(repo)
    # every server of the rig renames onto an existing file
    assert "warning" not in first.stderr, first.stderr

    again = run_ftpbc("check", "-c", str(path), env=env)
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout
    assert again.stdout.count(f"ok, {n} dirs") == 2
    if server.password:
        assert server.password not in first.stdout + first.stderr + again.stdout + again.stderr


def test_check_reports_each_failure_on_one_line_and_exits_1(tmp_path: Path,
                                                            pyftpdlib_server: ServerHandle) -> None:
    """A dead server, a wrong password and an unimportable handler: three lines, each naming where."""
    base = pyftpdlib_server.fresh_dir()
    dead_port = free_port()
    good = server_yaml(pyftpdlib_server, PW_VAR)
    path = write_config(tmp_path, {
        "good": good,
        "wrongpw": {**good, "password_env": "FTPBC_CHECK_WRONG"},
        "dead": {"url": f"ftp://app@127.0.0.1:{dead_port}/", "password_env": PW_VAR},
    }, {
        "fine": {"server": "good", "repository": f"{base}/fine"},
        "nohandler": {"server": "good", "repository": f"{base}/nh", "handler": "no_such_mod_q:handle"},
        "locked": {"server": "wrongpw", "repository": f"{base}/locked"},
        "gone1": {"server": "dead", "repository": "/a"},
        "gone2": {"server": "dead", "repository": "/b"},
    })
    wrong = "wrong-" + secrets.token_hex(6)
    env = ftpbc_env({PW_VAR: str(pyftpdlib_server.password), "FTPBC_CHECK_WRONG": wrong})
    began = time.monotonic()
    result = run_ftpbc("check", "-c", str(path), "--timeout", "5", env=env)
    assert time.monotonic() - began < 20
    assert result.returncode == 1
    failures = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(failures) == 4, result.stderr
    assert all(ln.startswith("ftpbc: check failed: server ") for ln in failures)
    by_endpoint = {ln.split("endpoint ")[1].split(":")[0]: ln for ln in failures}
    assert set(by_endpoint) == {"nohandler", "locked", "gone1", "gone2"}
    assert "cannot import handler module 'no_such_mod_q'" in by_endpoint["nohandler"]
    assert f"server dead (ftp://app@127.0.0.1:{dead_port})" in by_endpoint["gone1"]
    assert "server wrongpw (ftp://ftpbc@127.0.0.1" in by_endpoint["locked"]
    # the healthy endpoint still got its directories
    assert "fine" in result.stdout and pyftpdlib_server.local(f"{base}/fine/inbox").is_dir()
    for secret in (wrong, str(pyftpdlib_server.password)):
        assert secret not in result.stdout + result.stderr


def test_check_of_a_server_without_endpoints_logs_in(tmp_path: Path, pyftpdlib_server: ServerHandle) -> None:
    path = write_config(tmp_path, {"spare": server_yaml(pyftpdlib_server, PW_VAR)}, {})
    ok = run_ftpbc("check", "-c", str(path), env=ftpbc_env({PW_VAR: str(pyftpdlib_server.password)}))
    assert ok.returncode == 0, ok.stderr
    assert "ok (no endpoints)" in ok.stdout
    bad = run_ftpbc("check", "-c", str(path), env=ftpbc_env({PW_VAR: "not-it"}))
    assert bad.returncode == 1
    assert bad.stderr.startswith("ftpbc: check failed: server spare (ftp://ftpbc@127.0.0.1")


def test_check_warns_about_a_server_that_cannot_rename_onto_a_file(
        tmp_path: Path, proftpd_no_overwrite_server: ServerHandle, proftpd_server: ServerHandle) -> None:
    """ProFTPD's default AllowOverwrite off refuses RNTO onto an existing file: one warning line
    naming that server, exit 0 (it works, just not atomically); the same server allowing it: none."""
    strict, open_ = proftpd_no_overwrite_server, proftpd_server
    strict_base, open_base = strict.fresh_dir(), open_.fresh_dir()
    path = write_config(tmp_path, {"strict": server_yaml(strict, "FTPBC_CHECK_PW_STRICT"),
                                   "open": server_yaml(open_, "FTPBC_CHECK_PW_OPEN")}, {
        "a": {"server": "strict", "repository": f"{strict_base}/a"},
        "b": {"server": "open", "repository": f"{open_base}/b"},
    })
    env = ftpbc_env({"FTPBC_CHECK_PW_STRICT": str(strict.password),
                     "FTPBC_CHECK_PW_OPEN": str(open_.password)})

    result = run_ftpbc("check", "-c", str(path), env=env)

    assert result.returncode == 0, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ftpbc: check warning: server strict ({strict.url.rstrip('/')}): "
                               "refuses to rename onto an existing file")
    assert "AllowOverwrite off" in lines[0] and "not atomic" in lines[0]
    assert result.stdout.rstrip().endswith("all ok, 1 warning(s)")
    for handle, repo in ((strict, f"{strict_base}/a"), (open_, f"{open_base}/b")):
        assert {p.name for p in handle.local(repo).iterdir()} == exchange_dir_names(repo)
    for secret in (str(strict.password), str(open_.password)):
        assert secret not in result.stdout + result.stderr
