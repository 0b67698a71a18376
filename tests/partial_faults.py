"""Partial faults across hosts: the instrumented node, the fault nemesis, the clients, the checker.

Used by ``tests/test_partial_faults.py`` (docs/faults.md).  Builds on ``tests/chaos.py``: the
same :class:`~tests.chaos.Cluster` and :class:`~tests.chaos.NodeProcess`, the same handler and
invocation log, to which this module adds, inside the nodes, two lines per response upload:

``staging <uuid> <node>``
    before a node uploads a response into the out stage directory;
``staged <uuid> <node>``
    once that upload has returned: from then on the result is on the server.

A *run* is one ``start`` line; the ``recorded``/``staging``/``staged`` lines of the same uuid on
the same node belong to the latest run there (a node's recovery after a restart stages the result
its killed predecessor recorded).  A *re-run* is any run after a message's first.  Each re-run
has a *cut*: the moment the message was taken from the earlier run's node, which is when a
sweeper logged "returned <request> claimed by dead node <node>", else (the node's own recovery
returned it) the re-run's start.  The checker (:func:`judge`) requires:

* every request acknowledged to a client (or whose failed submit its journal shows exposed) was
  answered exactly once with ``re:<body>``, or failed to its caller with a clear error
  (:class:`~ftpbc.errors.RemoteHandlerError`, :class:`~ftpbc.errors.RequestExpired`), and has at
  most one response on the server; a submit the journal rolled back is nowhere on the server;
* no handler started again once its result was on the server: from the server's own log (vsftpd,
  in its order), a request taken back from its holder after the holder's whole response upload
  may be served elsewhere only by delivering that staged reply (:func:`rerun_after_staged`);
* no two responses to one request put in the outbox (server log);
* every re-run attributed to a fault that hit the earlier run's node (or the server) between that
  run's start and the cut;
* once the clients are done, every box, stage and select directory empty (waited for, with a
  deadline, while the nodes still run), then, the nodes stopped, every journal empty;
* every node beating again after each fault (the nemesis waits for it, with a deadline).
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ftpbc.errors import (
    FtpbcError,
    RemoteHandlerError,
    RequestExpired,
    RequestTimeout,
    TransportError,
    UnknownRequest,
)
from ftpbc.exchange.lifecycle import HOOKS
from tests.chaos import (
    ENDPOINT,
    LOG_ENV,
    Cluster,
    Ledger,
    NodeProcess,
    _log_line,
    _recover_own_send,
    _uuid_of,
    load_client_config,
    server_census,
)
from tests.chaos import handler as _chaos_handler
from tests.faults_net import LinkFault, RelayProcess, set_link

HANDLER = "tests.partial_faults:handler"
#: how long the nodes may take to serve at the start: a start-up that fails (a login through the
#: relay that times out on a loaded machine) is tried again after 1, 2, 4, 8, 16 s
START_TIMEOUT = 120.0
handler = _chaos_handler

# ---------------------------------------------------------------------- inside a node


def _response_stage(path: str) -> str | None:
    """The uuid of a response uploaded to the out stage directory, else None."""
    directory, _, name = path.rpartition("/")
    if not directory.endswith("/outstage"):
        return None
    return _uuid_of(name, "resp.")


def _log_staging(path: str) -> None:
    uid = _response_stage(path)
    if uid is not None:
        _log_line("staging", uid)


def _log_staged(path: str) -> None:
    uid = _response_stage(path)
    if uid is not None:
        _log_line("staged", uid)


if os.environ.get(LOG_ENV):
    # Only inside the instrumented nodes (tests/chaos.py hooks served_durable there likewise).
    HOOKS.before_reply_staged.append(_log_staging)
    HOOKS.after_reply_staged.append(_log_staged)


# ---------------------------------------------------------------------- configuration


def route_configs(cluster: Cluster, relay: RelayProcess, *, server_timeout: float,
                  lock_expiry: float) -> None:
    """Point each node's config at its own relay route (the clients' at ``clients``), with the
    instrumented handler, ``server_timeout`` per command and ``lock_expiry`` for the poll locks."""
    configs = {"clients": cluster.config, **{n: h.config for n, h in cluster.hosts.items()}}
    for route, path in configs.items():
        doc = yaml.safe_load(path.read_text())
        server = doc["servers"]["s"]
        scheme, rest = server["url"].split("://", 1)
        login, _, tail = rest.partition("@")
        base = tail.partition("/")[2]
        server["url"] = f"{scheme}://{login}@{relay.listen}:{relay.ports[route]}/{base}"
        server["timeout"] = server_timeout
        doc["node"]["lock_expiry"] = lock_expiry
        doc["endpoints"][ENDPOINT]["handler"] = HANDLER
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


def coordination_dir(cluster: Cluster) -> str:
    return str(yaml.safe_load(cluster.config.read_text())["node"]["coordination_dir"])


# ---------------------------------------------------------------------- the nemesis


@dataclass(frozen=True)
class Step:
    """One fault: ``kind`` on ``target`` (a node id, or ``server``) for ``hold`` seconds."""

    kind: str
    target: str
    hold: float


@dataclass
class FaultEvent:
    kind: str
    target: str
    began: float
    healed: float = 0.0
    #: when every node had beaten again after the heal (0: not within the deadline)
    recovered: float = 0.0
    #: an aimed fault: the server log line it waited for
    note: str = ""

    def hits(self, node: str) -> bool:
        return self.target in (node, "server")

    def label(self) -> str:
        return f"{self.kind} {self.target}"


#: node link faults (a node's route of the relay) and the server's (every route at once)
NODE_LINK = LinkFault(delay=0.03, jitter=0.05, stall_p=0.03, stall_min=0.2, stall_max=1.2, reset_p=0.003)
SERVER_LINK = LinkFault(delay=0.02, jitter=0.03, stall_p=0.02, stall_min=0.2, stall_max=1.0, reset_p=0.002)


#: an aimed fault's node link while it waits for its moment: a completed transfer's ``226``
#: reaches the node this much after the server sent it, so the fault lands before the node reads
#: it.  Only that reply: a node whose every reply is slowed loses every poll lock race to the
#: others (a lock is taken by a rename, two commands, which the others complete in between), so
#: it claims nothing, uploads nothing, and the fault never finds its moment.
AIM_HOLD = LinkFault(held_replies=("226 Transfer complete",), hold=0.3)
#: how long an aimed fault waits for its moment before it strikes anyway
AIM_TIMEOUT = 20.0


class Faults:
    """The faults, one call each: inject, hold, heal.  Knows the nodes, their hosts, the relay and
    the server (and its log, where an aimed fault finds its moment).

    A kind ending in ``-after-upload`` is aimed: the ``226`` replies to the node's transfers are
    held back (AIM_HOLD), and the fault strikes as soon as the server logs a whole response
    upload by that node, so before the node has read that ``226`` and renamed its claim to the
    archive: its result is on the server, and it is cut off before committing it.
    """

    def __init__(self, nodes: dict[str, NodeProcess], netns: dict[str, str], relay: RelayProcess,
                 restart_server: Callable[[], object], stop_server: Callable[[], object] | None,
                 start_server: Callable[[], object] | None, *, server_log: Path, repository: str) -> None:
        self.nodes, self.netns, self.relay = nodes, netns, relay
        self.restart_server = restart_server
        self.stop_server, self.start_server = stop_server, start_server
        self.server_log, self.repository = server_log, repository.rstrip("/")
        self.paused: set[str] = set()
        self.partitioned: set[str] = set()

    def _upload_by(self, node: str) -> str:
        """Wait (up to AIM_TIMEOUT) until the server logs a whole response upload by ``node``;
        returns what was seen."""
        stage = re.escape(f"{self.repository}/outstage/resp.")
        wanted = re.compile(rf'OK UPLOAD: [^,]*, "{stage}[^"]*~{re.escape(node)}(=\d+)?"')
        deadline = time.monotonic() + AIM_TIMEOUT
        with open(self.server_log, "rb") as log:
            log.seek(0, os.SEEK_END)
            pending = b""
            while time.monotonic() < deadline:
                chunk = log.read()
                if not chunk:
                    time.sleep(0.001)  # polling the log for its next line
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if wanted.search(line.decode(errors="replace")):
                        return "aimed: struck after " + line.decode(errors="replace").split("OK UPLOAD: ")[1]
        return f"aim missed: no response upload by {node} in {AIM_TIMEOUT:g} s"

    def inject(self, step: Step, hold: Callable[[float], object]) -> str:
        """Apply ``step``, ``hold(seconds)``, heal it (also when ``hold`` raises); returns a note
        (what an aimed fault waited for)."""
        kind, target = step.kind, step.target
        note = ""
        if kind.endswith("-after-upload"):
            kind = kind.removesuffix("-after-upload")
            self.relay.set_fault(target, AIM_HOLD)
            try:
                note = self._upload_by(target)
                self._strike(kind, target)
            finally:
                self.relay.set_fault(target, None)
            try:
                hold(step.hold)
            finally:
                self._heal(kind, target)
            return note
        if kind == "partition":
            set_link(self.netns[target], False)
            self.partitioned.add(target)
            try:
                hold(step.hold)
            finally:
                set_link(self.netns[target], True)
                self.partitioned.discard(target)
        elif kind == "pause":
            proc = self.nodes[target].proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            self.paused.add(target)
            try:
                hold(step.hold)
            finally:
                proc.send_signal(signal.SIGCONT)
                self.paused.discard(target)
        elif kind in ("link-delay", "server-delay"):
            routes = [target] if kind == "link-delay" else list(self.relay.ports)
            fault = NODE_LINK if kind == "link-delay" else SERVER_LINK
            try:
                for r in routes:
                    self.relay.set_fault(r, fault)
                hold(step.hold)
            finally:
                for r in routes:
                    self.relay.set_fault(r, None)
        elif kind == "server-restart":
            if step.hold and self.stop_server is not None and self.start_server is not None:
                self.stop_server()
                try:
                    hold(step.hold)
                finally:
                    self.start_server()
            else:
                self.restart_server()
        elif kind == "kill":
            node = self.nodes[target]
            node.kill()
            try:
                hold(step.hold)
            finally:
                node.start()
        else:
            raise ValueError(f"unknown fault {kind!r}")
        return note

    def _strike(self, kind: str, target: str) -> None:
        if kind == "partition":
            set_link(self.netns[target], False)
            self.partitioned.add(target)
        elif kind == "pause":
            proc = self.nodes[target].proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            self.paused.add(target)
        elif kind == "kill":
            self.nodes[target].kill()
        else:
            raise ValueError(f"no aimed {kind!r}")

    def _heal(self, kind: str, target: str) -> None:
        if kind == "partition":
            set_link(self.netns[target], True)
            self.partitioned.discard(target)
        elif kind == "pause":
            proc = self.nodes[target].proc
            assert proc is not None
            proc.send_signal(signal.SIGCONT)
            self.paused.discard(target)
        elif kind == "kill":
            self.nodes[target].start()

    def heal_all(self) -> None:
        """Undo whatever is still in effect (the nemesis failed mid-fault): links up, nodes going."""
        for target in list(self.partitioned):
            set_link(self.netns[target], True)
        for target in list(self.paused):
            proc = self.nodes[target].proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)


class FaultNemesis(threading.Thread):
    """Runs ``schedule`` one fault at a time.  After each heal it waits (up to ``recovery``
    seconds) until every node runs, serves and has beaten on the server since the heal, then
    paces 1-2 s (random) before the next fault."""

    def __init__(self, schedule: list[Step], faults: Faults, beat_time: Callable[[str], float | None],
                 *, seed: int, recovery: float = 45.0) -> None:
        super().__init__(name="fault-nemesis", daemon=True)
        self.schedule = schedule
        self.faults = faults
        self.beat_time = beat_time
        self.rng = random.Random(seed)
        self.recovery = recovery
        self.events: list[FaultEvent] = []
        self.unrecovered: list[str] = []
        self.error: BaseException | None = None
        self.stop_event = threading.Event()
        self.done = threading.Event()

    def _recovered(self, since: float) -> bool:
        for node_id, node in self.faults.nodes.items():
            if not node.alive or not node.ready():
                return False
            beat = self.beat_time(node_id)
            if beat is None or beat <= since:
                return False
        return True

    def run(self) -> None:
        try:
            for step in self.schedule:
                if self.stop_event.is_set():
                    break
                event = FaultEvent(step.kind, step.target, time.time())
                self.events.append(event)
                # The hold is the fault's length, not a synchronisation.
                event.note = self.faults.inject(step, self.stop_event.wait)
                event.healed = time.time()
                deadline = time.monotonic() + self.recovery
                while not self._recovered(event.healed):
                    if time.monotonic() > deadline:
                        self.unrecovered.append(f"{event.label()}: some node had not beaten again "
                                                f"{self.recovery:g} s after the heal")
                        break
                    if self.stop_event.wait(0.1):
                        break
                else:
                    event.recovered = time.time()
                self.stop_event.wait(self.rng.uniform(1.0, 2.0))  # pacing between faults
        except BaseException as exc:  # reported by the test, never swallowed
            self.error = exc
        finally:
            self.faults.heal_all()
            self.done.set()

    def halt(self) -> None:
        self.stop_event.set()
        if self.ident is not None:  # started
            self.join(timeout=60)


# ---------------------------------------------------------------------- clients


@dataclass
class FaultLedger(Ledger):
    """:class:`~tests.chaos.Ledger` plus the errors callers were given and each request's phase
    and answer time."""

    errors: dict[str, str] = field(default_factory=dict)
    #: a failed submit's uuid -> what its client's journal recovery said of it, in the end
    send_outcomes: dict[str, str] = field(default_factory=dict)
    #: collects refused at once (UnknownRequest): uuid -> why
    unknown: dict[str, str] = field(default_factory=dict)
    phase_of: dict[str, str] = field(default_factory=dict)
    answered_at: dict[str, float] = field(default_factory=dict)


class Requests:
    """Request bodies for one phase, shared by its clients: ``count`` of them, or with ``until``,
    at least ``count`` and on until ``until`` is set (the nemesis done)."""

    def __init__(self, phase: str, count: int, until: threading.Event | None = None,
                 deadline: float | None = None) -> None:
        self.phase, self.count, self.until, self.deadline = phase, count, until, deadline
        self.issued = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            with self.lock:
                more = self.issued < self.count or (self.until is not None and not self.until.is_set())
                if not more or (self.deadline is not None and time.monotonic() > self.deadline):
                    return
                i = self.issued
                self.issued += 1
            yield f"{self.phase}{i}:{random.getrandbits(64):016x}".encode()


def fault_client(cluster: Cluster, client_id: str, requests: Requests, ledger: FaultLedger,
                 stop: threading.Event, collect_timeout: float) -> None:
    """One client: submit, then collect, one request at a time (as :func:`tests.chaos.client_loop`),
    recording an error reply or an expiry as the caller's clear error."""
    from ftpbc.client import Client

    with Client(load_client_config(cluster, client_id), connections=2) as client:
        for body in requests:
            while True:
                if stop.is_set():
                    return
                try:
                    uid = client.submit(ENDPOINT, body)
                except TransportError:
                    with ledger.lock:
                        ledger.submit_errors += 1
                    uid, outcome = _settled_send(client, stop)
                    with ledger.lock:
                        ledger.send_outcomes[uid] = outcome
                    if outcome.startswith("rolled back"):
                        with ledger.lock:
                            ledger.rolled_back[uid] = body
                        continue  # never exposed: a new request is no duplicate
                    with ledger.lock:
                        ledger.indeterminate[uid] = body
                        ledger.phase_of[uid] = requests.phase
                else:
                    with ledger.lock:
                        ledger.acknowledged[uid] = body
                        ledger.phase_of[uid] = requests.phase
                break
            deadline = time.monotonic() + collect_timeout
            while True:
                try:
                    answer = client.collect(ENDPOINT, uid, timeout=max(deadline - time.monotonic(), 0.1))
                except (RemoteHandlerError, RequestExpired) as exc:
                    with ledger.lock:
                        ledger.errors[uid] = str(exc)
                        ledger.answered_at[uid] = time.time()
                    break
                except RequestTimeout:
                    with ledger.lock:
                        ledger.timeouts.append(uid)
                    break
                except UnknownRequest as exc:  # said at once: asking again changes nothing
                    with ledger.lock:
                        ledger.unknown[uid] = str(exc)
                    break
                except FtpbcError:
                    with ledger.lock:
                        ledger.collect_retries += 1
                    if time.monotonic() < deadline and not stop.is_set():
                        continue
                    break
                with ledger.lock:
                    ledger.answers[uid].append(answer)
                    ledger.answered_at[uid] = time.time()
                break


