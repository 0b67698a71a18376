"""A partner's completion signal (docs/transfers.md, "When is a partner's file complete?").

A partner that pauses in the middle of an upload for longer than ``stable_for`` has its half
file delivered by ``stable_for`` alone.  These tests hold the two signals that close that gap
on real servers: a completion marker beside the file (``done_file``) and a temporary name the
partner renames from once it is finished (a ``receive_from`` pattern the temporary name does
not match).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ftpbc.config.models import TransferConfig
from ftpbc.model.message import Message
from tests.servers.handle import ServerHandle
from tests.support import crash_area, handler_env, run_until_killed, wait_until
from tests.test_transfers import (
    CLI,
    REPO_ROOT,
    files,
    make_config,
    serving,
    write_yaml,
)

#: the servers every completion strategy is checked on (in-process FTP, vsftpd, OpenSSH)
PARTNER_KINDS = ["pyftpdlib", "vsftpd", "sshd"]
FIRST_HALF = b"<order id='1'><line>first half"
SECOND_HALF = b" and the rest</line></order>"


class Received:
    """What a handler was called with, in order (handlers run on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, bytes]] = []

    def __call__(self, m: Message) -> None:
        with self._lock:
            self.calls.append((m.name, m.body))

    def names(self) -> list[str]:
        with self._lock:
            return [n for n, _ in self.calls]


def deliver_sentinel(directory: Path, got: Received, name: str, *, marker: str | None) -> None:
    """Put a whole file (and its marker) in ``directory`` and wait until it is received.

    A sentinel written after a paused partial file, delivered, proves that the partial file
    has stood still longer than ``stable_for`` in the listing that delivered the sentinel:
    without another signal, that listing would have delivered the partial file too."""
    (directory / name).write_bytes(b"<sentinel/>")
    if marker is not None:
        (directory / marker).write_bytes(b"")
    wait_until(lambda: name in got.names(), timeout=20, what=f"{name} received")


@pytest.mark.parametrize("strategy", ["done_file", "rename"])
@pytest.mark.parametrize("kind", PARTNER_KINDS)
def test_paused_partial_upload_is_never_delivered_and_the_whole_once(
        request: pytest.FixtureRequest, kind: str, strategy: str, tmp_path: Path) -> None:
    """A partner writes half a file, pauses for several times ``stable_for`` and then finishes
    it: with a marker (``done_file: "%f.done"``) or under a temporary name renamed when done
    (``ORD_1.xml.part`` -> ``ORD_1.xml``), the half is never delivered, the whole exactly once,
    and the marker is gone afterwards."""
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = server.fresh_dir()
    out = server.local(base)
    spec = {"receive_from": f"{base}/ORD_%*.xml", "workers": 1}
    if strategy == "done_file":
        spec["done_file"] = "%f.done"
    marker = (lambda n: f"{n}.done") if strategy == "done_file" else (lambda n: None)
    partial = out / ("ORD_1.xml" if strategy == "done_file" else "ORD_1.xml.part")
    got = Received()
    cfg = make_config(server, tmp_path, "n1", {"orders": spec})
    with serving(cfg, {"orders": got}):
        with partial.open("wb") as upload:
            upload.write(FIRST_HALF)
            upload.flush()
            for i in range(3):  # three poll rounds, each longer than stable_for
                deliver_sentinel(out, got, f"ORD_s{i}.xml", marker=marker(f"ORD_s{i}.xml"))
            assert "ORD_1.xml" not in got.names()
            upload.write(SECOND_HALF)
        if strategy == "done_file":
            (out / "ORD_1.xml.done").write_bytes(b"")
        else:
            partial.rename(out / "ORD_1.xml")
        wait_until(lambda: "ORD_1.xml" in got.names(), timeout=20, what="the finished file received")
        wait_until(lambda: not list(out.glob("*.done")), timeout=20, what="every marker consumed")
        deliver_sentinel(out, got, "ORD_s9.xml", marker=marker("ORD_s9.xml"))
    orders = [(n, b) for n, b in got.calls if n == "ORD_1.xml"]
    assert orders == [("ORD_1.xml", FIRST_HALF + SECOND_HALF)]
    assert sorted(got.names()) == ["ORD_1.xml", "ORD_s0.xml", "ORD_s1.xml", "ORD_s2.xml", "ORD_s9.xml"]
    left = files(out)
    archived = sorted(k.split("~")[0] for k in left if k.startswith(".ftpbc-archive/"))
    assert archived == sorted(f".ftpbc-archive/{n}" for n in got.names())
    assert not [k for k in left if not k.startswith(".ftpbc-")], left  # no data file, no marker


