"""``ftpbc check`` against every real server kind: it logs in, creates what is missing, reports."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import yaml

from ftpbc.exchange.area import ExchangeArea
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


def test_check_creates_missing_directories_then_finds_them(tmp_path: Path, server: ServerHandle) -> None:
    base = server.fresh_dir()
    path = write_config(tmp_path, {"main": server_yaml(server, PW_VAR)}, {
        "quote": {"server": "main", "repository": f"{base}/quote", "handler": "examples.handlers:quote"},
        "audit": {"server": "main", "repository": f"{base}/deep/audit"},
    })
    env = ftpbc_env({PW_VAR: server.password or ""}, cwd_imports=str(REPO))

    first = run_ftpbc("check", "-c", str(path), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ok, 12 dirs (12 created)" in first.stdout
    assert "examples.handlers:quote: ok" in first.stdout
    assert "- (client only)" in first.stdout
    for repo in (f"{base}/quote", f"{base}/deep/audit"):
        for d in ExchangeArea(repo).all_dirs():
            assert server.local(d).is_dir(), d

    again = run_ftpbc("check", "-c", str(path), env=env)
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout
    assert again.stdout.count("ok, 12 dirs") == 2
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