#: outcomes of a send's recovery that decide nothing yet (the server could not be reached)
UNSETTLED = ("left for the next recovery", "deferred")
#: how long a client retries the recovery of a failed submit before it gives up
SETTLE_TIMEOUT = 60.0


def _settled_send(client: Any, stop: threading.Event) -> tuple[str, str]:
    """After a failed submit: replay the client's journal until it decides the send (rolled back
    or exposed), as a careful caller does; (uuid, outcome)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        uid, outcome = _recover_own_send(client, stop)
        if not outcome.startswith(UNSETTLED) or time.monotonic() > deadline or stop.wait(0.2):
            return uid, outcome


def run_clients(cluster: Cluster, requests: Requests, ledger: FaultLedger, *, clients: int,
                collect_timeout: float, join_timeout: float) -> tuple[float, float]:
    """Run ``clients`` client threads over ``requests`` until they are all done; returns the
    phase's (start, end) wall-clock times.  A client's exception is raised here."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def one(k: int) -> None:
        try:
            fault_client(cluster, f"c{k}", requests, ledger, stop, collect_timeout)
        except BaseException as exc:
            errors.append(exc)

    started = time.time()
    threads = [threading.Thread(target=one, args=(k,), name=f"client-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_timeout
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0.1))
    stop.set()
    for t in threads:
        t.join(timeout=60)
    if any(t.is_alive() for t in threads):
        raise AssertionError(f"clients still busy {join_timeout:g} s into the {requests.phase} phase")
    if errors:
        raise errors[0]
    return started, time.time()


