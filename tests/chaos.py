"""Crash-safety harness: an instrumented handler, node processes, a nemesis and a checker.

Shared by ``tests/test_recovery.py``, ``tests/test_sweeper.py``, ``tests/test_chaos.py``,
``tests/test_hosts.py`` (nodes on hosts of their own: :class:`NodeHost`) and
``bench/soak_chaos.py``.  Nodes run as real ``ftpbc serve`` subprocesses (so a SIGKILL is a real
crash) with :func:`handler` as their handler; clients are :class:`ftpbc.client.Client` objects.

The handler's invocation log
    :func:`handler` appends ``start <uuid> <node>`` before its work and ``return <uuid> <node>``
    after it, to the file named by ``FTPBC_TEST_HANDLER_LOG`` (``O_APPEND``, one ``write`` per
    line, so a killed node leaves a ``start`` without its ``return``).  Importing this module in a
    node also appends to the lifecycle's ``HOOKS.after_served_durable``
    (:class:`ftpbc.exchange.lifecycle.Hooks`) so that ``recorded <uuid> <node>`` is logged once
    the handler's result is durable in the journal: from then on the core promises never to run
    the handler again, so a second ``recorded`` for one UUID is a violation, whereas a second
    ``return`` whose first one was cut short by a kill before its result was recorded is ordinary
    at-least-once delivery.

The checker (Jepsen's queue checker, adapted)
    Every request the client got an acknowledgement for (``submit`` returned its UUID) must be
    answered exactly once with the right body.  A ``submit`` that raised is *indeterminate*: the
    client replays its own journal to learn whether it was exposed; if it was, it is collected
    like any other request, and if it was rolled back it must be absent everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ftpbc.errors import FtpbcError, RequestTimeout, TransportError
from ftpbc.exchange.area import KINDS
from ftpbc.exchange.lifecycle import HOOKS, Served
from ftpbc.journal import EndpointJournal, Journal
from ftpbc.model.message import Message

REPO = Path(__file__).resolve().parent.parent
HANDLER = "tests.chaos:handler"
LOG_ENV = "FTPBC_TEST_HANDLER_LOG"
NODE_ENV = "FTPBC_TEST_NODE"
PASSWORD_ENV = "FTPBC_TEST_PASSWORD"
#: the file an instrumented node appends a line to for every journal record it writes
TRACE_ENV = "FTPBC_TEST_JOURNAL_TRACE"
ENDPOINT = "echo"
#: how long a client waits for the answer to a request whose submit failed ambiguously
INDETERMINATE_WAIT = 15.0
#: the directories that must be empty once everything is finished
TRANSIENT = [f"{d}{k}" for d in ("in", "out") for k in KINDS if k not in ("archive", "error", "protect")]


# ---------------------------------------------------------------------- the instrumented handler

#: caps the seconds a ``sleep:`` body makes the handler work, on the node whose env sets it
SLEEP_CAP_ENV = "CHAOS_SLEEP_CAP"


def _log_line(kind: str, uuid: str | None, detail: str = "") -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    node = os.environ.get(NODE_ENV, "?")
    line = f"{kind} {uuid} {node} {time.time():.6f} {detail}".rstrip().encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)  # one write of a short line to an O_APPEND file: never interleaved
    finally:
        os.close(fd)


def handler(message: Message) -> bytes:
    """``re:<body>``.  A body ``sleep:<seconds>:...`` makes the handler work that long first."""
    body = message.body
    # The body read is logged, so a wrong answer can be traced to a torn read or a torn file.
    _log_line("start", message.uuid, repr(body[:80]).replace(" ", "\\x20"))
    if body.startswith(b"sleep:"):
        # the handler's own work, not a synchronisation; SLEEP_CAP_ENV shortens it on one node
        time.sleep(min(float(body.split(b":")[1]), float(os.environ.get(SLEEP_CAP_ENV, "inf"))))
    _log_line("return", message.uuid)
    return b"re:" + body


def _log_recorded(served: Served) -> None:
    # Every path that records a result (record_served, a provider's write_served) passes here.
    _log_line("recorded", served.claimed.uuid)


if os.environ.get(LOG_ENV):
    # Only inside the instrumented nodes: the pytest process itself is left untouched.
    HOOKS.after_served_durable.append(_log_recorded)


# ---------------------------------------------------------------------- the journal trace

_original_record_many = EndpointJournal.record_many
_original_end = EndpointJournal.end


def _trace(journal: EndpointJournal, records: list[tuple[str, str, dict[str, str]]]) -> None:
    """Append ``records`` (just written to ``journal``) to the file TRACE_ENV names: ``<time>
    <node> <journal file> <op id> <event> <fields as JSON>`` a line, one ``write`` per batch.

    The journal itself is emptied whenever nothing is pending, so after a run it says nothing
    of the operations that ended; the trace keeps every record, for following one message.
    A kill between a record and its trace line loses that line only."""
    path = os.environ[TRACE_ENV]
    node = os.environ.get(NODE_ENV, "?")
    stamp = trace_time(time.time())
    data = "".join(f"{stamp} {node} {journal.path.name} {op_id} {event} "
                   f"{json.dumps(fields, separators=(',', ':'))}\n"
                   for op_id, event, fields in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)  # one write to an O_APPEND file: never interleaved with another process's
    finally:
        os.close(fd)


def trace_time(t: float) -> str:
    """A time (``time.time()``) as the trace writes it: local, as the nodes' log lines, to the
    microsecond, so that log and trace lines sort together."""
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S.%f")


#: per thread: records traced by the journal's own calls since the current end() began
_traced = threading.local()


def _record_many_traced(self: EndpointJournal, records: list[tuple[str, str, dict[str, str]]], *,
                        durable: bool) -> int:
    seq = _original_record_many(self, records, durable=durable)
    _trace(self, records)
    _traced.count = getattr(_traced, "count", 0) + 1
    return seq


def _end_traced(self: EndpointJournal, op_id: str) -> None:
    _traced.count = 0
    _original_end(self, op_id)
    if not _traced.count:  # ended by emptying the file, without an end record
        _trace(self, [(op_id, "end", {})])


if os.environ.get(TRACE_ENV):
    # Only in a node started with NodeProcess(trace_journal=True).
    EndpointJournal.record_many = _record_many_traced  # type: ignore[method-assign]
    EndpointJournal.end = _end_traced  # type: ignore[method-assign]


def read_trace(cluster: Cluster, needles: list[str]) -> list[str]:
    """The journal trace lines (every traced node's) that mention any of ``needles``, by time,
    each with its journal file's endpoint name (the node's journal registry) in place of the
    file name."""
    lines = []
    for path in sorted(cluster.workdir.glob("journal-*.trace")):
        node = path.stem.removeprefix("journal-")
        names = {}
        for journal_dir in cluster.journal_dirs():
            registry = journal_dir / node / "registry"
            if registry.exists():
                names.update({file: name for name, _, file in
                              (ln.partition("\t") for ln in registry.read_text().splitlines())})
        for line in path.read_text(errors="replace").splitlines():
            if any(n in line for n in needles):
                parts = line.split(" ", 4)  # date, time, node, journal file, the rest
                if len(parts) == 5:
                    parts[3] = names.get(parts[3], parts[3])
                lines.append(" ".join(parts))
    return sorted(lines)


@dataclass
class Invocations:
    starts: Counter[str] = field(default_factory=Counter)
    returns: Counter[str] = field(default_factory=Counter)
    recorded: Counter[str] = field(default_factory=Counter)

    @property
    def cut_short(self) -> int:
        """Invocations that started and never returned (their node was killed)."""
        return sum(self.starts.values()) - sum(self.returns.values())

    def returned_twice(self) -> list[str]:
        return sorted(u for u, n in self.returns.items() if n > 1)

    def recorded_twice(self) -> list[str]:
        return sorted(u for u, n in self.recorded.items() if n > 1)


def read_invocations(logs: list[Path]) -> Invocations:
    inv = Invocations()
    for path in logs:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue  # a line torn by SIGKILL cannot happen (one write), but be safe
            counter = {"start": inv.starts, "return": inv.returns, "recorded": inv.recorded}[parts[0]]
            counter[parts[1]] += 1
    return inv


# ---------------------------------------------------------------------- configuration

@dataclass
class NodeHost:
    """A node on a host of its own (tests/hosts.py): its own config, whose ``state_dir`` and
    ``journal_dir`` no other process uses, and the command prefix that runs a process there."""

    workdir: Path
    prefix: list[str]

    @property
    def config(self) -> Path:
        return self.workdir / "ftpbc.yaml"

    @property
    def journal_dir(self) -> Path:
        return self.workdir / "journals"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"


@dataclass
class Cluster:
    """Files of one test cluster: its config, journals, state and logs, all under ``workdir``.

    ``hosts`` maps a node id to its :class:`NodeHost`; every other process (the clients, nodes
    without one) shares ``config``, ``journal_dir`` and ``state_dir`` as processes of one host.
    """

    workdir: Path
    url: str
    password: str | None
    options: dict[str, Any]
    repository: str
    server_root: Path
    hosts: dict[str, NodeHost] = field(default_factory=dict)

    @property
    def config(self) -> Path:
        return self.workdir / "ftpbc.yaml"

    def to_json(self) -> str:
        """For handing the cluster to a child process (:meth:`from_json`)."""
        return json.dumps({"workdir": str(self.workdir), "url": self.url, "password": self.password,
                           "options": {k: str(v) for k, v in self.options.items()},
                           "repository": self.repository, "server_root": str(self.server_root),
                           "hosts": {n: {"workdir": str(h.workdir), "prefix": h.prefix}
                                     for n, h in self.hosts.items()}})

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        d = json.loads(text)
        hosts = {n: NodeHost(Path(h["workdir"]), h["prefix"]) for n, h in d.get("hosts", {}).items()}
        return cls(Path(d["workdir"]), d["url"], d["password"], d["options"], d["repository"],
                   Path(d["server_root"]), hosts)

    @property
    def journal_dir(self) -> Path:
        return self.workdir / "journals"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def config_for(self, node_id: str | None) -> Path:
        """The config ``node_id`` runs with: its host's, else the shared one."""
        host = self.hosts.get(node_id or "")
        return host.config if host else self.config

    def prefix_for(self, node_id: str | None) -> list[str]:
        """What runs a command on ``node_id``'s host (nothing: this host)."""
        host = self.hosts.get(node_id or "")
        return list(host.prefix) if host else []

    def journal_dirs(self) -> list[Path]:
        return [self.journal_dir, *(h.journal_dir for h in self.hosts.values())]

    def handler_log(self, node_id: str) -> Path:
        return self.workdir / f"handler-{node_id}.log"

    def handler_logs(self) -> list[Path]:
        return sorted(self.workdir.glob("handler-*.log"))

    def env(self, node_id: str | None = None, crash_at: str | None = None,
            **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FTPBC_")}
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if self.password is not None:
            env[PASSWORD_ENV] = self.password
        if node_id is not None:
            env[LOG_ENV] = str(self.handler_log(node_id))
            env[NODE_ENV] = node_id
        if crash_at:
            env["FTPBC_CRASH_AT"] = crash_at
        return env

    def local(self, *parts: str) -> Path:
        return self.server_root / self.repository.lstrip("/") / "/".join(parts)

    def files(self, directory: str) -> list[str]:
        d = self.local(directory)
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def leftovers(self) -> dict[str, list[str]]:
        """Files left in any stage, box or select directory (must be none at the end)."""
        return {d: names for d in TRANSIENT if (names := self.files(d))}

    def pending(self) -> dict[str, dict[str, list[str]]]:
        """Pending journal operations of every node id that has a journal directory (any host)."""
        out: dict[str, dict[str, list[str]]] = {}
        for journal_dir in self.journal_dirs():
            if not journal_dir.is_dir():
                continue
            for node_dir in sorted(p for p in journal_dir.iterdir() if p.is_dir()):
                j = Journal(journal_dir, node_dir.name)
                try:
                    ops = {ep: [f"{o.op_id} {'>'.join(o.events)}" for o in pend]
                           for ep, pend in j.all_pending().items()}
                finally:
                    j.close()
                if ops:
                    out[node_dir.name] = ops
        return out

    def nonempty_journal_files(self) -> list[str]:
        return sorted(str(p.relative_to(self.workdir)) for d in self.journal_dirs() if d.is_dir()
                      for p in d.glob("*/*.journal") if p.stat().st_size > 0)


def make_cluster(workdir: Path, *, url: str, password: str | None, options: dict[str, Any],
                 repository: str, server_root: Path, lease: float = 20.0, heartbeat: float = 1.0,
                 workers: int = 4, poll_interval: float = 0.05, durable: bool = True,
                 uncollected_after: float = 3600.0, timeout: float = 60.0,
                 drain_timeout: float = 10.0, node: dict[str, Any] | None = None,
                 hosts: dict[str, list[str]] | None = None) -> Cluster:
    """Write ``workdir/ftpbc.yaml`` for one echo endpoint served by :func:`handler`.

    ``node`` adds keys to every config's ``node:`` (e.g. ``coordination: server``).  ``hosts``
    maps node ids to the command prefix of their own host (tests/hosts.py): each such node gets
    ``workdir/hosts/<id>/ftpbc.yaml``, the same but for its private ``state_dir`` and
    ``journal_dir`` beside it, as a separate machine would have.

    The lease outlasts the slowest restart of a killed node (seconds, on a loaded 2-core CI box):
    the nemesis restarts every node it kills, so each node recovers its own claims, and a
    handler whose result is recorded never runs again.  A shorter lease would let a peer return
    the claim of a node that is merely restarting, which is the documented at-least-once case
    of nodes that never come back (tests/test_sweeper.py covers that).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    server: dict[str, Any] = {"url": url, **{k: str(v) if isinstance(v, Path) else v
                                             for k, v in options.items()}}
    if password is not None:
        server["password_env"] = PASSWORD_ENV

    def write(config: Path, base: Path) -> None:
        doc = {
            "node": {"state_dir": str(base / "state"), "journal_dir": str(base / "journals"),
                     "heartbeat_interval": heartbeat, "lease": lease, "durable_journal": durable,
                     **(node or {})},
            "servers": {"s": server},
            "endpoints": {ENDPOINT: {"server": "s", "repository": repository, "handler": HANDLER,
                                     "poll_interval": poll_interval, "workers": workers,
                                     "timeout": timeout, "drain_timeout": drain_timeout,
                                     "uncollected_after": uncollected_after}},
        }
        config.write_text(yaml.safe_dump(doc, sort_keys=False))

    node_hosts = {n: NodeHost(workdir / "hosts" / n, list(prefix)) for n, prefix in (hosts or {}).items()}
    cluster = Cluster(workdir, url, password, options, repository, server_root, node_hosts)
    write(cluster.config, workdir)
    for h in node_hosts.values():
        h.workdir.mkdir(parents=True, exist_ok=True)
        write(h.config, h.workdir)
    return cluster


def load_client_config(cluster: Cluster, node_id: str) -> Any:
    """The cluster's config as a client with ``node_id`` (the password from the env or given)."""
    from ftpbc.config.loader import load_config

    with _password_env(cluster.password):
        return load_config(cluster.config, node_id=node_id)


_env_lock = threading.Lock()


@contextlib.contextmanager
def _password_env(password: str | None) -> Iterator[None]:
    with _env_lock:  # clients load their configs from several threads at once
        yield from _with_env(password)


def _with_env(password: str | None) -> Iterator[None]:
    old = os.environ.get(PASSWORD_ENV)
    if password is not None:
        os.environ[PASSWORD_ENV] = password
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PASSWORD_ENV, None)
        else:
            os.environ[PASSWORD_ENV] = old


