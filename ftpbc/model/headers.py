"""The header table: every header a message carries, declared once.

Each field of :class:`Headers` is one header, declared with :func:`header`: its Python type
(the annotation and the :class:`ValueKind` that checks, writes and reads it), its default, the
key it takes in ftpbc names, where DropboxMQ names carry it, the JMS identifiers selectors read
it by, whether a sender may set it (a :class:`MessageOptions` key and a command-line option),
and whether routing templates may read it.  The codecs (``ftpbc_names``, ``dropboxmq_names``),
the selector, the runtime, the command line, dead letters and the router read
``Headers.table`` instead of naming headers one by one; adding a header is one ``header(...)``
line here (docs/architecture.md, "Adding a header").

What the table cannot express stays in the code that owns it, and names the header it is
about: the parts of a name that are its structure (the ftpbc base gives ``id`` and ``kind``; a
response's ``correlation_id`` is its id and an error reply's ``type`` its ``.error`` suffix;
DropboxMQ's eight positional fields), the endpoint's default priority, and ``reply_to``'s
check against the configuration.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Generic, Literal, TypedDict, TypeVar, dataclass_transform

__all__ = [
    "COUNT",
    "DEFAULT_PRIORITY",
    "DIGIT",
    "ERROR_TYPE",
    "EXPIRED_TYPE",
    "KIND",
    "RESERVED_TYPE_PREFIX",
    "TEXT",
    "TIME",
    "HeaderSpec",
    "HeaderTable",
    "Headers",
    "Kind",
    "MessageOptions",
    "PropertyValue",
    "ValueKind",
    "header",
    "header_table",
]

Kind = Literal["request", "response", "oneway"]
PropertyValue = bool | int | float | str

DEFAULT_PRIORITY = 4
ERROR_TYPE = "ftpbc.error"  # headers.type of an error reply (a handler that failed)
EXPIRED_TYPE = "ftpbc.expired"  # headers.type of the reply to a request that expired unserved
RESERVED_TYPE_PREFIX = "ftpbc."  # types ftpbc's own replies use; applications may not send them

_KINDS = ("request", "response", "oneway")
_INT64 = 2**63
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

V = TypeVar("V")
_T = TypeVar("_T")


# --------------------------------------------------------------------------- value kinds


class ValueKind(Generic[V]):
    """How the values of one kind of header are checked, written into a name and read back.

    ``check`` is what :class:`Headers` runs on a value other than the default (TypeError or
    ValueError naming the header; it returns the value to keep, e.g. converted to UTC).
    ``text``/``parse`` are the ftpbc field text (percent-encoded around them when ``encoded``);
    ``parse`` raises ValueError with one line naming the header and the text.  ``to_property``/
    ``from_property`` carry the value as a DropboxMQ property of one of ``property_letters``.
    ``selector`` is the value a JMS selector compares, ``json`` the one ``ftpbc`` prints, and
    ``cli`` reads it from a command-line option (ValueError with the reason).
    """

    encoded = False
    #: how ``--help`` shows a value
    metavar = "TEXT"
    #: ``selector`` returns the value itself
    selects_as_is = True
    #: the property type letters that may carry it (``what_property`` says so in an error)
    property_letters = "YHIL"
    what_property = "an integer (type I or L)"

    def check(self, value: object, what: str) -> V:
        raise NotImplementedError

    def text(self, value: V) -> str:
        return str(value)

    def parse(self, text: str, what: str) -> V:
        raise NotImplementedError

    def to_property(self, value: V) -> PropertyValue:
        raise NotImplementedError

    def from_property(self, value: PropertyValue, what: str) -> V:
        raise NotImplementedError

    def selector(self, value: V) -> Any:
        return value

    def json(self, value: V) -> Any:
        return value

    def cli(self, text: str, what: str) -> V:
        return self.parse(text, what)


class _Text(ValueKind[str]):
    encoded = True
    property_letters = "S"
    what_property = "a string (type S)"

    def check(self, value: object, what: str) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str or None, got {type(value).__name__}")
        return value

    def text(self, value: str) -> str:
        return value

    def parse(self, text: str, what: str) -> str:
        return text

    def to_property(self, value: str) -> PropertyValue:
        return value

    def from_property(self, value: PropertyValue, what: str) -> str:
        return str(value)

    def cli(self, text: str, what: str) -> str:
        return text


class _Digit(ValueKind[int]):
    """One decimal digit, 0 to 9."""

    metavar = "0-9"

    def check(self, value: object, what: str) -> int:
        if type(value) is not int or not 0 <= value <= 9:
            raise ValueError(f"{what} must be an int from 0 to 9, got {value!r}")
        return value

    def parse(self, text: str, what: str) -> int:
        if len(text) != 1 or text not in "0123456789":
            raise ValueError(f"{what.replace('_', ' ')} {text!r} is not a digit 0-9")
        return int(text)

    def to_property(self, value: int) -> PropertyValue:
        return value

    def from_property(self, value: PropertyValue, what: str) -> int:
        return self.check(value, what)

    def cli(self, text: str, what: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]{1,4}", text.strip()) or not 0 <= int(text) <= 9:
            raise ValueError(f"{text!r} is not an integer from 0 to 9")
        return int(text)


class _Count(ValueKind[int]):
    """A count from 0 below 2**63."""

    metavar = "N"

    def check(self, value: object, what: str) -> int:
        if type(value) is not int or not 0 <= value < _INT64:
            raise ValueError(f"{what} must be an int from 0 to 2**63-1, got {value!r}")
        return value

    def parse(self, text: str, what: str) -> int:
        if not (text.isascii() and text.isdigit() and len(text) <= 19) or int(text) >= _INT64:
            raise ValueError(f"{what.replace('_', ' ')} {text!r} is not a number")
        return int(text)

    def to_property(self, value: int) -> PropertyValue:
        return value

    def from_property(self, value: PropertyValue, what: str) -> int:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"{what} {value} is negative")
        return self.check(value, what)


_TIME_RE = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})\.([0-9]{3})Z")


def ms_of(dt: datetime) -> int:
    """Milliseconds since the epoch, rounded toward the past."""
    return (dt - _EPOCH) // _MS


def time_of_ms(ms: int) -> datetime:
    """The UTC time ``ms`` milliseconds after the epoch; ValueError when out of range."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        raise ValueError(f"{ms} ms since the epoch is out of range") from None