# ---------------------------------------------------------------------- what happened


@dataclass
class Run:
    node: str
    start: float
    returned: float | None = None
    recorded: float | None = None
    staging: float | None = None
    staged: float | None = None


def read_runs(logs: list[Path]) -> dict[str, list[Run]]:
    """uuid -> its handler runs, in start order (module docstring)."""
    lines: list[tuple[float, str, str, str]] = []
    for path in logs:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 4:
                    lines.append((float(parts[3]), parts[0], parts[1], parts[2]))
    lines.sort()
    runs: dict[str, list[Run]] = defaultdict(list)
    latest: dict[tuple[str, str], Run] = {}
    for when, kind, uid, node in lines:
        if kind == "start":
            run = Run(node, when)
            runs[uid].append(run)
            latest[uid, node] = run
            continue
        run_or_none = latest.get((uid, node))
        if run_or_none is None:
            continue
        attr = _RUN_FIELDS.get(kind)
        if attr is not None and getattr(run_or_none, attr) is None:
            setattr(run_or_none, attr, when)
    return runs


_RUN_FIELDS = {"return": "returned", "recorded": "recorded", "staging": "staging", "staged": "staged"}
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_RETURNED = re.compile(r"returned (\S+) claimed by dead node (\S+)$")


def claim_returns(node_logs: list[Path]) -> dict[tuple[str, str], list[float]]:
    """(uuid, owner) -> when a sweeper returned that owner's claim of it (from the nodes' logs)."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in node_logs:
        for line in path.read_text(errors="replace").splitlines():
            if "claimed by dead node" not in line or not (t := _LOG_TIME.match(line)):
                continue
            if (m := _RETURNED.search(line)) and (uid := _uuid_of(m.group(1), "req.")):
                when = datetime.strptime(t.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out[uid, m.group(2)].append(when)
    for times in out.values():
        times.sort()
    return out


_SERVER_OP = re.compile(r'\] OK (UPLOAD|RENAME|DELETE): Client "[^"]*", "([^"]*)"')


@dataclass
class ServerHistory:
    """What the server's own log (vsftpd, ``xferlog_enable``) shows of the exchange area: in the
    order the server did it, each claim of a request taken back from its holder after the
    holder's response to it was uploaded whole, and each response put in the outbox."""

    #: a request taken back from its holder (returned to the inbox) although that holder's
    #: complete response was already on the server: (uuid, holder, what the log shows)
    returned_after_staged: list[tuple[str, str, str]] = field(default_factory=list)
    #: uuid -> how many times a response to it was renamed into the outbox
    exposed: Counter[str] = field(default_factory=Counter)
    #: uuid -> how many times its request was taken back from a holder
    returned: Counter[str] = field(default_factory=Counter)
    #: requests uploaded whole to the in stage directory, and those renamed from there to the inbox
    requests_staged: set[str] = field(default_factory=set)
    requests_exposed: set[str] = field(default_factory=set)
    #: a holder's staged response deleted while its upload ran (vsftpd logs the delete, then the
    #: upload as complete, into a file no longer there): not a result on the server
    deleted_mid_upload: list[str] = field(default_factory=list)


