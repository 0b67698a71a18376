"""``routes:``: rule-based routing of an endpoint's one-way messages (docs/routing.md).

A route consumes the inbox of its ``source`` endpoint (it is that endpoint's handler, so the
endpoint has none), picks the first of its ``rulesets`` that selects a message, builds the
destination from the ruleset's URI template and delivers the message there: ``endpoint:NAME``,
``topic:NAME`` or a directory on a configured server (``ftp|ftps|sftp://user@host:port/dir``,
``file:///dir``).  Messages no ruleset selects go to ``nohit``, messages that cannot be
delivered to ``failure`` (either an endpoint or a directory URI); without one, they are filed in
the source endpoint's error directory with their reason.

Everything is checked when the configuration loads: patterns compile, substitutions parse,
outlinks, fixed destinations and ``allow`` entries name a known endpoint, topic or configured
server.  What a message's values make of a template is checked per message
(:mod:`ftpbc.routing.templates`, :class:`AllowList`, :class:`Fence`).

The fence (docs/routing.md, "Where a route may deliver"):

* A ruleset whose destination is built from message values (a ``##name##`` template) delivers
  only inside its ``allow`` list: directory URLs (that directory and everything below it, on
  the server the URL names), ``endpoint:NAME``, ``topic:NAME``.  Without an ``allow`` list such
  a ruleset is refused at load, unless its template can only make ``endpoint:``/``topic:``
  destinations (it may then name any endpoint or topic of the configuration but its source).
* No directory destination lies inside an endpoint's or a topic's repository, whatever server
  name reaches it: a message for an endpoint goes through ``endpoint:NAME`` (its naming, its
  stage directory), never into its boxes by path.  Refused at load for fixed destinations,
  outlinks and ``allow`` entries, per message for templated ones.  The serving node adds the
  cluster's coordination directory (``coordination: server``), checked per message.

Not fenced: transfers' directories (a partner's free-form layout) and anything outside the
configured servers, which no route can reach anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ftpbc import schemes
from ftpbc.config.servers import ServerConfig
from ftpbc.paths import normalize
from ftpbc.routing.rules import RuleError, Ruleset
from ftpbc.routing.templates import Target, TemplateError, parse_destination

RULESET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PROPERTY_RE = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$.-]{0,127}$")

Scalar = bool | int | float | str


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class RulesetConfig(_Frozen):
    """One ruleset: what it selects and where those messages go."""

    name: str
    #: groups of property patterns; a message is selected when ANY group matches ALL its properties
    properties: tuple[dict[str, str], ...] = ()
    #: groups of property patterns; a message one of them matches is not selected
    exclude: tuple[dict[str, str], ...] = ()
    #: groups of body patterns (each group: patterns that must all be found in the body's first
    #: ``max_body_scan`` bytes); ANY group selects
    body: tuple[tuple[str, ...], ...] = ()
    exclude_body: tuple[tuple[str, ...], ...] = ()
    #: properties the routed message gets when it lacks them (templates see them too)
    default_properties: dict[str, Scalar] = Field(default_factory=dict)
    #: the destination URI, built by position with uri_substitution (docs/routing.md)
    uri_template: tuple[str | None, ...]
    uri_substitution: tuple[str | None, ...] = ()
    #: per destination: connections (and delivery threads); default the route's
    capacity: int | None = Field(default=None, ge=1, le=64)
    #: seconds an idle destination keeps its connections; default the route's
    max_idle: float | None = Field(default=None, gt=0)
    #: retries of a failed delivery before the message goes to ``failure``; default the route's
    max_retry: int | None = Field(default=None, ge=0, le=100)
    #: where a destination built from message values may go: directory URLs (that directory
    #: and below), ``endpoint:NAME``, ``topic:NAME``; none: see the module's docstring
    allow: tuple[str, ...] | None = None

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("allow: an empty list would refuse every message; list where the "
                             "ruleset may deliver, or remove the key")
        for i, entry in enumerate(v):
            if "##" in entry:
                raise ValueError(f"allow[{i}]: {entry!r} is fixed: no ##name## templates")
            try:
                parse_destination(entry)
            except TemplateError as exc:
                raise ValueError(f"allow[{i}]: {exc}") from None
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not RULESET_RE.fullmatch(v):
            raise ValueError(f"ruleset name {v!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
        return v

    @field_validator("default_properties")
    @classmethod
    def _property_names(cls, v: dict[str, Scalar]) -> dict[str, Scalar]:
        for name in v:
            if not PROPERTY_RE.fullmatch(name):
                raise ValueError(f"property name {name!r} must be 1-128 characters of A-Z a-z 0-9 _ $ . - "
                                 "not starting with a digit, '.' or '-'")
        return v

    @model_validator(mode="after")
    def _compiles(self) -> RulesetConfig:
        self.compiled()
        return self

    def compiled(self) -> Ruleset:
        """The ruleset compiled (ValueError naming the key when it does not compile)."""
        try:
            return Ruleset.compile(self.name, uri_template=self.uri_template,
                                   uri_substitution=self.uri_substitution, properties=self.properties,
                                   exclude=self.exclude, body=self.body, exclude_body=self.exclude_body,
                                   defaults=self.default_properties)
        except RuleError as exc:
            raise ValueError(str(exc)) from None


class RouteConfig(_Frozen):
    """A route: the source endpoint it consumes, its rulesets and its outlinks."""

    #: the endpoint whose inbox this route consumes (it has no handler of its own)
    source: str
    rulesets: tuple[RulesetConfig, ...]
    #: where messages that could not be delivered go: ``endpoint:NAME``, ``topic:NAME`` or a
    #: directory URL; none: the source's error directory, with their reason
    failure: str | None = None
    #: where messages no ruleset selects go (the same forms); none: the source's error directory
    nohit: str | None = None
    #: per destination, unless its ruleset says otherwise: connections and delivery threads
    capacity: int = Field(default=4, ge=1, le=64)
    #: seconds a destination may stay idle before its connections are closed and its worker retired
    max_idle: float = Field(default=900.0, gt=0)
    #: retries of a failed delivery (backoff from retry_delay, doubling) before ``failure``
    max_retry: int = Field(default=2, ge=0, le=100)
    retry_delay: float = Field(default=1.0, ge=0)
    #: body patterns see at most this many bytes of a message
    max_body_scan: int = Field(default=64 * 1024, ge=0, le=16 * 1024 * 1024)
    #: live destinations at most: a message for one more (all busy) waits for one to retire
    max_destinations: int = Field(default=256, ge=1, le=4096)

    @field_validator("failure", "nohit")
    @classmethod
    def _outlink(cls, v: str | None) -> str | None:
        if v is not None:
            if "##" in v:
                raise ValueError(f"outlink {v!r} is fixed: no ##name## templates")
            try:
                parse_destination(v)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _unique(self) -> RouteConfig:
        if not self.rulesets:
            raise ValueError("rulesets: a route needs at least one ruleset")
        names = [r.name for r in self.rulesets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rulesets: the name {dup[0]!r} is used twice")
        if "nohit" in names or "failure" in names:
            raise ValueError("rulesets: 'nohit' and 'failure' name the outlinks; give the ruleset "
                             "another name")
        return self

    def compiled(self) -> tuple[Ruleset, ...]:
        return tuple(r.compiled() for r in self.rulesets)


def match_server(servers: Mapping[str, ServerConfig], target: Target) -> tuple[str, str] | None:
    """``(server name, path below its base)`` of the configured server a directory ``target``
    names, by scheme, host, port and user (a URL without a user matches when exactly one
    server has the rest); None when no server (or more than one) matches, or the path lies
    outside the server's base directory.  Credentials always come from that server."""
    found = []
    for name, s in servers.items():
        if s.scheme != target.scheme:
            continue
        spec = schemes.lookup(s.scheme)
        if spec is None or spec.has_host:
            port = target.port if target.port is not None else (spec.default_port if spec else 0)
            if s.host.lower() != target.host or s.port != port:
                continue
            if target.user is not None and s.user != target.user:
                continue
        base = s.base.rstrip("/")
        if target.path != base and not target.path.startswith(base + "/"):
            continue
        found.append((name, target.path[len(base):] or "/"))
    return found[0] if len(found) == 1 else None