class _Time(ValueKind[datetime]):
    """A timezone-aware time, kept in UTC; names carry it to the millisecond."""

    selects_as_is = False
    metavar = "TIME"

    def check(self, value: object, what: str) -> datetime:
        if not isinstance(value, datetime):
            raise TypeError(f"{what} must be a datetime or None, got {type(value).__name__}")
        if value.tzinfo is UTC:
            return value
        if value.utcoffset() is None:
            raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError(f"{what} {value.isoformat()} is out of range in UTC") from None

    def text(self, value: datetime) -> str:
        """``YYYYmmddTHHMMSS.mmmZ`` (UTC, microseconds truncated to milliseconds)."""
        dt = value
        return (f"{dt.year:04d}{dt.month:02d}{dt.day:02d}T{dt.hour:02d}{dt.minute:02d}"
                f"{dt.second:02d}.{dt.microsecond // 1000:03d}Z")

    def parse(self, text: str, what: str) -> datetime:
        m = _TIME_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"{text!r} is not a time like 20261125T120000.000Z")
        y, mo, d, h, mi, s, ms = map(int, m.groups())
        try:
            return datetime(y, mo, d, h, mi, s, ms * 1000, tzinfo=UTC)
        except ValueError:
            raise ValueError(f"{text!r} is not a valid time") from None

    def to_property(self, value: datetime) -> PropertyValue:
        return ms_of(value)

    def from_property(self, value: PropertyValue, what: str) -> datetime:
        if type(value) is not int:
            raise ValueError(f"{what} must be milliseconds since the epoch, got {value!r}")
        return time_of_ms(value)

    def selector(self, value: datetime) -> Any:
        return ms_of(value)

    def json(self, value: datetime) -> Any:
        return value.isoformat(timespec="milliseconds")

    def cli(self, text: str, what: str) -> datetime:
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an ISO 8601 time") from None
        if value.utcoffset() is None:
            raise ValueError(f"{text!r} has no time zone (add Z or +01:00)")
        return value.astimezone(UTC)


class _Kind(ValueKind[str]):
    def check(self, value: object, what: str) -> str:
        if value not in _KINDS:
            raise ValueError(f"{what} must be 'request', 'response' or 'oneway', got {value!r}")
        return str(value)

    def parse(self, text: str, what: str) -> str:
        return self.check(text, what)


#: text, percent-encoded in names
TEXT: ValueKind[str] = _Text()
#: a digit 0-9
DIGIT: ValueKind[int] = _Digit()
#: a count from 0 below 2**63
COUNT: ValueKind[int] = _Count()
#: a timezone-aware time (UTC, milliseconds in names)
TIME: ValueKind[datetime] = _Time()
#: request, response or oneway: the base of a name says it, no field
KIND: ValueKind[str] = _Kind()