def _stager(name: str) -> str:
    """The node id in a staged reply's name (``resp.<uuid>~<node>``, with ``=<size>`` or not)."""
    return name.rsplit("~", 1)[-1].partition("=")[0]


def server_history(log: Path, repository: str) -> ServerHistory:
    """Read the server's log (module docstring of tests/test_partial_faults.py: vsftpd logs every
    completed upload and rename, one line each, when it is done)."""
    root = repository.rstrip("/") + "/"
    out = ServerHistory()
    #: uuid -> (holder, line of its claim, line of its complete response upload or 0)
    held: dict[str, tuple[str, int, int]] = {}
    #: uuids whose holder's staged response was deleted before its upload was logged complete
    cut: set[str] = set()
    text = log.read_text(errors="replace") if log.exists() else ""
    for number, line in enumerate(text.splitlines(), 1):
        m = _SERVER_OP.search(line)
        if m is None or not m.group(2).startswith(root):
            continue
        if m.group(1) == "DELETE":
            directory, _, name = m.group(2)[len(root):].rpartition("/")
            uid = _uuid_of(name, "resp.") if directory == "outstage" else None
            if uid is not None and uid in held and _stager(name) == held[uid][0] and not held[uid][2]:
                cut.add(uid)
            continue
        if m.group(1) == "UPLOAD":
            directory, _, name = m.group(2)[len(root):].rpartition("/")
            if directory == "instage" and (uid := _uuid_of(name, "req.")):
                out.requests_staged.add(uid)
            uid = _uuid_of(name, "resp.") if directory == "outstage" else None
            if uid is not None and uid in held and _stager(name) == held[uid][0]:
                holder, claimed, _ = held[uid]
                if uid in cut:
                    cut.discard(uid)
                    out.deleted_mid_upload.append(f"{uid}: {holder}'s upload logged complete (line {number}) "
                                                  "after its file was deleted")
                else:
                    held[uid] = (holder, claimed, number)
            continue
        src, _, dst = m.group(2).partition(" ")
        (sdir, _, sname), (ddir, _, dname) = (p[len(root):].rpartition("/") for p in (src, dst))
        if sdir == "inbox" and ddir == "inselect" and (uid := _uuid_of(dname, "req.")):
            held[uid] = (dname.split("~")[1] if "~" in dname else "?", number, 0)
            cut.discard(uid)
        elif sdir == "inselect" and (uid := _uuid_of(sname, "req.")):
            holder, claimed, uploaded = held.pop(uid, ("?", 0, 0))
            if ddir == "inbox":
                out.returned[uid] += 1
                if uploaded:
                    out.returned_after_staged.append((uid, holder, (
                        f"claimed by {holder} (server log line {claimed}), its response uploaded whole "
                        f"(line {uploaded}), then the request returned to the inbox (line {number})")))
        elif sdir == "outstage" and ddir == "outbox" and (uid := _uuid_of(dname, "resp.")):
            out.exposed[uid] += 1
        elif sdir == "instage" and ddir == "inbox" and (uid := _uuid_of(dname, "req.")):
            out.requests_exposed.add(uid)
    return out


