"""``ftpbc check`` against every real server kind: it logs in once per server, creates what is
missing, proves it can write, rename and delete in every box, in every transfer directory and in
state_dir and journal_dir, reports one failure per server, prints the same as JSON, and warns
about an FTP server that cannot rename onto an existing file."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.config.models import EndpointConfig, TransferConfig
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.exchange.area import ExchangeArea, archive_name
from ftpbc.exchange.layout import AreaLayout, Layout, PartnerLayout
from ftpbc.node.check import PROBE_PREFIX, probe_name
from ftpbc.sequences import SequenceStore
from ftpbc.transport.base import Entry
from tests.conftest import CONFORMANCE_SERVERS
from tests.servers.handle import ServerHandle
from tests.servers.pyftpd import handle_for
from tests.support import free_port, ftpbc_env, run_ftpbc, server_yaml

REPO = Path(__file__).resolve().parent.parent
PW_VAR = "FTPBC_CHECK_PW"


def write_config(tmp_path: Path, servers: Mapping[str, object], endpoints: Mapping[str, object],
                 transfers: Mapping[str, object] | None = None, **node: str) -> Path:
    path = tmp_path / "check.yaml"
    doc: dict[str, object] = {
        "node": {"state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "journals"), **node},
        "servers": dict(servers), "endpoints": dict(endpoints)}
    if transfers:
        doc["transfers"] = dict(transfers)
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture(params=CONFORMANCE_SERVERS)
def server(request: pytest.FixtureRequest) -> ServerHandle:
    """Each test runs once per server kind, ProFTPD and pure-ftpd included."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle


def exchange_dir_names(repo: str) -> set[str]:
    return {d.rsplit("/", 1)[-1] for d in ExchangeArea(repo).all_dirs()}


def probes_under(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"{PROBE_PREFIX}*")]


