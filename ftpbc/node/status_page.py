"""The status page a node serves on its metrics port: ``/`` (HTML), ``/status.json`` and
``/status.css``.

What it shows is what ``ftpbc status`` computes (:func:`ftpbc.node.status.cluster_status`:
nodes from their heartbeats, each endpoint's directories, topics and subscriptions, routes) and,
for the node serving the page, the figures of its own registry (the samples ``/metrics``
exposes, read the same way, so the two agree at any instant).

Guaranteed:

* the exchange area is listed at most once per :data:`MAX_AGE` seconds however many clients
  ask (one request recomputes while the others are given the previous result, or wait at most
  :data:`WAIT` seconds for the first one); the page says how old its cluster figures are;
* read-only: the server answers GET and HEAD only (:func:`ftpbc.metrics.serve_http`), and
  computing the page moves nothing (see :mod:`ftpbc.node.status` for the one probe it writes
  with ``coordination: server``);
* every value on the page is HTML-escaped: names come from partners and are hostile; the page
  loads nothing but its own stylesheet, and its content security policy forbids the rest
  (scripts included);
* a failure to compute (a server down) is shown on the page, with the last good figures and
  their age, and never stops the server.

Not guaranteed: that figures older than :data:`MAX_AGE` plus the time a listing takes are
never shown (a listing that hangs until its transport's timeout keeps the old ones up).
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from string import Template
from typing import Any

from prometheus_client import CollectorRegistry

from ftpbc.metrics import Page
from ftpbc.node.status import ClusterStatus, EndpointStatus, cluster_status

#: seconds the cluster figures are reused before the exchange area is listed again
MAX_AGE = 5.0
#: seconds the page asks the browser to wait before loading it again
REFRESH = 5
#: seconds a request waits for a computation another request started, when there is nothing older
WAIT = 4.0

#: this node's figures per endpoint: sample name in ``/metrics`` -> column heading
NODE_FIGURES = {
    "ftpbc_messages_served_total": "served",
    "ftpbc_messages_failed_total": "failed",
    "ftpbc_messages_expired_total": "expired",
    "ftpbc_messages_dead_lettered_total": "dead letters",
    "ftpbc_messages_returned_total": "returned",
    "ftpbc_in_flight_messages": "in flight",
    "ftpbc_inbox_messages": "inbox at last listing",
    "ftpbc_inbox_oldest_message_age_seconds": "oldest at last listing (s)",
}

_SECURITY = (
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
     "frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


def _asset(name: str) -> str:
    return resources.files("ftpbc.node").joinpath(name).read_text(encoding="utf-8")


@dataclass
class Snapshot:
    """The cluster figures and when they were computed; ``error`` when the last try failed."""

    status: ClusterStatus | None
    computed: float  # time.monotonic() of ``status``; 0 when there is none
    error: str | None = None
    #: seconds the computation of ``status`` took (what one listing of the area costs)
    took: float = 0.0

    def age(self) -> float | None:
        return None if self.status is None else max(time.monotonic() - self.computed, 0.0)


class StatusCache:
    """``compute()``'s result, reused for ``max_age`` seconds; one computation at a time."""

    def __init__(self, compute: Callable[[], ClusterStatus], max_age: float = MAX_AGE,
                 wait: float = WAIT) -> None:
        self._compute = compute
        self.max_age = max_age
        self.wait = wait
        self._cond = threading.Condition()
        self._snapshot = Snapshot(None, 0.0)
        self._computing = False
        #: computations done (for tests: the area is not listed per request)
        self.computations = 0

    def get(self) -> Snapshot:
        with self._cond:
            snap = self._snapshot
            age = snap.age()
            if age is not None and age < self.max_age:
                return snap
            if self._computing:
                # Someone lists already: the old figures, or a bounded wait for the first ones.
                if snap.status is None:
                    self._cond.wait_for(lambda: not self._computing, timeout=self.wait)
                return self._snapshot
            self._computing = True
        status: ClusterStatus | None = None
        error: str | None = None
        started = time.monotonic()
        try:
            status = self._compute()
        except Exception as exc:  # shown on the page; the server goes on
            error = f"{type(exc).__name__}: {exc}"
        with self._cond:
            self.computations += 1
            now = time.monotonic()
            if status is not None:
                self._snapshot = Snapshot(status, now, took=now - started)
            else:
                old = self._snapshot
                self._snapshot = Snapshot(old.status, old.computed, error, old.took)
            self._computing = False
            self._cond.notify_all()
            return self._snapshot