@dataclass
class Rerun:
    uuid: str
    earlier: Run
    later: Run
    cut: float
    cut_by: str
    causes: list[str]

    def describe(self) -> str:
        e = self.earlier
        stage = ("never staged" if e.staging is None else
                 f"staged {e.staged - e.start:.2f} s in" if e.staged is not None else "staging cut short")
        returned = "returned" if e.returned else "no return"
        return (f"{self.uuid}: ran on {e.node} at {e.start:.3f} ({returned}, "
                f"{'recorded' if e.recorded else 'not recorded'}, {stage}), cut at {self.cut:.3f} by "
                f"{self.cut_by}, re-run on {self.later.node} at {self.later.start:.3f}; causes: "
                f"{', '.join(self.causes) or 'none'}")


#: how long after a node beat again a fault still counts as the cause of losing a claim
AFTERMATH = 3.0


def find_reruns(runs: dict[str, list[Run]], returns: dict[tuple[str, str], list[float]],
                events: list[FaultEvent]) -> list[Rerun]:
    out = []
    for uid, rs in runs.items():
        for earlier, later in itertools.pairwise(rs):
            cut, cut_by = later.start, "the re-run's start (no sweeper returned it)"
            for when in returns.get((uid, earlier.node), []):
                if earlier.start <= when <= later.start:
                    cut, cut_by = when, "a sweeper (dead owner)"
                    break
            causes = [e.label() for e in events if e.hits(earlier.node)
                      and e.began <= cut and earlier.start <= (e.recovered or e.healed or cut) + AFTERMATH]
            out.append(Rerun(uid, earlier, later, cut, cut_by, causes))
    return out