# --------------------------------------------------------------------------- the table

Selectable = Callable[[Any], Any]


@dataclass(frozen=True)
class HeaderSpec:
    """One row of the header table (see :func:`header` for the columns)."""

    name: str
    kind: ValueKind[Any]
    default: Any
    rank: int
    ftpbc: str | None
    dropboxmq: int | str | None
    jms: Mapping[str, Selectable]
    send: bool
    cli: str | None
    help: str
    lookup: bool
    refuse: Callable[[Any], str | None] | None

    def value_text(self, value: Any) -> str | None:
        """The header's value as text (templates and lookups); None for none."""
        return None if value is None else self.kind.text(value)


def header(kind: ValueKind[Any], *, default: Any = dataclasses.MISSING, rank: int = 1000,
           ftpbc: str | None = None, dropboxmq: int | str | None = None,
           jms: str | Mapping[str, Selectable] | None = None, send: bool = False,
           cli: str | None = None, help: str = "", lookup: bool = False,
           refuse: Callable[[Any], str | None] | None = None) -> Any:
    """Declare a field of :class:`Headers` as a header.

    ``kind``       how values are checked, written and read (TEXT, DIGIT, COUNT, TIME, KIND)
    ``default``    the value of a message that does not give it; none: the header is required
    ``rank``       where it is listed: ftpbc names write fields in this order, JSON lists it so
                   (ties: declaration order; leave it for a new header, which then comes last)
    ``ftpbc``      its one-letter key in ftpbc names (``;p=9``); only ``id`` and ``kind``, which
                   the base carries, have none (the codec refuses a table otherwise)
    ``dropboxmq``  the name of the reserved property that carries it in DropboxMQ names
                   (``JMSXDeliveryCount``), or, for the headers DropboxMQ's own fields carry,
                   that field's position (1-7)
    ``jms``        the JMS name selectors read it by, or ``{name: value -> selector value}``
                   (such a function gets None too, for a message without the header)
    ``send``       a sender may set it: a keyword of ``Client.send``/``request``/``publish``
    ``cli``        its option of ``ftpbc send``/``request``/``publish`` (``--priority``), with ``help``
    ``lookup``     routing templates and rules may read it as ``{name}`` (its text)
    ``refuse``     for a value a sender gives, the reason to refuse it (None: fine)
    """
    if isinstance(jms, str):
        jms = {jms: _or_none(kind)}
    spec = HeaderSpec("", kind, default, rank, ftpbc, dropboxmq, MappingProxyType(dict(jms or {})),
                      send, cli, help, lookup, refuse)
    return dataclasses.field(default=default, metadata={"header": spec})


class HeaderTable:
    """The header rows of one :class:`Headers` class, in rank order, and their indexes."""

    def __init__(self, specs: tuple[HeaderSpec, ...]) -> None:
        self.specs = specs
        self.by_name = {s.name: s for s in specs}
        #: headers with an ftpbc key, in the order names write them
        self.ftpbc = tuple(s for s in specs if s.ftpbc is not None)
        self.ftpbc_keys = {s.ftpbc: s for s in self.ftpbc if s.ftpbc is not None}
        #: headers DropboxMQ names carry as reserved properties, by property name
        self.dropboxmq_properties = {s.dropboxmq: s for s in specs if isinstance(s.dropboxmq, str)}
        #: what a sender may set, and the command-line options
        self.sendable = tuple(s for s in specs if s.send)
        self.cli = tuple(s for s in specs if s.cli is not None)
        #: the headers routing lookups read, by name
        self.lookup = tuple(s for s in specs if s.lookup)
        #: the JMS identifiers, each with a function of the headers giving its value
        self.identifiers: dict[str, Callable[[Any], Any]] = {}
        for s in specs:
            for jname, convert in s.jms.items():
                self.identifiers[jname] = _identifier(s.name, convert)
        # What Headers checks field by field when made: all but id and kind (checked first).
        self.checked = tuple(s for s in specs if s.name not in ("id", "kind"))
        self._check()

    def _check(self) -> None:
        seen: dict[object, str] = {}
        for s in self.specs:
            if s.ftpbc is not None and not (len(s.ftpbc) == 1 and s.ftpbc.isascii() and s.ftpbc.isalpha()):
                raise ValueError(f"header {s.name!r}: ftpbc key {s.ftpbc!r} must be one ASCII letter")
            if s.send and s.default is dataclasses.MISSING:
                raise ValueError(f"header {s.name!r}: a header a sender sets needs a default")
            for column, value in (("ftpbc key", s.ftpbc), ("dropboxmq", s.dropboxmq), ("cli option", s.cli),
                                  *(("JMS name", j) for j in s.jms)):
                if value is None:
                    continue
                if (column, value) in seen:
                    raise ValueError(f"header {s.name!r}: {column} {value!r} is also "
                                     f"{seen[column, value]!r}'s")
                seen[column, value] = s.name
            if s.default is None or s.default is dataclasses.MISSING:
                continue
            s.kind.check(s.default, s.name)

    def json(self, headers: Headers) -> dict[str, Any]:
        """``{name: value}`` of every header, in rank order (times in ISO 8601, UTC)."""
        d = headers.__dict__
        return {s.name: None if d[s.name] is None else s.kind.json(d[s.name]) for s in self.specs}


