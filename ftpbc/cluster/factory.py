"""Which :class:`~ftpbc.cluster.coordination.Coordination` a configuration asks for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.coordination import Coordination, StateDirCoordination
from ftpbc.cluster.server import ServerCoordination
from ftpbc.config.models import Config
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConfigError
from ftpbc.transport.base import Transport


def coordination_server(config: Config) -> str:
    """The name of the server ``coordination: server`` keeps the cluster's state on: the one
    named by ``node.coordination_server``, else the first endpoint's (or transfer's) server."""
    node = config.node
    if node.coordination_server is not None:
        if node.coordination_server not in config.servers:
            known = ", ".join(sorted(config.servers)) or "none"
            raise ConfigError(f"unknown server {node.coordination_server!r} (defined: {known})",
                              file=config.source, key="node.coordination_server")
        return node.coordination_server
    for table in (config.endpoints, config.transfers):
        for spec in table.values():
            return spec.server
    raise ConfigError("coordination: server needs a server: name one here (no endpoint or transfer "
                      "names one)", file=config.source, key="node.coordination_server")


def open_coordination(config: Config, connect: Callable[[ServerConfig], Transport]) -> Coordination:
    """The coordination ``config.node`` asks for.  ``connect`` opens a transport (lazily: no
    connection is made here); the server coordination gets one of its own, so that busy
    workers never hold up a heartbeat or a poll lock."""
    node = config.node
    local, _shared = config.sequence_dirs()
    if node.coordination == "state_dir":
        return StateDirCoordination(Path(node.state_dir), node.id, node.lease, local_sequences=local)
    name = coordination_server(config)
    server = config.servers[name]
    if server.pool_size < 4:
        server = server.model_copy(update={"pool_size": 4})
    return ServerCoordination(connect(server), node.coordination_dir, node.id, node.lease,
                              lock_expiry=node.lock_expiry, local_sequences=local,
                              display=f"{server.display}{node.coordination_dir}")
