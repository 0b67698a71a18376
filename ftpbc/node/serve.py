"""A serving node: what ``ftpbc serve`` runs.

Start-up order matters: the heartbeat first (so no other node mistakes us for dead while we
recover), then journal recovery (our own unfinished operations), then the pollers.  Shutdown
is the reverse: stop polling, drain in-flight handlers within ``drain_timeout``, release locks,
remove the heartbeat.

A start-up that fails is tried again, whatever failed (a server down, a refused login, a
directory that cannot be made, a journal that cannot be replayed), until it succeeds or the node
is stopped: a node never sits alive without serving and without saying so.  Meanwhile its
heartbeat says ``not serving: <why>`` and ``/readyz`` answers 503 with the same reason.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ftpbc.cluster.coordination import Peers
from ftpbc.cluster.heartbeat import Serves
from ftpbc.cluster.liveness import LoopGuard
from ftpbc.config.models import CLIENT_ID_RE, Config
from ftpbc.errors import ConfigError
from ftpbc.exchange.recovery import Action
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.sweeper import Sweeper
from ftpbc.model.message import Message
from ftpbc.node.fanout import FanOut, TopicSweeper, declare_subscriptions, remove_orphan_copies
from ftpbc.node.poller import Poller
from ftpbc.node.provider import Provider

log = logging.getLogger("ftpbc.node")

#: a handler: called with each message of the endpoint it serves; what it returns is the reply
#: body (bytes, str or None: :data:`ftpbc.HandlerResult`), what it raises an error reply
Handler = Callable[[Message], object]

#: why a node does not serve before its first start-up attempt ends (for /readyz; the
#: heartbeat says nothing of it: a start that succeeds at once is the common case)
STARTING = "starting: recovery and the servers' directories"


def load_handler(spec: str, *, key: str, source: str, path: Sequence[str | Path] = ()) -> Handler:
    """Import ``package.module:function``; ConfigError naming it if that fails.

    ``path``: directories to import handler modules from as well (node.handler_path, ``serve
    --path``).  They are searched after the installed packages, so a file there never replaces a
    library ftpbc itself uses; the working directory is not searched unless named (a stray
    ``paramiko.py`` in it once replaced the real one).
    """
    module_name, _, attr = spec.partition(":")
    use_handler_path(path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"cannot import handler module {module_name!r}: {type(exc).__name__}: {exc}",
                          file=source, key=key) from None
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ConfigError(f"handler {spec!r}: {module_name} has no callable {attr!r}", file=source, key=key)
    return handler  # type: ignore[no-any-return]


def use_handler_path(path: Sequence[str | Path]) -> None:
    """Append each directory of ``path`` (made absolute) to ``sys.path`` unless it is there."""
    for entry in path:
        directory = str(Path(entry).absolute())
        if directory not in sys.path:
            sys.path.append(directory)


def recover(runtime: Runtime, *, orphans: bool = True) -> list[Action]:
    """Replay this node's journal (see :meth:`Runtime.recover`)."""
    return runtime.recover(orphans=orphans)


