"""What a client or a serving node holds open: transports, the journal, sequences, exchanges."""

from __future__ import annotations

import threading
import uuid as uuidlib
from pathlib import Path

from ftpbc.cluster.heartbeat import Heartbeat
from ftpbc.config.models import Config, EndpointConfig
from ftpbc.exchange.area import ExchangeArea
from ftpbc.exchange.lifecycle import Exchange
from ftpbc.journal import Journal
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.sequences import SequenceStore
from ftpbc.transport import Transport, open_transport


class Runtime:
    """Shared by every endpoint of one process with one node identity.  Thread-safe."""

    def __init__(self, config: Config, *, connections: int = 4) -> None:
        self.config = config
        self.node_id = config.node.id
        self.journal = Journal(Path(config.node.journal_dir), self.node_id,
                               durable=config.node.durable_journal)
        local, shared = config.sequence_dirs()
        self.sequences = SequenceStore(local, shared)
        self.heartbeat = Heartbeat(Path(config.node.state_dir), self.node_id, config.node.heartbeat_interval)
        self._connections = connections
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._exchanges: dict[str, Exchange] = {}

    def transport(self, server: str) -> Transport:
        with self._lock:
            if server not in self._transports:
                cfg = self.config.servers[server]
                if cfg.pool_size < self._connections:
                    cfg = cfg.model_copy(update={"pool_size": self._connections})
                self._transports[server] = open_transport(cfg)
            return self._transports[server]

    def exchange(self, endpoint: str) -> Exchange:
        ep = self.config.endpoint(endpoint)
        with self._lock:
            ex = self._exchanges.get(endpoint)
        if ex is None:
            ex = Exchange(endpoint, ExchangeArea(ep.repository), self.transport(ep.server),
                          self.journal.endpoint(endpoint), self.node_id, archive=ep.archive,
                          response_prefix=ep.response_prefix)
            ex.prepare()
            with self._lock:
                ex = self._exchanges.setdefault(endpoint, ex)
        return ex

    def new_message_name(self, endpoint: str, prefix: str) -> tuple[str, str]:
        """A fresh ``(name, uuid)`` from the endpoint's message_name pattern."""
        ep: EndpointConfig = self.config.endpoint(endpoint)
        if ep.message_name == "%u":
            # The default pattern: nothing to expand but the UUID (the general path builds a
            # context and walks the tokens, a fifth of a message's bookkeeping on the send path).
            uid = str(uuidlib.uuid4())
            return prefix + uid, uid
        expansion = Pattern.parse(ep.message_name).expand(
            ExpandContext(endpoint=endpoint, store=self.sequences, tz=ep.timezone))
        assert expansion.uuid is not None  # message_name is validated to contain %u
        return prefix + expansion.name, expansion.uuid

    def close(self) -> None:
        with self._lock:
            transports = list(self._transports.values())
            self._transports.clear()
            self._exchanges.clear()
        for t in transports:
            t.close()
        self.journal.close()
