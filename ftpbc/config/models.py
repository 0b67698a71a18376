"""Typed, validated, immutable configuration: the node, its servers and its endpoints.

Every default documented in README's configuration section is set here and nowhere else.
Relative paths (``state_dir``, ``journal_dir``, ``key_file``...) are relative to the working
directory of the process, as with most command-line tools; docker-compose and the examples set it.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ftpbc.config.area import LARGE_BOX, AreaSettings, Prefix, TimeZone, Workers
from ftpbc.config.routes import RouteConfig, check_routes
from ftpbc.config.servers import ServerConfig
from ftpbc.config.topics import SEPARATOR as TOPIC_SEPARATOR
from ftpbc.config.topics import TopicConfig, check_subscription_name

NODE_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ENDPOINT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def default_node_id() -> str:
    """This host's name, made a valid node id: stable across restarts, so a restarted node
    replays its own journal.  Two nodes on one host need ids of their own (``--node-id``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:48] or "node"


#: a client's identity is ``<node id>.client<slot>``: serving nodes may not take such an id
CLIENT_ID_RE = re.compile(r"\.client\d+$")


def check_node_id(value: str) -> str:
    if not NODE_ID_RE.fullmatch(value):
        raise ValueError(f"node id {value!r} must be 1-64 characters of A-Z a-z 0-9 . _ -")
    return value


class _Frozen(BaseModel):
    # hide_input_in_errors: a ValidationError's text would quote the input, which may hold a
    # server url with its password (the loader builds its own one-line messages, redacted)
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class MetricsConfig(_Frozen):
    """``node.metrics``: where ``ftpbc serve`` answers /metrics, /healthz and /readyz."""

    #: TCP port (0: any free port, logged at start)
    port: int = Field(ge=0, le=65535)
    #: address to listen on; loopback by default (the figures name endpoints and nodes)
    host: str = "127.0.0.1"


class NodeConfig(_Frozen):
    id: str = Field(default_factory=default_node_id)
    #: file locks, heartbeats and cluster-wide sequences: the same directory (NFS) on every node
    #: (with ``coordination: server``, this node's own)
    state_dir: Path = Path(".ftpbc-state")
    #: this node's own journal and node-local sequences
    journal_dir: Path = Path("journals")
    #: directories handler modules are imported from, after the installed packages (relative:
    #: to the working directory, like state_dir); ``ftpbc serve --path DIR`` adds more
    handler_path: tuple[Path, ...] = ()
    #: how often this node refreshes its heartbeat in state_dir
    heartbeat_interval: float = Field(default=5.0, gt=0)
    #: a claim whose owner's heartbeat is older than this is returned to the inbox
    lease: float = Field(default=60.0, gt=0)
    #: fsync journal records before the remote write they announce (off only for benchmarks)
    durable_journal: bool = True
    #: serve Prometheus metrics and health checks over HTTP (``ftpbc serve --metrics-port``)
    metrics: MetricsConfig | None = None
    #: where poll locks, heartbeats and cluster-wide sequences live: ``state_dir`` (a shared
    #: directory) or ``server`` (on coordination_server, for hosts that share no filesystem)
    coordination: Literal["state_dir", "server"] = "state_dir"
    #: coordination: server: the server (a ``servers:`` name); default the first endpoint's
    coordination_server: str | None = None
    #: coordination: server: the directory on that server
    coordination_dir: str = "/.ftpbc-cluster"
    #: coordination: server: a poll lock not given back (its holder killed) is taken over after
    #: this many seconds; a live holder renews it while it holds it
    lock_expiry: float = Field(default=10.0, gt=0)

    @field_validator("id")
    @classmethod
    def _check_id(cls, v: str) -> str:
        return check_node_id(v)

    @field_validator("coordination_dir")
    @classmethod
    def _check_coordination_dir(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"expected an absolute path on the server (like /.ftpbc-cluster), got {v!r}")
        parts = [p for p in v.split("/") if p not in ("", ".")]
        if ".." in parts or any(c in v for c in "\0\r\n"):
            raise ValueError(f"{v!r} must not contain '..', NUL or line breaks")
        if not parts:
            raise ValueError("must be a directory below / (the cluster's files need one of their own)")
        return "/" + "/".join(parts)

    @model_validator(mode="after")
    def _lease_outlives_heartbeat(self) -> NodeConfig:
        if self.lease <= 2 * self.heartbeat_interval:
            raise ValueError(
                f"lease ({self.lease:g} s) must exceed twice heartbeat_interval "
                f"({self.heartbeat_interval:g} s), or live nodes would look dead")
        return self

    @model_validator(mode="after")
    def _coordination_keys(self) -> NodeConfig:
        if self.coordination == "state_dir":
            given = sorted({"coordination_server", "coordination_dir", "lock_expiry"} & self.model_fields_set)
            if given:
                raise ValueError(f"{given[0]} is only used with coordination: server (this node has "
                                 "coordination: state_dir)")
        return self