def rerun_after_staged(history: ServerHistory, runs: dict[str, list[Run]]) -> list[str]:
    """Requests the server log shows taken from a holder after its whole response was uploaded,
    whose handler then started again: after the holder's run began staging (the holder kept its
    claim until after the upload, so any later start came after the result was on the server)."""
    out = []
    for uid, holder, what in history.returned_after_staged:
        staged = [r.staging for r in runs.get(uid, []) if r.node == holder and r.staging is not None]
        later = [r for r in runs.get(uid, []) if staged and r.start > min(staged)]
        if later or not staged:
            ran = (", ".join(f"{r.node} at {r.start:.3f}" for r in later)
                   or "? (the holder logged no staging: this harness cannot tell)")
            out.append(f"{uid}: {what}; handler started again on {ran}")
    return out


@dataclass
class Verdict:
    sent: int
    answered_once: int
    errors_to_caller: dict[str, str]
    indeterminate_absent: int
    lost: list[str]
    answered_twice: list[str]
    wrong: list[str]
    rolled_back_present: list[str]
    handler_runs: int
    reruns: list[Rerun]
    #: from the server's log: requests taken from a holder whose whole result was on the server
    returned_after_staged: list[str]
    #: ... and whose handler then ran again (a run started after that holder began staging)
    rerun_after_staged: list[str]
    exposed_twice: list[str]
    #: info: a holder's staged response deleted while it was being uploaded (server log)
    deleted_mid_upload: list[str]
    #: failed submits the client's recovery called exposed, whose whole staged request the server
    #: deleted without ever putting it in the inbox: uuid -> the outcome the caller was given
    misreported_sends: dict[str, str]
    leftovers: dict[str, list[str]]
    pending: dict[str, dict[str, list[str]]]
    journal_files_nonempty: list[str]
    unrecovered: list[str]

    @property
    def unattributed(self) -> list[Rerun]:
        return [r for r in self.reruns if not r.causes]

    def causes(self) -> dict[str, int]:
        """Re-runs by the kind of fault that cut their earlier run off (the first cause listed)."""
        return dict(Counter(r.causes[0].split()[0] if r.causes else "unattributed" for r in self.reruns))

    def violations(self) -> list[str]:
        out = []
        for what, items in (("lost (never answered, no error)", self.lost),
                            ("answered twice", self.answered_twice), ("answered wrongly", self.wrong),
                            ("rolled back yet on the server", self.rolled_back_present)):
            if items:
                out.append(f"{len(items)} {what}: {items[:5]}")
        if self.misreported_sends:
            out.append(f"{len(self.misreported_sends)} failed submits recovered as exposed, whose staged "
                       f"request was deleted and never reached the inbox (server log): "
                       f"{list(self.misreported_sends.items())[:5]}")
        if self.exposed_twice:
            out.append(f"{len(self.exposed_twice)} with two responses put in the outbox (server log): "
                       f"{self.exposed_twice[:5]}")
        if self.rerun_after_staged:
            out.append(f"{len(self.rerun_after_staged)} run again after their result was on the server:\n    "
                       + "\n    ".join(self.rerun_after_staged[:8]))
        if self.unattributed:
            out.append(f"{len(self.unattributed)} re-run with no fault to attribute it to:\n    "
                       + "\n    ".join(r.describe() for r in self.unattributed[:8]))
        if self.leftovers:
            out.append(f"files left in boxes/stages: { {k: v[:5] for k, v in self.leftovers.items()} }")
        if self.pending:
            out.append(f"journal operations left pending: {self.pending}")
        if self.journal_files_nonempty:
            out.append(f"journal files not empty: {self.journal_files_nonempty}")
        out += [f"not recovered: {u}" for u in self.unrecovered]
        return out