def run_json(*args: str, env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    result = run_ftpbc(*args, "--json", env=env)
    return result.returncode, json.loads(result.stdout), result.stderr


def test_check_creates_missing_directories_then_finds_them(tmp_path: Path, server: ServerHandle) -> None:
    """Every box of every endpoint, every transfer directory, state_dir and journal_dir: created
    when missing, a probe written, renamed and deleted in each, none left behind."""
    base = server.fresh_dir()
    path = write_config(tmp_path, {"main": server_yaml(server, PW_VAR)}, {
        "quote": {"server": "main", "repository": f"{base}/quote", "handler": "examples.handlers:quote"},
        "audit": {"server": "main", "repository": f"{base}/deep/audit"},
    }, {"orders": {"server": "main", "receive_from": f"{base}/partner/in/%*.xml",
                   "send_to": f"{base}/partner/out/%f", "pre_send": "rename"}})
    env = ftpbc_env({PW_VAR: server.password or ""}, cwd_imports=str(REPO))

    first = run_ftpbc("check", "-c", str(path), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    n = len(ExchangeArea("/").all_dirs())
    assert f"ok, {n} dirs ({n} created)" in first.stdout
    # in, select, error, its reason stage, archive, out, stage, protect
    assert "ok, 8 dirs (8 created)" in first.stdout
    assert "examples.handlers:quote: ok" in first.stdout
    assert "- (client only)" in first.stdout
    assert "state_dir    " in first.stdout and "ok (created)" in first.stdout
    for repo in (f"{base}/quote", f"{base}/deep/audit"):
        for d in ExchangeArea(repo).all_dirs():
            assert server.local(d).is_dir(), d
        # every probe file is gone again
        assert {p.name for p in server.local(repo).iterdir()} == exchange_dir_names(repo)
    partner = server.local(f"{base}/partner")
    assert {p.name for p in (partner / "in").iterdir()} == {".ftpbc-select", ".ftpbc-error", ".ftpbc-stage",
                                                          ".ftpbc-archive"}
    assert {p.name for p in (partner / "out").iterdir()} == {".ftpbc-stage", ".ftpbc-protect"}
    assert probes_under(server.local(base)) == []
    for local in ("state", "journals"):
        assert (tmp_path / local).is_dir() and list((tmp_path / local).iterdir()) == []
        assert (tmp_path / local).stat().st_mode & 0o777 == 0o700  # as a node creates it
    # every server of the rig renames onto an existing file
    assert "warning" not in first.stderr, first.stderr
    assert first.stdout.rstrip().endswith("1 server(s), 2 endpoint(s), 1 transfer(s): all ok")

    again = run_ftpbc("check", "-c", str(path), env=env)
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout
    assert again.stdout.count(f"ok, {n} dirs") == 2 and "ok, 8 dirs" in again.stdout
    assert probes_under(server.local(base)) == []
    if server.password:
        assert server.password not in first.stdout + first.stderr + again.stdout + again.stderr


@pytest.fixture
def restricted_ftp(tmp_path: Path) -> Iterator[tuple[EmbeddedFTPServer, ServerHandle]]:
    """A pyftpdlib server of this test's own, whose rights the test narrows per directory."""
    password = secrets.token_urlsafe(12)
    root = tmp_path / "ftp-root"
    root.mkdir()
    with EmbeddedFTPServer(root.resolve(), password=password, auth_failed_delay=0) as srv:
        yield srv, handle_for(srv, "pyftpdlib", password)


def test_check_proves_write_rename_and_delete_in_every_box(tmp_path: Path,
                                                          restricted_ftp: tuple[EmbeddedFTPServer,
                                                                                ServerHandle]) -> None:
    """A box where the server refuses to store, one where it refuses to rename, one where it
    refuses to delete: one failure line for the endpoint naming each box and what failed there
    (and the probe a refused delete left behind); the other boxes and endpoints are fine."""
    srv, handle = restricted_ftp
    repo = "/repo"
    area = ExchangeArea(repo)
    for d in area.all_dirs():
        handle.local(d).mkdir(parents=True)
    refusals = {"inerror": "elr", "inbox": "elrw", "outbox": "elrwf"}  # no store / rename / delete
    for box, perm in refusals.items():
        directory = str(handle.local(f"{repo}/{box}").resolve())
        srv.handler_class.authorizer.override_perm(srv.user, directory, perm)
    path = write_config(tmp_path, {"ftp": server_yaml(handle, PW_VAR)}, {
        "narrow": {"server": "ftp", "repository": repo},
        "wide": {"server": "ftp", "repository": "/wide"},
    })
    env = ftpbc_env({PW_VAR: str(handle.password)})

    result = run_ftpbc("check", "-c", str(path), env=env)

    assert result.returncode == 1, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"ftpbc: check failed: server ftp ({handle.url.rstrip('/')}), endpoint narrow: ")
    problems = dict(p.split(": ", 1) for p in line.split("endpoint narrow: ", 1)[1].split("; "))
    assert problems[f"{repo}/inerror"].startswith("cannot write a file: ")
    assert problems[f"{repo}/inbox"].startswith("cannot rename a file: ")
    assert problems[f"{repo}/outbox"].startswith("cannot delete a file: ")
    assert "left behind" in problems[f"{repo}/outbox"]
    assert "FAILED (3 of 16 dirs)" in result.stdout
    assert f"ok, {len(area.all_dirs())} dirs" in result.stdout  # "wide" is fine
    # the probes the server would not let go are the ones named; no other is left
    left = probes_under(handle.root)
    assert {p.parent.name for p in left} <= {"inbox", "outbox"} and left
    for p in left:
        assert p.name in line

    code, doc, stderr = run_json("check", "-c", str(path), env=env)
    assert code == 1 and stderr == ""
    narrow = next(e for e in doc["endpoints"] if e["name"] == "narrow")
    failed = {d["path"].rsplit("/", 1)[-1]: d["error"] for d in narrow["directories"] if not d["ok"]}
    assert set(failed) == set(refusals)
    assert narrow["ok"] is False and narrow["skipped"] is False and narrow["repository"] == repo
    assert [e["ok"] for e in doc["endpoints"] if e["name"] == "wide"] == [True]


def test_check_reports_one_failure_per_server_and_exits_1(tmp_path: Path,
                                                          pyftpdlib_server: ServerHandle) -> None:
    """A dead server with two endpoints and a transfer, a wrong password and an unimportable
    handler: three lines, one per server (its endpoints named as not checked) and one for the
    handler; the wrong password is called one, not "unreachable"."""
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
    }, {"gone3": {"server": "dead", "send_to": "/out/%f"}})
    wrong = "wrong-" + secrets.token_hex(6)
    env = ftpbc_env({PW_VAR: str(pyftpdlib_server.password), "FTPBC_CHECK_WRONG": wrong})
    began = time.monotonic()
    result = run_ftpbc("check", "-c", str(path), "--timeout", "5", env=env)
    assert time.monotonic() - began < 20
    assert result.returncode == 1
    failures = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(failures) == 3, result.stderr
    assert all(ln.startswith("ftpbc: check failed: server ") for ln in failures)
    dead, handler, locked = sorted(failures, key=lambda ln: ln.split(" (")[0])
    assert dead.startswith(f"ftpbc: check failed: server dead (ftp://app@127.0.0.1:{dead_port}): "
                           "unreachable: ")
    assert dead.endswith("; not checked: endpoint gone1, endpoint gone2, transfer gone3")
    assert "endpoint nohandler: " in handler and "cannot import handler module 'no_such_mod_q'" in handler
    assert locked.startswith("ftpbc: check failed: server wrongpw (ftp://ftpbc@127.0.0.1")
    assert ": wrong user name or password: " in locked and "unreachable" not in locked
    assert locked.endswith("; not checked: endpoint locked")
    assert result.stdout.count("not checked (server dead failed)") == 3
    assert "FAILED: wrong user name or password" in result.stdout
    # the healthy endpoint still got its directories
    assert "fine" in result.stdout and pyftpdlib_server.local(f"{base}/fine/inbox").is_dir()
    for secret in (wrong, str(pyftpdlib_server.password)):
        assert secret not in result.stdout + result.stderr

    code, doc, stderr = run_json("check", "-c", str(path), "--timeout", "5", env=env)
    assert code == 1 and stderr == ""
    assert set(doc) >= {"servers", "endpoints", "transfers", "state_dir", "journal_dir", "warnings",
                        "failures"}
    servers = {s["name"]: s for s in doc["servers"]}
    assert servers["good"]["ok"] is True and servers["good"]["error"] is None
    assert servers["wrongpw"]["error"].startswith("wrong user name or password: ")
    assert servers["dead"]["error"].startswith("unreachable: ")
    assert servers["dead"]["not_checked"] == ["endpoint gone1", "endpoint gone2", "transfer gone3"]
    endpoints = {e["name"]: e for e in doc["endpoints"]}
    assert [n for n, e in endpoints.items() if e["skipped"]] == ["gone1", "gone2", "locked"]
    assert endpoints["fine"]["ok"] is True and len(endpoints["fine"]["directories"]) == 16
    assert endpoints["nohandler"]["handler"]["ok"] is False
    assert doc["transfers"][0]["skipped"] is True
    assert doc["state_dir"]["ok"] and doc["journal_dir"]["ok"] and doc["ok"] is False
    assert doc["failures"] == [ln.removeprefix("ftpbc: check failed: ") for ln in failures]
    for secret in (wrong, str(pyftpdlib_server.password)):
        assert secret not in json.dumps(doc)