def _identity(value: Any) -> Any:
    return value


def _or_none(kind: ValueKind[Any]) -> Selectable:
    """The selector value of a header of ``kind``; None for None (a header the message does not
    have is NULL)."""
    if kind.selects_as_is:
        return _identity
    convert = kind.selector
    return lambda v: None if v is None else convert(v)


def _identifier(name: str, convert: Selectable) -> Callable[[Any], Any]:
    get = operator.attrgetter(name)
    if convert is _identity:
        return get
    return lambda h: convert(get(h))


@dataclass_transform(frozen_default=True, field_specifiers=(header,))
def header_table(cls: type[_T]) -> type[_T]:
    """Make ``cls`` (Headers or a subclass adding headers) a frozen dataclass with its table."""
    made = dataclass(frozen=True)(cls)
    specs = []
    for order, f in enumerate(dataclasses.fields(made)):  # type: ignore[arg-type]
        spec = f.metadata.get("header")
        if not isinstance(spec, HeaderSpec):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with header(...)")
        specs.append((spec.rank, order, dataclasses.replace(spec, name=f.name, default=f.default)))
    made.table = HeaderTable(tuple(s for _, _, s in sorted(specs, key=lambda t: t[:2])))  # type: ignore[attr-defined]
    made._plain_templates = {}  # type: ignore[attr-defined]
    return made


def _reserved_type(value: str) -> str | None:
    if value.startswith(RESERVED_TYPE_PREFIX):
        return f"message type {value!r}: types starting {RESERVED_TYPE_PREFIX!r} are ftpbc's own"
    return None


def _expiration_ms(value: datetime | None) -> int:
    return 0 if value is None else ms_of(value)  # JMS: 0 when the message never expires


