"""A node fences itself: it claims, and starts handlers, only while its own lease is provably
valid (its last heartbeat written successfully, plus the lease, minus a margin, still ahead), and
never serves a claim made before a lapse of its lease."""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import is_dead
from ftpbc.cluster.lease import Lease, safety_margin
from ftpbc.cluster.liveness import Liveness, LoopGuard
from ftpbc.config.models import Config
from ftpbc.model.message import Message
from ftpbc.node.check import lease_warning
from ftpbc.node.provider import Provider
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, run_ftpbc, server_yaml, wait_until

# --------------------------------------------------------------------------- the Lease itself


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fence_lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    """The lease's log lines starting with ``word`` (``fenced:``, ``unfenced:``)."""
    return [r.getMessage() for r in caplog.records
            if r.name == "ftpbc.lease" and r.getMessage().startswith(word)]


def test_held_for_counts_from_the_beat_that_ended_the_last_lapse() -> None:
    """A node sweeps (judges other nodes dead) only once its own lease has held for a whole
    lease: after an outage that stopped every heartbeat, the others then had time to beat."""
    clock = Clock(100.0)
    lease = Lease(6.0, 1.0, clock=clock, wall=lambda: 0.0)
    assert lease.held_for() == float("inf")  # no heartbeat at all: never fenced
    lease.arm()
    assert lease.held_for() == 0.0
    lease.renewed(100.0)
    clock.now = 103.0
    lease.renewed(102.5)  # renewals within the lease do not restart the count
    assert lease.held_for() == 3.0
    clock.now = 120.0  # an outage: no beat for 17 s
    assert lease.held_for() == 0.0
    lease.renewed(119.0)
    clock.now = 121.0
    assert lease.held_for() == 2.0  # counted from the beat that ended the lapse


def test_a_lease_runs_from_the_start_of_the_last_beat_written(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(100.0)
    lease = Lease(6.0, 1.0, clock=clock, wall=lambda: 0.0)
    assert lease.valid() and lease.until is None  # no heartbeat: never fenced
    lease.arm()
    assert not lease.valid()  # armed: over until the first beat is written
    lease.renewed(100.0)
    term = lease.term()
    assert term is not None
    clock.now = 104.9
    assert lease.holds(term)
    lease.renewed(103.0)  # a slow write: issued at 103, done at 104.9, counts from 103
    assert lease.until == 108.0
    clock.now = 107.99
    assert lease.holds(term)
    clock.now = 108.0
    assert not lease.valid() and not lease.holds(term) and lease.term() is None
    assert not lease.valid()
    assert len(_fence_lines(caplog, "fenced:")) == 1  # once, however often it is asked
    assert "lease valid until 1970-01-01" in _fence_lines(caplog, "fenced:")[0]
    clock.now = 109.0
    lease.renewed(108.5)
    fresh = lease.term()
    assert fresh is not None and fresh != term
    assert not lease.holds(term)  # a claim made before the lapse is never served again
    assert lease.holds(fresh)
    assert len(_fence_lines(caplog, "unfenced:")) == 1
    assert len(_fence_lines(caplog, "fenced:")) == 1


def test_a_beat_issued_in_time_but_written_after_the_lease_still_ends_the_term() -> None:
    """A node paused (or cut off) in the middle of a beat: the write was issued while the lease
    held and lands after it ran out.  Other nodes may have taken its claims meanwhile."""
    clock = Clock(0.0)
    lease = Lease(6.0, 1.0, clock=clock)
    lease.arm()
    lease.renewed(0.0)
    term = lease.term()
    clock.now = 12.0  # nobody asked in between: the lapse is noticed by the renewal itself
    lease.renewed(4.5)
    assert not lease.valid()  # 4.5 + 5 is over too
    lease.renewed(11.5)
    assert lease.valid() and not lease.holds(term)


def test_the_margin_leaves_a_node_beating_on_time_a_valid_lease() -> None:
    assert safety_margin(6.0, 1.0) == 1.0
    assert safety_margin(6.0, 1.0, clock_error=1.0) == 2.0
    assert safety_margin(2.5, 1.0, clock_error=1.0) == 0.75  # never more than (lease - interval) / 2
    with pytest.raises(ValueError, match="margin"):
        Lease(1.0, 1.0)


def test_a_slow_step_is_not_a_stuck_loop_but_a_failing_one_is() -> None:
    clock = Clock(0.0)
    liveness = Liveness(clock)
    stop = threading.Event()
    guard = LoopGuard("poller ep", liveness, stop, first_wait=0.0, max_wait=0.0)
    health = liveness.health(3.0, 60.0)

    def slow() -> int:
        clock.now += 10.0
        assert health() is None  # 10 s into one step: slow, not stuck
        clock.now += 55.0
        assert health() is not None and "poller ep made no progress for 65 s" in (health() or "")
        return 1

    assert guard.run(slow) == 1
    assert health() is None

    def failing() -> int:
        raise OSError("no lock")

    guard.run(failing)
    clock.now += 4.0
    assert health() is not None  # failing steps are no progress: ``within`` applies


# --------------------------------------------------------------------------- nodes


def _echo_recording(calls: list[bytes]) -> Callable[[Message], bytes]:
    def handler(message: Message) -> bytes:
        calls.append(message.body)
        return b"re:" + message.body
    return handler


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor


@pytest.fixture
def immutable() -> Iterator[Callable[[Path, bool], None]]:
    """``set(path, True)`` makes ``path`` immutable (chattr +i: refused even to root); undone at
    the end of the test whatever happened."""
    made: set[Path] = set()

    def chattr(path: Path, on: bool) -> None:
        subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)
        (made.add if on else made.discard)(path)

    yield chattr
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