@pytest.mark.parametrize("fixture", ["pyftpdlib_server", "vsftpd_server", "proftpd_server",
                                     "sshd_password_login"])
def test_check_calls_a_wrong_password_a_wrong_password(tmp_path: Path, request: pytest.FixtureRequest,
                                                       fixture: str) -> None:
    handle: ServerHandle = request.getfixturevalue(fixture)
    path = write_config(tmp_path, {"srv": server_yaml(handle, PW_VAR)}, {
        "a": {"server": "srv", "repository": "/a"}, "b": {"server": "srv", "repository": "/b"}})
    result = run_ftpbc("check", "-c", str(path), env=ftpbc_env({PW_VAR: "not-" + secrets.token_hex(4)}))
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ftpbc: check failed: server srv ({handle.config().display}): "
                               "wrong user name or password: ")
    assert lines[0].endswith("; not checked: endpoint a, endpoint b")
    assert str(handle.password) not in result.stdout + result.stderr


def test_check_of_a_server_without_endpoints_logs_in(tmp_path: Path, pyftpdlib_server: ServerHandle) -> None:
    path = write_config(tmp_path, {"spare": server_yaml(pyftpdlib_server, PW_VAR)}, {})
    ok = run_ftpbc("check", "-c", str(path), env=ftpbc_env({PW_VAR: str(pyftpdlib_server.password)}))
    assert ok.returncode == 0, ok.stderr
    assert "ok (no endpoints)" in ok.stdout
    bad = run_ftpbc("check", "-c", str(path), env=ftpbc_env({PW_VAR: "not-it"}))
    assert bad.returncode == 1
    assert bad.stderr.startswith("ftpbc: check failed: server spare (ftp://ftpbc@127.0.0.1")
    assert "wrong user name or password" in bad.stderr