@header_table
class Headers:
    """A message's headers, as its file name carries them (docs/naming.md); immutable.

    A handler reads them as ``message.headers``; senders set some of them through
    :class:`MessageOptions`.  Made by hand, they are checked: ``priority`` 0-9 (higher first),
    ``delivery_count`` from 0 (below 2**63), datetimes timezone-aware (converted to UTC; names
    carry them at millisecond precision); a bad value is a ValueError or TypeError naming the
    header.  A response's ``correlation_id`` defaults to its ``id``: with ftpbc names a
    response's id *is* the request's id.

    For ftpbc's developers: this class is THE header table (one ``header(...)`` per header).
    Subclasses (decorated with :func:`header_table`) may add headers; codecs and selectors take
    the class whose table they read.
    """

    id: str = header(TEXT, rank=0, dropboxmq=2, jms="JMSMessageID", lookup=True)
    """The message id: the ``<uuid>`` of ``req.<uuid>`` (JMSMessageID)."""
    kind: Kind = header(KIND, default="oneway", rank=1, jms="JMS_ftpbcKind", lookup=True)
    """``request``, ``response`` or ``oneway``, from the name's prefix."""
    priority: int = header(
        DIGIT, default=DEFAULT_PRIORITY, rank=2, ftpbc="p", dropboxmq=1, jms="JMSPriority", send=True,
        cli="--priority", lookup=True,
        help="Give the message this priority, 0 (lowest) to 9 (highest) (default: the endpoint's, 4).")
    """0 (lowest) to 9 (highest); nodes take higher priorities first (JMSPriority)."""
    timestamp: datetime | None = header(TIME, default=None, rank=4, ftpbc="s",
                                        dropboxmq="JMS_ftpbcTimestamp", jms="JMSTimestamp")
    """When the sender made the message (UTC), if the name says (JMSTimestamp)."""
    expiration: datetime | None = header(TIME, default=None, rank=5, ftpbc="e", dropboxmq=4,
                                         jms={"JMSExpiration": _expiration_ms})
    """When the message expires (UTC); None: never.  An expired message is never delivered
    (docs/queues.md, Expiry)."""
    correlation_id: str | None = header(TEXT, default=None, rank=6, ftpbc="c", dropboxmq=5,
                                        jms="JMSCorrelationID", send=True, cli="--correlation-id",
                                        lookup=True, help="Set the message's correlation id.")
    """The sender's correlation id (JMSCorrelationID); a response's is its request's id."""
    reply_to: str | None = header(TEXT, default=None, rank=7, ftpbc="r", dropboxmq=6, jms="JMSReplyTo",
                                  send=True, lookup=True)
    """The endpoint whose outbox gets the response to this request (JMSReplyTo); None: its own."""
    type: str | None = header(TEXT, default=None, rank=8, ftpbc="t", dropboxmq=7, jms="JMSType", send=True,
                              cli="--type", lookup=True, refuse=_reserved_type,
                              help="Set the message's type (JMSType).")
    """The sender's message type (JMSType); types starting ``ftpbc.`` are ftpbc's own (error and
    expiry replies)."""
    message_class: str | None = header(TEXT, default=None, rank=9, ftpbc="k", dropboxmq=3, lookup=True)
    """The JMS message class letter a DropboxMQ name carries (docs/naming.md); None if none."""
    # JMS counts deliveries from 1 (this one); the header counts the ones before
    delivery_count: int = header(COUNT, default=0, rank=3, ftpbc="n", dropboxmq="JMSXDeliveryCount",
                                 jms={"JMSXDeliveryCount": lambda n: n + 1,
                                      "JMSRedelivered": lambda n: n > 0})
    """How often the message was delivered before this delivery (0: first); JMSXDeliveryCount
    is this plus one."""

    #: the table of this class's headers (set by header_table)
    table: ClassVar[HeaderTable]
    #: True when nothing but id and kind differs from the defaults (set per instance)
    _plain: ClassVar[bool]
    _plain_templates: ClassVar[dict[tuple[str, str | None], dict[str, Any]]]

    def __post_init__(self) -> None:
        d = self.__dict__
        if not isinstance(d["id"], str):
            raise TypeError(f"id must be a str, got {type(d['id']).__name__}")
        kind = d["kind"]
        if kind not in _KINDS:
            raise ValueError(f"kind must be 'request', 'response' or 'oneway', got {kind!r}")
        response = kind == "response"
        plain = True
        for spec in self.table.checked:
            name = spec.name
            v = d[name]
            default = spec.default
            if v is default or (v is not None and type(v) is type(default) and v == default):
                continue
            checked = spec.kind.check(v, name)
            if checked is not v:
                object.__setattr__(self, name, checked)
            # What a response's base already says is no departure from the defaults.
            if response and ((name == "correlation_id" and checked == d["id"])
                             or (name == "type" and checked == ERROR_TYPE)):
                continue
            plain = False
        if response and d["correlation_id"] is None:
            object.__setattr__(self, "correlation_id", d["id"])
        object.__setattr__(self, "_plain", plain)

    @classmethod
    def _unchecked(cls, uid: str, kind: Kind, typ: str | None = None) -> Headers:
        """``cls(uid, kind, type=typ)`` without the checks: the hot path of decoding a plain name.

        The instance dict is copied from a template built the ordinary way, which keeps it
        small (a dict sharing its keys with every other instance's) and fast to make.
        """
        templates = cls._plain_templates
        try:
            template = templates[kind, typ]
        except KeyError:
            template = templates.setdefault((kind, typ), cls("", kind, type=typ).__dict__)
        d = template.copy()
        d["id"] = uid
        if kind == "response":
            d["correlation_id"] = uid
        h = object.__new__(cls)
        object.__setattr__(h, "__dict__", d)
        return h


class MessageOptions(TypedDict, total=False):
    """Per-message headers and properties a sender may give (``Client.send`` and the others):
    ``ttl`` (seconds until the message expires), ``properties``, and one key per header the table
    lets a sender set (``send=True``; a test keeps the two in step)."""

    ttl: float
    """Seconds the message stays deliverable (default: the endpoint's ``ttl``, else for ever)."""
    properties: Mapping[str, PropertyValue]
    """Typed properties (names as identifiers, values bool, int, float or str), carried in the
    file name and readable by selectors (docs/naming.md gives the limits)."""
    priority: int
    """0 (lowest) to 9 (highest) (default: the endpoint's ``priority``, 4)."""
    correlation_id: str
    """Any text the receiver gets back as ``headers.correlation_id``."""
    type: str
    """The message type (JMSType); not starting with ``ftpbc.``."""
    reply_to: str
    """Requests only: the endpoint whose outbox gets the response (docs/queues.md, Reply-to)."""
