"""The cluster at a glance, for ``ftpbc status``: nodes from their heartbeats (alive or dead,
what each serves, what each served over the last minute), and per endpoint the depth of every
directory of its exchange area, the oldest waiting message, and what was served over the last
minute (from the archive names' stamps).

Heartbeats are read where ``node.coordination`` keeps them: ``state_dir``, or the coordination
server (:meth:`~ftpbc.cluster.coordination.Coordination.heartbeats`).  Safe beside running nodes:
it lists directories and reads heartbeat files; it opens no journal, takes no lock and moves
nothing.  The only write is the server coordination's clock probe (``clock/<node-id>``), by
which it learns the server's clock to age the heartbeats.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ftpbc.cluster.factory import open_coordination
from ftpbc.cluster.heartbeat import HeartbeatInfo, read_heartbeats
from ftpbc.config.models import Config
from ftpbc.errors import FtpbcError, NotFound
from ftpbc.exchange.area import (
    KINDS,
    REASON_SUFFIX,
    ExchangeArea,
    is_staged_reason,
    parse_archive_name,
    split_claim,
)
from ftpbc.node.route_status import RouteStatus, render_routes, route_statuses
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
    #: ``{"endpoints": [...], "transfers": [...]}`` from its heartbeat; None for a client, a
    #: node that does not serve (see ``not_serving``) or a node whose ftpbc does not publish it
    serves: dict[str, list[str]] | None = None
    #: endpoint -> requests this node archived within the last WINDOW seconds
    served_last_minute: dict[str, int] = field(default_factory=dict)
    #: why this serving node does not serve (its start-up keeps failing), from its heartbeat
    not_serving: str | None = None
    #: its heartbeat is from this host and names a pid no process here has: dead at once
    process_gone: bool = False
    #: messages claimed by this node (in an ``inselect`` under its name) in every endpoint listed
    claims_held: int = 0

    @classmethod
    def of(cls, beat: HeartbeatInfo) -> NodeStatus:
        return cls(beat.node_id, beat.alive, beat.age, beat.pid, beat.host,
                   beat.serves.to_dict() if beat.serves is not None else None,
                   not_serving=beat.not_serving, process_gone=beat.process_gone)


@dataclass
class EndpointStatus:
    name: str
    server: str
    repository: str
    #: directory (``inbox``, ``inselect``...) -> files in it (``.reason`` files not counted)
    depth: dict[str, int] = field(default_factory=dict)
    #: ``inbox``/``outbox`` -> seconds the oldest file there has waited (absent when empty)
    oldest_age: dict[str, float] = field(default_factory=dict)
    #: ``inbox``/``outbox`` -> name of that oldest file (of equal times, the first by name)
    oldest_name: dict[str, str] = field(default_factory=dict)
    #: requests archived within the last WINDOW seconds, per node that served them
    served_last_minute: dict[str, int] = field(default_factory=dict)
    #: node -> messages it holds claimed (``inselect`` files carrying its name)
    claims: dict[str, int] = field(default_factory=dict)
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
    #: where the heartbeats were read (``state_dir <dir>`` or ``server <server><dir>``)
    coordination: str = ""
    #: why no heartbeats could be read (the coordination server failed); None when they were
    nodes_error: str | None = None
    #: the topics, their incoming areas and subscriptions (see :func:`topic_statuses`)
    topics: list[TopicStatus] = field(default_factory=list)
    #: the routes and their live destinations per node (see :mod:`ftpbc.node.route_status`)
    routes: list[RouteStatus] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for ep, raw in zip(self.endpoints, out["endpoints"], strict=True):
            raw["served_per_minute"] = ep.served_total
        return out


def node_statuses(state_dir: Path, lease: float, *, now: float | None = None) -> list[NodeStatus]:
    """Every node (or client) with a heartbeat file in ``state_dir``, alive or dead."""
    return [NodeStatus.of(b) for b in read_heartbeats(state_dir, lease, now=now)]


def _nodes(config: Config) -> tuple[list[NodeStatus], str, str | None]:
    """The nodes from the heartbeats where ``node.coordination`` keeps them, where that is, and
    why they could not be read (None when they were)."""
    coordination = open_coordination(config, open_transport)
    try:
        return [NodeStatus.of(b) for b in coordination.heartbeats()], coordination.where, None
    except FtpbcError as exc:
        return [], coordination.where, f"{type(exc).__name__}: {exc}"
    finally:
        coordination.close()


def attribute_served(nodes: list[NodeStatus], endpoints: list[EndpointStatus]) -> None:
    """Fill each node's ``served_last_minute`` from the endpoints' archive stamps, and its
    ``claims_held`` from their ``inselect`` names."""
    by_id = {n.id: n for n in nodes}
    for ep in endpoints:
        for node_id, count in ep.claims.items():
            if node_id in by_id:
                by_id[node_id].claims_held += count
        for node_id, count in ep.served_last_minute.items():
            if node_id in by_id:
                by_id[node_id].served_last_minute[ep.name] = count


def _files(transport: Transport, path: str) -> list[Entry]:
    try:
        return [e for e in transport.list(path) if not e.is_dir]
    except NotFound:
        return []


def endpoint_status(name: str, config: Config, transport: Transport, *,
                    now: datetime | None = None) -> EndpointStatus:
    """Depths, oldest waiting ages and last-minute throughput of endpoint ``name``."""
    ep = config.endpoint(name)  # a topic's areas too (docs/topics.md)
    status = EndpointStatus(name, ep.server, ep.repository)
    area = ExchangeArea(ep.repository)
    now = now or datetime.now(UTC)
    for direction in ("in", "out"):
        for kind in KINDS:
            directory = f"{direction}{kind}"
            entries = _files(transport, area.dir(direction, kind))
            # reasons are no messages, nor a reason being uploaded (in instage, a moment)
            entries = [e for e in entries if not e.name.endswith(REASON_SUFFIX)
                       and not (kind == "stage" and is_staged_reason(e.name))]
            status.depth[directory] = len(entries)
            if directory in WAITING:
                timed = [(e.mtime, e.name) for e in entries if e.mtime is not None]
                if timed:
                    oldest, oldest_name = min(timed)
                    status.oldest_age[directory] = round(max((now - oldest).total_seconds(), 0.0), 3)
                    status.oldest_name[directory] = oldest_name
            if directory == "inselect":
                for e in entries:
                    claimer = split_claim(e.name)[1]
                    if claimer is not None:
                        status.claims[claimer] = status.claims.get(claimer, 0) + 1
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
    nodes, where, nodes_error = _nodes(config)
    attribute_served(nodes, endpoints)
    return ClusterStatus(str(config.node.state_dir), config.node.lease,
                         datetime.now(UTC).isoformat(timespec="seconds"), nodes, endpoints,
                         coordination=where, nodes_error=nodes_error, topics=topic_statuses(config),
                         routes=route_statuses(config, {n.id: n.alive for n in nodes}))


def render(status: ClusterStatus) -> str:
    """The text ``ftpbc status`` prints."""
    lines = [f"nodes (heartbeats in {status.coordination or 'state_dir ' + status.state_dir}, "
             f"lease {status.lease:g} s) at {status.time}"]
    if status.nodes_error:
        lines.append(f"  cannot read heartbeats: {status.nodes_error}")
    elif not status.nodes:
        lines.append("  none")
    for n in status.nodes:
        where = " ".join(x for x in (f"pid {n.pid}" if n.pid else "",
                                     f"host {n.host}" if n.host else "") if x)
        lines.append(f"  {n.id:<24} {'alive' if n.alive else 'DEAD':<6} heartbeat {n.heartbeat_age:.1f} s ago"
                     f"{'  ' + where if where else ''}"
                     f"{' (no such process on this host)' if n.process_gone else ''}")
        if n.not_serving is not None:
            lines.append(f"    not serving: {n.not_serving}")
        elif n.serves is not None:
            served = [*n.serves.get("endpoints", []),
                      *(f"transfer {t}" for t in n.serves.get("transfers", []))]
            per_minute = ", ".join(f"{ep} {count}" for ep, count in sorted(n.served_last_minute.items()))
            lines.append(f"    serves {', '.join(served) or 'nothing'}; served in the last minute: "
                         f"{sum(n.served_last_minute.values())}" + (f" ({per_minute})" if per_minute else ""))
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
                    cells.append(f"{d} {count}" + (f" (oldest {oldest:.1f} s: {ep.oldest_name[d]})"
                                                   if oldest is not None and d in ep.oldest_name else ""))
            lines.append("  " + "  ".join(cells))
        per_node = ", ".join(f"{node} {count}" for node, count in sorted(ep.served_last_minute.items()))
        lines.append(f"  served in the last minute: {ep.served_total}"
                     + (f" ({per_node})" if per_node else ""))
    lines.extend(render_topics(status.topics))
    lines.extend(render_routes(status.routes))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- topics


@dataclass
class SubscriptionStatus:
    name: str
    durable: bool
    selector: str | None
    owner: str
    created: str
    #: messages waiting in its inbox
    backlog: int
    area: EndpointStatus


@dataclass
class TopicStatus:
    name: str
    server: str
    repository: str
    #: the incoming area (``inbox``: published, not fanned out yet; ``inarchive``: fanned out)
    incoming: EndpointStatus | None = None
    subscriptions: list[SubscriptionStatus] = field(default_factory=list)
    error: str | None = None


def topic_statuses(config: Config) -> list[TopicStatus]:
    """Every topic: its incoming area's depths and fan-out throughput (its archive), and each
    subscription with its backlog; a topic whose server fails says so in ``error``."""
    from ftpbc.exchange.topics import read_subscriptions

    out = []
    for name in sorted(config.topics):
        tc = config.topics[name]
        status = TopicStatus(name, tc.server, tc.repository)
        try:
            with open_transport(config.servers[tc.server]) as transport:
                status.incoming = endpoint_status(name, config, transport)
                for sub in read_subscriptions(transport, name, tc):
                    area = endpoint_status(sub.endpoint, config, transport)
                    status.subscriptions.append(SubscriptionStatus(
                        sub.name, sub.durable, sub.selector, sub.owner,
                        sub.created.isoformat(timespec="seconds"), area.depth.get("inbox", 0), area))
        except FtpbcError as exc:
            status.error = f"{type(exc).__name__}: {exc}"
        out.append(status)
    return out


def render_topics(topics: list[TopicStatus]) -> list[str]:
    """The lines ``ftpbc status`` shows for the topics."""
    lines = []
    for t in topics:
        lines.append(f"topic {t.name} ({t.server}:{t.repository})")
        if t.error or t.incoming is None:
            lines.append(f"  cannot list: {t.error}")
            continue
        inc = t.incoming
        oldest = inc.oldest_age.get("inbox")
        lines.append(f"  incoming inbox {inc.depth.get('inbox', 0)}"
                     + (f" (oldest {oldest:.1f} s)" if oldest is not None else "")
                     + f"  inselect {inc.depth.get('inselect', 0)}  inerror {inc.depth.get('inerror', 0)}"
                     + f"  fanned out in the last minute: {inc.served_total}")
        if not t.subscriptions:
            lines.append("  no subscriptions")
        for s in t.subscriptions:
            age = s.area.oldest_age.get("inbox")
            kind = "durable" if s.durable else f"non-durable (owner {s.owner})"
            extra = "".join(f"  {d} {s.area.depth[d]}" for d in ("inselect", "inerror", "indead")
                            if s.area.depth.get(d))
            lines.append(f"  subscription {s.name}: {kind}"
                         + (f", selector {s.selector!r}" if s.selector else "")
                         + f"; backlog {s.backlog}" + (f" (oldest {age:.1f} s)" if age is not None else "")
                         + extra)
    return lines