# ---------------------------------------------------------------------- processes

FTPBC = [sys.executable, "-c", "from ftpbc.cli import main; main()"]
#: ``ftpbc`` with this module imported first (its instrumentation, by the environment's choice)
TRACED = [sys.executable, "-c", "import tests.chaos; from ftpbc.cli import main; main()"]


def run_cli(cluster: Cluster, *args: str, node_id: str | None = None, crash_at: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``ftpbc <args> -c <config>`` (with ``--node-id``) to completion, on the node's host."""
    cmd = [*cluster.prefix_for(node_id), *FTPBC, *args, "-c", str(cluster.config_for(node_id))]
    if node_id:
        cmd += ["--node-id", node_id]
    return subprocess.run(cmd, cwd=REPO, env=cluster.env(node_id, crash_at), capture_output=True,
                          text=True, timeout=timeout, check=False)


class NodeProcess:
    """One ``ftpbc serve`` subprocess with a fixed node id, restartable after a kill."""

    def __init__(self, cluster: Cluster, node_id: str, *, trace_journal: bool = False) -> None:
        """``trace_journal``: the node appends every journal record it writes to
        ``journal-<node_id>.trace`` in the cluster's workdir (:func:`read_trace`)."""
        self.cluster = cluster
        self.node_id = node_id
        self.log = cluster.workdir / f"node-{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: environment every start of this node gets (e.g. injected faults)
        self.extra_env: dict[str, str] = {}
        self._log_offset = 0
        self._command = FTPBC
        if trace_journal:
            self.extra_env[TRACE_ENV] = str(cluster.workdir / f"journal-{node_id}.trace")
            self._command = TRACED  # a topic's node never imports this module as its handler

    def start(self, crash_at: str | None = None, **env: str) -> None:
        with open(self.log, "ab") as log:
            self._log_offset = log.tell()
            # The prefix execs (tests/hosts.py), so proc.pid is the node's own: a kill is a crash.
            self.proc = subprocess.Popen([*self.cluster.prefix_for(self.node_id), *self._command, "serve",
                                          "-c", str(self.cluster.config_for(self.node_id)), "--node-id",
                                          self.node_id], cwd=REPO, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log,
                                         env=self.cluster.env(self.node_id, crash_at,
                                                              **{**self.extra_env, **env}))
        self.starts += 1

    def ready(self) -> bool:
        """True once this run of the node serves (its signal handlers are installed by then)."""
        with open(self.log, "rb") as fh:
            fh.seek(self._log_offset)
            return b"INFO ftpbc.node: serving " in fh.read()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (drain, then exit); SIGKILL if it does not exit within ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout=10)


