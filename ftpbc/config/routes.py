"""``routes:``: rule-based routing of an endpoint's one-way messages (docs/routing.md).

A route consumes the inbox of its ``source`` endpoint (it is that endpoint's handler, so the
endpoint has none), picks the first of its ``rulesets`` that selects a message, builds the
destination from the ruleset's URI template and delivers the message there: ``endpoint:NAME``,
``topic:NAME`` or a directory on a configured server (``ftp|ftps|sftp://user@host:port/dir``,
``file:///dir``).  Messages no ruleset selects go to ``nohit``, messages that cannot be
delivered to ``failure`` (either an endpoint or a directory URI); without one, they are filed in
the source endpoint's error directory with their reason.

Everything is checked when the configuration loads: patterns compile, substitutions parse,
outlinks name a known endpoint, topic or configured server.  What a message's values make of a
template is checked per message (:mod:`ftpbc.routing.templates`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ftpbc.config.servers import DEFAULT_PORTS, ServerConfig
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
        if s.scheme != "file":
            port = target.port if target.port is not None else DEFAULT_PORTS[s.scheme]
            if s.host.lower() != target.host or s.port != port:
                continue
            if target.user is not None and s.user != target.user:
                continue
        base = s.base.rstrip("/")
        if target.path != base and not target.path.startswith(base + "/"):
            continue
        found.append((name, target.path[len(base):] or "/"))
    return found[0] if len(found) == 1 else None


def check_routes(routes: Mapping[str, RouteConfig], endpoints: Mapping[str, object],
                 topics: Mapping[str, object], servers: Mapping[str, ServerConfig]) -> None:
    """ValueError naming the key for a route whose source or outlinks do not exist."""
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
            if target.kind == "directory" and match_server(servers, target) is None:
                raise ValueError(f"routes.{name}.{key}: {uri!r} matches no configured server (by scheme, "
                                 "host, port and user, below its base directory)")
