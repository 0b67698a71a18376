"""Where a message is and was: its trail across every exchange area of one configuration.

A message leaves its name wherever it goes: ``instage/req.<id>~<client>`` while it is uploaded,
``inbox/req.<id>`` while it waits, ``inselect/req.<id>~<node>`` while a node holds it,
``inarchive/req.<id>~<node>~<stamp>`` once served, ``outbox/resp.<id>`` once answered, and so on
for errors (with a ``.reason`` file beside), expiry, dead letters, topic fan-out copies and route
destinations (:mod:`ftpbc.exchange.area`).  :class:`Tracer` lists those directories, keeps the
names that are the message's, and puts them in time order: a :class:`Trace` of
:class:`Sighting` s.  Node journals, where given, add the operations still recorded there.

What a trace costs (docs/tracing.md)
    One listing per directory: for each endpoint 16 (``in`` and ``out``: box, stage, select,
    archive, protect, error, expired, dead), for each topic 8 plus 8 per subscription and one per
    fan-out directory, one per route directory destination.  Names carry the id, so a trace by
    id (or correlation id) asks the server for ``*<id>*`` only, where it lists by glob (vsftpd,
    ProFTPD, pure-ftpd: :attr:`Transport.globs`): the server still reads its directory, but
    sends only the matching names, so a large archive costs a directory read,
    not a line per name.  Elsewhere (pyftpdlib, SFTP, a local directory) every name is listed
    and matched here.  A property selector of the form ``name = 'value'`` (or ``= 42``) is a
    glob of the same kind (``*;.nameS=value*``); any other selector lists every name.  A time
    window (``since``/``until``) narrows the stamped directories (archive, error, expired, dead,
    protect: their names end in ``~<stamp>``) to the hours, days or months it spans, at most
    :data:`MAX_TIME_GLOBS` globs.

What is guaranteed
    Every directory is listed once per id; a directory missing is no place, a server that fails
    is a problem named in :attr:`Trace.problems` and the others are still listed.  Names that
    are not usable are skipped.  Every listing is bounded (:data:`MAX_VISITED` names handed
    back, :data:`MAX_SIGHTINGS` kept, :attr:`Trace.truncated` says so), every reason file read
    at most :data:`REASON_BYTES`, every journal file at most :data:`MAX_JOURNAL_BYTES`.

What is not
    A trace is a sequence of snapshots, not one: a message moving while it runs may be seen
    twice (claimed, then served) or not at all between two listings.  A message that was
    deleted (``archive: false``, a purge) left no name; journals keep only operations still
    pending (they are compacted), and log lines are not read.  Route destinations a template
    builds from message values are found through the ``routed`` journal record only; the fixed
    ones, the outlinks and the ``allow`` directories are listed.  Times come from names
    (stamps, the ``timestamp`` header) or from the servers' file times, whose precision is the
    server's.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from ftpbc.config.models import Config, EndpointConfig
from ftpbc.errors import FtpbcError, NotFound, ReadPastSize, TransportError, UnsafeNameError
from ftpbc.exchange.area import KINDS, REASON_SUFFIX, ExchangeArea, parse_stamp, stamp
from ftpbc.exchange.bounds import BoundedSink
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.sweeper import UNCOLLECTED
from ftpbc.exchange.topics import read_subscriptions
from ftpbc.model.envelope import ERROR_TYPE, Envelope, NameCodec, PropertyValue, UnusableName
from ftpbc.model.names import pct
from ftpbc.model.selector import Selector, compile_selector
from ftpbc.routing.templates import TemplateError, UriTemplate, parse_destination
from ftpbc.transport import open_transport
from ftpbc.transport.base import Entry, GlobRefused, Transport

log = logging.getLogger("ftpbc.trace")

#: the property a replayed message carries: the id of the message it sends again
REPLAY_OF = "ftpbc_replay_of"
#: the property a replayed message carries: the replay's own id
REPLAY_ID = "ftpbc_replay_id"

#: sightings one trace keeps at most (a selector matching a whole archive is cut there)
MAX_SIGHTINGS = 10_000
#: names one listing may hand back before it is stopped (a server that ignores the glob)
MAX_VISITED = 2_000_000
#: bytes of a reason file shown; a longer one is named, not read
REASON_BYTES = 4096
#: ids a trace follows beyond the one asked for (its replays, what it replays)
MAX_FOLLOW = 8
#: globs one directory is listed with at most for a time window; a wider window lists it whole
MAX_TIME_GLOBS = 48
#: bytes of one journal file read at most
MAX_JOURNAL_BYTES = 64 * 1024 * 1024
#: directories listed at once (each server's transport pools its connections)
PARALLEL_LISTINGS = 4
#: journal files read at most per ``--journal`` directory
MAX_JOURNAL_FILES = 1000

#: directories whose names end in ``~<node>~<stamp>``
STAMPED = frozenset({"archive", "protect", "error", "expired", "dead"})
#: directories that may hold ``<name>.reason`` beside a message
REASONED = frozenset({"error", "expired", "dead", "directory"})

_TOKEN = re.compile(r"[A-Za-z0-9_\-]+")
_EQUALS = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?:'((?:[^']|'')*)'|(-?[0-9]+))\s*")

#: what a name in a directory means: (direction, kind) -> event
_EVENTS: dict[tuple[str, str], str] = {
    ("in", "stage"): "staged", ("in", "box"): "waiting", ("in", "select"): "claimed",
    ("in", "archive"): "served", ("in", "protect"): "displaced", ("in", "error"): "failed",
    ("in", "expired"): "expired", ("in", "dead"): "dead-lettered",
    ("out", "stage"): "reply staged", ("out", "box"): "answered", ("out", "select"): "reply claimed",
    ("out", "archive"): "collected", ("out", "protect"): "displaced", ("out", "error"): "reply unreadable",
    ("out", "expired"): "expired", ("out", "dead"): "dead-lettered",
    ("in", "fanout"): "fan-out copy staged", ("in", "directory"): "delivered",
}


@dataclass(frozen=True)
class Query:
    """What to trace: a message id, a correlation id, or a selector (``where``), within an
    optional time window (UTC, inclusive)."""

    id: str | None = None
    correlation_id: str | None = None
    where: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if not (self.id or self.correlation_id or self.where):
            raise ValueError("trace needs a message id, a correlation id or a selector (--where)")
        for key in ("since", "until"):
            value = getattr(self, key)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{key} must carry a time zone, got {value.isoformat()}")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError(f"since {self.since.isoformat()} is after until {self.until.isoformat()}")


@dataclass(frozen=True)
class Sighting:
    """One place a message is or was, as one name in one directory (or one journal record)
    says; read from the name and the listing only (a reason file aside), never from the body."""

    when: datetime | None
    """The time the place gives (an archive stamp, else the file's time, a journal record's
    time); None when the server gives none."""
    event: str
    """What the place means: ``staged``, ``waiting``, ``claimed``, ``served``, ``answered``,
    ``collected``, ``failed``, ``expired``, ``dead-lettered``, ``delivered``, ``journal <event>``..."""
    place: str
    """Where, for a person: ``endpoint quote``, ``subscription orders/audit``, ``route r: failure``."""
    server: str
    """The configured server's name (a journal's directory for a journal record)."""
    path: str
    """The file's path on that server (the journal file for a record)."""
    id: str
    kind: str
    """``request``, ``response``, ``oneway`` (``journal`` for a record)."""
    node: str | None = None
    """The node the name (or journal) names: who staged, claimed, served, collected or filed it."""
    delivery_count: int = 0
    correlation_id: str | None = None
    properties: dict[str, PropertyValue] = field(default_factory=dict)
    size: int = -1
    reason: str | None = None
    """The reason file beside a failed, expired or dead-lettered message (or a route failure)."""
    waited: float | None = None
    """Seconds from when the message was sent (its timestamp header, else its file time, to
    that time's precision) to this stamp: how long it waited and was served, for a stamped
    place; None when neither says (a file time without seconds)."""
    detail: str = ""
    """What else the place says (a journal record's fields)."""
    exact: bool = True
    """False when :attr:`when` is a file time in whole seconds or minutes (a listing's
    precision): it only says "during that second" (or minute: LIST gives no seconds), and is
    ordered as its end."""

    @property
    def replay_of(self) -> str | None:
        """The id of the message this one replays (its ``ftpbc_replay_of`` property), or None."""
        value = self.properties.get(REPLAY_OF)
        return value if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        """This sighting as JSON types (times ISO 8601 UTC; a NaN property as ``"NaN"``)."""
        props = {k: (v if not isinstance(v, float) or v == v else "NaN") for k, v in self.properties.items()}
        return {"when": _iso(self.when), "event": self.event, "place": self.place, "server": self.server,
                "path": self.path, "id": self.id, "kind": self.kind, "node": self.node,
                "delivery_count": self.delivery_count, "correlation_id": self.correlation_id,
                "properties": props, "size": self.size, "reason": self.reason, "waited": self.waited,
                "replay_of": self.replay_of, "detail": self.detail or None}