# ---------------------------------------------------------------------- clients and ledger

@dataclass
class Ledger:
    """What the clients did: acknowledged requests, indeterminate ones and the answers seen."""

    acknowledged: dict[str, bytes] = field(default_factory=dict)
    indeterminate: dict[str, bytes] = field(default_factory=dict)
    rolled_back: dict[str, bytes] = field(default_factory=dict)
    answers: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    timeouts: list[str] = field(default_factory=list)
    submit_errors: int = 0
    collect_retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def _recover_own_send(client: Any, stop: threading.Event) -> tuple[str, str]:
    """After a failed submit: replay this client's journal; (uuid, outcome) of its send."""
    from ftpbc.exchange.recovery import recover_pending

    lifecycles = client.runtime.endpoint_lifecycles(ENDPOINT)
    while True:
        try:
            actions = recover_pending(lifecycles)
            break
        except TransportError:
            if stop.wait(0.2):
                raise
    sends = [a for a in actions if a.op_id.endswith(".send")]
    if not sends:
        raise AssertionError("submit failed, but its client's journal held no send operation")
    a = sends[-1]
    return a.op_id.removesuffix(".send"), a.outcome


def client_loop(cluster: Cluster, client_id: str, bodies: Iterator[bytes], ledger: Ledger,
                stop: threading.Event, collect_timeout: float,
                options: Callable[[bytes], dict[str, Any]] | None = None) -> None:
    """One client: submit, then collect, one request at a time, until ``bodies`` runs out.
    ``options`` gives the submit options of a body (priority, properties...).

    A failed submit is resolved from the client's own journal (never resubmitted blindly, which
    could create a duplicate); a collect that times out is retried with the same UUID once the
    transport may have recovered, for up to ``collect_timeout`` in all.
    """
    from ftpbc.client import Client

    with Client(load_client_config(cluster, client_id), connections=2) as client:
        for body in bodies:
            while True:
                if stop.is_set():
                    return
                try:
                    uid = client.submit(ENDPOINT, body, **(options(body) if options else {}))
                except TransportError:
                    with ledger.lock:
                        ledger.submit_errors += 1
                    uid, outcome = _recover_own_send(client, stop)
                    if outcome.startswith("rolled back"):
                        with ledger.lock:
                            ledger.rolled_back[uid] = body
                        continue  # never exposed: a new request is no duplicate
                    with ledger.lock:
                        ledger.indeterminate[uid] = body
                    # "already exposed and taken, or never uploaded" may be a send whose upload
                    # never started: wait less; the checker tells the two apart on the server.
                    indeterminate_wait = (collect_timeout if outcome == "already exposed"
                                          else min(collect_timeout, INDETERMINATE_WAIT))
                else:
                    indeterminate_wait = collect_timeout
                    with ledger.lock:
                        ledger.acknowledged[uid] = body
                break
            deadline = time.monotonic() + indeterminate_wait
            while True:
                try:
                    answer = client.collect(ENDPOINT, uid, timeout=max(deadline - time.monotonic(), 0.1))
                except RequestTimeout:
                    with ledger.lock:
                        ledger.timeouts.append(uid)
                    break
                except FtpbcError:
                    with ledger.lock:
                        ledger.collect_retries += 1
                    if time.monotonic() < deadline:
                        continue
                    break
                with ledger.lock:
                    ledger.answers[uid].append(answer)
                break