class Node:
    """A serving node, what ``ftpbc serve`` runs: the endpoints with a handler, the transfers
    with a ``receive_from``, the topics it fans out and the routes of one configuration, served
    by one node identity (``node.id``) in this process.

    ``with Node(config) as node: ...`` starts it (:meth:`start`) and stops it (:meth:`stop`)
    when the block ends.  Several nodes, in one process or many, hosts included, share the work
    of the same exchange areas.

    Guaranteed (docs/guarantees.md): every claimed message is journaled before its handler runs;
    a recorded result is delivered, never recomputed; a crash is settled at the next start of the
    same identity, or by a live node after the lease; a reply is exposed at most once.  Not
    guaranteed: a handler runs at most once (one cut short by a crash or a drain timeout may run
    again elsewhere: handlers must be idempotent).  Attributes not documented here are internal.
    """

    def __init__(self, config: Config, handlers: dict[str, Handler] | None = None, *,
                 handler_path: Sequence[str | Path] = ()) -> None:
        """Prepare the node: handlers imported, its journal directory opened; no server is
        contacted before :meth:`start`.

        ``handlers``: endpoint or transfer name -> handler, serving that name in place of (or
        without) a ``handler:`` in the configuration.  ``handler_path``: directories to import
        configured handler modules from, after ``node.handler_path`` (``serve --path``).

        Raises ConfigError naming the key when a configured handler cannot be imported or is
        not callable, or when ``node.id`` has the form of a client identity
        (``<id>.client<N>``); JournalError when the journal directory cannot be used.
        """
        if CLIENT_ID_RE.search(config.node.id):
            raise ConfigError(f"node id {config.node.id!r} has the form of a client identity "
                              "(<id>.client<N>); give the serving node another id", key="node.id",
                              file=config.source)
        self.config = config
        handlers = handlers or {}
        search = [*config.node.handler_path, *handler_path]
        served = {name: ep for name, ep in config.endpoints.items() if ep.handler or name in handlers}
        self.handlers: dict[str, Handler] = {}
        for name, ep in served.items():
            if name in handlers:
                self.handlers[name] = handlers[name]
            else:
                assert ep.handler is not None
                self.handlers[name] = load_handler(ep.handler, key=f"endpoints.{name}.handler",
                                                   source=config.source, path=search)
        self.transfer_handlers: dict[str, Handler] = {}
        for name, tc in config.transfers.items():
            if tc.receive_from is not None and (tc.handler or name in handlers):
                self.transfer_handlers[name] = handlers.get(name) or load_handler(
                    str(tc.handler), key=f"transfers.{name}.handler", source=config.source, path=search)
        #: the topics this node fans out (docs/topics.md)
        self.topics = sorted(name for name, topic in config.topics.items() if topic.fanout)
        workers = (sum(config.endpoints[n].workers for n in self.handlers)
                   + sum(config.transfers[n].workers for n in self.transfer_handlers)
                   + sum(config.topics[n].workers for n in self.topics))
        served_count = len(self.handlers) + len(self.transfer_handlers) + len(self.topics)
        #: the routes this node serves (docs/routing.md): each is its source endpoint's handler
        self.routes = sorted(config.routes)
        workers += sum(config.endpoints[config.routes[n].source].workers for n in self.routes)
        served_count += len(self.routes)
        self.runtime = Runtime(config, connections=workers + 2 * served_count + 1)
        # Published in every heartbeat, so that ``ftpbc status`` shows what each node serves.
        self.runtime.heartbeat.serves = Serves(tuple(sorted([*self.handlers, *self.topics])),
                                               tuple(sorted(self.transfer_handlers)))
        if self.routes:
            serves = self.runtime.heartbeat.serves or Serves()
            sources = {config.routes[n].source for n in self.routes}
            self.runtime.heartbeat.serves = Serves(tuple(sorted({*serves.endpoints, *sources})),
                                                   serves.transfers)
        self.providers: dict[str, Poller] = {}
        self.sweepers: list[Sweeper] = []
        #: sweep rounds done (every sweeper once per round)
        self.sweeps = 0
        self.recovered: list[Action] = []
        #: why the node does not serve yet (None once it does); shown by /readyz and the heartbeat
        self.not_serving: str | None = STARTING if served_count else None
        #: called with each new :attr:`not_serving` (None: it serves now), from :meth:`start`
        self.serving_observers: list[Callable[[str | None], None]] = []
        self._beating = False
        self._refused: ConfigError | None = None
        self._stop = threading.Event()
        self._sweep_thread: threading.Thread | None = None
        #: whether :meth:`start` got as far as serving (False: it failed or was interrupted first)
        self.served = False

    @property
    def node_id(self) -> str:
        """This node's identity (``node.id``): its journal, heartbeat and claims carry it."""
        return self.config.node.id

    def start(self) -> None:
        """Recover, then serve; returns once serving, or once :meth:`interrupt` or :meth:`stop`
        was called.

        Every failure of the start-up is tried again (with backoff, one log line per distinct
        failure), a refused login included: ``password_file`` is read again at each login, so
        a corrected file is used at the next try.  Meanwhile :attr:`not_serving` and, from the
        first failure on, the heartbeat say why (each beat says what it was at that beat, so
        ``ftpbc status`` may lag by one heartbeat interval).  A failure that comes back
        unchanged (an endpoint the server cannot hold, say) is tried again for ever; it is
        logged once and shown, not hidden.

        Raises at once, before any heartbeat of this node is written, only when the node id is
        live elsewhere (ConfigError): going on would take that node's heartbeat and journal over.
        """
        guard = LoopGuard("start-up", None, self._stop, first_wait=1.0, max_wait=30.0, logger=log)
        while not self._stop.is_set():
            ready = guard.run(self._attempt)
            if ready:
                break
        if self._refused is not None:
            raise self._refused
        if self._stop.is_set():
            return
        self._serving(None)
        self.served = True
        for poller in self.providers.values():
            poller.start()
        self._sweep_thread = threading.Thread(target=self._sweep_loop, name="sweeper", daemon=True)
        self._sweep_thread.start()

    def _attempt(self) -> bool:
        """One try at starting: True when done (or refused, in :attr:`_refused`); raises what
        failed, having published it as the reason the node does not serve."""
        try:
            if not self._beating:
                # Asked on every try until the heartbeat runs: with ``coordination: server`` the
                # question itself needs the server, which may be down or refuse the login.
                other = self.runtime.coordination.live_elsewhere()
                if other is not None:
                    self._refused = ConfigError(other, key="node.id", file=self.config.source)
                    return True
                self.runtime.heartbeat.start()
                self._beating = True
            self._prepare()
        except Exception as exc:
            self._serving(f"{type(exc).__name__}: {exc}")
            raise
        return True

    def _serving(self, why: str | None) -> None:
        """Publish why the node does not serve (None: it serves) to /readyz and the heartbeat."""
        changed = why != self.not_serving
        self.not_serving = why
        self.runtime.heartbeat.not_serving = why
        if changed:
            for observer in self.serving_observers:
                observer(why)

    def _prepare(self) -> None:
        """Recovery and every served area's directories; raises what the servers answer."""
        self.recovered = recover(self.runtime)
        self._build()

    def _build(self) -> None:
        self.providers, self.sweepers = {}, []  # a retried start builds afresh
        coordination = self.runtime.coordination
        liveness = self.runtime.liveness
        # Which nodes serve each box, from their heartbeats: nodes sharing a box each claim
        # their own part of it without the poll lock (see Provider).
        peers = Peers(coordination, self.config.node.heartbeat_interval)
        for name, handler in self.handlers.items():
            ep = self.config.endpoints[name]
            inbound, outbound = self.runtime.endpoint_lifecycles(name)
            lock = coordination.poll_lock(name, ep.lock)
            self.providers[name] = Provider(name, ep, inbound, handler, lock, liveness=liveness,
                                            share=peers.share(name))
            self.sweepers.append(Sweeper([inbound, outbound], coordination,
                                         uncollected_after=ep.uncollected_after))
            log.info("serving %s on %s%s (lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[ep.server].display, ep.repository, ep.lock, ep.workers, self.node_id)
        for name, handler in self.transfer_handlers.items():
            tc = self.config.transfers[name]
            lc = self.runtime.transfer(name)
            lock = coordination.poll_lock(lc.layout.key, tc.lock)
            self.providers[name] = Provider(name, tc, lc, handler, lock, liveness=liveness,
                                            share=peers.share(name, transfer=True))
            self.sweepers.append(Sweeper([lc], coordination))
            log.info("serving transfer %s on %s%s (lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[tc.server].display, tc.receive_from, tc.lock, tc.workers,
                     self.node_id)
        self._build_topics()
        self._build_routes()

    def _build_topics(self) -> None:
        """A fan-out provider and a sweeper per topic; declared subscriptions made first."""
        from ftpbc.exchange.topics import Registry

        for name in self.topics:
            topic = self.config.topics[name]
            registry = Registry(self.runtime, name)
            declare_subscriptions(registry, topic, self.node_id)
            remove_orphan_copies(self.runtime, name)
            lock = self.runtime.coordination.poll_lock(name, topic.lock)
            self.providers[name] = FanOut(name, topic, self.runtime, registry, lock,
                                          liveness=self.runtime.liveness)
            self.sweepers.append(TopicSweeper(self.runtime, name, registry))
            log.info("serving topic %s (fan-out) on %s%s (lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[topic.server].display, topic.repository, topic.lock, topic.workers,
                     self.node_id)

    def _build_routes(self) -> None:
        """A router and a sweeper per route: the route serves its source endpoint's inbox."""
        from ftpbc.node.router import Router, status_dir

        for name in self.routes:
            route = self.config.routes[name]
            ep = self.config.endpoints[route.source]
            inbound, outbound = self.runtime.endpoint_lifecycles(route.source)
            lock = self.runtime.coordination.poll_lock(route.source, ep.lock)
            self.providers[f"route:{name}"] = Router(name, self.config, inbound, lock,
                                                     liveness=self.runtime.liveness,
                                                     status_dir=status_dir(self.config))
            self.sweepers.append(Sweeper([inbound, outbound], self.runtime.coordination,
                                         uncollected_after=ep.uncollected_after))
            log.info("routing %s from %s%s (%d rulesets, lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[ep.server].display, ep.repository, len(route.rulesets), ep.lock,
                     ep.workers, self.node_id)

    def _sweep_loop(self) -> None:
        interval = self.config.node.lease / 3
        guards = {s.endpoint: LoopGuard(f"sweeper {s.endpoint}", self.runtime.liveness, self._stop,
                                        first_wait=0.0, max_wait=0.0, logger=log) for s in self.sweepers}
        lease = self.runtime.liveness.lease
        while not self._stop.wait(interval):
            if lease is not None and lease.held_for() < self.config.node.lease:
                # Not yet a whole lease of this node's own: another node's stale heartbeat may only
                # mean it had no time to beat again since an outage (see Lease.held_for).
                for g in guards.values():
                    g.progress()  # waiting on purpose is not a stuck sweeper
                continue
            for s in self.sweepers:
                guards[s.endpoint].run(s.sweep)  # never raises; a failed sweep waits for the next round
            self.sweeps += 1
        for g in guards.values():
            self.runtime.liveness.forget(g.loop)

    def interrupt(self) -> None:
        """Make a :meth:`start` that is waiting for servers give up (a signal arrived)."""
        self._stop.set()

    def stop(self, drain_timeout: float | None = None) -> bool:
        """Stop claiming and drain: handlers running get ``drain_timeout`` seconds (default:
        each endpoint's ``drain_timeout``) to finish; the claims of those still running then go
        back to their boxes for other nodes at once, results already recorded are delivered, and
        the heartbeat and connections end.  Returns True if nothing was left behind; False if
        some claims stay for recovery or the lease (the heartbeat file is then kept).  A handler
        cut short this way may run again elsewhere."""
        self._stop.set()
        clean = True
        for provider in self.providers.values():
            limit = provider.config.drain_timeout if drain_timeout is None else drain_timeout
            clean = provider.stop(limit) and clean
        if self._sweep_thread is not None:
            self._sweep_thread.join(timeout=5)
        # A node that left claims behind keeps its heartbeat file: they stay its own until the
        # lease runs out or it restarts and recovers them.
        self.runtime.heartbeat.stop(remove=clean)
        self.runtime.close()
        log.info("node %s stopped%s", self.node_id,
                 "" if clean else " (claims left for recovery or the lease)")
        return clean

    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