class EndpointConfig(AreaSettings):
    """A request/response (or one-way) message exchange area on one server (the settings
    every area has: :class:`~ftpbc.config.area.AreaSettings`)."""

    #: ``module:function``; present means this node serves the endpoint
    handler: str | None = None
    message_name: str = "%u"
    request_prefix: Prefix = "req."
    response_prefix: Prefix = "resp."
    #: move an existing file aside (to in/outprotect, name + stamp) before a new one takes its
    #: name; off by default: ftpbc's names carry a UUID, and the check costs a round trip
    protect: bool = False
    #: bounds of the inbox (none: unbounded): a send that finds this many messages waiting, or
    #: whose body would take the waiting bytes past max_bytes, overflows (docs/queues.md)
    max_messages: int | None = Field(default=None, ge=1)
    max_bytes: int | None = Field(default=None, ge=1)
    #: an overflowing send: reject (QueueFull, nothing sent) or dead_letter (filed in indead)
    on_overflow: Literal["reject", "dead_letter"] = "reject"
    #: responses nobody collects within this many seconds are archived and counted
    uncollected_after: float = Field(default=3600.0, gt=0)
    #: what a failed handler's error reply and ``.reason`` say: type (its class and a reference
    #: id; the text is in the node's log), message (the exception's text) or none (empty)
    error_reply: Literal["type", "message", "none"] = "type"
    #: a JMS message selector (docs/queues.md): a serving node claims only the messages it
    #: selects; the others stay in the inbox for other consumers
    selector: str | None = None

    @field_validator("selector")
    @classmethod
    def _selector_syntax(cls, v: str | None) -> str | None:
        # Compiled here so a bad selector is refused at load with its file, line and column,
        # not by a node that starts serving.  The selector language is pure (it reads headers
        # only when evaluating): see the one import exception in pyproject.toml.
        from ftpbc.errors import SelectorError
        from ftpbc.model.selector import compile_selector

        if v is not None:
            try:
                compile_selector(v)
            except SelectorError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("message_name")
    @classmethod
    def _pattern_syntax(cls, v: str) -> str:
        from ftpbc.errors import PatternError
        from ftpbc.patterns import Pattern

        try:
            Pattern.parse(v)
        except PatternError as exc:
            # As a ValueError pydantic reports the key path, and the loader then the line.
            raise ValueError(str(exc)) from None
        return v

    @field_validator("handler")
    @classmethod
    def _handler_form(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
            raise ValueError(f"handler {v!r} must look like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _patterns(self) -> EndpointConfig:
        from ftpbc.patterns import Pattern

        pattern = Pattern.parse(self.message_name)
        if not pattern.has_uuid:
            raise ValueError(
                f"message_name {self.message_name!r} must contain %u: the UUID correlates a response "
                "with its request")
        if self.naming == "dropboxmq" and self.message_name != "%u":
            raise ValueError(f"message_name {self.message_name!r} applies to naming: ftpbc; with "
                             "naming: dropboxmq every field of the name is DropboxMQ's")
        if ";" in self.message_name or any(";" in p for p in (self.request_prefix, self.response_prefix,
                                                              self.oneway_prefix)):
            raise ValueError("message_name and prefixes may not contain ';', which starts a name's "
                             "header fields (docs/naming.md)")
        prefixes = (self.request_prefix, self.response_prefix, self.oneway_prefix)
        if len(set(prefixes)) < 3 or any(a != b and a.startswith(b) for a in prefixes for b in prefixes):
            raise ValueError(f"request, response and one-way prefixes {prefixes} must differ and "
                             "none may start with another")
        return self


def split_pattern_path(key: str, value: str) -> tuple[str, str]:
    """``(directory, name pattern)`` of ``/dir/pattern``; the directory must be literal."""
    from ftpbc.paths import normalize

    if not value.startswith("/"):
        raise ValueError(f"{key} {value!r} must be an absolute path on the server")
    directory, _, name = value.rpartition("/")
    if not name:
        raise ValueError(f"{key} {value!r} must end with a file name pattern")
    if "%" in directory:
        raise ValueError(f"{key} {value!r}: only the last segment may be a pattern; "
                         "the directory must be literal")
    return normalize(directory or "/"), name


class TransferConfig(_Frozen):
    """Free-form exchange with a partner's own directory layout (the spec's ``ftp:transfer``).

    See docs/transfers.md.  ``receive_from`` is ``/directory/pattern`` polled for inbound files
    (the pattern may use ``%*``); ``send_to`` is ``/directory/pattern`` expanded once per outbound
    file.  Every ``*_to`` path below is a pattern over the whole path, where ``%f``/``%p`` are the
    file's name/directory (the received file's for post_receive_to, the target's for
    pre_send_to/post_send_to); their directories are created when missing.
    """

    server: str
    receive_from: str | None = None
    send_to: str | None = None
    #: ``module:function`` called with a Message per received file; a result that is not None
    #: is sent to ``send_to``.  Present means a serving node polls ``receive_from``.
    handler: str | None = None
    #: rename: claim into select_dir as ``<name>~<node>`` (competing nodes safe);
    #: none: read in place while holding the poll lock (needs ``lock: file``)
    pre_receive: Literal["rename", "none"] = "rename"
    #: default ``<receive dir>/.ftpbc-select``
    select_dir: str | None = None
    #: rename: to post_receive_to (default ``<receive dir>/.ftpbc-archive/<name>~<node>~<stamp>``);
    #: delete: remove the file once its result is out
    post_receive: Literal["rename", "delete"] = "rename"
    post_receive_to: str | None = None
    #: an existing target: none (replaced), rename (moved to pre_send_to), copy (copied there)
    pre_send: Literal["none", "rename", "copy"] = "none"
    #: default ``<send dir>/.ftpbc-protect/<target name>~<node>~<stamp>``
    pre_send_to: str | None = None
    #: rename: once in place, the target is renamed to post_send_to (e.g. ``%p/%f.done``)
    post_send: Literal["none", "rename"] = "none"
    post_send_to: str | None = None
    #: upload to stage_dir (default ``<send dir>/.ftpbc-stage``) and rename into place
    stage: bool = True
    stage_dir: str | None = None
    #: files whose handler raised, with ``<name>.reason`` beside (default ``<receive dir>/.ftpbc-error``)
    error_dir: str | None = None
    #: a file is received only once its size and time stayed unchanged for this many seconds
    #: (partners that upload in place); 0 for partners that stage and rename
    stable_for: float = Field(default=1.0, ge=0)
    #: a file is received only once its listed modification time is this many seconds before
    #: this node's clock (NiFi's minimum file age; 0: not judged); combines with stable_for
    min_age: float = Field(default=0.0, ge=0)
    #: a file is received only once the partner's completion marker lies beside it: a name
    #: pattern of ``%f`` (the file's name), ``%*`` (what receive_from's wildcards matched) and
    #: text, e.g. ``%f.done``; the marker is removed once the file is settled
    done_file: str | None = None
    max_deliveries: int = Field(default=5, ge=1, le=1000)
    redelivery_delay: float = Field(default=1.0, ge=0)
    #: the longest that wait grows to (doubling per delivery), seconds
    max_redelivery_delay: float = Field(default=300.0, ge=0)
    poll_interval: float = Field(default=1.0, gt=0)
    max_per_poll: int = Field(default=32, ge=1)
    #: as an endpoint's (a receive_from directory this large is listed a part at a time)
    large_box: int = Field(default=LARGE_BOX, ge=1)
    workers: Workers = 2
    lock: Literal["file", "none"] = "file"
    #: time zone of date letters in names (IANA name)
    timezone: TimeZone = "UTC"
    drain_timeout: float = Field(default=30.0, ge=0)
    #: what a failed handler's ``.reason`` in error_dir says: type, message or none (as for endpoints)
    error_reply: Literal["type", "message", "none"] = "type"
    #: bodies larger than this are refused at send (when their length is known) and, listed
    #: larger, filed in the error directory unread; a read stops past the listed size
    max_message_bytes: int = Field(default=1 << 30, ge=0)

    @field_validator("handler")
    @classmethod
    def _handler_form(cls, v: str | None) -> str | None:
        return EndpointConfig._handler_form(v)

    @field_validator("done_file")
    @classmethod
    def _marker_syntax(cls, v: str | None) -> str | None:
        from ftpbc.errors import PatternError
        from ftpbc.patterns.marker import MarkerPattern

        if v is None:
            return v
        try:
            MarkerPattern.parse(v)
        except PatternError as exc:
            # As a ValueError pydantic reports the key path, and the loader then the line.
            raise ValueError(str(exc)) from None
        return v

    @field_validator("select_dir", "stage_dir", "error_dir")
    @classmethod
    def _literal_dir(cls, v: str | None) -> str | None:
        from ftpbc.paths import normalize

        if v is None:
            return v
        if not v.startswith("/") or "%" in v:
            raise ValueError(f"directory {v!r} must be an absolute, literal path on the server")
        return normalize(v)

    @model_validator(mode="after")
    def _consistent(self) -> TransferConfig:
        from ftpbc.patterns import Pattern

        if self.receive_from is None and self.send_to is None:
            raise ValueError("a transfer needs receive_from, send_to or both")
        if self.receive_from is not None:
            _, name = split_pattern_path("receive_from", self.receive_from)
            from ftpbc.patterns.grammar import DirName, FileName, Wildcard

            if any(isinstance(t, FileName | DirName) for t in Pattern.parse(name).tokens):
                raise ValueError(f"receive_from {self.receive_from!r}: %f and %p cannot select files")
            if self.done_file is not None:
                from ftpbc.patterns.marker import MarkerPattern

                marker = MarkerPattern.parse(self.done_file)
                given = sum(isinstance(t, Wildcard) for t in Pattern.parse(name).tokens)
                if marker.wildcards > given:
                    raise ValueError(f"done_file {self.done_file!r} uses {marker.wildcards} %* but "
                                     f"receive_from {self.receive_from!r} has {given}")
                if self.done_file == name:
                    raise ValueError(f"done_file {self.done_file!r} is receive_from's own name "
                                     "pattern: every data file would be its own marker")
        elif self.handler is not None:
            raise ValueError("handler needs receive_from (the files it is called with)")
        elif self.done_file is not None:
            raise ValueError("done_file needs receive_from (the files whose markers it names)")
        if self.send_to is not None:
            _, name = split_pattern_path("send_to", self.send_to)
            if Pattern.parse(name).has_wildcard:
                raise ValueError(f"send_to {self.send_to!r}: the wildcard %* cannot make a name")
        for key in ("post_receive_to", "pre_send_to", "post_send_to"):
            value = getattr(self, key)
            if value is not None:
                if not value.startswith("/") and not value.startswith("%p"):
                    raise ValueError(f"{key} {value!r} must be an absolute path or start with %p")
                if Pattern.parse(value).has_wildcard:
                    raise ValueError(f"{key} {value!r}: the wildcard %* cannot make a name")
        if self.post_send == "rename" and self.post_send_to is None:
            raise ValueError("post_send: rename needs post_send_to (e.g. '%p/%f.done')")
        if self.post_send == "rename" and self.send_to is None:
            raise ValueError("post_send: rename needs send_to")
        if self.pre_receive == "none" and self.lock != "file":
            raise ValueError("pre_receive: none reads files in place, which only the poll lock keeps "
                             "other nodes from: it needs lock: file")
        return self


class Config(_Frozen):
    """A whole configuration, validated and immutable: the ``node``, ``servers``,
    ``endpoints``, ``transfers``, ``topics`` and ``routes`` sections of the YAML file (every key:
    README.md, Configuration, and docs/).  Made by :func:`ftpbc.load_config`; a bad file or value
    is a ConfigError naming the file, line and key.  Secrets are held as ``SecretStr`` and never
    appear in its ``repr``."""

    node: NodeConfig = Field(default_factory=NodeConfig)
    servers: dict[str, ServerConfig]
    endpoints: dict[str, EndpointConfig] = Field(default_factory=dict)
    transfers: dict[str, TransferConfig] = Field(default_factory=dict)
    #: publish/subscribe topics (docs/topics.md); ``TOPIC`` and ``TOPIC/SUB`` act as endpoints
    topics: dict[str, TopicConfig] = Field(default_factory=dict)
    #: rule-based routing of an endpoint's one-way messages (docs/routing.md)
    routes: dict[str, RouteConfig] = Field(default_factory=dict)
    #: the file this was loaded from, for messages; not a YAML key
    source: str = Field(default="<config>", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _name_servers(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("servers"), dict):
            servers = {}
            for name, spec in data["servers"].items():
                if isinstance(spec, dict) and "name" not in spec:
                    spec = {"name": name, **spec}
                servers[name] = spec
            data = {**data, "servers": servers}
        return data

    @model_validator(mode="after")
    def _references(self) -> Config:
        for kind, table in (("endpoints", self.endpoints), ("transfers", self.transfers)):
            for name, ep in table.items():
                if not ENDPOINT_RE.match(name):
                    raise ValueError(f"{kind}.{name}: name must be 1-64 characters of A-Z a-z 0-9 . _ -")
                if ep.server not in self.servers:
                    known = ", ".join(sorted(self.servers)) or "none"
                    raise ValueError(f"{kind}.{name}.server: unknown server {ep.server!r} (defined: {known})")
        both = sorted(set(self.endpoints) & set(self.transfers))
        if both:
            raise ValueError(f"transfers.{both[0]}: {both[0]!r} is also an endpoint; names must differ "
                             "(ftpbc send NAME picks one by its name)")
        return self

    @model_validator(mode="after")
    def _topic_references(self) -> Config:
        for name, topic in self.topics.items():
            if not ENDPOINT_RE.match(name):
                # named in the text: a key path cannot carry what the name may hold ('/', ' ')
                raise ValueError(f"topics: topic name {name!r} must be 1-64 characters of A-Z a-z 0-9 . _ -")
            if topic.server not in self.servers:
                known = ", ".join(sorted(self.servers)) or "none"
                raise ValueError(f"topics.{name}.server: unknown server {topic.server!r} (defined: {known})")
            for kind, table in (("endpoint", self.endpoints), ("transfer", self.transfers)):
                if name in table:
                    article = "an" if kind == "endpoint" else "a"
                    raise ValueError(f"topics.{name}: {name!r} is also {article} {kind}; names must differ "
                                     "(ftpbc send NAME picks one by its name)")
            for sub, declared in topic.subscriptions.items():
                try:
                    EndpointConfig._selector_syntax(declared.selector)
                except ValueError as exc:
                    raise ValueError(f"topics.{name}.subscriptions.{sub}.selector: {exc}") from None
            try:
                _topic_area(topic, "", topic.incoming_dir)  # every area setting, checked as an endpoint's
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                raise ValueError(f"topics.{name}{'.' + where if where else ''}: "
                                 f"{err['msg'].removeprefix('Value error, ')}") from None
        return self

    @model_validator(mode="after")
    def _route_references(self) -> Config:
        check_routes(self.routes, self.endpoints, self.topics, self.servers)
        return self

    def sequence_dirs(self) -> tuple[Path, Path]:
        """(node-local, cluster-shared) base directories of the persisted sequences.

        Node-local counters (``%0``-``%9``) live beside this node's journal, per node id, so two
        nodes started from one configuration on one host keep separate counters.
        """
        return (self.node.journal_dir / self.node.id, self.node.state_dir)

    def with_node_id(self, node_id: str | None) -> Config:
        """This configuration with ``node.id`` replaced (itself for None or "");
        ValueError for an id that is not 1-64 characters of ``A-Z a-z 0-9 . _ -``."""
        if not node_id:
            return self
        check_node_id(node_id)
        return self.model_copy(update={"node": self.node.model_copy(update={"id": node_id})})

    def endpoint(self, name: str) -> EndpointConfig:
        """An endpoint's configuration; a topic's name gives its incoming area and ``TOPIC/SUB``
        a subscription's area (derived: docs/topics.md)."""
        found = self.endpoints.get(name)
        if found is not None:
            return found
        from ftpbc.errors import ConfigError

        topic, _, sub = name.partition(TOPIC_SEPARATOR)
        if topic in self.topics:
            tc = self.topics[topic]
            if name == topic:
                return _topic_area(tc, "", tc.incoming_dir)
            try:
                check_subscription_name(sub)
            except ValueError as exc:
                raise ConfigError(f"topic {topic!r}: {exc}", file=self.source) from None
            return _topic_area(tc, sub, tc.subscription_dir(sub))
        known = ", ".join(sorted([*self.endpoints, *self.topics])) or "none"
        raise ConfigError(f"unknown endpoint {name!r} (defined: {known})", file=self.source) from None

    def knows_endpoint(self, name: str) -> bool:
        """Whether :meth:`endpoint` resolves ``name`` (an endpoint, a topic, ``TOPIC/SUB``)."""
        if name in self.endpoints:
            return True
        from ftpbc.config.topics import SUBSCRIPTION_RE

        topic, sep, sub = name.partition(TOPIC_SEPARATOR)
        return topic in self.topics and (not sep or SUBSCRIPTION_RE.fullmatch(sub) is not None)


def _topic_area(topic: TopicConfig, key: str, repository: str) -> EndpointConfig:
    """The endpoint configuration of one of ``topic``'s areas (``key`` "": its incoming area; a
    subscription's name: that subscription's), made once per process (docs/topics.md)."""
    return topic.derived(key, lambda: EndpointConfig(server=topic.server, repository=repository,
                                                     **topic.area_settings()))