# ---------------------------------------------------------------------- nemesis

@dataclass
class NemesisLog:
    kills: int = 0
    restarts: int = 0
    server_restarts: int = 0
    connection_cuts: int = 0
    #: files planted in the inbox whose listing line does not parse (vsftpd) or whose name cannot
    #: be used (a line break): every node must skip them and go on
    bad_entries: int = 0
    events: list[str] = field(default_factory=list)


#: kills a chaos run owes before its last request is submitted
MIN_KILLS = 5

#: how long a client waits for the nemesis to catch up before the run fails
NEMESIS_CATCH_UP = 60.0


class Nemesis(threading.Thread):
    """SIGKILLs a node every ``min_gap``-``max_gap`` seconds and restarts it at once; each
    ``len(nodes)`` kills hit every node once, in a random order.

    ``once`` maps a progress fraction (0..1 of requests done, read from ``progress()``) to a
    fault run once when progress passes it, e.g. ``{0.33: restart_server, 0.66: drop}``.

    The clients submit through :meth:`await_due`, so the faults are spread over the requests
    however fast the nodes answer: a request past a ``once`` mark waits until that fault ran,
    and the last request waits until ``min_kills`` kills were done.  (Paced by time alone, a
    run that answered quickly finished before its faults.)
    """

    def __init__(self, nodes: list[NodeProcess], progress: Callable[[], float],
                 once: dict[float, tuple[str, Callable[[], object]]], *, min_gap: float = 0.5,
                 max_gap: float = 2.0, seed: int | None = None, min_kills: int = MIN_KILLS,
                 wait_ready: float = 0.0) -> None:
        """``wait_ready``: after a restart, wait up to that many seconds for the node to serve
        again before the next gap begins (0: never wait).  Paced so, the kills follow the
        machine's speed: on a loaded one, where a restart takes longer than the gaps, the
        nodes would otherwise spend their lives starting, and the cluster make no progress."""
        super().__init__(name="nemesis", daemon=True)
        self.wait_ready = wait_ready
        self.nodes = nodes
        self.progress = progress
        self.once = dict(once)
        self.min_gap, self.max_gap = min_gap, max_gap
        self.min_kills = min_kills
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.log = NemesisLog()
        self.error: BaseException | None = None
        self.changed = threading.Condition()
        self._deck: list[NodeProcess] = []

    def _next_victim(self) -> NodeProcess:
        # Drawn from a shuffled deck, not uniformly: every process is killed once in each
        # len(nodes) kills, so a test can count on each of its kinds of process being hit.
        if not self._deck:
            self._deck = self.rng.sample(self.nodes, len(self.nodes))
        return self._deck.pop()

    def _owes(self, fraction: float) -> bool:
        kills_due = min(self.min_kills, int((self.min_kills + 1) * fraction))
        return self.log.kills < kills_due or any(mark < fraction for mark in self.once)

    def await_due(self, fraction: float, timeout: float = NEMESIS_CATCH_UP) -> None:
        """Block until the nemesis has done what it owes before ``fraction`` of the requests
        (returns at once if it stopped or failed)."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.stop_event.is_set() or self.error is not None
                                         or not self._owes(fraction), timeout):
                raise AssertionError(f"the nemesis did not catch up with {fraction:.0%} of the "
                                     f"requests in {timeout:.0f} s: {self.log}")

    def run(self) -> None:
        try:
            # The schedule is the nemesis's own randomised pacing, not a synchronisation.
            while not self.stop_event.wait(self.rng.uniform(self.min_gap, self.max_gap)):
                for mark in sorted(self.once):
                    if self.progress() >= mark:
                        what, fault = self.once[mark]
                        fault()
                        with self.changed:  # the mark is paid only once its fault has run
                            del self.once[mark]
                            self.log.events.append(f"{time.time():.3f} {what}")
                            if what == "restart-server":
                                self.log.server_restarts += 1
                            elif what == "bad-listing-line":
                                self.log.bad_entries += 1
                            else:
                                self.log.connection_cuts += 1
                            self.changed.notify_all()
                node = self._next_victim()
                node.kill()
                node.start()
                with self.changed:
                    self.log.kills += 1
                    self.log.restarts += 1
                    self.log.events.append(f"{time.time():.3f} kill+restart {node.node_id}")
                    self.changed.notify_all()
                ready_by = time.monotonic() + self.wait_ready
                while not node.ready() and time.monotonic() < ready_by and not self.stop_event.wait(0.05):
                    pass  # a condition polled until its deadline (or the nemesis stops)
        except BaseException as exc:  # reported by the test, never swallowed
            self.error = exc
        finally:
            with self.changed:
                self.changed.notify_all()

    def halt(self) -> None:
        self.stop_event.set()
        with self.changed:
            self.changed.notify_all()
        self.join(timeout=30)


#: the nemesis's flaky poll lock: flock failing as on an NFS mount without locks
FLAKY_POLL_LOCK = "poll-lock=0.05"

#: a name with a line break: vsftpd's LIST then has a line that does not parse, other servers
#: list a name no layout can use; either way every node must skip it and go on
BAD_ENTRY = "junk\nsize=\u00b2;type=file; req.bogus"


# ---------------------------------------------------------------------- the checker

@dataclass
class Verdict:
    requests: int
    answered: int
    lost: list[str]
    answered_twice: list[str]
    unexpected: list[str]
    indeterminate_answered: int
    indeterminate_absent: int
    rolled_back_present: list[str]
    handler_starts: int
    handler_returns: int
    handler_cut_short: int
    handler_repeated: int
    recorded_twice: list[str]
    responses_on_server: int
    leftovers: dict[str, list[str]]
    pending: dict[str, dict[str, list[str]]]
    journal_files_nonempty: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.answered_twice or self.unexpected or self.recorded_twice
                    or self.rolled_back_present or self.leftovers or self.pending
                    or self.journal_files_nonempty)

    def summary(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("lost", "answered_twice", "unexpected", "recorded_twice", "rolled_back_present",
                  "journal_files_nonempty"):
            d[k] = len(d[k])
        d["leftovers"] = {k: len(v) for k, v in self.leftovers.items()}
        d["pending"] = sum(len(ops) for eps in self.pending.values() for ops in eps.values())
        return d


def _uuid_of(name: str, prefix: str) -> str | None:
    if not name.startswith(prefix):
        return None
    base = name.split("~", 1)[0]
    # Headers follow the uuid after ';' (``req.<uuid>;p=8``: a request sent with a priority).
    return base[len(prefix):].split(";", 1)[0].removesuffix(".error")


def server_census(cluster: Cluster) -> tuple[Counter[str], set[str]]:
    """What the server holds: responses per request UUID (every out directory) and the UUIDs of
    the requests still anywhere in the in directories."""
    responses: Counter[str] = Counter()
    for d in ("outarchive", "outbox", "outselect", "outstage"):
        for name in cluster.files(d):
            if (u := _uuid_of(name, "resp.")) is not None:
                responses[u] += 1
    requests_seen: set[str] = set()
    for d in ("inarchive", "inerror", "inbox", "inselect", "instage"):
        for name in cluster.files(d):
            if (u := _uuid_of(name, "req.")) is not None:
                requests_seen.add(u)
    return responses, requests_seen


def check(cluster: Cluster, ledger: Ledger) -> Verdict:
    """Classify every request, from the clients' answers plus the server's archives."""
    responses, requests_seen = server_census(cluster)
    expected = {**ledger.acknowledged, **ledger.indeterminate}
    answered, lost, twice, unexpected = 0, [], [], []
    ind_answered = ind_absent = 0
    for uid, body in expected.items():
        got = ledger.answers.get(uid, [])
        if len(got) > 1 or responses[uid] > 1:
            twice.append(uid)
        elif got and got[0] != b"re:" + body:
            unexpected.append(uid)
        elif got:
            answered += 1
            ind_answered += uid in ledger.indeterminate
        elif uid in ledger.indeterminate and uid not in requests_seen and not responses[uid]:
            ind_absent += 1  # a submit that failed before its request was exposed
        else:
            lost.append(uid)
    unexpected += sorted(u for u in ledger.answers if u not in expected)
    unexpected += sorted(u for u in responses if u not in expected and u not in ledger.rolled_back)
    rolled_back_present = sorted(u for u in ledger.rolled_back if u in requests_seen or responses[u])
    inv = read_invocations(cluster.handler_logs())
    return Verdict(
        requests=len(expected), answered=answered, lost=lost, answered_twice=twice,
        unexpected=unexpected, indeterminate_answered=ind_answered, indeterminate_absent=ind_absent,
        rolled_back_present=rolled_back_present,
        handler_starts=sum(inv.starts.values()), handler_returns=sum(inv.returns.values()),
        handler_cut_short=inv.cut_short, handler_repeated=sum(n - 1 for n in inv.starts.values() if n > 1),
        recorded_twice=inv.recorded_twice(), responses_on_server=sum(responses.values()),
        leftovers=cluster.leftovers(), pending=cluster.pending(),
        journal_files_nonempty=cluster.nonempty_journal_files())


# ---------------------------------------------------------------------- one chaos run

@dataclass
class ChaosResult:
    verdict: Verdict
    nemesis: NemesisLog
    ledger: Ledger
    seconds: float
    final_recovery: dict[str, str]
    #: :func:`forensics` of the first few lost, twice-answered and wrongly answered requests
    evidence: dict[str, Any]

    def report(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 1), "kills": self.nemesis.kills,
                "node_restarts": self.nemesis.restarts, "server_restarts": self.nemesis.server_restarts,
                "connection_cuts": self.nemesis.connection_cuts,
                "submit_errors": self.ledger.submit_errors, "rolled_back": len(self.ledger.rolled_back),
                "collect_retries": self.ledger.collect_retries, **self.verdict.summary()}

    def assert_held(self, cluster: Cluster, requests: int, label: str) -> str:
        """Fail the test unless a :func:`run_chaos` of ``requests`` requests with every nemesis
        (kills, one server restart, one connection cut, one bad entry, the flaky poll lock) kept
        every guarantee: nothing lost, answered twice or unexpected, no recorded handler run
        again, every stage, box, select and journal empty.  Prints the report (``label``);
        returns the nodes' logs, for more checks."""
        report = self.report()
        print(f"{label}: {report}")
        v = self.verdict
        assert self.nemesis.kills >= MIN_KILLS and self.nemesis.server_restarts == 1
        assert self.nemesis.connection_cuts == 1
        assert self.nemesis.bad_entries == 1  # a listing line / name that cannot be used, skipped
        logs = "".join(p.read_text(errors="replace") for p in cluster.workdir.glob("node-*.log"))
        assert "injected by FTPBC_FAIL" in logs  # the flaky poll lock failed, and was ridden out
        assert v.requests >= requests
        assert v.lost == [], f"lost: {v.lost[:5]} ({report}) evidence: {self.evidence}"
        assert v.answered_twice == [], f"answered twice: {v.answered_twice[:5]} evidence: {self.evidence}"
        assert v.unexpected == [], f"unexpected: {v.unexpected[:5]} evidence: {self.evidence}"
        assert v.rolled_back_present == []
        assert v.recorded_twice == [], "a handler ran again after its result was recorded"
        assert v.leftovers == {}, v.leftovers
        assert v.pending == {}, v.pending
        assert v.journal_files_nonempty == []
        assert v.answered + v.indeterminate_absent == v.requests
        return logs