def test_without_a_signal_a_paused_upload_is_delivered_half(pyftpdlib_server: ServerHandle,
                                                            tmp_path: Path) -> None:
    """The gap the signals close, shown: ``stable_for`` alone delivers a file whose partner
    paused longer than it (what the test above would see without ``done_file``)."""
    base = pyftpdlib_server.fresh_dir()
    out = pyftpdlib_server.local(base)
    got = Received()
    cfg = make_config(pyftpdlib_server, tmp_path, "n1", {"orders": {"receive_from": f"{base}/ORD_%*.xml"}})
    with serving(cfg, {"orders": got}), (out / "ORD_1.xml").open("wb") as upload:
        upload.write(FIRST_HALF)
        upload.flush()
        deliver_sentinel(out, got, "ORD_s0.xml", marker=None)
        wait_until(lambda: "ORD_1.xml" in got.names(), timeout=20, what="the half file received")
    assert ("ORD_1.xml", FIRST_HALF) in got.calls


@pytest.mark.parametrize("kind", PARTNER_KINDS)
def test_min_age_holds_a_file_until_its_listed_time_is_that_old(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> None:
    """``min_age``: a file whose modification time is recent is not received, one whose time
    lies further back than ``min_age`` is (the partner's clock, as listed, against ours)."""
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = server.fresh_dir()
    out = server.local(base)
    got = Received()
    cfg = make_config(server, tmp_path, "n1", {"orders": {
        "receive_from": f"{base}/ORD_%*.xml", "min_age": 3600, "stable_for": 0}})
    hours_ago = time.time() - 3 * 3600
    (out / "ORD_new.xml").write_bytes(b"<new/>")
    with serving(cfg, {"orders": got}):
        for i in range(3):
            sentinel = out / f"ORD_s{i}.xml"
            sentinel.write_bytes(b"<old/>")
            os.utime(sentinel, (hours_ago, hours_ago))
            wait_until(lambda s=sentinel.name: s in got.names(), timeout=20, what=f"{sentinel.name} received")
        assert "ORD_new.xml" not in got.names()
        os.utime(out / "ORD_new.xml", (hours_ago, hours_ago))
        wait_until(lambda: "ORD_new.xml" in got.names(), timeout=20, what="the aged file received")
    assert sorted(got.calls) == [("ORD_new.xml", b"<new/>"), ("ORD_s0.xml", b"<old/>"),
                                 ("ORD_s1.xml", b"<old/>"), ("ORD_s2.xml", b"<old/>")]


# --------------------------------------------------------------------------- markers and crashes


@pytest.mark.parametrize(("kind", "point"), [(k, "serve.after-commit") for k in PARTNER_KINDS]
                         + [("pyftpdlib", "serve.after-result")])
def test_node_killed_between_settling_a_file_and_its_marker_delivers_once(
        request: pytest.FixtureRequest, kind: str, point: str, tmp_path: Path) -> None:
    """SIGKILL after the second of two marked files is committed but before its marker is
    removed (``serve.after-commit``), or before the commit (``serve.after-result``): the
    marker outlives the crash, the restarted node delivers every result once (and a third file
    put there meanwhile), never runs the handler twice, and removes every marker."""
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base, out = crash_area(server, tmp_path)
    config = write_yaml(tmp_path, server, {"up": {
        "receive_from": f"{base}/out/F%*.txt", "handler": "crashhandlers:upper", "workers": 1,
        "send_to": f"{base}/in/%f", "done_file": "%f.done"}})
    def put(i: int) -> None:
        (out / f"F{i}.txt").write_bytes(f"file {i}".encode())
        (out / f"F{i}.txt.done").write_bytes(b"")

    # Two files only while the node runs to its crash: a third would be claimed, even handled,
    # while the second one's commit runs (its worker's slot is free by then), and where the
    # crash leaves it would depend on the machine's speed.
    put(0)
    put(1)
    run_until_killed(config, tmp_path, f"{point}@2", "serve")
    calls = (tmp_path / "calls.log").read_text().split()
    assert len(calls) == 2
    crashed = calls[1]
    assert (out / f"{crashed}.done").exists()  # the crash came before the marker's removal
    assert (point == "serve.after-commit") == (not (out / crashed).exists()
                                               and not list((out / ".ftpbc-select").iterdir()))
    put(2)

    inbox = server.local(base) / "in"
    log = tmp_path / "node.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*CLI, "serve", "-c", str(config)], cwd=REPO_ROOT, stdout=sink, stderr=sink,
                                env=handler_env(tmp_path))
    try:
        wait_until(lambda: len(list(inbox.glob("F*.txt"))) == 3 and not list(out.glob("*.done")),
                   timeout=30, what="all three results and no marker left")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")[-2000:]
    assert files(inbox) == {f"F{i}.txt": f"FILE {i}".encode() for i in range(3)}
    assert sorted((tmp_path / "calls.log").read_text().split()) == ["F0.txt", "F1.txt", "F2.txt"]
    assert sorted(p.name.split("~")[0] for p in (out / ".ftpbc-archive").iterdir()) == [
        "F0.txt", "F1.txt", "F2.txt"]
    assert not [p for p in out.iterdir() if not p.name.startswith(".ftpbc-")]


