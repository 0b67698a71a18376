"""A route's serving loop: claim the source endpoint's messages, pick a ruleset, deliver
(docs/routing.md).

The poller (:class:`~ftpbc.node.poller.Poller`: the source endpoint's poll lock, claims no
more than it has idle workers for) claims messages from the source's inbox; a worker reads one
(spooled to disk past a few MiB), decides where it goes and hands it to that destination's
delivery worker (:mod:`ftpbc.node.destinations`), which stages it there (with ``max_retry``
retries), renames it into place and commits the source's claim.  Every step is journaled
(:mod:`ftpbc.exchange.route`), so a node killed at any point delivers the message exactly once
after its restart.

Where a message goes:

* the first ruleset that selects it (:mod:`ftpbc.routing.rules`), to the URI its template
  builds (:mod:`ftpbc.routing.templates`), with the ruleset's default properties added;
* no ruleset: ``nohit``;
* a template that fails (a hostile or missing value, an unknown endpoint, a URL that matches no
  configured server, a destination outside its ruleset's ``allow`` list or inside an endpoint's
  or a topic's area: :mod:`ftpbc.config.routes`), a request (a route carries one-way messages:
  no reply could come), or a delivery that still fails after ``max_retry`` retries:
  ``failure``, its reason in ``<name>.reason`` beside it (a directory) or in its
  ``route_failure`` property (an endpoint or topic);
* a destination endpoint whose bounded inbox stays full through the retries: as a sender's
  overflow, by that endpoint's ``on_overflow``: ``reject``, to ``failure`` (reason ``queue
  full: ...``); ``dead_letter``, filed in its dead letters with the reason beside it;
* an outlink not configured, or one that fails too: the source's error directory with the
  reason (after ``max_deliveries`` attempts for a failing outlink).

The routed message keeps its name's headers and properties (its delivery count starts again
at 0); at an endpoint it takes that endpoint's naming and one-way prefix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ftpbc.cluster.factory import coordination_server
from ftpbc.cluster.liveness import Liveness, LoopGuard
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.models import Config, EndpointConfig
from ftpbc.config.routes import AllowList, Fence, match_server
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConfigError, TransportError
from ftpbc.exchange import route
from ftpbc.exchange.area import archive_name, claim_name
from ftpbc.exchange.capacity import Capacity
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import SPOOL_IN_MEMORY, Claimed, Lifecycle, Unread
from ftpbc.exchange.policy import QueuePolicy
from ftpbc.model.envelope import Envelope, PropertyValue
from ftpbc.node.destinations import Destination, Destinations, InboxFull, retry_policy
from ftpbc.node.poller import Poller
from ftpbc.paths import join
from ftpbc.routing.rules import Ruleset, first_match, text_of, with_defaults
from ftpbc.routing.templates import Lookup, Target, TemplateError, parse_destination
from ftpbc.tracing import TRACE_PROPERTIES, consuming, current_properties
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.route")

#: the property that carries why a message went to a failure outlink that is an endpoint
REASON_PROPERTY = "route_failure"
#: how much of the reason that property keeps (it travels in the file name)
REASON_IN_NAME = 100
#: the directory (below ``state_dir``) where each serving node publishes its routes' figures
STATUS_DIR = "routes"


class RouteError(Exception):
    """Why a message cannot go where its ruleset says; one line."""


@dataclass(frozen=True)
class Plan:
    """Where one message goes and how its destination's worker is set up."""

    key: str
    delivery: route.Delivery
    server: ServerConfig
    prepare: Callable[[Transport], None]
    capacity: int
    max_idle: float
    max_retry: int
    #: routed, nohit or failure
    kind: str
    ruleset: str | None = None
    #: a destination endpoint's bounded inbox, counted before each attempt (None: unbounded)
    bound: Callable[[Transport], Capacity] | None = None
    #: with ``on_overflow: dead_letter``: where a message its inbox had no room for is filed
    #: instead (the overflow's reason -> the delivery to the endpoint's dead letters)
    dead_letter: Callable[[str], route.Delivery] | None = None


@dataclass
class RouteStats:
    routed: int = 0
    nohit: int = 0
    failed: int = 0
    #: filed in the source's error directory (no outlink, or the outlink failed too)
    filed: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