def run_chaos(cluster: Cluster, *, requests: int, nodes: int = 3, clients: int = 8,
              restart_server: Callable[[], object] | None, drop_connections: Callable[[], object] | None,
              collect_timeout: float = 90.0, min_gap: float = 0.5, max_gap: float = 2.0,
              seed: int | None = None, deadline: float | None = None) -> ChaosResult:
    """Run ``requests`` requests through ``nodes`` serve processes under the nemesis; check them.

    ``deadline`` (seconds) stops submitting new requests when reached (the soak sets it).
    """
    started = time.monotonic()
    procs = [NodeProcess(cluster, f"n{i}") for i in range(nodes)]
    for p in procs:
        p.extra_env = {"FTPBC_FAIL": FLAKY_POLL_LOCK}  # one poll lock in twenty fails (ENOLCK)
        p.start()
    ledger = Ledger()
    stop = threading.Event()
    counter = iter(range(requests))
    counter_lock = threading.Lock()
    done = [0]

    def bodies() -> Iterator[bytes]:
        while True:
            with counter_lock:
                i = next(counter, None)
                if i is None or (deadline is not None and time.monotonic() - started > deadline):
                    return
            nemesis.await_due(i / requests)
            yield f"{i}:{random.getrandbits(64):016x}".encode()
            with counter_lock:
                done[0] += 1

    once: dict[float, tuple[str, Callable[[], object]]] = {}
    if restart_server is not None:
        once[0.3] = ("restart-server", restart_server)
    if drop_connections is not None:
        once[0.6] = ("drop-connections", drop_connections)
    bad_entry = cluster.local("inbox") / BAD_ENTRY
    once[0.45] = ("bad-listing-line", lambda: bad_entry.write_bytes(b"not a message"))
    nemesis = Nemesis(procs, lambda: done[0] / max(requests, 1), once, min_gap=min_gap,
                      max_gap=max_gap, seed=seed)
    errors: list[BaseException] = []

    def run_client(k: int) -> None:
        try:
            client_loop(cluster, f"c{k}", bodies(), ledger, stop, collect_timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run_client, args=(k,), name=f"client-{k}") for k in range(clients)]
    try:
        nemesis.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=collect_timeout * 4 + (deadline or 0))
    finally:
        stop.set()
        nemesis.halt()
        for p in procs:
            if not p.alive:
                p.start()  # a node killed last must still recover before it is stopped
        for p in procs:
            p.stop()
    if errors:
        raise errors[0]
    if nemesis.error is not None:
        raise nemesis.error
    if nemesis.log.bad_entries:
        # Left alone by every node (nobody could claim it); removed so the checks see a clean area.
        assert bad_entry.exists(), "the planted entry was taken by a node"
        bad_entry.unlink()
    final = {}
    for node_id in [p.node_id for p in procs] + [f"c{k}" for k in range(clients)]:
        r = run_cli(cluster, "recover", node_id=node_id)
        final[node_id] = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()
    verdict = check(cluster, ledger)
    evidence = forensics(cluster, ledger,
                         verdict.lost[:5] + verdict.answered_twice[:5] + verdict.unexpected[:5])
    return ChaosResult(verdict, nemesis.log, ledger, time.monotonic() - started, final, evidence)