@pytest.mark.parametrize("kind", ["pyftpdlib", "sshd"])
def test_lone_marker_is_left_alone_and_logged_once(request: pytest.FixtureRequest, kind: str,
                                                   tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A marker whose data file is not there stays where it is and is logged once, however
    many polls see it; the marker of a file claimed by a slow handler is not called lone."""
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = server.fresh_dir()
    out = server.local(base)
    (out / "ORD_lone.xml.done").write_bytes(b"")
    release = threading.Event()
    got = Received()

    def handler(m: Message) -> None:
        if m.name == "ORD_slow.xml":
            release.wait(30)
        got(m)

    cfg = make_config(server, tmp_path, "n1", {"orders": {
        "receive_from": f"{base}/ORD_%*.xml", "done_file": "%f.done", "workers": 2}})
    with caplog.at_level(logging.WARNING, logger="ftpbc.exchange"), serving(cfg, {"orders": handler}):
        (out / "ORD_slow.xml").write_bytes(b"<slow/>")
        (out / "ORD_slow.xml.done").write_bytes(b"")
        wait_until(lambda: (out / ".ftpbc-select").is_dir() and any(
            p.name.startswith("ORD_slow.xml~") for p in (out / ".ftpbc-select").iterdir()),
            timeout=20, what="the slow file claimed")
        for i in range(4):  # several polls see both markers
            deliver_sentinel(out, got, f"ORD_s{i}.xml", marker=f"ORD_s{i}.xml.done")
        release.set()
        wait_until(lambda: "ORD_slow.xml" in got.names(), timeout=20, what="the slow file handled")
        wait_until(lambda: not (out / "ORD_slow.xml.done").exists(), timeout=20, what="its marker consumed")
        wait_until(lambda: any("ORD_lone.xml.done" in r.getMessage() for r in caplog.records),
                   timeout=20, what="the lone marker logged")
        for i in range(5, 8):  # and more polls see it after that
            deliver_sentinel(out, got, f"ORD_s{i}.xml", marker=f"ORD_s{i}.xml.done")
    lone = [r.getMessage() for r in caplog.records if "ORD_lone.xml.done" in r.getMessage()]
    assert len(lone) == 1, lone
    assert "without its data file" in lone[0]
    assert not [r for r in caplog.records if "ORD_slow.xml.done" in r.getMessage()]
    assert (out / "ORD_lone.xml.done").exists()
    assert "ORD_lone.xml" not in got.names()


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(("done_file", "says"), [
    ("%Q.done", "unknown token '%Q' in a marker name"),
    ("%u.done", "unknown token '%u' in a marker name"),
    ("%f", "needs literal text"),
    ("old/%f.done", "no '/'"),
    ("%*.%*.ok", "uses 2 %* but receive_from"),
])
def test_bad_done_file_is_one_line_naming_the_key(tmp_path: Path, done_file: str, says: str) -> None:
    config = tmp_path / "ftpbc.yaml"
    config.write_text(
        f"node: {{state_dir: {tmp_path}/state, journal_dir: {tmp_path}/journals}}\n"
        f"servers: {{files: {{url: 'file://{tmp_path}/x'}}}}\n"
        "transfers:\n  orders:\n    server: files\n    receive_from: /out/ORD_%*.xml\n"
        f"    done_file: '{done_file}'\n", encoding="utf-8")
    proc = subprocess.run([*CLI, "check", "-c", str(config)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, env=handler_env(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "transfers.orders" in lines[0] and says in lines[0], lines[0]
    if says.startswith("unknown") or says.startswith("no '/'") or says.startswith("needs"):
        assert "transfers.orders.done_file" in lines[0]


def test_marker_names_from_the_file_and_its_wildcards(tmp_path: Path) -> None:
    """``%f`` is the data file's name, ``%*`` what receive_from's wildcard matched there."""
    from ftpbc.exchange.layout import PartnerLayout
    from ftpbc.sequences import SequenceStore

    cfg = TransferConfig(server="s", receive_from="/out/ORD_%*_%*.xml", done_file="ORD_%*_%*.ok")
    layout = PartnerLayout("orders", cfg, SequenceStore(tmp_path / "l", tmp_path / "s"))
    c = layout.decode_name("ORD_7_b.xml")
    assert c is not None and layout.marker_of(c) == "ORD_7_b.ok"
    assert layout.is_marker("ORD_7_b.ok") and layout.decode_name("ORD_7_b.ok") is None
    plain = PartnerLayout("p", TransferConfig(server="s", receive_from="/out/%*", done_file="%f.done"),
                          SequenceStore(tmp_path / "l", tmp_path / "s"))
    assert plain.decode_name("a.xml.done") is None  # a marker is never data, whatever matches
    c = plain.decode_name("a.xml")
    assert c is not None and plain.marker_of(c) == "a.xml.done"


def test_only_a_marker_file_beside_the_file_completes_it(tmp_path: Path) -> None:
    """A directory of the marker's name, or a marker of another file, completes nothing; a
    marker listed before its file completes it all the same (one whole listing is judged)."""
    from ftpbc.exchange.layout import PartnerLayout
    from ftpbc.sequences import SequenceStore
    from ftpbc.transport.base import Entry

    cfg = TransferConfig(server="s", receive_from="/out/%*.xml", done_file="%f.done", stable_for=0)
    layout = PartnerLayout("orders", cfg, SequenceStore(tmp_path / "l", tmp_path / "s"))
    now = datetime.now(UTC)

    def taken(*entries: tuple[str, bool]) -> list[str]:
        return [c.name for c in layout.candidates([Entry(n, 5, now, d) for n, d in entries])]

    assert taken(("a.xml", False), ("a.xml.done", True)) == []
    assert taken(("a.xml", False), ("b.xml.done", False)) == []
    assert taken(("a.xml.done", False), ("a.xml", False), ("b.xml", False)) == ["a.xml"]
