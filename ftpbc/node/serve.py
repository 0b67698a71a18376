"""A serving node: what ``ftpbc serve`` runs.

Start-up order matters: the heartbeat first (so no other node mistakes us for dead while we
recover), then journal recovery (our own unfinished operations), then the pollers.  Shutdown
is the reverse: stop polling, drain in-flight handlers within ``drain_timeout``, release locks,
remove the heartbeat.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError
from ftpbc.exchange.message import Message
from ftpbc.exchange.recovery import Action
from ftpbc.exchange.runtime import Runtime
from ftpbc.exchange.sweeper import Sweeper
from ftpbc.node.provider import Poller, Provider

log = logging.getLogger("ftpbc.node")

Handler = Callable[[Message], object]


def load_handler(spec: str, *, key: str, source: str) -> Handler:
    """Import ``package.module:function``; ConfigError naming it if that fails."""
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # so examples.handlers works from a checkout
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"cannot import handler module {module_name!r}: {type(exc).__name__}: {exc}",
                          file=source, key=key) from None
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ConfigError(f"handler {spec!r}: {module_name} has no callable {attr!r}", file=source, key=key)
    return handler  # type: ignore[no-any-return]


def recover(runtime: Runtime, *, orphans: bool = True) -> list[Action]:
    """Replay this node's journal (see :meth:`Runtime.recover`)."""
    return runtime.recover(orphans=orphans)


class Node:
    def __init__(self, config: Config, handlers: dict[str, Handler] | None = None) -> None:
        self.config = config
        handlers = handlers or {}
        served = {name: ep for name, ep in config.endpoints.items() if ep.handler or name in handlers}
        self.handlers: dict[str, Handler] = {}
        for name, ep in served.items():
            if name in handlers:
                self.handlers[name] = handlers[name]
            else:
                assert ep.handler is not None
                self.handlers[name] = load_handler(ep.handler, key=f"endpoints.{name}.handler",
                                                   source=config.source)
        self.transfer_handlers: dict[str, Handler] = {}
        for name, tc in config.transfers.items():
            if tc.receive_from is not None and (tc.handler or name in handlers):
                self.transfer_handlers[name] = handlers.get(name) or load_handler(
                    str(tc.handler), key=f"transfers.{name}.handler", source=config.source)
        workers = (sum(config.endpoints[n].workers for n in self.handlers)
                   + sum(config.transfers[n].workers for n in self.transfer_handlers))
        served_count = len(self.handlers) + len(self.transfer_handlers)
        self.runtime = Runtime(config, connections=workers + 2 * served_count + 1)
        self.providers: dict[str, Poller] = {}
        self.sweepers: list[Sweeper] = []
        #: sweep rounds done (every sweeper once per round)
        self.sweeps = 0
        self.recovered: list[Action] = []
        self._stop = threading.Event()
        self._sweep_thread: threading.Thread | None = None

    @property
    def node_id(self) -> str:
        return self.config.node.id

    def start(self) -> None:
        node = self.config.node
        state_dir = Path(node.state_dir)
        self.runtime.heartbeat.start()
        self.recovered = recover(self.runtime)
        for name, handler in self.handlers.items():
            ep = self.config.endpoints[name]
            inbound, outbound = self.runtime.endpoint_lifecycles(name)
            lock = PollLock(state_dir, name, ep.lock, holder=node.id, lease=node.lease)
            self.providers[name] = Provider(name, ep, inbound, handler, lock)
            self.sweepers.append(Sweeper([inbound, outbound], state_dir, node.lease,
                                         uncollected_after=ep.uncollected_after))
            log.info("serving %s on %s%s (lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[ep.server].display, ep.repository, ep.lock, ep.workers, self.node_id)
        for name, handler in self.transfer_handlers.items():
            tc = self.config.transfers[name]
            lc = self.runtime.transfer(name)
            self.providers[name] = Provider(name, tc, lc, handler,
                                            PollLock(state_dir, lc.layout.key, tc.lock, holder=node.id,
                                                     lease=node.lease))
            self.sweepers.append(Sweeper([lc], state_dir, node.lease))
            log.info("serving transfer %s on %s%s (lock: %s, workers: %d, node: %s)", name,
                     self.config.servers[tc.server].display, tc.receive_from, tc.lock, tc.workers,
                     self.node_id)
        for poller in self.providers.values():
            poller.start()
        self._sweep_thread = threading.Thread(target=self._sweep_loop, name="sweeper", daemon=True)
        self._sweep_thread.start()

    def _sweep_loop(self) -> None:
        interval = self.config.node.lease / 3
        while not self._stop.wait(interval):
            for s in self.sweepers:
                try:
                    s.sweep()
                except Exception as exc:  # the sweeper never dies: log and go on next round
                    log.warning("%s: sweep failed: %s: %s", s.endpoint, type(exc).__name__, exc)
            self.sweeps += 1

    def stop(self, drain_timeout: float | None = None) -> bool:
        """Stop polling and drain; True if every in-flight handler finished in time."""
        self._stop.set()
        drained = True
        for provider in self.providers.values():
            limit = provider.config.drain_timeout if drain_timeout is None else drain_timeout
            drained = provider.stop(limit) and drained
        if self._sweep_thread is not None:
            self._sweep_thread.join(timeout=5)
        # A node that did not drain keeps its heartbeat file: its claims stay its own until the
        # lease runs out or it restarts and recovers them.
        self.runtime.heartbeat.stop(remove=drained)
        self.runtime.close()
        return drained

    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