def test_check_fails_a_file_server_only_when_it_is_wrong(tmp_path: Path, local_server: ServerHandle) -> None:
    """file://: a base directory that exists, or is missing but can be created (ftpbc creates it
    on first use), is fine, with or without endpoints; one under a regular file is the failure."""
    existing = local_server.root / local_server.fresh_dir().lstrip("/")
    missing = tmp_path / "not-yet" / "base"
    created = tmp_path / "made-by-check"
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    servers = {"existing": {"url": f"file://{existing}"}, "missing": {"url": f"file://{missing}"},
               "created": {"url": f"file://{created}"}, "wrong": {"url": f"file://{blocker}/base"}}
    path = write_config(tmp_path, servers, {"ep": {"server": "created", "repository": "/x"},
                                            "ep2": {"server": "wrong", "repository": "/y"}})
    result = run_ftpbc("check", "-c", str(path), env=ftpbc_env())

    assert result.returncode == 1
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines == [f"ftpbc: check failed: server wrong (file://{blocker}/base): base directory "
                     f"{blocker}/base is missing and cannot be created: {blocker} is not a directory; "
                     "not checked: endpoint ep2"], result.stderr
    rows = {ln.split()[0]: ln for ln in result.stdout.splitlines() if ln.strip()}
    assert "ok (no endpoints)" in rows["existing"] and "missing" not in rows["existing"]
    assert "ok (no endpoints); base directory missing: created on first use" in rows["missing"]
    assert not missing.exists()  # a server without endpoints: nothing to create it for
    assert "ok; base directory created" in rows["created"]
    assert {p.name for p in (created / "x").iterdir()} == exchange_dir_names("/x")


def test_check_fails_on_an_unusable_state_dir_or_journal_dir(tmp_path: Path) -> None:
    """Neither is a traceback: one line each, exit 1; the servers are still checked."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = write_config(tmp_path, {"loc": {"url": f"file://{tmp_path / 'root'}"}},
                        {"ep": {"server": "loc", "repository": "/r"}},
                        state_dir=str(blocker / "state"), journal_dir=str(blocker))
    result = run_ftpbc("check", "-c", str(path), env=ftpbc_env())
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"ftpbc: check failed: state_dir {blocker}/state: cannot create the directory: Not a directory",
        f"ftpbc: check failed: journal_dir {blocker}: not a directory"]
    assert "Traceback" not in result.stdout + result.stderr
    assert "ok, 16 dirs (16 created)" in result.stdout

    code, doc, _ = run_json("check", "-c", str(path), env=ftpbc_env())
    assert code == 1
    assert doc["state_dir"] == {"key": "state_dir", "path": f"{blocker}/state", "created": False, "ok": False,
                                "error": "cannot create the directory: Not a directory", "status": "FAILED"}
    assert doc["journal_dir"]["ok"] is False and doc["servers"][0]["ok"] is True


def test_check_exits_2_on_an_invalid_configuration(tmp_path: Path) -> None:
    path = tmp_path / "check.yaml"
    path.write_text("servers:\n  s: {url: 'gopher://x/'}\nendpoints: {}\n", encoding="utf-8")
    for extra in ((), ("--json",)):
        result = run_ftpbc("check", "-c", str(path), *extra, env=ftpbc_env())
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1 and "gopher" in result.stderr


def _refused(layout: Layout, name: str) -> bool:
    return layout.candidates([Entry(name, 10, datetime.now(UTC), False)]) == []


@pytest.mark.parametrize("naming", ["ftpbc", "dropboxmq"])
def test_no_layout_takes_a_probe_for_a_message(tmp_path: Path, naming: str) -> None:
    """Why a probe is safe in a box a running node polls: whatever the endpoint's naming or the
    transfer's pattern, the layouts refuse its name (too long to archive, even with the shortest
    node id), while they take an ordinary name in the same place."""
    shortest = len(archive_name("", "x", datetime.now(UTC)))
    ep = EndpointConfig(server="s", repository="/r", naming=naming)
    partner = TransferConfig(server="s", receive_from="/in/%*", stable_for=0)
    uid = str(uuid.uuid4())
    layouts: list[tuple[Layout, str]] = [
        (AreaLayout("e", ep, "in"), f"req.{uid}"), (AreaLayout("e", ep, "out"), f"resp.{uid}"),
        (PartnerLayout("t", partner, SequenceStore(tmp_path, tmp_path)), "partner-file.xml")]
    for layout, ordinary in layouts:
        layout.reserve = shortest
        assert not _refused(layout, ordinary), layout.display
        for tag in ("a", "b"):
            assert _refused(layout, probe_name(tag)), layout.display


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

    code, doc, stderr = run_json("check", "-c", str(path), env=env)
    assert code == 0 and stderr == "" and doc["ok"] is True
    assert [w.split(": ", 1)[0] for w in doc["warnings"]] == [f"server strict ({strict.url.rstrip('/')})"]
    assert {s["name"]: len(s["warnings"]) for s in doc["servers"]} == {"open": 0, "strict": 1}