class Router(Poller):
    """The poller, workers and destinations of one route on one node."""

    def __init__(self, name: str, config: Config, lifecycle: Lifecycle, poll_lock: PollLock, *,
                 liveness: Liveness | None = None, status_dir: Path | None = None) -> None:
        self.route_name = name
        self.route = config.routes[name]
        self.source: EndpointConfig = config.endpoint(self.route.source)
        # named as Node.providers keys it, so that readiness finds its poll_interval
        super().__init__(f"route:{name}", self.source, poll_lock, liveness=liveness)
        self.full_config = config
        self.lifecycle = lifecycle
        self.node_id = lifecycle.node_id
        self.rulesets: tuple[Ruleset, ...] = self.route.compiled()
        self._settings = {r.name: r for r in self.route.rulesets}
        self._allow = {r.name: AllowList.of(r.allow, config.servers) for r in self.route.rulesets
                       if r.allow is not None}
        self._fence = Fence.of(config.servers, config.endpoints, config.topics, _coordination_area(config))
        self.destinations = Destinations(name, self.route.max_destinations)
        self.route_stats = RouteStats()
        self._layouts: dict[str, AreaLayout] = {}
        self._layouts_lock = threading.Lock()
        self._status_file = (status_dir / f"{name}~{self.node_id}.json") if status_dir is not None else None
        idle = min([self.route.max_idle, *(r.max_idle for r in self.route.rulesets if r.max_idle)])
        self._tick = max(0.05, min(1.0, idle / 4))
        self._house_thread: threading.Thread | None = None
        self._house_guard = LoopGuard(f"route:{name} destinations", liveness, self._stop,
                                      first_wait=self._tick, logger=log)

    # ------------------------------------------------------------------ polling

    def start(self) -> None:
        super().start()
        self._house_thread = threading.Thread(target=self._housekeeping, name=f"route-{self.route_name}",
                                              daemon=True)
        self._house_thread.start()

    def _poll_locked(self, free: int) -> int:
        lc = self.lifecycle
        waiting = lc.waiting()
        selector = lc.policy.selector  # the source endpoint's selector: the others stay for others
        if selector is not None:
            waiting = [c for c in waiting if selector.matches(c.envelope.headers, c.envelope.properties)]
        self.observer.listed(c.mtime for c in waiting)
        claimed, lost = lc.claim(waiting[:free], "route")
        for c in claimed:
            self._dispatch(lambda c=c: self._route_one(c), c.name)  # type: ignore[misc]
        return self._claimed_count(len(claimed), lost)

    def _housekeeping(self) -> None:
        """Retire idle destinations and publish the figures, every tick, until the node stops."""
        while not self._stop.wait(self._tick):
            self._house_guard.run(self._housekeep_once)
        if self._liveness is not None:
            self._liveness.forget(self._house_guard.loop)

    def _housekeep_once(self) -> None:
        # Published before retiring, so every destination live at a tick is shown at least once,
        # however short its life; and again when some were retired.
        self._write_status()
        if self.destinations.retire_idle():
            self._write_status()

    def stop(self, drain_timeout: float) -> bool:
        clean = super().stop(drain_timeout)
        if self._house_thread is not None:
            self._house_thread.join(timeout=5)
        self.destinations.close()
        if self._status_file is not None:
            try:
                self._status_file.unlink()
            except OSError:
                pass
        return clean

    # ------------------------------------------------------------------ one message

    def _route_one(self, claimed: Claimed) -> bool:
        # Handling while the route decides (nothing journaled yet: a shutdown may hand it back),
        # finishing once it delivers (a delivery under way is this node's until its recovery).
        env = claimed.candidate.envelope
        # The route's span, a child of the sender's; current while it decides and delivers, so
        # the routed message names it as its parent (_plan).
        with self.claims.holding(claimed), consuming("route", self.route.source, env.properties,
                                                     client_id=self.node_id) as span:
            if span:
                span.message(env.headers.id, claimed.size if claimed.size >= 0 else None,
                             env.headers.correlation_id)
            done = self._route(claimed)
            if span and not done:
                span.failed("not settled here: returned, lost to another node, or left for recovery")
            return done

    def _route(self, claimed: Claimed) -> bool:
        lc = self.lifecycle
        started = time.monotonic()
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        with spool:
            unread = lc.read_claim(claimed, spool, retry=self._retry, stop=self._stop)  # type: ignore[arg-type]
            if isinstance(unread, Unread):
                return self._unread(claimed, unread, started)
            plan, reason = self._decide(claimed, spool)  # type: ignore[arg-type]
            if not self.claims.finishing(claimed):
                return False
            if plan is None:
                self._file(claimed, reason or "no outlink")
                return True
            ok = self._deliver(claimed, plan, spool, reason)  # type: ignore[arg-type]
        if ok:
            log.info("%s: %s %s to %s in %.3f s", self.name, claimed.name,
                     plan.kind if plan.kind != "routed" else f"routed by {plan.ruleset}",
                     plan.delivery.label, time.monotonic() - started,
                     extra={"endpoint": self.route.source, "message_id": claimed.uuid})
        return ok

    def _file(self, claimed: Claimed, reason: str) -> None:
        """No outlink for it: the source's error directory, with the reason beside it."""
        self.route_stats.add("filed")
        what = self.lifecycle.file_error(claimed, reason, retry=self._retry)
        log.warning("%s: %s: %s; %s", self.name, claimed.name, reason, what)

    def _decide(self, claimed: Claimed, spool: BinaryIO) -> tuple[Plan | None, str | None]:
        """(where the message goes, the failure reason when it goes to ``failure``)."""
        env = claimed.candidate.envelope
        if env.headers.kind != "oneway":
            reason = (f"a {env.headers.kind}: a route carries one-way messages, no reply could come "
                      f"(route {self.route_name})")
            return self._outlink("failure", claimed, reason), reason
        lookup = _lookup(env)

        def body() -> str:
            spool.seek(0)
            return spool.read(self.route.max_body_scan).decode("utf-8", "replace")

        ruleset = first_match(self.rulesets, lookup, body)
        if ruleset is None:
            return self._outlink("nohit", claimed, None), "no ruleset selected it"
        try:
            uri = ruleset.uri(with_defaults(lookup, ruleset.defaults))
            return self._plan(uri, claimed, ruleset, "routed", None), None
        except (TemplateError, RouteError, ConfigError, ValueError) as exc:
            reason = f"ruleset {ruleset.name}: {exc}"
            return self._outlink("failure", claimed, reason), reason

    def _outlink(self, which: str, claimed: Claimed, reason: str | None) -> Plan | None:
        uri = getattr(self.route, which)
        if uri is None:
            return None
        try:
            return self._plan(uri, claimed, None, which, reason)
        except (TemplateError, RouteError, ConfigError, ValueError) as exc:
            log.warning("%s: %s outlink %s cannot take %s: %s", self.name, which, uri, claimed.name, exc)
            return None

    def _plan(self, uri: str, claimed: Claimed, ruleset: Ruleset | None, kind: str,
              reason: str | None) -> Plan:
        """The plan for ``uri``; TemplateError or RouteError when it cannot be one."""
        target = parse_destination(uri)
        if ruleset is not None and ruleset.template.templated:
            self._check_allowed(uri, target, ruleset)
        settings = self._settings.get(ruleset.name) if ruleset is not None else None
        capacity = (settings.capacity if settings and settings.capacity else None) or self.route.capacity
        max_idle = (settings.max_idle if settings and settings.max_idle else None) or self.route.max_idle
        max_retry = (settings.max_retry if settings and settings.max_retry is not None
                     else self.route.max_retry)
        env = claimed.candidate.envelope
        props = dict(env.properties)
        for key, value in (ruleset.defaults.items() if ruleset is not None else ()):
            props.setdefault(key, value)
        props.update(current_properties())  # the route's span as the parent (tracing on)
        config = self.full_config
        if target.kind in ("endpoint", "topic"):
            table: Mapping[str, object] = config.endpoints if target.kind == "endpoint" else config.topics
            if target.name not in table:
                raise RouteError(f"destination {uri!r}: no such {target.kind} in the configuration")
            if target.name == self.route.source:
                raise RouteError(f"destination {uri!r} is the route's own source")
            layout = self._layout(target.name)
            if target.kind == "topic" and env.headers.timestamp is None:
                # as a publish stamps it: subscriptions made after it was sent do not get it
                env = env.replace(timestamp=datetime.now(UTC))
            if reason is not None:
                props[REASON_PROPERTY] = reason[:REASON_IN_NAME]
            name = _endpoint_name(layout, env, props)
            out = layout.outbound(name, self.node_id, datetime.now(UTC))
            stage_dir = join(layout.stages[0], route.STAGE_DIR)
            delivery = route.Delivery(layout.config.server, out.target,
                                      join(stage_dir, claim_name(name, self.node_id)), out.protect, None,
                                      target.uri)

            def prepare(t: Transport, layout: AreaLayout = layout, stage_dir: str = stage_dir) -> None:
                layout.prepare(t)
                t.mkdir(stage_dir)

            bound, dead_letter = self._bound(layout, name, delivery)
            return Plan(target.uri, delivery, config.servers[layout.config.server], prepare, capacity,
                        max_idle, max_retry, kind, ruleset.name if ruleset else None, bound, dead_letter)
        found = match_server(config.servers, target)
        if found is None:
            raise RouteError(f"destination {uri!r} matches no configured server (by scheme, host, port and "
                             "user, below its base directory): not attempted without credentials")
        server_name, directory = found
        refusal = self._fence.refusal(server_name, directory)
        if refusal is not None:
            raise RouteError(f"destination {uri!r} {refusal}")
        server = config.servers[server_name]
        name = self._file_name(claimed, env, props)
        stage_dir = join(directory, route.STAGE_DIR)
        delivery = route.Delivery(server_name, join(directory, name),
                                  join(stage_dir, claim_name(name, self.node_id)), None, reason, target.uri)

        def prepare_dir(t: Transport, directory: str = directory, stage_dir: str = stage_dir) -> None:
            t.mkdir(directory)
            t.mkdir(stage_dir)

        return Plan(f"{server_name}:{directory}", delivery, server, prepare_dir, capacity, max_idle,
                    max_retry, kind, ruleset.name if ruleset else None)

    def _check_allowed(self, uri: str, target: Target, ruleset: Ruleset) -> None:
        """RouteError unless a destination built from message values lies inside its ruleset's
        ``allow`` list (without one, the load let only endpoint:/topic: templates through)."""
        allow = self._allow.get(ruleset.name)
        if allow is None:
            if target.kind == "directory":
                raise RouteError(f"destination {uri!r} is a directory built from message properties and "
                                 f"ruleset {ruleset.name} has no allow list")
            return
        found = match_server(self.full_config.servers, target) if target.kind == "directory" else None
        if not allow.permits(target, found):
            raise RouteError(f"destination {uri!r} is outside the allow list of ruleset {ruleset.name} "
                             f"({', '.join(allow.entries)})")

    def _bound(self, layout: AreaLayout, name: str, delivery: route.Delivery) -> tuple[
            Callable[[Transport], Capacity] | None, Callable[[str], route.Delivery] | None]:
        """How a destination endpoint's inbox bound is kept: its count (None: unbounded), and
        with ``on_overflow: dead_letter`` the delivery of ``name`` to its dead letters."""
        policy = QueuePolicy.of(layout.config, "in")
        if not policy.bounded:
            return None, None

        def bound(t: Transport) -> Capacity:
            return Capacity(layout, t, policy)

        if policy.on_overflow != "dead_letter":
            return bound, None

        def dead_letter(reason: str) -> route.Delivery:
            when = datetime.now(UTC)
            return dataclasses.replace(
                delivery, target=layout.filed_path(layout.dead_dir, name, self.node_id, when), protect=None,
                reason=f"overflow: {reason}; routed by route {self.route_name} and filed by node "
                       f"{self.node_id} at {when.isoformat(timespec='milliseconds')}, never delivered",
                label=f"{delivery.label} (dead letters)")

        return bound, dead_letter

    def _layout(self, endpoint: str) -> AreaLayout:
        with self._layouts_lock:
            layout = self._layouts.get(endpoint)
            if layout is None:
                layout = AreaLayout(endpoint, self.full_config.endpoint(endpoint), "in")
                # what this node's archive names add (as its own Lifecycle would set it)
                layout.reserve = len(archive_name("", self.node_id, datetime.now(UTC)).encode("utf-8"))
                self._layouts[endpoint] = layout
            return layout

    def _file_name(self, claimed: Claimed, env: Envelope, props: dict[str, PropertyValue]) -> str:
        """The name a message takes in a directory: its own, headers kept, defaults added,
        delivery count reset."""
        layout = self.lifecycle.layout
        assert isinstance(layout, AreaLayout)
        try:
            name = layout.name_for(dataclasses.replace(env.headers, delivery_count=0), props,
                                   env.base if layout.codec.name == "ftpbc" else "")
            layout.check_usable(name)
            return name
        except Exception:  # a name that cannot take the defaults: its own, as it came
            return layout.name_for(env.headers, dict(env.properties),
                                   env.base if layout.codec.name == "ftpbc" else "")

    # ------------------------------------------------------------------ delivery

    def _deliver(self, claimed: Claimed, plan: Plan, spool: BinaryIO, reason: str | None) -> bool:
        """Journal the decision, stage (retried), and if that fails for good, decide again for
        ``failure`` (or, for a full inbox whose endpoint says so, its dead letters); then expose
        and commit.  True once the message is at its place."""
        with ExitStack() as admitted:  # a bounded inbox counts the message until it is exposed
            return self._deliver_admitted(claimed, plan, spool, admitted)

    def _deliver_admitted(self, claimed: Claimed, plan: Plan, spool: BinaryIO, admitted: ExitStack) -> bool:
        lc = self.lifecycle
        commit = lc.layout.commit(claimed.candidate, self.node_id, lc.clock(), error=False)
        fields = route.decide(lc, claimed, plan.delivery, commit)
        dest, error = self._stage(claimed, plan, spool, admitted)
        if dest is None and not self._stop.is_set() and plan.kind != "failure":
            why = _why(error)
            reason = f"delivery to {plan.delivery.label} failed after {plan.max_retry} retries: {why}"
            log.warning("%s: %s: %s", self.name, claimed.name, reason)
            if isinstance(error, InboxFull) and plan.dead_letter is not None:
                filed = plan.dead_letter(f"{why} (after {plan.max_retry} retries)")
                fallback: Plan | None = dataclasses.replace(plan, delivery=filed, kind="failure", bound=None,
                                                            dead_letter=None)
            else:
                fallback = self._outlink("failure", claimed, reason)
            if fallback is None:
                self._file(claimed, reason)
                return False
            plan = fallback
            fields = route.decide(lc, claimed, plan.delivery, commit)
            dest, error = self._stage(claimed, plan, spool, admitted)
        if dest is None:
            # Nothing exposed: back to the inbox (a stopping node: unchanged; otherwise with its
            # delivery count raised, so a message no outlink takes ends in the error directory).
            why = f"delivery to {plan.delivery.label} failed: {_why(error)}"
            what = self._retry(lambda: route.roll_back(lc, claimed, None, None, why,
                                                       count=not self._stop.is_set()))
            log.warning("%s: %s: %s; %s", self.name, claimed.name, why, what)
            return False
        try:
            done = self._retry(lambda: dest.run(lambda t: route.finish(lc, claimed.op_id, fields, t)))
        finally:
            self.destinations.release(dest, delivered=True)
        if done is None:
            log.warning("%s: %s left for recovery: the node is stopping", self.name, claimed.name)
            return False
        self.route_stats.add({"routed": "routed", "nohit": "nohit"}.get(plan.kind, "failed"))
        return True

    def _stage(self, claimed: Claimed, plan: Plan, spool: BinaryIO,
               admitted: ExitStack) -> tuple[Destination | None, TransportError | None]:
        """Stage at the plan's destination under the retry policy: (its worker, still counted
        in flight, once staged; None and the last error after the last retry).  A bounded
        destination inbox is counted first, each attempt; the message admitted stays counted
        until ``admitted`` closes."""
        lc = self.lifecycle
        name = plan.delivery.target.rsplit("/", 1)[-1]
        size = spool.seek(0, os.SEEK_END)

        def make() -> Destination:
            return Destination(plan.key, plan.server, plan.capacity, plan.max_idle, plan.prepare, plan.bound)

        def attempt() -> Destination:
            dest = self.destinations.acquire(plan.key, make)
            try:
                def put(t: Transport) -> None:
                    # Counted until the block ends if the stage fails (a retry counts it anew),
                    # else until ``admitted`` closes.
                    with ExitStack() as counted:
                        if plan.bound is not None:
                            dest.admit(name, size, counted)
                        spool.seek(0)
                        route.stage(lc, claimed.op_id, t, plan.delivery, spool)
                        admitted.push(counted.pop_all())
                dest.run(put)
            except BaseException:
                self.destinations.release(dest, delivered=False)
                raise
            return dest

        try:
            return retry_policy(plan.max_retry, self.route.retry_delay, self._stop)(attempt), None
        except TransportError as exc:
            return None, exc

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, object]:
        """This route's figures and live destinations, as ``ftpbc status`` shows them."""
        s = self.route_stats
        with s.lock:
            counts = {"routed": s.routed, "nohit": s.nohit, "failed": s.failed, "filed": s.filed}
        return {"route": self.route_name, "source": self.route.source, "node": self.node_id,
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"), **counts,
                "retired": self.destinations.retired, "in_flight": self.in_flight,
                "destinations": self.destinations.snapshot()}

    def _write_status(self) -> None:
        if self._status_file is None:
            return
        path = self._status_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.status(), sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)


