"""Topics under crashes (docs/topics.md, "What is guaranteed"): a fanning-out node SIGKILLed at
each step, and three nodes fanning out 2,000 messages under the SIGKILL nemesis of
tests/test_chaos.py.

What must hold after recovery: every subscription holds exactly the messages it selects, each
once; none holds one it does not select; every published message is archived once in the
topic's incoming area; no staged copy, claim or pending journal operation is left.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from tests.chaos import (
    PASSWORD_ENV,
    REPO,
    Cluster,
    Nemesis,
    NodeProcess,
    load_client_config,
    read_trace,
    run_cli,
    trace_time,
)
from tests.servers.handle import ServerHandle
from tests.support import wait_until

TOPIC = "orders"
CRASH_SERVERS = ["pyftpdlib", "local"]


def make_topic_cluster(handle: ServerHandle, workdir: Path, subscriptions: dict[str, Any], *,
                       lease: float = 20.0, workers: int = 2, **topic: Any) -> Cluster:
    """A cluster (tests/chaos.py) whose configuration has one topic and no endpoint; ``topic``
    adds keys to the topic's configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    base = handle.fresh_dir()
    cluster = Cluster(workdir, handle.url, handle.password, handle.options, f"{base}/{TOPIC}", handle.root)
    server: dict[str, Any] = {"url": handle.url, **{k: str(v) if isinstance(v, Path) else v
                                                    for k, v in handle.options.items()}}
    if handle.password is not None:
        server["password_env"] = PASSWORD_ENV
    doc = {"node": {"state_dir": str(cluster.state_dir), "journal_dir": str(cluster.journal_dir),
                    "heartbeat_interval": 1.0, "lease": lease},
           "servers": {"s": server},
           "topics": {TOPIC: {"server": "s", "repository": cluster.repository, "poll_interval": 0.05,
                              "workers": workers, "drain_timeout": 10, "subscriptions": subscriptions,
                              **topic}}}
    cluster.config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return cluster


def bodies(cluster: Cluster, sub: str) -> Counter[bytes]:
    d = cluster.local("subscriptions", sub, "inbox")
    return Counter(p.read_bytes() for p in d.iterdir()) if d.is_dir() else Counter()


def leftovers(cluster: Cluster, subs: list[str]) -> dict[str, list[str]]:
    """Files in any stage, select or incoming box directory: none once everything is done."""
    dirs = ["incoming/inbox", "incoming/instage", "incoming/inselect",
            *(f"subscriptions/{s}/{d}" for s in subs for d in ("instage", "inselect")),
            *(f"fanout/{s}" for s in subs)]
    # ``.ftpbc-put-*``: the local transport's temporary file of a put its process was killed in
    # (file:// only; not a message, never renamed into place: a transport leftover, not ours)
    return {d: names for d in dirs
            if (names := [n for n in cluster.files(d) if not n.startswith(".ftpbc-put-")])}


def all_fanned_out(cluster: Cluster, count: int) -> bool:
    return (len(cluster.files("incoming/inarchive")) >= count and not cluster.files("incoming/inbox")
            and not cluster.files("incoming/inselect"))


def publish(cluster: Cluster, messages: dict[bytes, dict[str, Any]], subscriptions: dict[str, Any],
            node_id: str = "pub") -> None:
    """Make the subscriptions (before the messages: a subscription gets what is published after
    it), then publish."""
    with Client(load_client_config(cluster, node_id), connections=2) as client:
        for name, sub in subscriptions.items():
            client.create_subscription(TOPIC, name, selector=sub.get("selector"))
        for body, options in messages.items():
            client.publish(TOPIC, body, **options)


# ---------------------------------------------------------------------- a node killed at each step

SUBS = {"all": {}, "eu": {"selector": "region = 'eu'"}, "us": {"selector": "region = 'us'"}}
MESSAGES = {b"eu-1": {"properties": {"region": "eu"}}, b"us-1": {"properties": {"region": "us"}},
            b"eu-2": {"properties": {"region": "eu"}, "priority": 8}}
EXPECTED = {"all": Counter(list(MESSAGES)), "eu": Counter([b"eu-1", b"eu-2"]), "us": Counter([b"us-1"])}


