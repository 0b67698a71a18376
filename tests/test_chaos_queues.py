"""Chaos over queue semantics: priorities, expiring messages, client-ack pull consumers and
transacted sends, under the nemesis of tests/test_chaos.py.

Three ``ftpbc serve`` nodes serve ``echo`` (requests of random priority 0-9, checked by the
checker of tests/chaos.py); two pull-consumer *processes* (:func:`consumer_main`) take the
one-way endpoint ``events`` with ``client.consume(..., ack="client")``, acknowledging every one
to three messages; producers in this process send one-way messages with ttls from "always too
late" to a few seconds, and transactions of two to four one-way messages (one in five rolled
back on purpose).  The nemesis SIGKILLs a random node *or consumer* every 0.5 to 2 s and
restarts it at once (same identity: it recovers its own journal), restarts the FTP server once
and cuts every connection once.

What docs/queues.md promises, and is asserted here exactly:

* requests: each answered exactly once (lost 0, twice 0), as in tests/test_chaos.py;
* one-way messages ("Pull consumers", "What is guaranteed"): an acknowledged message is archived
  once and never delivered again, and an unacknowledged one is never lost.  So every message
  sent ends in exactly one place, ``inarchive`` (acknowledged once) or ``inexpired``; none is
  acknowledged twice, none acknowledged and also expired.  A delivery that was *not*
  acknowledged (its consumer killed or its block left first) comes back: such redeliveries are
  at-least-once by design and counted apart, never as duplicates;
* expiry ("Expiry"): a message is delivered only if it had not expired when it was claimed.
  The consumer processes log, per delivery, the time of the claim's expiry check (the wrapped
  ``Lifecycle.is_expired``, read with the lifecycle's own clock just before it reads it), and
  it must be before the expiration in the name (kept to the millisecond): no slack.  How many
  expired while being read, after the check, is reported (it is not a violation: the check is
  at the claim);
* transactions ("Transactions"): all members or none, after recovery; a transaction rolled back
  has no member anywhere.

At the end every stage, box and select directory of both endpoints is empty and every journal
(nodes, consumers, producers) is empty.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.errors import FtpbcError
from tests.chaos import (
    ENDPOINT,
    FLAKY_POLL_LOCK,
    HANDLER,
    MIN_KILLS,
    PASSWORD_ENV,
    REPO,
    TRANSIENT,
    Cluster,
    Ledger,
    Nemesis,
    NodeProcess,
    check,
    client_loop,
    forensics,
    load_client_config,
    run_cli,
)
from tests.servers.handle import ServerHandle
from tests.support import wait_until

EVENTS = "events"
REQUESTS = 600
ONEWAY = 200
TRANSACTIONS = 50
#: the one-way and transaction producers' pace (seconds between two sends, at random up to it):
#: about what two consumer processes take on a loaded 2-core box, spread over the requests' run,
#: so that the consumers keep up except while killed or the server restarts
ONEWAY_PACE = 0.5
TX_PACE = 1.0
NODES = ["n0", "n1", "n2"]
CONSUMERS = ["k0", "k1"]
REQUEST_CLIENTS = 4
ONEWAY_PRODUCERS = ["p0", "p1"]
TX_PRODUCER = "t0"
#: one-way ttls: 0.001 s is always too late (expires in flight), the longer ones expire only
#: while consumers are behind or restarting
TTLS = [0.001, 0.3, 1.0, 3.0, 10.0]

CONSUMER_ENV = "CHAOSQ_CONSUMER"
CONFIG_ENV = "CHAOSQ_CONFIG"
LEDGER_ENV = "CHAOSQ_LEDGER"
CONSUMER_MAIN = "from tests.test_chaos_queues import consumer_main; consumer_main()"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FILED = {"inexpired", "indead", "outexpired", "outdead"}


def _us(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


# ---------------------------------------------------------------------- the consumer process

def _append(path: str, line: str) -> None:
    """One line, one ``write`` on an O_APPEND file, fsynced: a SIGKILL leaves whole lines."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def consumer_main() -> None:
    """A client-ack pull consumer of ``events`` until SIGTERM; its ledger lines:

    ``deliver <uuid> <check us> <delivered us> <expiration ms|-> <delivery count> <body>``
    ``ack <uuid> <body>`` once ``ack()`` settled it as acknowledged.
    """
    from ftpbc.client import Client
    from ftpbc.exchange.lifecycle import Lifecycle

    node_id, config, ledger = os.environ[CONSUMER_ENV], os.environ[CONFIG_ENV], os.environ[LEDGER_ENV]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    checked: dict[str, datetime] = {}
    original = Lifecycle.is_expired

    def is_expired(self: Lifecycle, c: Any) -> bool:
        # Read just before the lifecycle reads its clock (the same clock): a lower bound of the
        # instant the claim was found unexpired.  The last check of a uuid before its delivery
        # is the one after the claim (one consumer thread, nothing lists in between).
        checked[c.uuid] = datetime.now(UTC)
        return original(self, c)

    Lifecycle.is_expired = is_expired  # type: ignore[method-assign]
    rng = random.Random()
    acked: set[str] = set()

    def settle(held: list[tuple[Any, str]]) -> None:
        for d, body in held:
            if d.state == "acked" and d.uuid not in acked:
                acked.add(d.uuid)
                _append(ledger, f"ack {d.uuid} {body}")

    while True:
        try:
            # Replays this identity's journal: claims a killed run left are returned, acks it
            # had recorded are finished.
            client = Client.from_config(config, node_id=node_id)
            break
        except FtpbcError as exc:  # the server restarting
            print(f"consumer start: {type(exc).__name__}: {exc}", flush=True)
            if stopping.wait(0.2):
                return
    with client:
        print(f"consuming as {node_id}", flush=True)
        while not stopping.is_set():
            held: list[tuple[Any, str]] = []
            try:
                with client.consume(EVENTS, ack="client", timeout=0.5) as deliveries:
                    batch = rng.randint(1, 3)
                    for m in deliveries:
                        exp = m.headers.expiration
                        exp_ms = "-" if exp is None else str((exp - EPOCH) // timedelta(milliseconds=1))
                        seen = checked.get(m.uuid)
                        body = m.body.decode()
                        _append(ledger, f"deliver {m.uuid} {_us(seen) if seen else -1} "
                                        f"{_us(datetime.now(UTC))} {exp_ms} {m.delivery_count} {body}")
                        held.append((m, body))
                        if len(held) >= batch:
                            m.ack()  # client mode: this one and every one received before it
                            settle(held)
                            held, batch = [], rng.randint(1, 3)
                        if stopping.is_set():
                            break
                    # idle (0.5 s without a message) or stopping: the block's end gives the
                    # unacknowledged ones back, delivery count raised
            except FtpbcError as exc:
                print(f"consumer error: {type(exc).__name__}: {exc}", flush=True)
                stopping.wait(0.2)  # the server restarting: try again shortly
            finally:
                settle(held)  # give_back finishes an ack already recorded


class ConsumerProcess(NodeProcess):
    """A :func:`consumer_main` subprocess with a fixed identity, restartable after a kill: the
    nemesis kills and restarts it as it does a node."""

    def __init__(self, cluster: Cluster, node_id: str) -> None:
        super().__init__(cluster, node_id)
        self.log = cluster.workdir / f"consumer-{node_id}.log"
        self.ledger = cluster.workdir / f"consumer-{node_id}.ledger"

    def start(self, crash_at: str | None = None, **env: str) -> None:
        # Not cluster.env(node_id): that would log this process's acks as handler records.
        child_env = self.cluster.env(None, **{CONSUMER_ENV: self.node_id, LEDGER_ENV: str(self.ledger),
                                              CONFIG_ENV: str(self.cluster.config)})
        with open(self.log, "ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen([sys.executable, "-c", CONSUMER_MAIN], cwd=REPO,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=child_env)
        self.starts += 1

    def ready(self) -> bool:
        with open(self.log, "rb") as fh:
            fh.seek(self._log_offset)
            return b"consuming as " in fh.read()


# ---------------------------------------------------------------------- configuration

def write_config(workdir: Path, handle: ServerHandle, base: str) -> Cluster:
    """One configuration for everyone: ``echo`` served by :data:`tests.chaos.HANDLER`, and
    ``events``, which no node serves (its consumers are the pull consumers)."""
    server: dict[str, Any] = {"url": handle.url, **{k: str(v) if isinstance(v, Path) else v
                                                     for k, v in handle.options.items()}}
    if handle.password is not None:
        server["password_env"] = PASSWORD_ENV
    doc = {
        # The lease outlasts a restart (see tests/chaos.make_cluster): killed processes recover
        # their own claims, so a recorded result or ack is never undone by a peer's sweep.
        "node": {"state_dir": str(workdir / "state"), "journal_dir": str(workdir / "journals"),
                 "heartbeat_interval": 1.0, "lease": 20.0, "durable_journal": True},
        "servers": {"s": server},
        "endpoints": {
            ENDPOINT: {"server": "s", "repository": f"{base}/{ENDPOINT}", "handler": HANDLER,
                       "poll_interval": 0.05, "workers": 4, "timeout": 60, "drain_timeout": 10,
                       "uncollected_after": 3600},
            # Deliveries given back unacknowledged raise the count: never run out of them here
            # (a message in inerror would be neither acknowledged nor expired).
            EVENTS: {"server": "s", "repository": f"{base}/{EVENTS}", "poll_interval": 0.05,
                     "timeout": 60, "max_deliveries": 1000, "redelivery_delay": 0.05},
        },
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "ftpbc.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return Cluster(workdir, handle.url, handle.password, handle.options, f"{base}/{ENDPOINT}", handle.root)


# ---------------------------------------------------------------------- producers

@dataclass
class Sent:
    """What the one-way and transaction producers did."""

    oneway: dict[str, float] = field(default_factory=dict)  # body -> ttl, send returned
    oneway_indeterminate: dict[str, float] = field(default_factory=dict)  # send raised
    committed: dict[str, list[str]] = field(default_factory=dict)  # tx id -> member bodies
    rolled_back: dict[str, list[str]] = field(default_factory=dict)
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def oneway_producer(cluster: Cluster, node_id: str, bodies: Iterator[str], sent: Sent,
                    stop: threading.Event) -> None:
    from ftpbc.client import Client

    rng = random.Random()
    with Client(load_client_config(cluster, node_id), connections=2) as client:
        for body in bodies:
            if stop.wait(rng.uniform(0, ONEWAY_PACE)):  # pacing, not a synchronisation
                return
            ttl = rng.choice(TTLS)
            try:
                client.send(EVENTS, body, ttl=ttl, priority=rng.randint(0, 9))
            except FtpbcError:
                # Exposed or not: its producer's recovery (at the end) decides; checked as such.
                with sent.lock:
                    sent.oneway_indeterminate[body] = ttl
                    sent.errors += 1
                continue
            with sent.lock:
                sent.oneway[body] = ttl


class Abandon(Exception):
    """Raised in a transaction's block to roll it back on purpose."""


def tx_producer(cluster: Cluster, count: int, sent: Sent, stop: threading.Event,
                progress: list[int]) -> None:
    """``count`` transactions of 2-4 one-way messages, one in five rolled back on purpose;
    ``progress[0]`` counts the finished ones."""
    from ftpbc.client import Client

    rng = random.Random()
    with Client(load_client_config(cluster, TX_PRODUCER), connections=2) as client:
        for i in range(count):
            if stop.wait(rng.uniform(0, TX_PACE)):  # pacing, not a synchronisation
                return
            n = rng.randint(2, 4)
            bodies = [f"tx:{i}:{j}/{n}" for j in range(n)]
            abandon = rng.random() < 0.2
            tx = client.transaction()
            try:
                with tx:
                    for body in bodies:
                        tx.send(EVENTS, body, priority=rng.randint(0, 9))
                    if abandon:
                        raise Abandon
            except Abandon:
                pass
            except FtpbcError:
                with sent.lock:
                    sent.errors += 1
            if tx.state == "open":  # commit failed before its record: never committed
                with contextlib.suppress(FtpbcError):  # what a failed rollback leaves, recovery removes
                    tx.rollback()
            # Committed (its record written) but not all exposed: a retried commit finishes it.
            deadline = time.monotonic() + 60
            while tx.state == "committed" and time.monotonic() < deadline and not stop.is_set():
                try:
                    tx.commit()
                except FtpbcError:
                    stop.wait(0.2)  # the server is restarting: retry shortly
            with sent.lock:
                if tx.state == "done":
                    sent.committed[tx.id] = bodies
                elif tx.state == "rolled back":
                    sent.rolled_back[tx.id] = bodies
                else:
                    raise AssertionError(f"transaction {tx.id} left {tx.state}")
                progress[0] += 1


# ---------------------------------------------------------------------- the checks

@dataclass
class Delivery:
    uuid: str
    checked_us: int
    delivered_us: int
    expiration_ms: int | None
    count: int
    body: str


def read_consumer_ledgers(paths: list[Path]) -> tuple[list[Delivery], Counter[str], dict[str, str]]:
    """Deliveries, acks per body, and uuid -> body of every consumer's ledger."""
    deliveries: list[Delivery] = []
    acks: Counter[str] = Counter()
    bodies: dict[str, str] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if parts[0] == "deliver":
                _, uuid, checked, delivered, exp, count, body = parts
                deliveries.append(Delivery(uuid, int(checked), int(delivered),
                                           None if exp == "-" else int(exp), int(count), body))
                bodies[uuid] = body
            elif parts[0] == "ack":
                acks[parts[2]] += 1
    return deliveries, acks, bodies


def server_bodies(handle: ServerHandle, base: str, directory: str) -> Counter[str]:
    """The bodies of the messages in one of ``events``'s directories (reason files aside)."""
    d = handle.local(f"{base}/{EVENTS}/{directory}")
    if not d.is_dir():
        return Counter()
    return Counter(p.read_bytes().decode() for p in d.iterdir() if not p.name.endswith(".reason"))


def events_files(handle: ServerHandle, base: str, directory: str) -> list[str]:
    d = handle.local(f"{base}/{EVENTS}/{directory}")
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


# ---------------------------------------------------------------------- the test

@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_chaos_over_queue_semantics(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    cluster = write_config(tmp_path / "w", handle, base)
    started = time.monotonic()
    nodes = [NodeProcess(cluster, n) for n in NODES]
    consumers = [ConsumerProcess(cluster, k) for k in CONSUMERS]
    for node in nodes:
        node.extra_env = {"FTPBC_FAIL": FLAKY_POLL_LOCK}  # one poll lock in twenty fails (ENOLCK)
    everyone: list[NodeProcess] = [*nodes, *consumers]
    for p in everyone:
        p.start()

    ledger, sent = Ledger(), Sent()
    stop = threading.Event()
    lock = threading.Lock()
    requests = iter(range(REQUESTS))
    oneway = iter(range(ONEWAY))
    done = [0, 0]  # requests, one-way messages
    tx_done = [0]
    errors: list[BaseException] = []

    def request_bodies() -> Iterator[bytes]:
        while True:
            with lock:
                i = next(requests, None)
            if i is None:
                return
            nemesis.await_due(i / REQUESTS)
            yield f"{i}:{random.getrandbits(64):016x}".encode()
            with lock:
                done[0] += 1

    def oneway_bodies() -> Iterator[str]:
        while True:
            with lock:
                i = next(oneway, None)
            if i is None:
                return
            nemesis.await_due(i / ONEWAY)
            yield f"ow:{i}:{random.getrandbits(32):08x}"
            with lock:
                done[1] += 1

    def priority(_: bytes) -> dict[str, Any]:
        return {"priority": random.randint(0, 9)}

    def guarded(target: Any, *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # reported by the test, never swallowed
                errors.append(exc)
        return threading.Thread(target=run, daemon=True)

    threads = [guarded(client_loop, cluster, f"c{k}", request_bodies(), ledger, stop, 90.0, priority)
               for k in range(REQUEST_CLIENTS)]
    threads += [guarded(oneway_producer, cluster, p, oneway_bodies(), sent, stop) for p in ONEWAY_PRODUCERS]
    threads.append(guarded(tx_producer, cluster, TRANSACTIONS, sent, stop, tx_done))

    def progress() -> float:
        # Only the streams that wait for the nemesis (await_due): with the transactions counted
        # too, a client waiting at a mark would wait on the transaction producer as well.
        return min(done[0] / REQUESTS, done[1] / ONEWAY)

    nemesis = Nemesis(everyone, progress, {0.3: ("restart-server", handle.controls["restart"]),
                                           0.6: ("drop-connections", handle.controls["drop_connections"])},
                      min_gap=0.5, max_gap=2.0)
    try:
        nemesis.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "a producer is stuck"
        assert errors == [], errors
        nemesis.halt()
        assert nemesis.error is None, nemesis.error
        for p in everyone:
            if not p.alive:
                p.start()  # one killed last recovers its journal before it stops
        # The producers' journals: a send cut by the server is rolled back or found exposed,
        # before the consumers stop, so whatever it exposed is drained too.
        for node_id in [*ONEWAY_PRODUCERS, TX_PRODUCER]:
            r = run_cli(cluster, "recover", node_id=node_id)
            assert r.returncode == 0, r.stderr
        # Drained: every one-way message acknowledged or expired, nothing claimed or staged.
        wait_until(lambda: not any(events_files(handle, base, d) for d in ("inbox", "inselect", "instage")),
                   timeout=120, interval=0.1, what="the consumers to drain events")
    finally:
        stop.set()
        nemesis.halt()
        for p in everyone:
            if not p.alive:
                p.start()
        try:
            # A process restarted a moment ago has no SIGTERM handler yet: stop it once it runs.
            wait_until(lambda: all(p.ready() for p in everyone), timeout=60, what="every process to run")
        finally:
            # SIGTERM: nodes drain, consumers give back what they hold; SIGKILL after 30 s
            codes = {p.node_id: p.stop() for p in everyone}
    assert all(code == 0 for code in codes.values()), codes
    for node_id in [*NODES, *CONSUMERS, *ONEWAY_PRODUCERS, TX_PRODUCER,
                    *(f"c{k}" for k in range(REQUEST_CLIENTS))]:
        r = run_cli(cluster, "recover", node_id=node_id)
        assert r.returncode == 0, r.stderr

    # requests: the checker of tests/test_chaos.py (lost, twice, journals, echo's directories)
    v = check(cluster, ledger)
    # one-way messages and transactions
    deliveries, acks, _ = read_consumer_ledgers([c.ledger for c in consumers])
    archived = server_bodies(handle, base, "inarchive")
    expired = server_bodies(handle, base, "inexpired")
    filed_elsewhere = {d: events_files(handle, base, d) for d in ("inerror", "indead")}
    # inexpired and indead are where messages are filed, checked above: not transient here
    events_left = {d: names for d in TRANSIENT
                   if d not in FILED and (names := events_files(handle, base, d))}
    tx_members = {b: tx for tx, bodies in sent.committed.items() for b in bodies}
    rolled_back = {b for bodies in sent.rolled_back.values() for b in bodies}
    known = set(sent.oneway) | set(sent.oneway_indeterminate) | set(tx_members) | rolled_back

    oneway_lost = [b for b in sent.oneway if archived[b] + expired[b] == 0]
    acked_twice = sorted(b for b in known if archived[b] > 1 or acks[b] > 1)
    expired_twice = sorted(b for b in known if expired[b] > 1)
    acked_and_expired = sorted(b for b in known if expired[b] and (archived[b] or acks[b]))
    indeterminate_present = sum(1 for b in sent.oneway_indeterminate if archived[b] + expired[b])
    tx_partial = sorted(tx for tx, bodies in sent.committed.items() if any(archived[b] != 1 for b in bodies))
    rolled_back_seen = sorted(b for b in rolled_back if archived[b] or expired[b]
                              or any(d.body == b for d in deliveries))
    seen = set(archived) | set(expired) | {d.body for d in deliveries}
    unexpected = sorted(b for b in seen if b not in known)
    # Expiry, as promised: not expired when its claim was checked (no slack: the name keeps
    # milliseconds, the check's clock microseconds).
    late = [d for d in deliveries if d.expiration_ms is not None and d.checked_us >= d.expiration_ms * 1000]
    unchecked = [d for d in deliveries if d.checked_us < 0]
    read_after_expiry = sum(1 for d in deliveries
                            if d.expiration_ms is not None and d.delivered_us >= d.expiration_ms * 1000)
    delivered = Counter(d.body for d in deliveries)
    redelivered = sum(n - 1 for n in delivered.values() if n > 1)
    acks_unrecorded = sum(1 for b in archived if not acks[b])  # consumer killed between ack and its log line

    report = {
        "server": kind, "seconds": round(time.monotonic() - started, 1), "kills": nemesis.log.kills,
        "server_restarts": nemesis.log.server_restarts, "connection_cuts": nemesis.log.connection_cuts,
        "consumer_kills": sum(p.starts - 1 for p in consumers),
        "requests": v.requests, "answered": v.answered, "lost": len(v.lost),
        "answered_twice": len(v.answered_twice),
        "oneway_sent": len(sent.oneway), "oneway_indeterminate": len(sent.oneway_indeterminate),
        "indeterminate_present": indeterminate_present,
        "acked": sum(archived.values()), "expired": sum(expired.values()), "oneway_lost": len(oneway_lost),
        "delivered_twice_acked": len(acked_twice), "redelivered_unacked": redelivered,
        "acks_unrecorded": acks_unrecorded, "deliveries": len(deliveries),
        "delivered_after_expiry": len(late), "expired_while_read": read_after_expiry,
        "transactions_committed": len(sent.committed), "transactions_rolled_back": len(sent.rolled_back),
        "transactions_partial": len(tx_partial), "producer_errors": sent.errors,
    }
    print(f"chaos queues {kind}: {report}")
    assert nemesis.log.kills >= MIN_KILLS
    assert nemesis.log.server_restarts == 1 and nemesis.log.connection_cuts == 1
    assert sum(p.starts for p in consumers) > len(consumers), "no consumer was killed"
    # requests
    assert v.requests >= REQUESTS
    bad = v.lost[:3] + v.answered_twice[:3] + v.unexpected[:3]
    assert v.lost == [] and v.answered_twice == [] and v.unexpected == [], \
        (v.lost[:3], v.answered_twice[:3], v.unexpected[:3], forensics(cluster, ledger, bad))
    assert v.rolled_back_present == [] and v.recorded_twice == []
    assert v.answered + v.indeterminate_absent == v.requests
    # one-way: each sent exactly once in inarchive or inexpired; acked at most once, never also expired
    assert oneway_lost == [], oneway_lost[:5]
    assert acked_twice == [] and expired_twice == [] and acked_and_expired == [], \
        (acked_twice[:5], expired_twice[:5], acked_and_expired[:5])
    assert unexpected == [], unexpected[:5]
    assert filed_elsewhere == {"inerror": [], "indead": []}, filed_elsewhere
    assert late == [] and unchecked == [], (late[:5], unchecked[:5])
    assert sum(expired.values()) > 0 and sum(archived.values()) > 0, report  # both paths taken
    # transactions: all or none
    assert tx_partial == [] and rolled_back_seen == [], (tx_partial[:5], rolled_back_seen[:5])
    assert len(sent.committed) + len(sent.rolled_back) == TRANSACTIONS
    # nothing left anywhere, every journal empty (nodes, consumers, producers, clients)
    assert v.leftovers == {} and events_left == {}, (v.leftovers, events_left)
    assert v.pending == {} and v.journal_files_nonempty == []


__all__ = ["consumer_main"]