@dataclass
class Trace:
    """What ``Client.trace`` found: the sightings in time order (those without a time last),
    the ids traced, the replays found, what it cost and what could not be read.

    Guaranteed: every place of the configuration was listed once per id, or is named in
    :attr:`problems`; when :attr:`truncated` is False no bound cut a listing short.  Not
    guaranteed: one instant (each directory is its own snapshot), nor anything deleted or
    compacted away (docs/tracing.md, "What a trace does not see")."""

    query: Query
    sightings: list[Sighting] = field(default_factory=list)
    #: the ids traced: the one asked for, then those followed (its replays, what it replays)
    ids: list[str] = field(default_factory=list)
    #: id -> the ids of the messages that replay it (``ftpbc_replay_of``)
    replays: dict[str, list[str]] = field(default_factory=dict)
    #: directory listings made, names the servers handed back, seconds it all took
    listings: int = 0
    names: int = 0
    seconds: float = 0.0
    #: what could not be read, one line each (a server down, a directory refused)
    problems: list[str] = field(default_factory=list)
    #: a bound cut the trace short (MAX_SIGHTINGS, MAX_VISITED, MAX_FOLLOW): more may exist
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        """The trace as ``ftpbc trace --json`` prints it (docs/tracing.md, Asking)."""
        q = self.query
        return {"query": {"id": q.id, "correlation_id": q.correlation_id, "where": q.where,
                          "since": _iso(q.since), "until": _iso(q.until)},
                "ids": self.ids, "replays": self.replays,
                "sightings": [s.to_json() for s in self.sightings],
                "cost": {"listings": self.listings, "names": self.names, "seconds": round(self.seconds, 3)},
                "problems": self.problems, "truncated": self.truncated}