FENCED, UNFENCED = "fenced: node prov:", "unfenced: node prov:"


def _polls_after(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list whose length is the node's polls of ``ep`` from now on."""
    provider = node.providers["ep"]
    real = provider.poll_once
    seen: list[int] = []

    def counting() -> int:
        found = real()
        seen.append(found)
        return found

    monkeypatch.setattr(provider, "poll_once", counting)
    return seen


def _fenced_while_beats_fail(handle: ServerHandle, node: Node, client: Client,
                             break_beats: Callable[[bool], None], pool: ThreadPoolExecutor,
                             calls: list[bytes], caplog: pytest.LogCaptureFixture,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats made to fail: the node fences itself (said once), a request sent meanwhile
    waits in the box unclaimed while the node keeps polling; heartbeats written again: it resumes
    and serves it."""
    assert client.request("ep", b"before", timeout=30) == b"re:before"
    break_beats(True)
    wait_until(lambda: _fence_lines(caplog, FENCED), timeout=10, what="the node to fence itself")
    assert not node.runtime.lease.valid()
    polls = _polls_after(node, monkeypatch)
    during: Future[bytes] = pool.submit(client.request, "ep", b"during", timeout=60)
    provider = node.providers["ep"]
    assert isinstance(provider, Provider)
    box = handle.local(provider.lifecycle.layout.box)
    wait_until(lambda: any(p.name.startswith("req.") for p in box.iterdir()), timeout=10,
               what="the request to reach the box")
    start = len(polls)
    wait_until(lambda: len(polls) >= start + 10, timeout=10, what="ten polls of the fenced node")
    assert b"during" not in calls and not during.done()
    assert any(p.name.startswith("req.") for p in box.iterdir())  # unclaimed
    break_beats(False)
    assert during.result(timeout=30) == b"re:during"
    assert calls.count(b"during") == 1
    assert len(_fence_lines(caplog, FENCED)) == 1
    wait_until(lambda: _fence_lines(caplog, UNFENCED), timeout=5, what="the resumption to be logged")
    assert len(_fence_lines(caplog, UNFENCED)) == 1


def test_a_node_whose_heartbeat_cannot_be_written_stops_claiming_until_it_can(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any], pool: ThreadPoolExecutor,
        immutable: Callable[[Path, bool], None], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """state_dir's heartbeats made immutable under a running node: the failed write is logged
    once, other nodes see it dead after the lease, and it claims nothing meanwhile."""
    caplog.set_level(logging.WARNING)
    base = pyftpdlib_server.fresh_dir()
    calls: list[bytes] = []

    def config(node_id: str) -> Config:
        cfg = in_process_config(pyftpdlib_server, tmp_path, node_id,
                                {"ep": {"repository": f"{base}/ep", "poll_interval": 0.02}})
        return cfg.model_copy(update={"node": cfg.node.model_copy(
            update={"heartbeat_interval": 0.1, "lease": 1.0})})

    cfg = config("prov")
    node = Node(cfg, handlers={"ep": _echo_recording(calls)})
    things.append(node)
    node.start()
    client = Client(config("cli"))
    things.append(client)
    beats = Path(cfg.node.state_dir) / "heartbeats"

    def break_beats(on: bool) -> None:
        immutable(beats, on)
        if on:
            wait_until(lambda: is_dead(Path(cfg.node.state_dir), "prov", cfg.node.lease), timeout=10,
                       what="the node to look dead to others")

    _fenced_while_beats_fail(pyftpdlib_server, node, client, break_beats, pool, calls, caplog, monkeypatch)
    failed = [r for r in caplog.records if "heartbeat" in r.getMessage() and "cannot write" in r.getMessage()]
    assert len({r.getMessage() for r in failed}) <= 2  # once per distinct error, not per beat


def test_with_coordination_server_a_node_whose_beat_fails_stops_claiming_until_it_can(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any], pool: ThreadPoolExecutor,
        immutable: Callable[[Path, bool], None], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the heartbeat on the server: the server refuses to write it."""
    caplog.set_level(logging.WARNING)
    base = pyftpdlib_server.fresh_dir()
    calls: list[bytes] = []

    def config(node_id: str) -> Config:
        return Config.model_validate({
            "node": {"id": node_id, "state_dir": str(tmp_path / node_id / "state"),
                     "journal_dir": str(tmp_path / node_id / "journals"), "coordination": "server",
                     "coordination_dir": f"{base}/.cluster", "heartbeat_interval": 0.2, "lease": 2.0},
            "servers": {"srv": pyftpdlib_server.config(name="srv")},
            "endpoints": {"ep": {"server": "srv", "repository": f"{base}/ep", "poll_interval": 0.02}},
        })

    node = Node(config("prov"), handlers={"ep": _echo_recording(calls)})
    things.append(node)
    node.start()
    client = Client(config("cli"))
    things.append(client)
    beat = pyftpdlib_server.local(f"{base}/.cluster/heartbeats/prov")

    def break_beats(on: bool) -> None:
        immutable(beat, on)

    _fenced_while_beats_fail(pyftpdlib_server, node, client, break_beats, pool, calls, caplog, monkeypatch)


# --------------------------------------------------------------------------- a lease too tight


def test_check_warns_of_a_lease_too_tight_for_the_timeouts(pyftpdlib_server: ServerHandle,
                                                           tmp_path: Path) -> None:
    """lease 6 s, heartbeat 1 s, the server's timeout 30 s: one line naming the keys, their
    values and what to set; a lease that covers them: none."""
    def write(lease: float) -> Path:
        server = server_yaml(pyftpdlib_server, "FTPBC_LEASE_PW")
        server["timeout"] = 30
        path = tmp_path / f"lease{lease:g}.yaml"
        path.write_text(yaml.safe_dump({
            "node": {"state_dir": str(tmp_path / "state"), "journal_dir": str(tmp_path / "journals"),
                     "lease": lease, "heartbeat_interval": 1},
            "servers": {"slow": server}, "endpoints": {}}), encoding="utf-8")
        return path

    env = ftpbc_env({"FTPBC_LEASE_PW": str(pyftpdlib_server.password)})
    tight = run_ftpbc("check", "-c", str(write(6)), env=env)
    assert tight.returncode == 0, tight.stderr
    lines = [line for line in tight.stderr.splitlines() if "node.lease" in line]
    assert lines == [
        "ftpbc: check warning: node.lease 6 s is shorter than 3 x node.heartbeat_interval (1 s) + "
        "servers.slow.timeout (30 s) = 33 s: a live node on a slow link may lose its lease and its "
        "work; set node.lease to at least 33, or lower servers.slow.timeout (docs/cluster.md, sizing "
        "the lease)"], tight.stderr
    roomy = run_ftpbc("check", "-c", str(write(33)), env=env)
    assert roomy.returncode == 0 and "node.lease" not in roomy.stderr, roomy.stderr
    cfg = in_process_config(pyftpdlib_server, tmp_path, "n", {})
    node = cfg.node.model_copy(update={"lease": 6.0, "heartbeat_interval": 1.0})
    assert "set node.lease to at least 33," in (lease_warning(cfg.model_copy(update={"node": node})) or "")
    assert lease_warning(cfg) is None  # the defaults: lease 60, heartbeat 5, timeout 30