def judge(cluster: Cluster, ledger: FaultLedger, events: list[FaultEvent], unrecovered: list[str],
          server_log: Path) -> Verdict:
    """Classify every request and every handler run (module docstring)."""
    responses, requests_seen = server_census(cluster)
    expected = {**ledger.acknowledged, **ledger.indeterminate}
    answered = absent = 0
    lost: list[str] = []
    twice: list[str] = []
    wrong: list[str] = []
    errors: dict[str, str] = {}
    for uid, body in expected.items():
        got = ledger.answers.get(uid, [])
        if len(got) + (uid in ledger.errors) > 1 or responses[uid] > 1:
            twice.append(uid)
        elif got and got[0] != b"re:" + body:
            wrong.append(uid)
        elif got:
            answered += 1
        elif uid in ledger.errors:
            errors[uid] = ledger.errors[uid]
        elif uid in ledger.indeterminate and uid not in requests_seen and not responses[uid]:
            absent += 1  # a submit that failed before its request was exposed
        else:
            lost.append(uid)
    wrong += sorted(u for u in responses if u not in expected and u not in ledger.rolled_back)
    node_ids = list(cluster.hosts)
    runs = read_runs([cluster.handler_log(n) for n in node_ids])
    history = server_history(server_log, cluster.repository)
    returns = claim_returns([p for n in node_ids if (p := cluster.workdir / f"node-{n}.log").exists()])
    return Verdict(
        sent=len(expected), answered_once=answered, errors_to_caller=errors, indeterminate_absent=absent,
        lost=lost, answered_twice=twice, wrong=wrong,
        rolled_back_present=sorted(u for u in ledger.rolled_back if u in requests_seen or responses[u]),
        handler_runs=sum(len(rs) for rs in runs.values()), reruns=find_reruns(runs, returns, events),
        returned_after_staged=[f"{u}: {what}" for u, _, what in history.returned_after_staged],
        rerun_after_staged=rerun_after_staged(history, runs),
        deleted_mid_upload=history.deleted_mid_upload,
        exposed_twice=sorted(u for u, n in history.exposed.items() if n > 1),
        misreported_sends={u: o for u, o in ledger.send_outcomes.items()
                           if not o.startswith(("rolled back", *UNSETTLED))
                           and u in history.requests_staged and u not in history.requests_exposed},
        leftovers=cluster.leftovers(), pending=cluster.pending(),
        journal_files_nonempty=cluster.nonempty_journal_files(), unrecovered=unrecovered)


# ---------------------------------------------------------------------- one run


@dataclass
class Phase:
    name: str
    started: float
    ended: float
    sent: int
    answered: int

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def rate(self) -> float:
        return self.answered / max(self.seconds, 1e-9)


@dataclass
class FaultRunResult:
    verdict: Verdict
    phases: list[Phase]
    events: list[FaultEvent]
    ledger: FaultLedger
    relay_stats: dict[str, dict[str, float]]
    seed: int
    seconds: float
    #: seconds the boxes took to empty once the clients were done; each node's exit status
    drained_in: float
    exits: dict[str, int | None]
    #: what was still in the boxes when the drain's deadline passed (the nodes running)
    undrained: dict[str, list[str]]

    def report(self) -> str:
        v, led = self.verdict, self.ledger
        warmup, base, faults = self.phases
        lines = [
            f"seed {self.seed}, {self.seconds:.0f} s",
            f"requests: sent {v.sent} (warm-up {warmup.sent}, baseline {base.sent}, under faults "
            f"{faults.sent}), answered once "
            f"{v.answered_once}, errors to caller {len(v.errors_to_caller)}, never exposed (submit failed) "
            f"{v.indeterminate_absent}, lost {len(v.lost)}, answered twice {len(v.answered_twice)}, "
            f"wrong {len(v.wrong)}; submit errors {led.submit_errors} (recovered as "
            f"{dict(Counter(o.split(':')[0] for o in led.send_outcomes.values()))}), collects refused "
            f"{len(led.unknown)}, collect timeouts {len(led.timeouts)}, collect retries "
            f"{led.collect_retries}",
            f"handler runs {v.handler_runs}, re-runs {len(v.reruns)} by cause {v.causes()}, unattributed "
            f"{len(v.unattributed)}; their earlier run had recorded its result in "
            f"{sum(1 for r in v.reruns if r.earlier.recorded)}, begun staging it in "
            f"{sum(1 for r in v.reruns if r.earlier.staging)}; requests taken from a node after its "
            f"result was on the server {len(v.returned_after_staged)}, of which run again "
            f"{len(v.rerun_after_staged)}; responses put out twice {len(v.exposed_twice)}; staged responses "
            f"deleted while being uploaded {len(v.deleted_mid_upload)}",
            f"throughput: baseline {base.rate:.1f} req/s ({base.answered} in {base.seconds:.1f} s), "
            f"under faults {faults.rate:.1f} req/s ({faults.answered} in {faults.seconds:.1f} s), "
            f"ratio {faults.rate / max(base.rate, 1e-9):.2f}",
        ]
        lines.append("faults: " + "; ".join(
            f"{e.label()} {e.healed - e.began:.1f} s, beat again "
            + (f"{e.recovered - e.healed:.1f} s after" if e.recovered else "NEVER")
            + (f" ({e.note})" if e.note else "") for e in self.events))
        if v.errors_to_caller:
            lines.append("errors to caller: " + "; ".join(f"{u}: {m}" for u, m in
                                                          list(v.errors_to_caller.items())[:5]))
        per_fault: dict[str, Counter[str]] = defaultdict(Counter)
        for r in v.reruns:
            per_fault[r.causes[0] if r.causes else "unattributed"][r.cut_by.split(" (")[0]] += 1
        if per_fault:
            lines.append("re-runs per fault: " + "; ".join(f"{k}: {dict(c)}" for k, c in per_fault.items()))
            lines += [f"  re-run {r.describe()}" for r in v.reruns[:6]]
        undrained = {k: v[:3] for k, v in self.undrained.items()}
        lines.append(f"boxes empty {self.drained_in:.1f} s after the clients were done"
                     + (f" (NOT: {undrained})" if undrained else "") + f"; nodes exited {self.exits}")
        lines.append("relay: " + "; ".join(
            f"{r}: {int(s['connections'])} conns, {int(s['data_connections'])} data, "
            f"{int(s['stalls'])} stalls, {int(s['resets'])} resets, {int(s['refused'])} refused"
            for r, s in self.relay_stats.items()))
        return "\n".join(lines)