@dataclass
class _Listed:
    """What one place's listing gave: its sightings (keyed by server, directory and name), its
    cost, whether it was read to its end, and the problem that stopped it."""

    found: list[tuple[tuple[str, str, str], Sighting]] = field(default_factory=list)
    listings: int = 0
    names: int = 0
    complete: bool = True
    problem: str | None = None


@dataclass(frozen=True)
class Place:
    """One directory a trace lists, and how its names are read."""

    label: str
    server: str
    path: str
    direction: Literal["in", "out"]
    kind: str
    codec: NameCodec
    #: what a message archived here went through (a route's source: ``routed``; a topic's
    #: incoming area: ``fanned out``); None: served or consumed by a handler
    archived_as: str | None = None


def parse_when(text: str, *, now: datetime | None = None, key: str = "time") -> datetime:
    """``2026-11-28T04:00`` (ISO 8601; no zone: UTC), or an age before ``now``: ``90s``,
    ``30m``, ``2h``, ``7d``.  ValueError naming ``key`` and the text otherwise."""
    t = text.strip()
    m = re.fullmatch(r"([0-9]{1,6})([smhd])", t)
    if m is not None:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=int(m.group(1)) * unit)
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00") if t.endswith("Z") else t)
    except ValueError:
        raise ValueError(f"{key}: {text!r} is neither an ISO 8601 time (2026-11-28T04:00) nor an age "
                         "(90s, 30m, 2h, 7d)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Tracer:
    """Traces messages across the endpoints, topics, subscriptions and routes of ``config``.

    ``transport``: the transport of a configured server by name (a client's runtime); None:
    the tracer opens its own and :meth:`close` closes them.  ``journals``: node journal
    directories (a ``node.journal_dir``, or one node's directory in it) whose records are read
    too.  Thread-safe for one trace at a time."""

    def __init__(self, config: Config, transport: Callable[[str], Transport] | None = None, *,
                 journals: Sequence[Path] = ()) -> None:
        self.config = config
        self.journals = tuple(Path(j) for j in journals)
        self._own: dict[str, Transport] = {}
        self._transport = transport or self._open

    def _open(self, server: str) -> Transport:
        found = self._own.get(server)
        if found is None:
            found = self._own[server] = open_transport(self.config.servers[server])
        return found

    def close(self) -> None:
        for t in self._own.values():
            t.close()
        self._own.clear()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ places

    def places(self, problems: list[str] | None = None) -> list[Place]:
        """Every directory a trace lists (the subscriptions of each topic read from its server,
        and named in the configuration)."""
        config = self.config
        found: list[Place] = []
        sources = {r.source for r in config.routes.values()}
        for name, ep in config.endpoints.items():
            found.extend(_area_places(f"endpoint {name}", ep, ("in", "out"),
                                      "routed" if name in sources else None))
        for topic, tc in config.topics.items():
            found.extend(_area_places(f"topic {topic}", config.endpoint(topic), ("in",), "fanned out"))
            subs = set(tc.subscriptions)
            try:
                transport = self._transport(tc.server)
                subs.update(s.name for s in read_subscriptions(transport, topic, tc))
                fanout = [e.name for e in _list_dirs(transport, tc.fanout_dir)]
            except (TransportError, FtpbcError) as exc:
                if problems is not None:
                    problems.append(f"topic {topic}: subscriptions not listed: {exc}")
                fanout = []
            codec = _codec(config.endpoint(topic))
            for sub in sorted(subs):
                found.extend(_area_places(f"subscription {topic}/{sub}", config.endpoint(f"{topic}/{sub}"),
                                          ("in",)))
            for sub in sorted(fanout):
                found.append(Place(f"topic {topic}: fan-out to {sub}", tc.server, f"{tc.fanout_dir}/{sub}",
                                   "in", "fanout", codec))
        seen: set[tuple[str, str]] = set()
        for rname, route in config.routes.items():
            source = config.endpoints.get(route.source)
            if source is None:
                continue
            codec = _codec(source)
            for label, server, path in _route_directories(config, rname):
                if (server, path) in seen:
                    continue
                seen.add((server, path))
                found.append(Place(f"route {rname}: {label}", server, path, "in", "directory", codec))
        return found

    # ------------------------------------------------------------------ tracing

    def trace(self, query: Query) -> Trace:
        """The sightings ``query`` asks for, in time order, with their replays followed."""
        started = time.monotonic()
        result = Trace(query)
        places = self.places(result.problems)
        selector = compile_selector(query.where) if query.where else None
        todo: list[str] = [query.id] if query.id else []
        done: set[str] = set()
        keyed: dict[tuple[str, str, str], Sighting] = {}
        if not todo:
            self._round(places, query, None, selector, result, keyed)
        while todo:
            uid = todo.pop(0)
            if uid in done:
                continue
            if len(done) > MAX_FOLLOW:
                result.truncated = True
                break
            done.add(uid)
            result.ids.append(uid)
            self._round(places, query, uid, selector, result, keyed)
            self._journal(uid, keyed, result)
            for s in list(keyed.values()):
                if s.replay_of == uid and s.id not in done:
                    todo.append(s.id)  # a replay of it
                elif s.id == uid and s.replay_of is not None and s.replay_of not in done:
                    todo.append(s.replay_of)  # what it replays
        for s in keyed.values():
            if s.replay_of is not None and s.id != s.replay_of:
                ids = result.replays.setdefault(s.replay_of, [])
                if s.id not in ids:
                    ids.append(s.id)
        result.sightings = sorted(keyed.values(), key=_order)
        result.seconds = time.monotonic() - started
        return result

    def _round(self, places: Sequence[Place], query: Query, uid: str | None, selector: Selector | None,
               result: Trace, keyed: dict[tuple[str, str, str], Sighting]) -> None:
        """List every place once for ``uid`` (or the query), PARALLEL_LISTINGS at a time."""
        def one(place: Place) -> _Listed:
            try:
                return self._place(place, query, uid, selector)
            except NotFound:
                return _Listed()  # an area never made, a subscription gone: no place
            except (FtpbcError, OSError) as exc:  # one place never stops the others
                return _Listed(problem=f"{place.label}: {place.path}: {exc}")

        with ThreadPoolExecutor(PARALLEL_LISTINGS, thread_name_prefix="ftpbc-trace") as pool:
            for listed in pool.map(one, places):
                result.listings += listed.listings
                result.names += listed.names
                result.truncated = result.truncated or not listed.complete
                if listed.problem is not None:
                    result.problems.append(listed.problem)
                for key, found in listed.found:
                    if len(keyed) >= MAX_SIGHTINGS:
                        result.truncated = True
                        break
                    keyed.setdefault(key, found)

    def _place(self, place: Place, query: Query, uid: str | None, selector: Selector | None) -> _Listed:
        """One directory listed (by its globs where the server can), its names decoded as they
        come; only the sightings ``query`` asks for are kept, and the reason files' names."""
        transport = self._transport(place.server)
        globs = _globs(place, query, uid)
        listed = _Listed()
        kept: dict[str, Sighting] = {}
        reasons: set[str] = set()
        count = [0]

        def visit(e: Entry) -> bool:
            count[0] += 1
            if e.is_dir or (globs is not None and not any(fnmatchcase(e.name, g) for g in globs)):
                return count[0] < MAX_VISITED
            if e.name.endswith(REASON_SUFFIX) and place.kind in REASONED:
                reasons.add(e.name)
            else:
                found = self._sighting(place, e, query, uid, selector)
                if found is not None:
                    kept[e.name] = found
            return count[0] < MAX_VISITED and len(kept) < MAX_SIGHTINGS

        if globs is not None and transport.globs is not False:
            try:
                for g in globs:
                    listed.listings += 1
                    listed.complete = transport.scan(place.path, visit, glob=g) and listed.complete
            except GlobRefused:
                # Refused before anything was visited (pyftpdlib): one whole listing, matched here.
                kept.clear()
                reasons.clear()
                count[0] = 0
                listed.listings += 1
                listed.complete = transport.scan(place.path, visit)
        else:
            listed.listings += 1
            listed.complete = transport.scan(place.path, visit)
        listed.names = count[0]
        for name, found in kept.items():
            if name + REASON_SUFFIX in reasons:
                found = replace(found, reason=_read_reason(transport, f"{place.path}/{name}{REASON_SUFFIX}"))
            listed.found.append(((place.server, place.path, name), found))
        return listed

    def _sighting(self, place: Place, e: Entry, query: Query, uid: str | None,
                  selector: Selector | None) -> Sighting | None:
        """The sighting listed entry ``e`` is, if it is one ``query`` asks for."""
        parts = e.name.split("~")
        try:
            env = place.codec.decode(parts[0], direction=place.direction)
        except (UnusableName, UnsafeNameError, ValueError):
            return None
        if env is None:
            return None
        h = env.headers
        node: str | None = None
        when = e.mtime
        stamped = None
        if place.kind in STAMPED and len(parts) >= 3:
            node, stamped = parts[-2], parse_stamp(parts[-1])
            when = stamped or when
        elif len(parts) >= 2:
            node = parts[-1].partition("=")[0]
        if not _wanted(env, when, query, uid, selector):
            return None
        event = _EVENTS.get((place.direction, place.kind), place.kind)
        if place.kind == "archive" and place.direction == "in":
            event = place.archived_as or ("consumed" if h.kind == "oneway" else event)
        if place.kind == "archive" and node == UNCOLLECTED:
            event, node = "archived uncollected", None
        if place.kind == "box" and place.direction == "out" and h.type == ERROR_TYPE:
            event = "answered with an error"
        waited = None
        sent = h.timestamp or e.mtime
        if h.timestamp is None and e.mtime is not None and e.mtime.second == 0 and e.mtime.microsecond == 0:
            sent = None  # a file time without seconds (LIST): a minute is no measure of a wait
        if stamped is not None and sent is not None:
            waited = round((stamped - sent).total_seconds(), 3)
        exact = stamped is not None or when is None or when.microsecond != 0
        return Sighting(when, event, place.label, place.server, f"{place.path}/{e.name}", h.id, h.kind,
                        node, h.delivery_count, h.correlation_id, dict(env.properties), e.size, None,
                        waited, exact=exact)

    # ------------------------------------------------------------------ journals

    def _journal(self, uid: str, keyed: dict[tuple[str, str, str], Sighting], result: Trace) -> None:
        """Journal records naming ``uid`` become sightings."""
        needles = {uid.encode("utf-8"), pct(uid).encode("ascii")}
        for directory in self.journals:
            for path in _journal_files(directory):
                try:
                    with path.open("rb") as fh:
                        data = fh.read(MAX_JOURNAL_BYTES)
                except OSError as exc:
                    result.problems.append(f"journal {path}: {exc.strerror or exc}")
                    continue
                for number, raw in enumerate(data.split(b"\n"), 1):
                    if not any(n in raw for n in needles):
                        continue
                    s = _record(path, number, raw, uid)
                    if s is not None:
                        keyed.setdefault(("journal", str(path), str(number)), s)


# ---------------------------------------------------------------------- helpers


def _codec(ep: EndpointConfig) -> NameCodec:
    """The codec the endpoint's own layout reads names with (its prefixes, its name matcher)."""
    return AreaLayout("trace", ep, "in").codec


def _area_places(label: str, ep: EndpointConfig, directions: Sequence[Literal["in", "out"]],
                 archived_as: str | None = None) -> list[Place]:
    area = ExchangeArea(ep.repository)
    codec = _codec(ep)
    return [Place(label, ep.server, area.dir(d, k), d, k, codec, archived_as if d == "in" else None)
            for d in directions for k in KINDS]


def _list_dirs(transport: Transport, path: str) -> list[Entry]:
    try:
        return [e for e in transport.list(path) if e.is_dir][:1000]
    except NotFound:
        return []


def _route_directories(config: Config, name: str) -> list[tuple[str, str, str]]:
    """(label, server, path) of every directory route ``name`` delivers to that the
    configuration names: its outlinks, fixed rulesets and ``allow`` directories."""
    from ftpbc.config.routes import match_server

    route = config.routes[name]
    uris: list[tuple[str, str]] = [(k, u) for k, u in (("failure", route.failure), ("nohit", route.nohit))
                                   if u is not None]
    for rs in route.rulesets:
        try:
            template = UriTemplate.parse(rs.uri_template, rs.uri_substitution)
            if not template.templated:
                uris.append((f"ruleset {rs.name}", template.render(lambda _n: None)))
        except (TemplateError, ValueError):
            pass
        uris.extend((f"ruleset {rs.name} allow", a) for a in rs.allow or ())
    found = []
    for label, uri in uris:
        try:
            target = parse_destination(uri)
        except TemplateError:
            continue
        if target.kind != "directory":
            continue
        where = match_server(config.servers, target)
        if where is not None:
            found.append((label, where[0], where[1]))
    return found


def _globs(place: Place, query: Query, uid: str | None) -> list[str] | None:
    """The name globs that select the names ``query`` can match in ``place`` (None: every name)."""
    token: str | None = None
    if uid is not None:
        token = f"*{uid}*" if _TOKEN.fullmatch(uid) else None
    elif query.correlation_id is not None:
        token = f"*{query.correlation_id}*" if _TOKEN.fullmatch(query.correlation_id) else None
    elif query.where is not None and place.codec.name == "ftpbc":
        token = _property_glob(query.where)
    window = _window_globs(query.since, query.until) if place.kind in STAMPED else None
    if window is None:
        return None if token is None else [token]
    head = token.rstrip("*") if token is not None else ""
    return [f"{head}*~{w}*" for w in window]


def _property_glob(where: str) -> str | None:
    """``*;.nameS=value*`` for a selector that is one equality of a property with a literal."""
    m = _EQUALS.fullmatch(where)
    if m is None or m.group(1).upper().startswith("JMS") or m.group(1).upper() in ("NOT", "NULL", "TRUE"):
        return None
    name, text, number = m.group(1), m.group(2), m.group(3)
    value = pct(text.replace("''", "'")) if text is not None else number
    letter = "S" if text is not None else "?"
    glob = f"*;.{pct(name)}{letter}={value}*"
    return glob if "[" not in glob and "]" not in glob else None


def _window_globs(since: datetime | None, until: datetime | None) -> list[str] | None:
    """Stamp prefixes (``20261128T04``, ``20261128T``, ``202611``) covering [since, until], the
    finest of which there are at most MAX_TIME_GLOBS; None when the window is open or too wide."""
    if since is None or until is None:
        return None
    lo, hi = since.astimezone(UTC), until.astimezone(UTC)
    for step, width in ((timedelta(hours=1), 11), (timedelta(days=1), 9)):
        prefixes: list[str] = []
        t = lo
        while t <= hi + step and len(prefixes) <= MAX_TIME_GLOBS:
            p = stamp(t)[:width]
            if p not in prefixes and p <= stamp(hi)[:width]:
                prefixes.append(p)
            t += step
        if len(prefixes) <= MAX_TIME_GLOBS:
            return prefixes
    months: list[str] = []
    y, m = lo.year, lo.month
    while (y, m) <= (hi.year, hi.month) and len(months) <= MAX_TIME_GLOBS:
        months.append(f"{y:04d}{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return months if len(months) <= MAX_TIME_GLOBS else None


def _wanted(env: Envelope, when: datetime | None, query: Query, uid: str | None,
            selector: Selector | None) -> bool:
    """Whether a message named so, seen at ``when``, is one ``query`` asks for (with ``uid``:
    that message, a reply to it, or a replay of it)."""
    h = env.headers
    if uid is not None:
        if h.id != uid and h.correlation_id != uid and env.properties.get(REPLAY_OF) != uid:
            return False
    elif query.correlation_id is not None and query.correlation_id not in (h.correlation_id, h.id):
        return False
    if selector is not None and not selector.matches(h, env.properties):
        return False
    if when is not None:
        if query.since is not None and when < query.since:
            return False
        if query.until is not None and when > query.until:
            return False
    return True


def _read_reason(transport: Transport, path: str) -> str:
    """A reason file's text, at most REASON_BYTES of it (a longer one is named, not shown)."""
    sink = io.BytesIO()
    try:
        transport.get(path, BoundedSink(sink, REASON_BYTES, server=transport.server, path=path,
                                        listed=f"at most {REASON_BYTES} bytes").as_binary())
    except ReadPastSize:
        return f"(a reason longer than {REASON_BYTES} bytes: read it at {path})"
    except FtpbcError as exc:
        return f"(reason not read: {exc})"
    return sink.getvalue().decode("utf-8", "replace").strip()


def _journal_files(directory: Path) -> list[Path]:
    """The journal files of ``directory``: a node's own (``*.journal``) or a journal_dir's
    (``*/*.journal``), at most MAX_JOURNAL_FILES, in name order."""
    try:
        found = sorted([*directory.glob("*.journal"), *directory.glob("*/*.journal")])
    except OSError:
        return []
    return found[:MAX_JOURNAL_FILES]


def _record(path: Path, number: int, raw: bytes, uid: str) -> Sighting | None:
    """The sighting one journal line naming ``uid`` is (``<time> <op-id> <event> k=v... #crc``)."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    body = text.rsplit(" #", 1)[0] if " #" in text else text
    parts = body.split(" ")
    if len(parts) < 3:
        return None
    when = _parse_iso(parts[0])
    if when is None:
        return None
    op_id, event = parts[1], parts[2]
    fields = {}
    for item in parts[3:]:
        key, sep, value = item.partition("=")
        if sep and key not in ("body", "members"):
            fields[key] = unquote(value)
    if not op_id.startswith(uid) and not any(uid in v for v in fields.values()):
        return None
    node = path.parent.name
    detail = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("body_crc",))[:500]
    return Sighting(when, f"journal {event}", f"journal of {node}", str(path.parent), str(path), uid,
                    "journal", node, detail=f"op {op_id}: {detail}" if detail else f"op {op_id}")


def _parse_iso(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z") if when else None


_NEVER = datetime.max.replace(tzinfo=UTC)


_SECOND_END = timedelta(microseconds=999_999)
_MINUTE_END = timedelta(seconds=59, microseconds=999_999)


def _order(s: Sighting) -> tuple[datetime, int, str]:
    """Time order; a file time only as precise as its listing counts as the end of its second,
    or of its minute when it has no seconds (as ``Layout.old_enough`` takes it)."""
    when = s.when
    if when is None:
        when = _NEVER
    elif not s.exact:
        when += _MINUTE_END if when.second == 0 else _SECOND_END
    return (when, _RANK.get(s.event, 50), s.path)


#: the order of places with the same time (a name's time is a file time: a rename keeps it)
_RANK = {"staged": 0, "waiting": 1, "claimed": 2, "fan-out copy staged": 3, "delivered": 4, "served": 5,
         "consumed": 5, "routed": 5, "fanned out": 5, "failed": 5, "expired": 5, "dead-lettered": 5,
         "reply staged": 6, "answered": 7, "answered with an error": 7, "reply claimed": 8, "collected": 9}


def describe(s: Sighting) -> str:
    """One line for a person: time, event, place, node and what else the place says."""
    parts = [_iso(s.when) or "(no time)".ljust(24), f"{s.event:<22}", s.place]
    if s.node:
        parts.append(f"node={s.node}")
    if s.kind != "journal":
        parts.append(f"id={s.id}")
        if s.delivery_count:
            parts.append(f"deliveries={s.delivery_count}")
        if s.replay_of:
            parts.append(f"replay-of={s.replay_of}")
        if s.waited is not None:
            parts.append(f"after={s.waited:.3f}s")
    parts.append(s.path)
    if s.detail:
        parts.append(s.detail)
    line = "  ".join(parts)
    if s.reason:
        line += "\n    reason: " + " ".join(s.reason.split())[:500]
    return line


def text(trace: Trace) -> str:
    """The trace for a person: one line per sighting, then replays, problems and what it cost."""
    q = trace.query
    what = (f"id {q.id}" if q.id else f"correlation id {q.correlation_id}" if q.correlation_id
            else f"where {q.where}")
    window = ""
    if q.since or q.until:
        window = f" between {_iso(q.since) or 'the start'} and {_iso(q.until) or 'now'}"
    lines = [f"trace of {what}{window}: {len(trace.sightings)} sighting(s)"]
    lines.extend(describe(s) for s in trace.sightings)
    for original, replays in trace.replays.items():
        lines.append(f"{original} was replayed as {', '.join(replays)}")
    lines.extend(f"problem: {p}" for p in trace.problems)
    if trace.truncated:
        lines.append("truncated: a bound was reached; narrow the trace (an id, --since/--until)")
    lines.append(f"cost: {trace.listings} listing(s), {trace.names} name(s) handed back, "
                 f"{trace.seconds:.2f} s")
    return "\n".join(lines)


__all__ = ["MAX_SIGHTINGS", "REPLAY_ID", "REPLAY_OF", "Query", "Sighting", "Trace", "Tracer",
           "parse_when", "text"]