@pytest.fixture(params=CRASH_SERVERS)
def crash_handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


def tx_ops(cluster: Cluster, node_id: str) -> list[list[str]]:
    """The events of each pending operation of ``node_id``'s transaction journal."""
    ops = cluster.pending().get(node_id, {}).get("transactions:", [])
    return [op.split(" ", 1)[1].split(">") for op in ops]


def has_commit(cluster: Cluster, node_id: str) -> bool:
    """Whether ``node_id`` left a committed fan-out (its commit record) for recovery."""
    return any("commit" in events for events in tx_ops(cluster, node_id))


def crashed_then_recovered(cluster: Cluster, crash_at: str, *, recovery_crash: str | None = None) -> None:
    """Start a node that is killed at ``crash_at`` (optionally a second start killed inside its
    recovery), then a clean one; wait until it fanned out everything, stop it."""
    node = NodeProcess(cluster, "n0")
    try:
        node.start(crash_at=crash_at)
        assert node.wait(60) == -9, f"node should have been killed at {crash_at}:\n{node.log.read_text()}"
        # Killed after its commit record, a fan-out is rolled forward; before it, back.
        committed = crash_at.startswith(("fanout.after-commit-record", "fanout.after-first-expose"))
        assert has_commit(cluster, "n0") == committed, cluster.pending()
        if recovery_crash is not None:
            node.start(crash_at=recovery_crash)
            assert node.wait(60) == -9, node.log.read_text()
        node.start()
        wait_until(lambda: all_fanned_out(cluster, len(MESSAGES)), timeout=60, what="everything fanned out")
        assert node.stop() == 0, node.log.read_text()[-3000:]
    finally:
        node.kill()


@pytest.mark.parametrize("point", [
    "claim.after-rename",            # claimed, nothing staged: returned by recovery, fanned out again
    "fanout.after-stage",            # every copy staged, no commit record: rolled back, fanned out again
    "fanout.after-commit-record",    # committed, claim not settled: settled and exposed by recovery
    "fanout.after-first-expose",     # one copy out, the others staged: the rest exposed by recovery
    "fanout.after-first-expose@2",   # the second message's first copy out
])
def test_a_node_killed_while_fanning_out_leaves_one_copy_per_matching_subscription(
        crash_handle: ServerHandle, tmp_path: Path, point: str) -> None:
    cluster = make_topic_cluster(crash_handle, tmp_path / "w", SUBS)
    publish(cluster, MESSAGES, SUBS)  # waiting in the topic before the first node starts
    crashed_then_recovered(cluster, point)
    assert {s: bodies(cluster, s) for s in SUBS} == EXPECTED
    assert len(cluster.files("incoming/inarchive")) == len(MESSAGES)
    assert leftovers(cluster, list(SUBS)) == {}
    assert cluster.pending() == {}


@pytest.mark.parametrize("recovery_point", ["recover.before-op", "recover.after-op"])
def test_a_recovery_killed_while_rolling_a_fan_out_forward_is_finished_by_the_next(
        crash_handle: ServerHandle, tmp_path: Path, recovery_point: str) -> None:
    cluster = make_topic_cluster(crash_handle, tmp_path / "w", SUBS)
    publish(cluster, MESSAGES, SUBS)
    crashed_then_recovered(cluster, "fanout.after-first-expose", recovery_crash=recovery_point)
    assert {s: bodies(cluster, s) for s in SUBS} == EXPECTED
    assert leftovers(cluster, list(SUBS)) == {}
    assert cluster.pending() == {}