def _coordination_area(config: Config) -> list[tuple[str, str, str]]:
    """The cluster's coordination directory, with ``coordination: server``: written by any
    producer it would forge locks, heartbeats and sequences, so no route delivers there."""
    if config.node.coordination != "server":
        return []
    try:
        server = coordination_server(config)
    except ConfigError:
        return []  # no server to coordinate on: nothing there to protect
    return [("the cluster's coordination directory", server, config.node.coordination_dir)]


def _why(error: TransportError | None) -> str:
    """A failed delivery's last error, for its reason: a full inbox says so as it is."""
    if error is None or isinstance(error, InboxFull):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _lookup(env: Envelope) -> Lookup:
    """A message's values by name: its properties first, then its headers."""
    props = env.properties
    h = env.headers
    values = h.__dict__
    headers = {spec.name: spec.value_text(values[spec.name]) for spec in type(h).table.lookup}

    def find(name: str) -> str | None:
        if name in props:
            return text_of(props[name])
        return headers.get(name)

    return find


def _endpoint_name(layout: AreaLayout, env: Envelope, props: dict[str, PropertyValue]) -> str:
    """The name a message takes in an endpoint's inbox (that endpoint's naming and one-way
    prefix, the message's id and headers, delivery count 0); RouteError if it cannot be one."""
    cfg = layout.config
    headers = dataclasses.replace(env.headers, kind="oneway", delivery_count=0, reply_to=None)
    base = cfg.oneway_prefix + headers.id if cfg.naming == "ftpbc" else ""
    # The reason travels in the name: shortened, then left out, when the name has no room for it
    # (the whole reason is in the node's log).
    reason = props.get(REASON_PROPERTY)
    tries = [props] if reason is None else [
        {**props, REASON_PROPERTY: str(reason)[:n]} for n in (REASON_IN_NAME, 24)] + [
        {k: v for k, v in props.items() if k != REASON_PROPERTY}]
    # Tracing never costs a delivery: the message's own trace context, not the route's, when
    # the route's does not fit (the route's span adds one to a message that had none).
    own = {k: v for k, v in tries[-1].items() if k not in TRACE_PROPERTIES}
    own.update((k, env.properties[k]) for k in TRACE_PROPERTIES if k in env.properties)
    if own != tries[-1]:
        tries.append(own)
    error: Exception | None = None
    for attempt in tries:
        try:
            name = layout.name_for(headers, attempt, base)
            layout.check_usable(name)
            break
        except Exception as exc:  # too long, or not a name this endpoint's naming can take
            error = exc
    else:
        raise RouteError(f"no name in {layout.display} for it: {error}")
    decoded = layout.codec.decode(name, direction="in")
    if decoded is None or decoded.headers.id != headers.id:
        raise RouteError(f"{layout.display} would not read {name!r} back as message {headers.id!r}")
    return name


def status_dir(config: Config) -> Path:
    """Where serving nodes publish their routes' figures (read by ``ftpbc status``)."""
    return Path(config.node.state_dir) / STATUS_DIR