def forensics(cluster: Cluster, ledger: Ledger, uids: list[str]) -> dict[str, Any]:
    """Everything known about ``uids``: what was sent and answered, every server file carrying
    the uuid (with its first bytes), and the handler log lines, to tell a torn read from a torn
    file when a run answers wrongly."""
    out: dict[str, Any] = {}
    dirs = [p for p in cluster.local().iterdir() if p.is_dir()] if cluster.local().is_dir() else []
    logs = [line for path in cluster.handler_logs() if path.exists()
            for line in path.read_text().splitlines()]
    for uid in uids:
        files = {}
        for d in dirs:
            for f in d.iterdir():
                if uid in f.name:
                    files[f"{d.name}/{f.name}"] = repr(f.read_bytes()[:80])
        out[uid] = {"sent": repr(ledger.acknowledged.get(uid, ledger.indeterminate.get(uid))),
                    "answers": [repr(a[:80]) for a in ledger.answers.get(uid, [])],
                    "server_files": files, "handler_log": [ln for ln in logs if uid in ln]}
    return out


def dump(result: ChaosResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    led, v = result.ledger, result.verdict
    examples = {kind: [{"uuid": u, "sent": repr(led.acknowledged.get(u, led.indeterminate.get(u))),
                        "answers": [repr(a) for a in led.answers.get(u, [])]} for u in uids[:5]]
                for kind, uids in (("lost", v.lost), ("answered_twice", v.answered_twice),
                                   ("unexpected", v.unexpected)) if uids}
    path.write_text(json.dumps({**result.report(), "examples": examples, "evidence": result.evidence,
                                "final_recovery": result.final_recovery,
                                "events": result.nemesis.events}, indent=2) + "\n")