def test_a_fan_out_left_to_recovery_never_takes_the_copies_of_the_next_one(crash_handle: ServerHandle,
                                                                           tmp_path: Path) -> None:
    """One node fans a message out twice: the first fan-out's rollback failed (its staging
    record left to recovery, the claim given back), the second, of the message claimed again,
    is killed after its commit record.  Recovery rolls the first back and the second forward:
    each matching subscription gets the message once, whatever the order it takes them in."""
    cluster = make_topic_cluster(crash_handle, tmp_path / "w", SUBS, workers=1)
    publish(cluster, {b"eu-1": {"properties": {"region": "eu"}}}, SUBS)
    out = subprocess.run([sys.executable, "-m", "tests.fanout_twice", cluster.to_json(), TOPIC], cwd=REPO,
                         env=cluster.env("n0", "fanout.after-commit-record"), capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == -9, out.stdout + out.stderr
    assert [events[-1] for events in tx_ops(cluster, "n0")] == ["staging", "commit"], cluster.pending()
    out = run_cli(cluster, "recover", node_id="n0")
    assert out.returncode == 0, out.stderr
    assert "committed: rolled forward, 2 of 2 member(s) exposed now" in out.stdout, out.stdout
    assert {s: bodies(cluster, s) for s in SUBS} == {"all": Counter([b"eu-1"]), "eu": Counter([b"eu-1"]),
                                                     "us": Counter()}
    assert len(cluster.files("incoming/inarchive")) == 1
    assert leftovers(cluster, list(SUBS)) == {}
    assert cluster.pending() == {}


@pytest.fixture(params=["pyftpdlib", "vsftpd", "local"])
def recover_handle(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


def test_ftpbc_recover_finishes_a_fan_out_without_serving(recover_handle: ServerHandle,
                                                          tmp_path: Path) -> None:
    """``ftpbc recover`` of a node killed after its commit record: the copies are exposed and the
    claim archived by recovery alone (no node runs afterwards)."""
    cluster = make_topic_cluster(recover_handle, tmp_path / "w", SUBS, workers=1)
    publish(cluster, {b"eu-1": {"properties": {"region": "eu"}}}, SUBS)
    node = NodeProcess(cluster, "n0")
    try:
        node.start(crash_at="fanout.after-commit-record")
        assert node.wait(60) == -9, node.log.read_text()
    finally:
        node.kill()
    assert cluster.files("incoming/inselect") and cluster.files("fanout/eu")
    out = run_cli(cluster, "recover", node_id="n0")
    assert out.returncode == 0, out.stderr
    assert "committed: rolled forward, 2 of 2 member(s) exposed now" in out.stdout, out.stdout
    assert bodies(cluster, "all") == bodies(cluster, "eu") == Counter([b"eu-1"])
    assert bodies(cluster, "us") == Counter()
    assert len(cluster.files("incoming/inarchive")) == 1
    assert leftovers(cluster, list(SUBS)) == {}
    assert cluster.pending() == {}


@pytest.mark.parametrize("point", [
    "fanout.after-intent",  # the copies named in the transaction journal, none uploaded
    "fanout.after-stage",   # every copy staged as well, still no commit record
])
def test_ftpbc_recover_rolls_back_a_fan_out_named_but_not_committed(recover_handle: ServerHandle,
                                                                     tmp_path: Path, point: str) -> None:
    """A node killed between its fan-out's ``staging`` record and the commit record: ``ftpbc
    recover`` removes every staged copy the record names (a copy never uploaded is fine),
    exposes none, returns the message to the topic's inbox; the next node fans it out once."""
    cluster = make_topic_cluster(recover_handle, tmp_path / "w", SUBS, workers=1)
    publish(cluster, {b"eu-1": {"properties": {"region": "eu"}}}, SUBS)
    node = NodeProcess(cluster, "n0")
    try:
        node.start(crash_at=point)
        assert node.wait(60) == -9, node.log.read_text()
        assert tx_ops(cluster, "n0") == [["staging"]], cluster.pending()
        staged = {s: cluster.files(f"fanout/{s}") for s in SUBS}
        uploaded = 2 if point == "fanout.after-stage" else 0
        assert sum(len(names) for names in staged.values()) == uploaded, staged
        assert len(cluster.files("incoming/inselect")) == 1
        out = run_cli(cluster, "recover", node_id="n0")
        assert out.returncode == 0, out.stderr
        assert f"not committed: rolled back, {uploaded} of 2 staged member(s) removed, none exposed" \
            in out.stdout, out.stdout
        assert {s: bodies(cluster, s) for s in SUBS} == {s: Counter() for s in SUBS}
        assert not cluster.files("incoming/inarchive")
        assert list(leftovers(cluster, list(SUBS))) == ["incoming/inbox"]  # the message, back
        assert cluster.pending() == {}
        node.start()
        wait_until(lambda: all_fanned_out(cluster, 1), timeout=60, what="the message fanned out")
        assert node.stop() == 0, node.log.read_text()[-3000:]
    finally:
        node.kill()
    assert {s: bodies(cluster, s) for s in SUBS} == {"all": Counter([b"eu-1"]), "eu": Counter([b"eu-1"]),
                                                     "us": Counter()}
    assert leftovers(cluster, list(SUBS)) == {}
    assert cluster.pending() == {}


# ---------------------------------------------------------------------- chaos

CHAOS_MESSAGES = 2000
CHAOS_SUBS = {"a": {}, "b": {}, "eu": {"selector": "region = 'eu'"},
              "urgent": {"selector": "JMSPriority >= 7"}}
NODES = ["n0", "n1", "n2"]


def read_if_there(path: Path) -> bytes | None:
    """The file's bytes; None if it went meanwhile (the nodes are still at work)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def whereabouts(cluster: Cluster, wanted: set[bytes], odd: list[str], events: list[str]) -> str:
    """What a diagnosis of a failed chaos run needs, about the messages whose bodies are
    ``wanted`` and the files ``odd`` (paths under the repository): every file on the server
    holding one of the bodies, then one timeline of the node log lines and journal records
    (the nodes' traces) naming their uuids or the transactions those records name, with the
    nemesis's kills."""
    root = cluster.local()
    found: dict[bytes, list[str]] = defaultdict(list)
    for path in root.rglob("*"):
        try:
            if path.is_file() and path.stat().st_size <= 64 and (body := path.read_bytes()) in wanted:
                found[body].append(str(path.relative_to(root)))
        except FileNotFoundError:
            continue  # gone meanwhile: the nodes may still be at work
    needles = {u for paths in [*found.values(), odd] for p in paths for u in UUID_RE.findall(p)}
    trace = read_trace(cluster, sorted(needles))
    needles |= {m for line in trace for m in re.findall(r" ([0-9a-f-]{36}\.tx) ", line)}
    timeline = []
    for line in read_trace(cluster, sorted(needles)):  # "<date> <time> <node> <journal> ..."
        date, clock, node, rest = line.split(" ", 3)
        timeline.append(f"{date} {clock} {node} journal {rest}")
    for path in cluster.workdir.glob("node-*.log"):
        node = path.stem.removeprefix("node-")
        for line in path.read_text(errors="replace").splitlines():
            if any(n in line for n in needles):  # "2026-11-28 01:32:45,321 INFO ..."
                timeline.append(f"{line[:19]}.{line[20:23]}000 {node} log {line[24:]}")
    for event in events:  # "<time.time()> kill+restart n0"
        stamp, _, what = event.partition(" ")
        timeline.append(f"{trace_time(float(stamp))} nemesis {what}")
    return "\n".join(["files:", *(f"  {b!r}: {sorted(paths)}" for b, paths in sorted(found.items())),
                      *(f"  odd: {p}" for p in odd), "timeline:", *(f"  {ln}" for ln in sorted(timeline))])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["local", "pyftpdlib"])
def test_chaos_three_nodes_fan_out_2000_messages_under_sigkill(kind: str, request: pytest.FixtureRequest,
                                                               tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    # Each node lives a few seconds at a time here: the nemesis kills one as soon as the last
    # one killed serves again.  A message returned n times is held 2^(n-1) x redelivery_delay by
    # every node from the moment that node first lists it: with the default delay, one returned
    # four times is held longer than a node lives and waits for the nemesis to stop, which waits
    # for it; one cut off max_deliveries times is filed as an error.  Short holds and a high
    # bound keep this test about fan-out, not redelivery.
    cluster = make_topic_cluster(handle, tmp_path / "w", CHAOS_SUBS, workers=4, redelivery_delay=0.1,
                                 max_deliveries=20)
    rng = random.Random(12)
    messages = {f"m{n}".encode(): {"properties": {"region": rng.choice(["eu", "us", "apac"]), "n": n},
                                   "priority": rng.randint(0, 9)} for n in range(CHAOS_MESSAGES)}
    expected = {"a": Counter(list(messages)), "b": Counter(list(messages)),
                "eu": Counter(b for b, o in messages.items() if o["properties"]["region"] == "eu"),
                "urgent": Counter(b for b, o in messages.items() if o["priority"] >= 7)}
    nodes = [NodeProcess(cluster, n, trace_journal=True) for n in NODES]
    published = [0]
    started = time.monotonic()
    # Each restarted node serves again before the next kill, which then comes soon: paced by the
    # machine, the nemesis is as harsh on a loaded one as on an idle one, instead of killing
    # nodes that never got to serve (every message then waits, and the test times out).
    nemesis = Nemesis(nodes, lambda: published[0] / CHAOS_MESSAGES, {}, seed=7, min_gap=0.1, max_gap=0.6,
                      wait_ready=30)
    try:
        for node in nodes:
            node.start()
        wait_until(lambda: all(n.ready() for n in nodes), timeout=60, what="three nodes serving")
        nemesis.start()
        with Client(load_client_config(cluster, "pub"), connections=2) as client:
            for body, options in messages.items():
                client.publish(TOPIC, body, **options)
                published[0] += 1
        # at least five kills even on a machine fast enough to be done sooner (each one after the
        # node killed before it serves again: a while on a loaded machine)
        wait_until(lambda: nemesis.log.kills >= 5, timeout=150, interval=0.2, what="five kills")
        try:
            wait_until(lambda: all_fanned_out(cluster, CHAOS_MESSAGES), timeout=180, interval=0.2,
                       what="every message fanned out")
        except BaseException:  # pytest's Failed: say what is stuck, and why, before it propagates
            stuck = [f"incoming/{d}/{n}" for d in ("inbox", "inselect")
                     for n in cluster.files(f"incoming/{d}")][:5]
            print(f"not fanned out, among others: {stuck}")
            print(whereabouts(cluster, {body for p in stuck if (body := read_if_there(cluster.local(p)))},
                              stuck, nemesis.log.events))
            raise
        nemesis.halt()
        assert nemesis.error is None, nemesis.error
        # A node the nemesis restarted last must be up (its signal handlers set) to drain on SIGTERM.
        wait_until(lambda: all(n.ready() for n in nodes), timeout=60, what="every node serving again")
        codes = {n.node_id: n.stop() for n in nodes}
    finally:
        nemesis.halt()
        for node in nodes:
            node.kill()
    elapsed = time.monotonic() - started
    got = {s: bodies(cluster, s) for s in CHAOS_SUBS}
    twice = {s: [b for b, c in counts.items() if c > 1][:5] for s, counts in got.items()}
    missing = {s: sorted(set(expected[s]) - set(got[s]))[:5] for s in CHAOS_SUBS}
    extra = {s: sorted(set(got[s]) - set(expected[s]))[:5] for s in CHAOS_SUBS}
    print(f"topic chaos {kind}: {CHAOS_MESSAGES} messages, {nemesis.log.kills} kills, {elapsed:.1f} s, "
          f"copies {sum(sum(c.values()) for c in got.values())}")
    left = leftovers(cluster, list(CHAOS_SUBS))
    if got != expected or left:
        # Everything about the messages concerned, before the first assertion stops the test
        # (the run's files stay under its basetemp: node logs, journal traces, the server's tree).
        wanted = {b for s in CHAOS_SUBS for b in (set(expected[s]) ^ set(got[s])) | set(twice[s])}
        odd = [f"{d}/{n}" for d, names in left.items() for n in names]
        print(f"twice: {twice}\nmissing: {missing}\nextra: {extra}\nleftovers: {left}")
        print(whereabouts(cluster, wanted, odd, nemesis.log.events))
    assert nemesis.log.kills >= 5
    assert codes == dict.fromkeys(NODES, 0), codes
    assert all(not v for v in twice.values()), f"copied twice: {twice}"
    assert all(not v for v in missing.values()), f"missing: {missing}"
    assert all(not v for v in extra.values()), f"not selected but copied: {extra}"
    assert got == expected
    assert len(cluster.files("incoming/inarchive")) == CHAOS_MESSAGES
    assert leftovers(cluster, list(CHAOS_SUBS)) == {}
    assert cluster.pending() == {}
    assert cluster.nonempty_journal_files() == []
