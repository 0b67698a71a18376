"""Routes in ``ftpbc status``: each route's rulesets and outlinks, and per serving node its live
destinations and figures (docs/routing.md).

A serving node publishes what its routers know, once per housekeeping tick, as
``<state_dir>/routes/<route>~<node>.json`` (:meth:`ftpbc.node.router.Router.status`), and removes
the file when it stops.  This module only reads those files: no lock, no server.  With
``coordination: server`` each node's ``state_dir`` is its own, so ``ftpbc status`` shows the
routes of the nodes on this host only.  Untrusted: a file larger than :data:`MAX_FILE` or that
does not parse is reported, not read.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ftpbc.config.models import Config
from ftpbc.node.router import status_dir

#: the largest status file read (a route with max_destinations live is a few hundred KiB)
MAX_FILE = 4 * 1024 * 1024
#: the figures of a node's route, as published
FIGURES = ("routed", "nohit", "failed", "filed", "retired", "in_flight")


@dataclass
class RouteNodeStatus:
    node: str
    #: from its heartbeat; None when it has none
    alive: bool | None
    #: seconds since the node last published this
    age: float
    figures: dict[str, int] = field(default_factory=dict)
    #: the live destinations: destination, server, capacity, in_flight, delivered, failed,
    #: idle_seconds, max_idle
    destinations: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


@dataclass
class RouteStatus:
    name: str
    source: str
    rulesets: list[str]
    failure: str | None
    nohit: str | None
    nodes: list[RouteNodeStatus] = field(default_factory=list)


def route_statuses(config: Config, alive: dict[str, bool] | None = None) -> list[RouteStatus]:
    """Every configured route, with what each node publishing it says (``alive``: node id ->
    alive, from the heartbeats)."""
    directory = status_dir(config)
    now = time.time()
    out = []
    for name in sorted(config.routes):
        route = config.routes[name]
        status = RouteStatus(name, route.source, [r.name for r in route.rulesets], route.failure, route.nohit)
        files = sorted(directory.glob(f"{name}~*.json")) if directory.is_dir() else []
        for path in files:
            node = path.name[len(name) + 1:-len(".json")]
            entry = RouteNodeStatus(node, (alive or {}).get(node), 0.0)
            try:
                stat = path.stat()
                entry.age = round(max(now - stat.st_mtime, 0.0), 1)
                if stat.st_size > MAX_FILE:
                    raise ValueError(f"{stat.st_size} bytes, over {MAX_FILE}")
                raw = json.loads(path.read_text(encoding="utf-8"))
                entry.figures = {k: int(raw.get(k, 0)) for k in FIGURES}
                entry.destinations = [d for d in raw.get("destinations", []) if isinstance(d, dict)]
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                entry.error = f"{path}: cannot read it: {exc}"
            status.nodes.append(entry)
        out.append(status)
    return out


def render_routes(routes: list[RouteStatus]) -> list[str]:
    """The lines ``ftpbc status`` prints for the routes."""
    lines = []
    for r in routes:
        lines.append(f"route {r.name} (from endpoint {r.source}; rulesets {', '.join(r.rulesets)}; "
                     f"nohit {r.nohit or 'source error directory'}; "
                     f"failure {r.failure or 'source error directory'})")
        if not r.nodes:
            lines.append("  no serving node publishes it")
        for n in r.nodes:
            state = {True: "alive", False: "DEAD", None: "no heartbeat"}[n.alive]
            if n.error:
                lines.append(f"  node {n.node} ({state}): {n.error}")
                continue
            figures = ", ".join(f"{k} {n.figures.get(k, 0)}" for k in FIGURES)
            lines.append(f"  node {n.node} ({state}, {n.age:.1f} s ago): {figures}; "
                         f"{len(n.destinations)} live destination(s)")
            for d in n.destinations:
                lines.append(f"    {d.get('destination')}  capacity {d.get('capacity')}  in flight "
                             f"{d.get('in_flight')}  delivered {d.get('delivered')}  failed {d.get('failed')}"
                             f"  idle {d.get('idle_seconds')} s of {d.get('max_idle')}")
    return lines