class _Area(Protocol):
    """An endpoint's or a topic's configuration, as far as the fence needs it."""

    @property
    def server(self) -> str: ...

    @property
    def repository(self) -> str: ...


def _place(server: ServerConfig, path: str) -> tuple[tuple[str, ...], str]:
    """Where ``path`` (below ``server``'s base) is, whichever configured name reaches it: the
    machine (host and port, or this one's file system) and the absolute path there."""
    where = ("net", server.host.lower(), str(server.port)) if server.has_host else ("local",)
    return where, normalize(server.base.rstrip("/") + "/" + path.lstrip("/"))


def _below(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` or lies below it (both normal and absolute)."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


#: why a directory inside an endpoint's or a topic's area is refused, and what to do instead
_INTO_AREA = "deliver to an endpoint with endpoint:NAME (or topic:NAME), never into its directories"


@dataclass(frozen=True)
class Fence:
    """The directories no directory destination may lie in: endpoints' and topics' repositories,
    and what the caller adds (the cluster's coordination directory on a server); a server's two
    names (two users, ftp and ftps on one port) count as one server.  Paths are compared as
    written (normal, absolute): a ``file://`` base that reaches an area through a link is
    another place to the fence."""

    servers: Mapping[str, ServerConfig]
    #: (label, machine, absolute path, what the refusal says after the label)
    areas: tuple[tuple[str, tuple[str, ...], str, str], ...]

    @classmethod
    def of(cls, servers: Mapping[str, ServerConfig], endpoints: Mapping[str, _Area],
           topics: Mapping[str, _Area], extra: Iterable[tuple[str, str, str]] = ()) -> Fence:
        """``extra``: more (label, server name, path below its base) no route may deliver into."""
        areas = []
        for kind, table in (("endpoint", endpoints), ("topic", topics)):
            for name, area in table.items():
                server = servers.get(area.server)
                if server is not None:
                    areas.append((f"{kind} {name!r}", *_place(server, area.repository),
                                  f"lies inside the exchange area of {kind} {name!r}: {_INTO_AREA}"))
        for label, server_name, path in extra:
            server = servers.get(server_name)
            if server is not None:
                areas.append((label, *_place(server, path), f"lies inside {label}: no route delivers there"))
        return cls(servers, tuple(areas))

    def area_holding(self, server: str, path: str) -> str | None:
        """``endpoint 'NAME'`` (or ``topic 'NAME'``, or an extra area's label) whose directory
        holds directory ``path`` of configured server ``server``; None when it lies in none."""
        found = self._holding(server, path)
        return found[0] if found is not None else None

    def refusal(self, server: str, path: str) -> str | None:
        """Why a directory destination there is refused, or None."""
        found = self._holding(server, path)
        return found[3] if found is not None else None

    def _holding(self, server: str, path: str) -> tuple[str, tuple[str, ...], str, str] | None:
        where, absolute = _place(self.servers[server], path)
        for area in self.areas:
            if area[1] == where and _below(absolute, area[2]):
                return area
        return None


@dataclass(frozen=True)
class AllowList:
    """A ruleset's ``allow`` entries, resolved: the endpoints, topics and directories (server
    name, path below its base: that directory and everything below it) it may deliver to."""

    entries: tuple[str, ...]
    endpoints: frozenset[str]
    topics: frozenset[str]
    directories: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, entries: tuple[str, ...], servers: Mapping[str, ServerConfig]) -> AllowList:
        """ValueError naming the entry (``allow[1]: ...``) that names no configured server
        (the configuration's load checks that first)."""
        endpoints, topics, directories = set(), set(), []
        for i, entry in enumerate(entries):
            target = parse_destination(entry)
            if target.kind == "endpoint":
                endpoints.add(target.name)
            elif target.kind == "topic":
                topics.add(target.name)
            else:
                found = match_server(servers, target)
                if found is None:
                    raise ValueError(f"allow[{i}]: {entry!r} matches no configured server (by scheme, host, "
                                     "port and user, below its base directory)")
                directories.append(found)
        return cls(entries, frozenset(endpoints), frozenset(topics), tuple(directories))

    def permits(self, target: Target, found: tuple[str, str] | None) -> bool:
        """Whether ``target`` (``found``: the server and path a directory target resolved to)
        lies inside this list."""
        if target.kind == "endpoint":
            return target.name in self.endpoints
        if target.kind == "topic":
            return target.name in self.topics
        return found is not None and any(
            found[0] == server and _below(found[1], prefix) for server, prefix in self.directories)


def check_routes(routes: Mapping[str, RouteConfig], endpoints: Mapping[str, _Area],
                 topics: Mapping[str, _Area], servers: Mapping[str, ServerConfig]) -> None:
    """ValueError naming the key for a route whose source or outlinks do not exist, or whose
    destinations leave the fence (see the module's docstring)."""
    fence = Fence.of(servers, endpoints, topics)
    sources: dict[str, str] = {}
    for name, route in routes.items():
        if not RULESET_RE.fullmatch(name):
            raise ValueError(f"routes.{name}: name must be 1-64 characters of A-Z a-z 0-9 _ -")
        ep = endpoints.get(route.source)
        if ep is None:
            known = ", ".join(sorted(endpoints)) or "none"
            raise ValueError(f"routes.{name}.source: unknown endpoint {route.source!r} (defined: {known})")
        if getattr(ep, "handler", None):
            raise ValueError(f"routes.{name}.source: endpoint {route.source!r} has a handler; a routed "
                             "endpoint is served by its route alone (remove one of them)")
        if route.source in sources:
            raise ValueError(f"routes.{name}.source: endpoint {route.source!r} is the source of route "
                             f"{sources[route.source]!r} already")
        sources[route.source] = name
        for key in ("failure", "nohit"):
            uri = getattr(route, key)
            if uri is None:
                continue
            target = parse_destination(uri)
            if target.kind == "endpoint" and target.name not in endpoints:
                raise ValueError(f"routes.{name}.{key}: unknown endpoint {target.name!r}")
            if target.kind == "topic" and target.name not in topics:
                raise ValueError(f"routes.{name}.{key}: unknown topic {target.name!r}")
            if target.kind == "endpoint" and target.name == route.source:
                raise ValueError(f"routes.{name}.{key}: the source itself would route its messages again")
            problem = _destination_problem(target, route.source, endpoints, topics, servers, fence)
            if problem is not None:
                raise ValueError(f"routes.{name}.{key}: {uri!r} {problem}")
        for i, rs in enumerate(route.rulesets):
            _check_ruleset(f"routes.{name}.rulesets.{i}", rs, route.source, endpoints, topics, servers, fence)


def _destination_problem(target: Target, source: str, endpoints: Mapping[str, _Area],
                         topics: Mapping[str, _Area], servers: Mapping[str, ServerConfig],
                         fence: Fence) -> str | None:
    """Why a fixed destination cannot be one, or None."""
    if target.kind == "endpoint" and target.name not in endpoints:
        return f"names an unknown endpoint {target.name!r}"
    if target.kind == "topic" and target.name not in topics:
        return f"names an unknown topic {target.name!r}"
    if target.kind == "endpoint" and target.name == source:
        return "is the route's own source: it would route its messages again"
    if target.kind != "directory":
        return None
    found = match_server(servers, target)
    if found is None:
        return "matches no configured server (by scheme, host, port and user, below its base directory)"
    return fence.refusal(*found)


def _check_ruleset(key: str, rs: RulesetConfig, source: str, endpoints: Mapping[str, _Area],
                   topics: Mapping[str, _Area], servers: Mapping[str, ServerConfig], fence: Fence) -> None:
    template = rs.compiled().template
    for i, entry in enumerate(rs.allow or ()):
        problem = _destination_problem(parse_destination(entry), source, endpoints, topics, servers, fence)
        if problem is not None:
            raise ValueError(f"{key}.allow.{i}: {entry!r} {problem}")
    if template.templated:
        if rs.allow is None and template.fixed_kind() is None:
            names = ", ".join(f"##{n}##" for n in template.placeholders())
            raise ValueError(f"{key}.uri_template: ruleset {rs.name!r} builds its destination from message "
                             f"properties ({names}) and declares no allow list: add allow: [...] naming "
                             "the directory URLs (and endpoint:/topic: names) it may deliver to")
        return
    try:
        uri = template.render(lambda _: None)
        target = parse_destination(uri)
    except TemplateError as exc:
        raise ValueError(f"{key}.uri_template: {exc}") from None
    problem = _destination_problem(target, source, endpoints, topics, servers, fence)
    if problem is not None:
        raise ValueError(f"{key}.uri_template: {uri!r} {problem}")
