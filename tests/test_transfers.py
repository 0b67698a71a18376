"""Transfers (docs/transfers.md) against every server kind: a partner's own directory layout."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.model.message import Message
from ftpbc.node.serve import Handler, Node
from tests.cluster import node_section
from tests.servers.handle import ServerHandle
from tests.support import crash_area, handler_env, run_until_killed, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
FAST = {"poll_interval": 0.05, "stable_for": 0.2}
CLI = [sys.executable, "-c", "from ftpbc.cli import main; main()"]


def make_config(handle: ServerHandle, workdir: Path, node_id: str,
                transfers: dict[str, dict[str, Any]]) -> Config:
    return Config.model_validate({
        "node": node_section(workdir, node_id),
        "servers": {"srv": handle.config(name="srv")},
        "transfers": {name: {"server": "srv", **FAST, **t} for name, t in transfers.items()},
    })


@contextmanager
def serving(config: Config, handlers: dict[str, Handler]) -> Iterator[Node]:
    node = Node(config, handlers)
    node.start()
    try:
        yield node
    finally:
        assert node.stop(drain_timeout=10)


def files(local: Path) -> dict[str, bytes]:
    """Regular files under ``local``, by path relative to it."""
    return {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*")) if p.is_file()}


def today() -> set[str]:
    now = datetime.now(UTC)
    return {(now + timedelta(seconds=d)).strftime("%Y%m%d") for d in (-60, 0)}


# --------------------------------------------------------------------------- receiving


def test_receive_with_wildcard_and_answer_with_sequence_and_date(server: ServerHandle,
                                                                  tmp_path: Path) -> None:
    base = server.fresh_dir()
    out = server.local(base) / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    for name, body in {"ORD_17.xml": b"<o>17</o>", "ORD_18.xml": b"<o>18</o>", "INV_1.xml": b"inv",
                       "ORD_19.txt": b"wrong suffix"}.items():
        (out / name).write_bytes(body)
    seen: list[tuple[str, object]] = []

    def handler(m: Message) -> bytes:
        seen.append((m.name, m.values["%*0"]))
        return b"ACK " + m.body

    cfg = make_config(server, tmp_path, "n1", {"orders": {
        "receive_from": f"{base}/out/ORD_%*.xml", "handler": "unused:unused",
        "send_to": f"{base}/in/ACK_%y%y%y%y%M%M%d%d_%{{ackseq}}%{{ackseq}}%{{ackseq}}.xml"}})
    with serving(cfg, {"orders": handler}):
        wait_until(lambda: len(list((server.local(base) / "in").glob("ACK_*"))) == 2, what="two ACK files")
    assert sorted(seen) == [("ORD_17.xml", "17"), ("ORD_18.xml", "18")]
    acks = files(server.local(base) / "in")
    names = sorted(n for n in acks if n.startswith("ACK_"))
    assert sorted(acks[n] for n in names) == [b"ACK <o>17</o>", b"ACK <o>18</o>"]
    parsed = [re.fullmatch(r"ACK_(\d{8})_(\d{3})\.xml", n) for n in names]
    assert all(parsed), names
    assert {m.group(1) for m in parsed if m} <= today()
    assert sorted(int(m.group(2)) for m in parsed if m) == [0, 1]  # one draw per file, from 0
    left = files(out)
    # Not matching: untouched.  Matching: archived under their own name, with node and stamp.
    assert left["INV_1.xml"] == b"inv" and left["ORD_19.txt"] == b"wrong suffix"
    archived = {k.split("~")[0]: v for k, v in left.items() if k.startswith(".ftpbc-archive/")}
    assert archived == {".ftpbc-archive/ORD_17.xml": b"<o>17</o>", ".ftpbc-archive/ORD_18.xml": b"<o>18</o>"}
    assert not [k for k in left if k.startswith((".ftpbc-select/", ".ftpbc-error/"))]
    assert not list((server.local(base) / "in" / ".ftpbc-stage").iterdir())


@pytest.mark.parametrize("post_receive", ["delete", "rename"])
def test_post_receive_delete_or_rename(server: ServerHandle, tmp_path: Path, post_receive: str) -> None:
    base = server.fresh_dir()
    out = server.local(base)
    (out / "a.dat").write_bytes(b"A")
    (out / "b.dat").write_bytes(b"B")
    got: list[bytes] = []
    spec: dict[str, Any] = {"receive_from": f"{base}/%*.dat", "post_receive": post_receive}
    if post_receive == "rename":
        spec["post_receive_to"] = f"{base}/done/%y%y%y%y/%f.ok"
    cfg = make_config(server, tmp_path, "n1", {"drop": spec})
    with serving(cfg, {"drop": lambda m: got.append(m.body)}):
        wait_until(lambda: len(got) == 2 and not list(out.glob("*.dat")), what="both files handled")
    assert sorted(got) == [b"A", b"B"]
    wait_until(lambda: not list((out / ".ftpbc-select").iterdir()), what="select directory empty")
    if post_receive == "delete":
        assert not [k for k in files(out) if not k.startswith(".ftpbc")], files(out)
        assert not (out / ".ftpbc-archive").exists()
    else:
        year = datetime.now(UTC).strftime("%Y")
        assert files(out / "done" / year) == {"a.dat.ok": b"A", "b.dat.ok": b"B"}


def test_handler_failure_goes_to_error_dir_with_reason(server: ServerHandle, tmp_path: Path) -> None:
    base = server.fresh_dir()
    out = server.local(base)
    (out / "bad.csv").write_bytes(b"1,2,x")
    (out / "good.csv").write_bytes(b"1,2,3")

    def handler(m: Message) -> bytes:
        if b"x" in m.body:
            raise ValueError("column 3 is not a number")
        return m.body

    cfg = make_config(server, tmp_path, "n1", {"csv": {"receive_from": f"{base}/%*.csv",
                                                       "send_to": f"{base}/sums/%f",
                                                       "error_reply": "message"}})
    with serving(cfg, {"csv": handler}):
        wait_until(lambda: (out / "sums" / "good.csv").exists()
                   and len(list((out / ".ftpbc-error").iterdir())) == 2,
                   what="good answered, bad in error dir")
    errors = files(out / ".ftpbc-error")
    (failed,) = [k for k in errors if not k.endswith(".reason")]
    assert failed.startswith("bad.csv~n1~") and errors[failed] == b"1,2,x"
    assert errors[failed + ".reason"] == b"ValueError: column 3 is not a number\n"
    assert not (out / "sums" / "bad.csv").exists()
    assert (out / "sums" / "good.csv").read_bytes() == b"1,2,3"


# --------------------------------------------------------------------------- sending


def test_pre_send_rename_protects_the_existing_target(server: ServerHandle, tmp_path: Path) -> None:
    base = server.fresh_dir()
    cfg = make_config(server, tmp_path, "c1", {"feed": {
        "send_to": f"{base}/in/PRICES.csv", "pre_send": "rename", "pre_send_to": "%p/old/%f.%{gen}"}})
    with Client(cfg) as client:
        for body in (b"v1", b"v2", b"v3"):
            assert client.send("feed", body) == f"{base}/in/PRICES.csv"
    inbox = server.local(base) / "in"
    assert (inbox / "PRICES.csv").read_bytes() == b"v3"
    # gen 0 was drawn by the first send, which had nothing to protect
    assert files(inbox / "old") == {"PRICES.csv.1": b"v1", "PRICES.csv.2": b"v2"}
    assert not list((inbox / ".ftpbc-stage").iterdir())


def test_pre_send_none_replaces_and_copy_keeps_both(server: ServerHandle, tmp_path: Path) -> None:
    base = server.fresh_dir()
    cfg = make_config(server, tmp_path, "c1", {
        "plain": {"send_to": f"{base}/a/X"},
        "copied": {"send_to": f"{base}/b/X", "pre_send": "copy"}})
    with Client(cfg) as client:
        for body in (b"one", b"two"):
            client.send("plain", body)
            client.send("copied", body)
    root = server.local(base)
    assert files(root / "a") == {"X": b"two"}
    b = files(root / "b")
    assert b.pop("X") == b"two"
    (protected,) = b.values()
    assert protected == b"one"


def test_post_send_rename_after_upload(server: ServerHandle, tmp_path: Path) -> None:
    base = server.fresh_dir()
    cfg = make_config(server, tmp_path, "c1", {"orders": {
        "send_to": f"{base}/in/ORD_%{{n}}.xml", "post_send": "rename", "post_send_to": "%p/%f.done"}})
    with Client(cfg) as client:
        paths = [client.send("orders", f"order {i}") for i in range(3)]
    assert paths == [f"{base}/in/ORD_{i}.xml.done" for i in range(3)]
    assert files(server.local(base) / "in") == {f"ORD_{i}.xml.done": f"order {i}".encode() for i in range(3)}


def test_cli_send_to_a_transfer(server: ServerHandle, tmp_path: Path) -> None:
    base = server.fresh_dir()
    config = write_yaml(tmp_path, server, {"up": {"send_to": f"{base}/in/%u.txt"}})
    proc = subprocess.run([*CLI, "send", "-c", str(config), "up", "--data", "hi"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env=handler_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.strip()
    assert re.fullmatch(rf"{base}/in/[0-9a-f-]{{36}}\.txt", printed)
    assert server.local(printed).read_bytes() == b"hi"


# --------------------------------------------------------------------------- crash


def write_yaml(tmp_path: Path, handle: ServerHandle, transfers: dict[str, dict[str, Any]]) -> Path:
    server: dict[str, Any] = {"url": handle.url}
    server.update({k: str(v) if isinstance(v, Path) else v for k, v in handle.options.items()})
    if handle.password is not None:
        secret = tmp_path / "password"
        secret.write_text(handle.password + "\n", encoding="utf-8")
        secret.chmod(0o600)
        server["password_file"] = str(secret)
    doc = {"node": node_section(tmp_path, "n1"),
           "servers": {"srv": server},
           "transfers": {n: {"server": "srv", **FAST, **t} for n, t in transfers.items()}}
    path = tmp_path / "ftpbc.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


#: every crash point a received file passes through, in order
RECEIVE_POINTS = ["claim.after-intent", "claim.after-rename", "serve.after-result", "serve.after-stage",
                  "serve.after-commit", "serve.after-expose"]
#: crash points of recovery itself: the node is first killed after recording a result
RECOVERY_POINTS = ["recover.before-op", "recover.after-op"]
SEND_POINTS = ["send.after-intent", "send.after-put", "send.after-expose"]


def _crash_setup(request: pytest.FixtureRequest, kind: str, tmp_path: Path,
                 send_to: str = "in/%f") -> tuple[ServerHandle, str, Path]:
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base, _ = crash_area(server, tmp_path)
    config = write_yaml(tmp_path, server, {"up": {
        "receive_from": f"{base}/out/F%*.txt", "handler": "crashhandlers:upper", "workers": 1,
        "send_to": f"{base}/{send_to}", "pre_send": "rename", "post_send": "rename",
        "post_send_to": "%p/%f.ok"}})
    return server, base, config


@pytest.mark.parametrize("point", RECEIVE_POINTS + RECOVERY_POINTS)
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_receiving_node_killed_at_every_point_loses_and_duplicates_nothing(
        request: pytest.FixtureRequest, kind: str, point: str, tmp_path: Path) -> None:
    """SIGKILL at each step of receiving the second of three files; a restart finishes the job:
    every result once, under its final name, the handler never run twice, nothing left over."""
    server, base, config = _crash_setup(request, kind, tmp_path)
    out = server.local(base) / "out"
    for i in range(3):
        (out / f"F{i}.txt").write_bytes(f"file {i}".encode())
    first = "serve.after-result@2" if point in RECOVERY_POINTS else f"{point}@2"
    run_until_killed(config, tmp_path, first, "serve")
    inbox = server.local(base) / "in"
    assert len(list(inbox.glob("*.ok"))) <= 1 + (point == "serve.after-expose")
    if point in RECOVERY_POINTS:
        run_until_killed(config, tmp_path, point, "recover")

    log = tmp_path / "node.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*CLI, "serve", "-c", str(config)], cwd=REPO_ROOT, stdout=sink, stderr=sink,
                                env=handler_env(tmp_path))
    try:
        wait_until(lambda: len(list(inbox.glob("*.ok"))) == 3, timeout=30, what="all three results")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")[-2000:]
    assert files(inbox) == {f"F{i}.txt.ok": f"FILE {i}".encode() for i in range(3)}
    calls = (tmp_path / "calls.log").read_text().split()
    assert sorted(calls) == ["F0.txt", "F1.txt", "F2.txt"]  # the handler never ran twice
    assert not list(out.glob("F*.txt"))
    assert len(list((out / ".ftpbc-archive").iterdir())) == 3
    assert not list((out / ".ftpbc-select").iterdir())
    stage = server.local(base) / "in" / ".ftpbc-stage"
    assert not stage.exists() or not list(stage.iterdir())


@pytest.mark.parametrize("point", SEND_POINTS)
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_sender_killed_at_every_point_leaves_nothing_torn(
        request: pytest.FixtureRequest, kind: str, point: str, tmp_path: Path) -> None:
    """``ftpbc send`` to a transfer killed at each step, then recovered: the file is either not
    there at all (never acknowledged) or complete under its final name; no stage file is left."""
    server, base, config = _crash_setup(request, kind, tmp_path, send_to="in/S%u.txt")
    run_until_killed(config, tmp_path, point, "send", "up", "--data", "hello partner")
    recovered = subprocess.run([*CLI, "recover", "-c", str(config)], cwd=REPO_ROOT, capture_output=True,
                               timeout=60, env=handler_env(tmp_path))
    assert recovered.returncode == 0, recovered.stderr.decode()[-2000:]
    inbox = server.local(base) / "in"
    landed = files(inbox) if inbox.exists() else {}
    if point == "send.after-expose":
        assert list(landed.values()) == [b"hello partner"]
        assert next(iter(landed)).endswith(".ok")
    else:
        assert landed == {}, recovered.stdout.decode()
        assert "rolled back" in recovered.stdout.decode() or point == "send.after-intent"