def run_partial_faults(cluster: Cluster, relay: RelayProcess, faults: Faults, schedule: list[Step], *,
                       beat_time: Callable[[str], float | None], seed: int, baseline: int,
                       fault_requests: int, clients: int, collect_timeout: float, server_log: Path,
                       drain_timeout: float = 60.0) -> FaultRunResult:
    """Start the nodes, run ``baseline`` requests without faults, then at least
    ``fault_requests`` while the nemesis runs ``schedule``, wait for every box to empty, stop the
    nodes and judge.  Every node and the nemesis are ended here, also on failure."""
    started = time.monotonic()
    nodes = list(faults.nodes.values())
    ledger = FaultLedger()
    nemesis = FaultNemesis(schedule, faults, beat_time, seed=seed)
    phases: list[Phase] = []

    def phase(requests: Requests, join_timeout: float) -> None:
        t0, t1 = run_clients(cluster, requests, ledger, clients=clients, collect_timeout=collect_timeout,
                             join_timeout=join_timeout)
        mine = [u for u, p in ledger.phase_of.items() if p == requests.phase]
        done = [ledger.answered_at[u] for u in mine if u in ledger.answered_at]
        phases.append(Phase(requests.phase, t0, max(done, default=t1), len(mine), len(done)))

    try:
        for n in nodes:
            n.start()
        try:
            _wait(lambda: all(n.ready() for n in nodes), START_TIMEOUT, "every node to serve")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {_not_serving(nodes)}") from None
        # A warm-up (logins, first listings, lock tokens), then the fault-free baseline.
        phase(Requests("w", 4 * clients), join_timeout=collect_timeout * 3)
        phase(Requests("b", baseline), join_timeout=collect_timeout * 3)
        nemesis.start()
        schedule_time = sum(s.hold for s in schedule) + len(schedule) * (nemesis.recovery + 2)
        phase(Requests("f", fault_requests, until=nemesis.done, deadline=time.monotonic() + schedule_time),
              join_timeout=schedule_time + collect_timeout * 2)
        nemesis.join(timeout=60)
        if nemesis.error is not None:
            raise nemesis.error
        # The sweepers run on: what a cut-off node left behind must go (or stay, and be reported).
        drain_started = time.monotonic()
        deadline = drain_started + drain_timeout
        while cluster.leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)
        drained_in = time.monotonic() - drain_started
        undrained = cluster.leftovers()
        relay_stats = relay.stats()
    finally:
        nemesis.halt()
        faults.heal_all()
        exits = {n.node_id: n.stop() for n in nodes}
    verdict = judge(cluster, ledger, nemesis.events, nemesis.unrecovered, server_log)
    return FaultRunResult(verdict, phases, nemesis.events, ledger, relay_stats, seed,
                          time.monotonic() - started, drained_in, exits, undrained)


def _not_serving(nodes: Sequence[NodeProcess]) -> str:
    """The nodes that do not serve yet, each with the end of its log (why not)."""
    out = []
    for n in nodes:
        if n.ready():
            continue
        try:
            tail = n.log.read_text(errors="replace").splitlines()[-5:]
        except OSError as exc:
            tail = [f"(no log: {exc})"]
        out.append(f"{n.node_id} not serving, log ends: " + " | ".join(tail))
    return "; ".join(out)


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
