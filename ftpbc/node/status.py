"""The cluster at a glance, for ``ftpbc status``: nodes from their heartbeats in ``state_dir``,
and per endpoint the depth of every directory of its exchange area, the oldest waiting
message, and what was served over the last minute (from the archive names' stamps).

Read-only: it lists directories and reads heartbeat files; it opens no journal, takes no lock
and moves nothing, so it is safe beside running nodes.  It reads the state of
``coordination: state_dir`` (heartbeats kept on a server are not shown).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ftpbc.cluster.heartbeat import is_dead
from ftpbc.config.models import Config
from ftpbc.errors import FtpbcError, NotFound
from ftpbc.exchange.area import KINDS, REASON_SUFFIX, ExchangeArea, parse_archive_name
from ftpbc.transport import Transport, open_transport
from ftpbc.transport.base import Entry

#: seconds over which throughput is counted
WINDOW = 60.0
#: directories whose messages are waiting for someone (their oldest entry's age is shown)
WAITING = ("inbox", "outbox")


@dataclass
class NodeStatus:
    id: str
    alive: bool
    heartbeat_age: float
    pid: int | None = None
    host: str | None = None


@dataclass
class EndpointStatus:
    name: str
    server: str
    repository: str
    #: directory (``inbox``, ``inselect``...) -> files in it (``.reason`` files not counted)
    depth: dict[str, int] = field(default_factory=dict)
    #: ``inbox``/``outbox`` -> seconds the oldest file there has waited (absent when empty)
    oldest_age: dict[str, float] = field(default_factory=dict)
    #: requests archived within the last WINDOW seconds, per node that served them
    served_last_minute: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def served_total(self) -> int:
        return sum(self.served_last_minute.values())


@dataclass
class ClusterStatus:
    state_dir: str
    lease: float
    time: str
    nodes: list[NodeStatus]
    endpoints: list[EndpointStatus]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for ep, raw in zip(self.endpoints, out["endpoints"], strict=True):
            raw["served_per_minute"] = ep.served_total
        return out


def node_statuses(state_dir: Path, lease: float, *, now: float | None = None) -> list[NodeStatus]:
    """Every node (or client) with a heartbeat file in ``state_dir``, alive or dead."""
    directory = Path(state_dir) / "heartbeats"
    now = time.time() if now is None else now
    out: list[NodeStatus] = []
    if not directory.is_dir():
        return out
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        try:
            age = max(now - path.stat().st_mtime, 0.0)
            fields = path.read_text(encoding="utf-8", errors="replace").split()
        except OSError:
            continue  # removed meanwhile: a node that stopped cleanly
        pid = int(fields[0]) if fields and fields[0].isdigit() else None
        host = fields[2] if len(fields) > 2 else None
        out.append(NodeStatus(path.name, not is_dead(directory.parent, path.name, lease), round(age, 3),
                              pid, host))
    return out


def _files(transport: Transport, path: str) -> list[Entry]:
    try:
        return [e for e in transport.list(path) if not e.is_dir]
    except NotFound:
        return []


def endpoint_status(name: str, config: Config, transport: Transport, *,
                    now: datetime | None = None) -> EndpointStatus:
    """Depths, oldest waiting ages and last-minute throughput of endpoint ``name``."""
    ep = config.endpoints[name]
    status = EndpointStatus(name, ep.server, ep.repository)
    area = ExchangeArea(ep.repository)
    now = now or datetime.now(UTC)
    for direction in ("in", "out"):
        for kind in KINDS:
            directory = f"{direction}{kind}"
            entries = _files(transport, area.dir(direction, kind))
            entries = [e for e in entries if not e.name.endswith(REASON_SUFFIX)]
            status.depth[directory] = len(entries)
            if directory in WAITING:
                times = [e.mtime for e in entries if e.mtime is not None]
                if times:
                    status.oldest_age[directory] = round(max((now - min(times)).total_seconds(), 0.0), 3)
            if directory == "inarchive":
                for e in entries:
                    _, node, when = parse_archive_name(e.name)
                    if node is not None and when is not None and 0 <= (now - when).total_seconds() <= WINDOW:
                        status.served_last_minute[node] = status.served_last_minute.get(node, 0) + 1
    return status


def cluster_status(config: Config) -> ClusterStatus:
    """Everything ``ftpbc status`` shows; an endpoint whose server fails says so in ``error``."""
    transports: dict[str, Transport] = {}
    endpoints = []
    try:
        for name in sorted(config.endpoints):
            ep = config.endpoints[name]
            try:
                if ep.server not in transports:
                    transports[ep.server] = open_transport(config.servers[ep.server])
                endpoints.append(endpoint_status(name, config, transports[ep.server]))
            except FtpbcError as exc:
                endpoints.append(EndpointStatus(name, ep.server, ep.repository,
                                                error=f"{type(exc).__name__}: {exc}"))
    finally:
        for t in transports.values():
            t.close()
    state_dir = Path(config.node.state_dir)
    return ClusterStatus(str(state_dir), config.node.lease, datetime.now(UTC).isoformat(timespec="seconds"),
                         node_statuses(state_dir, config.node.lease), endpoints)


def render(status: ClusterStatus) -> str:
    """The text ``ftpbc status`` prints."""
    lines = [f"nodes (heartbeats in {status.state_dir}, lease {status.lease:g} s) at {status.time}"]
    if not status.nodes:
        lines.append("  none")
    for n in status.nodes:
        where = " ".join(x for x in (f"pid {n.pid}" if n.pid else "",
                                     f"host {n.host}" if n.host else "") if x)
        lines.append(f"  {n.id:<24} {'alive' if n.alive else 'DEAD':<6} heartbeat {n.heartbeat_age:.1f} s ago"
                     f"{'  ' + where if where else ''}")
    for ep in status.endpoints:
        lines.append(f"endpoint {ep.name} ({ep.server}:{ep.repository})")
        if ep.error:
            lines.append(f"  cannot list: {ep.error}")
            continue
        for direction in ("in", "out"):
            cells = []
            for kind in KINDS:
                d = f"{direction}{kind}"
                count = ep.depth.get(d, 0)
                if count or kind in ("box", "select", "error"):
                    oldest = ep.oldest_age.get(d)
                    cells.append(f"{d} {count}" + (f" (oldest {oldest:.1f} s)" if oldest is not None else ""))
            lines.append("  " + "  ".join(cells))
        per_node = ", ".join(f"{node} {count}" for node, count in sorted(ep.served_last_minute.items()))
        lines.append(f"  served in the last minute: {ep.served_total}"
                     + (f" ({per_node})" if per_node else ""))
    return "\n".join(lines)