def node_figures(registry: CollectorRegistry, node_id: str) -> dict[str, dict[str, float]]:
    """This node's figures per endpoint, read from ``registry`` as ``/metrics`` reads them."""
    out: dict[str, dict[str, float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in NODE_FIGURES and sample.labels.get("node") == node_id:
                endpoint = sample.labels.get("endpoint", "")
                out.setdefault(endpoint, {})[sample.name] = sample.value
    return out


def status_document(node_id: str, not_ready: list[str], figures: dict[str, dict[str, float]],
                    snap: Snapshot) -> dict[str, Any]:
    """What ``/status.json`` answers: this node, its figures, and the cluster's."""
    age = snap.age()
    return {
        "node": {"id": node_id, "ready": not not_ready, "not_ready": not_ready,
                 "endpoints": {ep: {NODE_FIGURES[k]: v for k, v in sorted(values.items())}
                               for ep, values in sorted(figures.items())}},
        "cluster": snap.status.to_dict() if snap.status is not None else None,
        "cluster_age_seconds": None if age is None else round(age, 1),
        "cluster_listing_seconds": None if snap.status is None else round(snap.took, 3),
        "cluster_error": snap.error,
        "max_age_seconds": MAX_AGE,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------- HTML


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _table(headings: list[str], rows: list[list[str]], css: str = "") -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in row) + "</tr>" for row in rows)
    cls = f' class="{_e(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value: object, key: str = "", warn: bool = False) -> str:
    attrs = f' data-key="{_e(key)}"' if key else ""
    if warn:
        attrs += ' class="warn"'
    return f"<td{attrs}>{_e(value)}</td>"


def _this_node(node_id: str, not_ready: list[str], figures: dict[str, dict[str, float]]) -> str:
    state = ("<p class=\"ok\" id=\"ready\">ready</p>" if not not_ready else
             "<p class=\"bad\" id=\"ready\">not ready: " + _e("; ".join(not_ready)) + "</p>")
    keys = list(NODE_FIGURES)
    rows = []
    for ep, values in sorted(figures.items()):
        row = [_td(ep, "endpoint")]
        for k in keys:
            value = values.get(k)
            row.append(_td("-" if value is None else _num(value), f"{ep}/{k}",
                           warn=k == "ftpbc_messages_dead_lettered_total" and bool(value)))
        rows.append(row)
    table = _table(["endpoint", *NODE_FIGURES.values()], rows, "figures") if rows else "<p>serves nothing</p>"
    return f"<section id=\"this-node\"><h2>This node: {_e(node_id)}</h2>{state}{table}</section>"


def _nodes(status: ClusterStatus) -> str:
    if status.nodes_error:
        return f"<p class=\"bad\">cannot read heartbeats: {_e(status.nodes_error)}</p>"
    rows = []
    for n in status.nodes:
        if n.not_serving is not None:
            serves = "not serving: " + n.not_serving
        elif n.serves is not None:
            serves = ", ".join([*n.serves.get("endpoints", []),
                                *(f"transfer {t}" for t in n.serves.get("transfers", []))]) or "nothing"
        else:
            serves = "(a client)"
        state = "alive" if n.alive else ("DEAD (no such process)" if n.process_gone else "DEAD")
        rows.append([_td(n.id, "node"), _td(state, f"{n.id}/state", warn=not n.alive),
                     _td(f"{n.heartbeat_age:.1f} s"), _td(n.host or "-"), _td(n.pid or "-"),
                     _td(n.claims_held, f"{n.id}/claims"),
                     _td(sum(n.served_last_minute.values()), f"{n.id}/served_last_minute"),
                     _td(serves, f"{n.id}/serves", warn=n.not_serving is not None)])
    if not rows:
        return "<p>no heartbeats</p>"
    return _table(["node", "state", "heartbeat", "host", "pid", "claims held", "served / min", "serves"],
                  rows)


_DIRS = ("inbox", "inselect", "inerror", "inexpired", "indead", "outbox", "outerror")


def _area_row(label: str, ep: EndpointStatus) -> list[str]:
    if ep.error:
        return [_td(label, "endpoint"), f'<td colspan="{len(_DIRS) + 2}" class="warn">cannot list: '
                f"{_e(ep.error)}</td>"]
    cells = [_td(label, "endpoint")]
    for d in _DIRS:
        cells.append(_td(ep.depth.get(d, 0), f"{label}/{d}", warn=d in ("inerror", "indead", "outerror")
                         and bool(ep.depth.get(d))))
    oldest = ep.oldest_age.get("inbox")
    cells.append(_td("-" if oldest is None else f"{oldest:.1f} s", f"{label}/oldest"))
    cells.append(_td(ep.served_total, f"{label}/served_last_minute"))
    return cells


def _endpoints(status: ClusterStatus) -> str:
    if not status.endpoints:
        return "<p>no endpoints</p>"
    return _table(["endpoint", *_DIRS, "oldest waiting", "served / min"],
                  [_area_row(ep.name, ep) for ep in status.endpoints])


def _topics(status: ClusterStatus) -> str:
    if not status.topics:
        return "<p>no topics</p>"
    parts = []
    for t in status.topics:
        parts.append(f"<h3>topic {_e(t.name)} <small>{_e(t.server)}:{_e(t.repository)}</small></h3>")
        if t.error or t.incoming is None:
            parts.append(f"<p class=\"bad\">cannot list: {_e(t.error)}</p>")
            continue
        inc = t.incoming
        parts.append(f"<p>incoming: inbox <span data-key=\"{_e(t.name)}/incoming\">"
                     f"{_e(inc.depth.get('inbox', 0))}</span>, fanned out in the last minute "
                     f"{_e(inc.served_total)}</p>")
        rows = []
        for s in t.subscriptions:
            age = s.area.oldest_age.get("inbox")
            rows.append([_td(s.name, "subscription"),
                         _td("durable" if s.durable else f"non-durable (owner {s.owner})"),
                         _td(s.selector or "-"),
                         _td(s.backlog, f"{t.name}/{s.name}/backlog"),
                         _td("-" if age is None else f"{age:.1f} s"),
                         _td(s.area.depth.get("indead", 0), f"{t.name}/{s.name}/indead",
                             warn=bool(s.area.depth.get("indead")))])
        parts.append(_table(["subscription", "kind", "selector", "backlog", "oldest", "dead letters"], rows)
                     if rows else "<p>no subscriptions</p>")
    return "".join(parts)


def _routes(status: ClusterStatus) -> str:
    if not status.routes:
        return "<p>no routes</p>"
    rows = []
    for r in status.routes:
        if not r.nodes:
            rows.append([_td(r.name, "route"), _td(r.source), _td(", ".join(r.rulesets)),
                         '<td colspan="3">no serving node publishes it</td>'])
        for n in r.nodes:
            state = {True: "alive", False: "DEAD", None: "no heartbeat"}[n.alive]
            figures = n.error or ", ".join(f"{k} {v}" for k, v in n.figures.items())
            rows.append([_td(r.name, "route"), _td(r.source), _td(", ".join(r.rulesets)),
                         _td(f"{n.node} ({state})"), _td(figures, warn=n.error is not None),
                         _td(len(n.destinations))])
    return _table(["route", "from", "rulesets", "node", "figures", "live destinations"], rows)


def render_html(doc: dict[str, Any], snap: Snapshot, figures: dict[str, dict[str, float]],
                not_ready: list[str]) -> str:
    """The page: every value escaped (see the module's docstring)."""
    status = snap.status
    age = snap.age()
    if status is None:
        cluster = "<p class=\"bad\">no cluster figures yet" + (
            f": {_e(snap.error)}" if snap.error else " (computing)") + "</p>"
    else:
        where = status.coordination or f"state_dir {status.state_dir}"
        note = f"<p class=\"bad\">the last listing failed: {_e(snap.error)}</p>" if snap.error else ""
        cluster = (f"{note}<section id=\"nodes\"><h2>Nodes</h2><p class=\"note\">heartbeats in {_e(where)}, "
                   f"lease {_e(f'{status.lease:g}')} s</p>{_nodes(status)}</section>"
                   f"<section id=\"endpoints\"><h2>Endpoints</h2>{_endpoints(status)}</section>"
                   f"<section id=\"topics\"><h2>Topics</h2>{_topics(status)}</section>"
                   f"<section id=\"routes\"><h2>Routes</h2>{_routes(status)}</section>")
    page = Template(_asset("status_page.html"))
    return page.substitute(
        refresh=str(REFRESH), node=_e(doc["node"]["id"]), time=_e(doc["time"]),
        age=_e("-" if age is None else f"{age:.1f}"),
        took=_e("-" if snap.status is None else f"{snap.took:.2f}"), max_age=_e(f"{MAX_AGE:g}"),
        this_node=_this_node(doc["node"]["id"], not_ready, figures), cluster=cluster)


def status_pages(node_id: str, registry: CollectorRegistry, not_ready: Callable[[], list[str]],
                 cache: StatusCache) -> dict[str, Callable[[], Page]]:
    """The paths the metrics server adds for the status page."""

    def gather() -> tuple[dict[str, Any], Snapshot, dict[str, dict[str, float]], list[str]]:
        snap = cache.get()
        figures = node_figures(registry, node_id)
        why = not_ready()
        return status_document(node_id, why, figures, snap), snap, figures, why

    def page() -> Page:
        doc, snap, figures, why = gather()
        return Page(200, render_html(doc, snap, figures, why).encode(), "text/html; charset=utf-8", _SECURITY)

    def document() -> Page:
        doc = gather()[0]
        return Page(200, (json.dumps(doc, indent=1, default=str) + "\n").encode(),
                    "application/json", _SECURITY)

    css = _asset("status_page.css").encode()

    def stylesheet() -> Page:
        return Page(200, css, "text/css; charset=utf-8", _SECURITY)

    return {"/": page, "/status.json": document, "/status.css": stylesheet}


def cached_cluster_status(config: Any, max_age: float = MAX_AGE) -> StatusCache:
    """A :class:`StatusCache` of ``ftpbc status``'s figures for ``config``."""
    return StatusCache(lambda: cluster_status(config), max_age)
