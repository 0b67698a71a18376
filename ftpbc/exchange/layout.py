"""Where messages live: the one thing endpoints and transfers do differently.

The lifecycle (:mod:`ftpbc.exchange.lifecycle`) moves a message through the same steps
everywhere: stage, expose, claim, read, serve, commit, respond, archive or delete, error,
return.  A :class:`Layout` says *where* each step puts the file:

:class:`AreaLayout`
    one direction of an endpoint's exchange area (``in``: requests and one-way messages, served
    by providers; ``out``: responses, collected by clients).  Names carry the envelope
    (:mod:`ftpbc.model.envelope`); the directories are ``<dir>box``, ``<dir>select`` ...
:class:`PartnerLayout`
    a transfer (``transfers:``): files in a partner's own directories, names from patterns,
    pre/post commands (docs/transfers.md).

A layout also turns a listing into :class:`Candidate` messages: names decoded once per listing
(never again downstream), unusable names logged once and skipped (one bad entry never stops the
rest), and, for partners that upload in place, files held back until they are stable.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from ftpbc.config.models import EndpointConfig, TransferConfig, split_pattern_path
from ftpbc.errors import ConfigError, FtpbcError, UnsafeNameError
from ftpbc.exchange.area import (
    ERROR_REPLY_SUFFIX,
    ExchangeArea,
    archive_name,
    claim_name,
    parse_archive_name,
    sized_stage_name,
)
from ftpbc.model.envelope import (
    ERROR_TYPE,
    NAME_LIMIT,
    Envelope,
    Headers,
    NameCodec,
    NameTooLong,
    PropertyValue,
    UnusableName,
    codec_for,
)
from ftpbc.paths import check_name, join
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.patterns.marker import MarkerPattern
from ftpbc.patterns.match import Value
from ftpbc.sequences import SequenceStore
from ftpbc.transport.base import Entry, Transport

log = logging.getLogger("ftpbc.exchange")

Direction = Literal["in", "out"]

#: names a layout remembers having warned about (so a bad file is logged once, not per poll)
REPORTED_NAMES = 10_000
#: decoded names a layout remembers (a large inbox is listed again and again)
DECODED_NAMES = 20_000
_NO_TIME = datetime.min.replace(tzinfo=UTC)
#: characters a slice glob must not hold literally (glob syntax, or what ends an FTP argument)
_GLOB_SPECIAL = frozenset("*?[]{}\\ \t\r\n")


@dataclass(frozen=True)
class Outbound:
    """Where one outgoing file goes.

    Uploaded to ``stage`` and renamed to ``target`` (``stage`` None: written to ``target``
    directly, so a reader may see it partial); an existing target is first moved
    (``protect_copy`` False) or copied to ``protect``; once in place it is renamed to ``final``.
    """

    target: str
    stage: str | None = None
    protect: str | None = None
    protect_copy: bool = False
    final: str | None = None

    def fields(self) -> dict[str, str]:
        out = {"target": self.target}
        for key in ("stage", "protect", "final"):
            value = getattr(self, key)
            if value:
                out[key] = value
        if self.protect_copy:
            out["protect_copy"] = "1"
        return out

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> Outbound | None:
        if "target" not in f:
            return None
        return cls(f["target"], f.get("stage") or None, f.get("protect") or None,
                   f.get("protect_copy") == "1", f.get("final") or None)

    @property
    def where(self) -> str:
        """Where the file is once the outbound step is over."""
        return self.final or self.target


@dataclass(frozen=True)
class Candidate:
    """A listed file that is a message of this layout, decoded once."""

    name: str
    size: int
    mtime: datetime | None
    envelope: Envelope
    #: what the name's pattern carried (transfers: ``%*0``..., dates, counters)
    values: dict[str, Value] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return self.envelope.headers.id


@dataclass(frozen=True)
class Commit:
    """Where a served message goes: ``path`` ("" = deleted in place); ``cleanup`` = deleted from
    there once its result is out (a commit by rename is decidable after a crash, a delete is not)."""

    path: str
    cleanup: bool = False


class Layout(ABC):
    """The directories and names of one message queue.  Thread-safe."""

    #: journal and poll-lock key (an endpoint's name, ``transfer:<name>`` for a transfer)
    key: str
    #: for log lines
    display: str
    direction: Direction
    #: where messages wait
    box: str
    #: where claims go (``<name>~<node>``); None: read in place under the poll lock
    select: str | None
    #: where failed messages go, with ``<name>.reason`` beside
    error: str
    #: where expired messages and dead letters go (None: this layout has none)
    expired_dir: str | None = None
    dead_dir: str | None = None
    #: staging directories this layout writes
    stages: tuple[str, ...] = ()
    #: staging directories whose files of this node are orphans once its journal is replayed
    orphan_stages: tuple[str, ...] = ()
    #: where reason files are uploaded before their rename beside a filed message: a directory
    #: on the server of ``error`` (and of the expired and dead directories) that no listing
    #: takes messages or reasons from (:func:`~ftpbc.exchange.steps.write_reason`)
    reason_stage: str = "/"
    #: seconds a file's size and time must stay unchanged before it is claimed (0: at once)
    stable_for: float = 0.0
    #: seconds a file's listed modification time must lie in the past before it is claimed
    min_age: float = 0.0
    #: files wait for a completion marker beside them (:meth:`marker_of`: a transfer's done_file)
    done_file: bool = False
    #: message ids are unique tokens (UUIDs) that can name journal operations
    unique_ids: bool = True
    #: the box holds message files only, so a directory found in it is refused (filed in the
    #: error directory) like a link; a partner's directory may hold subdirectories, ours too
    files_only: bool = False
    #: bytes a name grows by in this node's hands (``~<node>~<stamp>``); set by the lifecycle
    reserve: int = len("~") + 64 + len("~20261125T120000.000Z")

    def ensure_dir(self, transport: Transport, path: str) -> None:  # noqa: B027 - a no-op by default
        """Create ``path``'s directory if this layout's targets can be anywhere (no-op here)."""

    def __init__(self) -> None:
        self._reported: set[str] = set()
        self._decoded: dict[str, Candidate | None] = {}
        self._seen: dict[str, tuple[int, datetime | None, float]] = {}
        #: markers the last listing found without their data file -> since when (monotonic) they
        #: were found so and their file not claimed either (None: not checked yet)
        self._markers_alone: dict[str, float | None] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ listing

    @abstractmethod
    def prepare(self, transport: Transport) -> None:
        """Create the directories this layout uses that are missing."""

    @abstractmethod
    def _decode(self, entry: Entry) -> Candidate | None:
        """The candidate a listed file is, None if it is not one of ours; UnusableName or
        UnsafeNameError if it is ours but cannot be used."""

    def candidates(self, entries: Iterable[Entry], *, now: float | None = None) -> list[Candidate]:
        """The messages among ``entries``, in delivery order (higher priority first, then oldest).

        Unusable names are logged once and skipped; with ``stable_for`` a file is a candidate
        only once two listings at least ``stable_for`` apart saw the same size and time; with a
        completion marker (a transfer's ``done_file``), only while its marker is listed too.
        """
        gate = self.gate()
        if gate is None:
            found = [c for c in map(self.candidate, entries) if c is not None]
        else:
            for e in entries:
                gate.see(e, self.candidate(e))
            found = gate.admitted(time.monotonic() if now is None else now)
        found.sort(key=delivery_order)
        return found

    def gate(self) -> ListingGate | None:
        """What judges one whole listing before any of its files is a candidate (stability,
        completion markers); None when each listed file is one as it comes."""
        judged = self.stable_for > 0 or self.done_file or self.min_age > 0
        return ListingGate(self) if judged else None

    def marker_of(self, c: Candidate) -> str | None:
        """The name of the completion marker ``c`` waits for beside it (None: none)."""
        return None

    def is_marker(self, name: str) -> bool:
        """Whether a listed name is a completion marker (never a message of its own)."""
        return False

    def candidate(self, e: Entry) -> Candidate | None:
        """The candidate one listed entry is (None: a directory, not ours, or unusable, which
        is logged once); stability (``stable_for``) is not judged here."""
        if e.is_dir:
            return None
        decoded = self._decoded
        if len(decoded) > DECODED_NAMES:
            # Replaced, not cleared: a large box's complete pass lists in a thread of its own.
            decoded = self._decoded = {}
        try:
            cand = decoded[e.name]
        except KeyError:
            cand = self._decode_once(e)
        if cand is None:
            return None
        if cand.size != e.size or cand.mtime != e.mtime:
            cand = Candidate(cand.name, e.size, e.mtime, cand.envelope, cand.values)
        return cand

    def slices(self) -> tuple[str, ...]:
        """Name globs that together match every message this layout can take from its box, for
        listing a huge box a part at a time (:mod:`ftpbc.exchange.backlog`); () when its names
        cannot be cut so (the default).  A glob may match names of other slices, or names that
        are not messages: the caller decodes what it lists, as always."""
        return ()

    def _decode_once(self, e: Entry) -> Candidate | None:
        try:
            cand = self._decode(e)
        except (UnusableName, UnsafeNameError) as exc:
            self.report(e.name, f"unusable name, left untouched: {exc}")
            cand = None
        except FtpbcError as exc:  # one bad entry never stops the rest
            self.report(e.name, f"cannot decode, left untouched: {exc}")
            cand = None
        self._decoded[e.name] = cand
        return cand

    def decode_name(self, name: str) -> Candidate | None:
        """The candidate a bare name is (size unknown), None if it is not a usable message."""
        cand = (self._decoded[name] if name in self._decoded
                else self._decode_once(Entry(name, -1, None, False)))
        if cand is not None and cand.size != -1:
            cand = Candidate(cand.name, -1, None, cand.envelope, cand.values)
        return cand

    def stable(self, found: list[Candidate], now: float) -> list[Candidate]:
        """Files unchanged for ``stable_for`` seconds; remembers what it saw for the next call."""
        seen, fresh = self._seen, {}
        stable: list[Candidate] = []
        for c in found:
            size_time = (c.size, c.mtime)
            before = seen.get(c.name)
            since = before[2] if before is not None and before[:2] == size_time else now
            fresh[c.name] = (c.size, c.mtime, since)
            if now - since >= self.stable_for:
                stable.append(c)
        self._seen = fresh  # files no longer listed are forgotten
        return stable

    def old_enough(self, c: Candidate, wall: datetime) -> bool:
        """Whether ``c``'s listed time lies ``min_age`` seconds before ``wall``.  A time on the
        minute is taken as the minute's end (a LIST line gives no seconds, and a file must
        not look older than it is); a file listed without a time is never old enough (logged
        once)."""
        if c.mtime is None:
            self.report(c.name, "listed without a modification time, so min_age can never pass: not "
                                "received (set min_age: 0 for this server)")
            return False
        age = (wall - c.mtime).total_seconds()
        if c.mtime.second == 0 and c.mtime.microsecond == 0:
            age -= 60
        return age >= self.min_age

    def markers_alone(self, orphans: set[str]) -> set[str]:
        """Of the markers a listing found without their data file, those the previous listing
        found so too and not reported yet (worth asking whether their files are claimed)."""
        with self._lock:
            before = self._markers_alone
            self._markers_alone = {n: before.get(n) for n in orphans}
            return {n for n in orphans if n in before and n not in self._reported}

    def lone_markers(self, suspects: set[str], claimed: set[str], now: float) -> list[str]:
        """Of ``suspects`` (from :meth:`markers_alone`), those whose files were found neither in
        the box nor claimed for :data:`LONE_AFTER` seconds (``claimed``: whose files are, now).

        A marker is alone while its file is claimed, and for a moment between its file's
        commit and its own removal; only one alone longer than that is worth a warning."""
        lone = []
        with self._lock:
            for name in suspects:
                if name not in self._markers_alone:
                    continue
                since = self._markers_alone[name]
                if name in claimed:
                    self._markers_alone[name] = None
                elif since is None:
                    self._markers_alone[name] = now
                elif now - since >= LONE_AFTER:
                    lone.append(name)
        return sorted(lone)

    def report(self, name: str, why: str) -> None:
        """Log a problem with a file once (not once per poll)."""
        with self._lock:
            if name in self._reported or len(self._reported) >= REPORTED_NAMES:
                return
            self._reported.add(name)
        log.warning("%s: %r: %s", self.display, name, why)

    # ------------------------------------------------------------------ paths

    def check_sendable(self, name: str, base: str) -> None:
        """NameTooLong (naming the limit and what made it long) for a name this layout could
        not take through its lifecycle."""
        length = len(name.encode("utf-8"))
        if length + self.reserve > NAME_LIMIT:
            sizes = {"message_name": len(base.encode("utf-8")), "header fields": length - len(base)}
            raise NameTooLong(NAME_LIMIT - self.reserve, length, sizes)

    def check_usable(self, name: str) -> None:
        """Raise UnsafeNameError or UnusableName if ``name`` cannot go through the lifecycle: not
        a bare name, or too long to archive as ``<name>~<node>~<stamp>`` under the server's limit."""
        check_name(name)
        try:
            length = len(name.encode("utf-8"))
        except UnicodeEncodeError:  # bytes that are not UTF-8, decoded as lone surrogates
            raise UnusableName(name, "not UTF-8: no command or path of ftpbc's can carry it") from None
        if length + self.reserve > NAME_LIMIT:
            raise UnusableName(name, f"too long: archived as <name>~<node>~<stamp> it would exceed "
                                     f"{NAME_LIMIT} bytes")

    @staticmethod
    def is_claim(claimed: str) -> bool:
        """A bare claim ``<name>~<node>`` (not a committed ``<name>~<node>~<stamp>``)."""
        _, node, when = parse_archive_name(claimed)
        return node is not None and when is None

    def box_path(self, name: str) -> str:
        return join(self.box, name)

    def claim_path(self, name: str, node_id: str) -> str:
        """Where ``node_id`` claims ``name`` (the box itself when reading in place)."""
        if self.select is None:
            return self.box_path(name)
        return join(self.select, claim_name(name, node_id))

    def error_path(self, name: str, node_id: str, when: datetime) -> str:
        return join(self.error, archive_name(name, node_id, when))

    def filed_path(self, directory: str | None, name: str, node_id: str, when: datetime) -> str:
        """``<directory>/<name>~<node>~<stamp>`` (an expired message, a dead letter)."""
        if directory is None:
            raise ValueError(f"{self.display} has no such directory")
        return join(directory, archive_name(name, node_id, when))

    @abstractmethod
    def commit(self, c: Candidate, node_id: str, when: datetime, *, error: bool) -> Commit:
        """Where a served (``error``: failed) message goes."""

    def reply(self, c: Candidate, node_id: str, when: datetime, op_id: str, *,
              error: bool, type: str | None = None, size: int | None = None) -> Outbound | None:
        """Where a handler's result (or error reply; ``type``: a reply of that type) for ``c``
        goes; None: nowhere.  ``size``: the reply's byte count, carried by its stage name where
        the layout lets another node adopt a staged reply (:func:`~ftpbc.exchange.area.sized_stage_name`)."""
        return None

    def reply_refusal(self, c: Candidate) -> str | None:
        """Why a result for ``c`` cannot go where ``c`` asks (its reply_to), None if it can."""
        return None

    def with_delivery_count(self, c: Candidate, count: int) -> str:
        """``c``'s name with its delivery count set (the name it goes back to the box under)."""
        return c.name


class ListingGate:
    """One whole listing, judged at its end: a layout whose files become candidates only by
    what other listings or other entries say (``stable_for``: the previous listings; a
    ``done_file``: the marker beside the file).  Feed it every listed entry with
    :meth:`see`, then take :meth:`admitted`.

    Memory grows with the candidates listed (as ``stable_for`` always needed) and with the
    markers, at most :data:`MAX_MARKERS` of them (a directory holding more has the rest
    wait for a later listing, and says so once)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.found: list[Candidate] = []
        self.markers: set[str] = set()
        #: markers listed without their data file (known once :meth:`admitted` ran)
        self.orphans: set[str] = set()
        self._markers_full = False

    def see(self, e: Entry, c: Candidate | None) -> None:
        """One listed entry, and the candidate it is (None: not one)."""
        if c is not None:
            self.found.append(c)
        elif not e.is_dir and self.layout.is_marker(e.name):
            if len(self.markers) < MAX_MARKERS:
                self.markers.add(e.name)
            elif not self._markers_full:
                self._markers_full = True
                self.layout.report(e.name, f"more than {MAX_MARKERS} completion markers listed at once; "
                                           "the files of the others wait for a later listing")

    def admitted(self, now: float, wall: datetime | None = None) -> list[Candidate]:
        """The candidates this listing admits (``now``: monotonic seconds; ``wall``: the time
        ``min_age`` is judged against, now by default).  Each test a layout asks for must pass:
        a marker beside the file, its size and time unchanged for ``stable_for``, its listed
        time ``min_age`` old."""
        layout = self.layout
        found = admit = self.found
        if layout.done_file:
            expected: set[str] = set()
            admit = []
            for c in found:
                marker = layout.marker_of(c)
                if marker is None:
                    continue  # no marker it can have (logged once)
                expected.add(marker)
                if marker in self.markers:
                    admit.append(c)
            self.orphans = self.markers - expected
        if layout.stable_for > 0:
            # Stability is judged over every file listed, marked or not, so that a file whose
            # marker arrives after it stopped changing is delivered at once.
            stable = {c.name for c in layout.stable(found, now)}
            admit = [c for c in admit if c.name in stable]
        if layout.min_age > 0:
            admit = [c for c in admit if layout.old_enough(c, wall or datetime.now(UTC))]
        return admit


def delivery_order(c: Candidate) -> tuple[int, datetime, str]:
    """The sort key of delivery order: higher priority first, then oldest, then by name."""
    return (-c.envelope.headers.priority, c.mtime or _NO_TIME, c.name)


class AreaLayout(Layout):
    """One direction of an endpoint's exchange area (see :mod:`ftpbc.exchange.area`)."""

    files_only = True

    def __init__(self, endpoint: str, config: EndpointConfig, direction: Direction, *,
                 area: ExchangeArea | None = None, peers: Mapping[str, EndpointConfig] | None = None) -> None:
        super().__init__()
        #: the endpoints a request's reply_to may name (this node's configuration)
        self.peers: Mapping[str, EndpointConfig] = peers or {}
        self._reply_layouts: dict[str, AreaLayout] = {}
        self._made: set[str] = set()
        self.key = endpoint
        self.display = endpoint
        self.config = config
        self.direction = direction
        self.area = area or ExchangeArea(config.repository)
        #: the prefix of every path inside this area (ensure_dir's test, once per upload)
        self._inside = self.area.repository.rstrip("/") + "/"
        self.request_pattern = Pattern.parse(config.request_prefix + config.message_name)
        self.oneway_pattern = Pattern.parse(config.oneway_prefix + config.message_name)
        self.codec: NameCodec = codec_for(
            config.naming, **({"request_prefix": config.request_prefix,
                               "response_prefix": config.response_prefix,
                               "oneway_prefix": config.oneway_prefix,
                               "uuid_of": self._uuid_of}
                              if config.naming == "ftpbc" else {}))
        self.box = self.area.dir(direction, "box")
        self.select = self.area.dir(direction, "select")
        self.error = self.area.dir(direction, "error")
        self.stages = (self.area.dir(direction, "stage"),)
        # A staged response is never an orphan: its served record is fsynced before the upload.
        self.orphan_stages = self.stages if direction == "in" else ()
        # Both directions stage reasons in instage: the inbound sweeper and orphan search,
        # which remove a dead node's (or this node's orphaned) staged files, look there only.
        self.reason_stage = self.area.dir("in", "stage")
        self.archive_dir = self.area.dir(direction, "archive")
        self.protect_dir = self.area.dir(direction, "protect")
        self.expired_dir = self.area.dir(direction, "expired")
        self.dead_dir = self.area.dir(direction, "dead")

    def slices(self) -> tuple[str, ...]:
        """Sixteen globs, one per first hex digit of the UUID: ``*.0*`` ... ``*.f*`` with the
        default prefixes (``req.``, ``msg.``: the text they share before the UUID, so that one
        glob serves both), ``req.0*`` ... and ``msg.0*`` ... when they share none.

        Complete because a name this layout takes as a message is its prefix plus
        ``message_name`` expanded, and ``%u`` matches lower-case hex only
        (:mod:`ftpbc.patterns.match`).  None for the ``dropboxmq`` naming, a ``message_name``
        with a pattern letter before ``%u``, a response box, or text a glob cannot carry."""
        if self.direction != "in" or self.codec.name != "ftpbc":
            return ()
        lead, sep, _ = self.config.message_name.partition("%u")
        if not sep or "%" in lead:
            return ()
        prefixes = {self.config.request_prefix + lead, self.config.oneway_prefix + lead}
        if any(ch in p for p in prefixes for ch in _GLOB_SPECIAL) or any(p.startswith("-") for p in prefixes):
            return ()
        shared = posixpath.commonprefix([p[::-1] for p in prefixes])[::-1]
        heads = [f"*{shared}"] if shared else sorted(prefixes)
        return tuple(f"{head}{digit}*" for digit in "0123456789abcdef" for head in heads)

    def _uuid_of(self, base: str) -> str | None:
        m = self.request_pattern.match(base) or self.oneway_pattern.match(base)
        return m.uuid if m is not None else None

    def prepare(self, transport: Transport) -> None:
        # One listing of the repository first: an area made before (by a sender, another node,
        # a subscription's creation) then needs no MKD at all, where an MKD of a directory that
        # exists costs a refusal plus a check on the server, for each of the area's directories.
        repository = self.area.repository
        try:
            there = {e.name for e in transport.list(repository) if e.is_dir}
        except FtpbcError:  # no repository yet, or no listing: every directory is made below
            there = set()
        for d in self.area.all_dirs():
            if posixpath.dirname(d) != repository or posixpath.basename(d) not in there:
                transport.mkdir(d)

    def _decode(self, entry: Entry) -> Candidate | None:
        env = self.codec.decode(entry.name, direction=self.direction)
        if env is None:
            self.report(entry.name, f"does not match {self.request_pattern.text!r}; left untouched")
            return None
        self.check_usable(entry.name)
        return Candidate(entry.name, entry.size, entry.mtime, env)

    # names

    def name_for(self, headers: Headers, properties: dict[str, PropertyValue] | None = None,
                 base: str = "") -> str:
        """A file name for a message with these headers (``base``: the ftpbc codec's plain name)."""
        return check_name(self.codec.encode(base, headers, properties or {}))

    def response_name(self, request: Envelope, node_id: str, *, error: bool, type: str | None = None,
                      origin: str | None = None) -> str:
        """``origin``: the endpoint the request went to, when the response goes to another
        endpoint's outbox (reply_to); it travels as the response's reply_to header, which tells
        that endpoint's sweeper the response is not one of its own requests'."""
        uid = request.headers.id
        rtype = type if type is not None else ERROR_TYPE if error else None
        headers = Headers(id=uid, kind="response", correlation_id=uid, type=rtype,
                          priority=request.headers.priority, reply_to=origin)
        base = f"{self.config.response_prefix}{uid}{ERROR_REPLY_SUFFIX if rtype == ERROR_TYPE else ''}"
        return self.name_for(headers, base=base)

    def outbound(self, name: str, node_id: str, when: datetime) -> Outbound:
        """Stage ``name`` as ``<name>~<node>`` and expose it in the box."""
        return Outbound(self.box_path(name), join(self.stages[0], claim_name(name, node_id)),
                        join(self.protect_dir, archive_name(name, node_id, when))
                        if self.config.protect else None)

    def commit(self, c: Candidate, node_id: str, when: datetime, *, error: bool) -> Commit:
        if error:
            return Commit(self.error_path(c.name, node_id, when))
        return Commit(join(self.archive_dir, archive_name(c.name, node_id, when)),
                      cleanup=not self.config.archive)

    def reply(self, c: Candidate, node_id: str, when: datetime, op_id: str, *,
              error: bool, type: str | None = None, size: int | None = None) -> Outbound | None:
        """The response goes to the outbox of the endpoint the request's reply_to names, staged
        in that endpoint's outstage; to this endpoint's own outbox when there is no reply_to,
        when it names this endpoint, or when it cannot be reached (:meth:`reply_refusal`: the
        caller gets the error reply here)."""
        if self.direction != "in" or c.envelope.headers.kind != "request":
            return None
        target, _ = self._reply_route(c)
        there = target or self
        name = there.response_name(c.envelope, node_id, error=error, type=type,
                                   origin=self.key if target is not None else None)
        out = there.area
        staged = claim_name(name, node_id) if size is None else sized_stage_name(name, node_id, size)
        return Outbound(out.path("out", "box", name), out.path("out", "stage", staged),
                        out.path("out", "protect", archive_name(name, node_id, when))
                        if there.config.protect else None)

    def reply_refusal(self, c: Candidate) -> str | None:
        if self.direction != "in" or c.envelope.headers.kind != "request":
            return None
        return self._reply_route(c)[1]

    def _reply_route(self, c: Candidate) -> tuple[AreaLayout | None, str | None]:
        """(the layout of the endpoint ``c``'s reply_to names, None for this one; why the reply
        cannot go there, None if it can)."""
        reply_to = c.envelope.headers.reply_to
        if reply_to is None or reply_to == self.key:
            return None, None
        peer = self.peers.get(reply_to)
        if peer is None:
            if self.codec.name == "dropboxmq":
                # Every dropboxmq request carries a reply-to (it is what marks a request), most
                # often a JMS destination ftpbc does not know: the reply stays here, as it always has.
                return None, None
            return None, (f"reply_to {reply_to!r} names no endpoint this node knows; the reply "
                          "cannot be delivered there")
        if peer.server != self.config.server:
            return None, (f"reply_to {reply_to!r} is on server {peer.server!r}, and this request came "
                          f"through {self.config.server!r}: a reply goes to an endpoint on the same server")
        with self._lock:
            layout = self._reply_layouts.get(reply_to)
            if layout is None:
                layout = self._reply_layouts[reply_to] = AreaLayout(reply_to, peer, "out")
        return layout, None

    def ensure_dir(self, transport: Transport, path: str) -> None:
        """Create the directory of a path outside this area (another endpoint's outstage or
        outbox, for a reply_to) once per process: this area's own are made by :meth:`prepare`."""
        inside = self._inside
        if path.startswith(inside) and "/" in path[len(inside):]:
            return  # its directory is inside the area: the path's prefix says so, no dirname
        directory = posixpath.dirname(path)
        if directory in self._made:
            return
        transport.mkdir(directory)
        with self._lock:
            self._made.add(directory)

    def with_delivery_count(self, c: Candidate, count: int) -> str:
        if self.direction == "out":
            return c.name  # a response is delivered to one waiting caller: no count to keep
        env = c.envelope
        base = env.base if self.codec.name == "ftpbc" else ""
        try:
            return self.name_for(env.replace(delivery_count=count).headers, dict(env.properties), base)
        except (FtpbcError, ValueError):
            return c.name  # too long with the count, or not a name of ours: goes back as it was


class PartnerLayout(Layout):
    """A transfer: a partner's own directories (docs/transfers.md)."""

    direction: Direction = "in"
    unique_ids = False

    def __init__(self, name: str, config: TransferConfig, sequences: SequenceStore,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__()
        self.name = name
        self.key = KEY_PREFIX + name
        self.display = f"transfer {name}"
        self.config = config
        self.sequences = sequences
        self.clock = clock
        self.stable_for = config.stable_for
        self.min_age = config.min_age
        self.marker = MarkerPattern.parse(config.done_file) if config.done_file else None
        self.done_file = self.marker is not None
        self.receive_pattern: Pattern | None = None
        self.send_pattern: Pattern | None = None
        rdir = sdir = "/"
        if config.receive_from is not None:
            rdir, pattern = split_pattern_path("receive_from", config.receive_from)
            self.receive_pattern = Pattern.parse(pattern)
        if config.send_to is not None:
            sdir, pattern = split_pattern_path("send_to", config.send_to)
            self.send_pattern = Pattern.parse(pattern)
        self.receive_dir: str | None = rdir if config.receive_from is not None else None
        self.send_dir: str | None = sdir if config.send_to is not None else None
        self.box = rdir
        self.select = ((config.select_dir or join(rdir, ".ftpbc-select"))
                       if config.pre_receive == "rename" else None)
        self.error = config.error_dir or join(rdir, ".ftpbc-error")
        self.archive_dir = join(rdir, ".ftpbc-archive")
        self.stage_dir = config.stage_dir or join(sdir, ".ftpbc-stage")
        self.protect_dir = join(sdir, ".ftpbc-protect")
        self.stages = (self.stage_dir,) if config.stage and config.send_to is not None else ()
        self.orphan_stages = self.stages
        # Beside the error directory, so on its server and (file://) its file system: the
        # rename into it never crosses devices.  A partner's directory may hold subdirectories,
        # so listing the receive directory passes over it.
        self.reason_stage = join(posixpath.dirname(self.error.rstrip("/")) or "/", ".ftpbc-stage")
        self._made: set[str] = set()
        self._made_lock = threading.Lock()

    def prepare(self, transport: Transport) -> None:
        if self.receive_dir is not None:
            for d in (self.receive_dir, self.error, self.reason_stage,
                      *((self.select,) if self.select else ())):
                transport.mkdir(d)

    def ensure_dir(self, transport: Transport, path: str) -> None:
        """Create ``path``'s directory once per process (targets are patterns over whole paths)."""
        directory = posixpath.dirname(path)
        with self._made_lock:
            if directory in self._made:
                return
        transport.mkdir(directory)
        with self._made_lock:
            self._made.add(directory)

    def _decode(self, entry: Entry) -> Candidate | None:
        assert self.receive_pattern is not None
        if self.marker is not None and self.marker.is_marker(entry.name):
            return None  # a completion marker, never a file of its own
        m = self.receive_pattern.match(entry.name)
        if m is None:
            return None
        self.check_usable(entry.name)
        values = dict(m.values)
        values.update({f"%*{i}": w for i, w in enumerate(m.wildcards)})
        uid = m.uuid
        return Candidate(entry.name, entry.size, entry.mtime,
                         Envelope(Headers(id=uid or entry.name), {}, entry.name), values)

    def is_marker(self, name: str) -> bool:
        return self.marker is not None and self.marker.is_marker(name)

    def marker_of(self, c: Candidate) -> str | None:
        """``c``'s marker name (None without ``done_file``, or when its name is no name the
        transfer could remove: that file is never received, which is logged once)."""
        if self.marker is None:
            return None
        try:
            name = self.marker.name_for(c.name, sorted_wildcards(c.values))
            check_name(name)
        except (ValueError, UnsafeNameError) as exc:
            self.report(c.name, f"its completion marker cannot be named, so it is never received: {exc}")
            return None
        return name

    # names

    def _expand(self, text: str, now: datetime, *, file: str | None = None,
                directory: str | None = None) -> str:
        ctx = ExpandContext(endpoint=self.name, store=self.sequences, now=now, tz=self.config.timezone,
                            file=file, directory=directory)
        return Pattern.parse(text).expand(ctx).name

    def plan(self, op_id: str, node_id: str, *, file: str | None = None,
             directory: str | None = None) -> Outbound:
        """Every name of one outbound file, decided now (sequence values drawn once).

        ``file``/``directory`` feed ``%f``/``%p`` in ``send_to`` (a received file's).
        """
        cfg = self.config
        if self.send_pattern is None or self.send_dir is None:
            raise ConfigError(f"transfer {self.name!r} has no send_to", key=f"transfers.{self.name}.send_to")
        now = self.clock()
        ctx = ExpandContext(endpoint=self.name, store=self.sequences, now=now, tz=cfg.timezone,
                            file=file, directory=directory)
        target_name = self.send_pattern.expand(ctx).name
        target = join(self.send_dir, target_name)
        stage = None
        if cfg.stage:
            stage = join(self.stage_dir, f"{claim_name(target_name, node_id)}~{op_id.split('.', 1)[0][:8]}")
        protect = None
        if cfg.pre_send != "none":
            protect = (self._expand(cfg.pre_send_to, now, file=target_name, directory=self.send_dir)
                       if cfg.pre_send_to
                       else join(self.protect_dir, archive_name(target_name, node_id, now)))
        final = None
        if cfg.post_send == "rename":
            assert cfg.post_send_to is not None  # validated with the configuration
            final = self._expand(cfg.post_send_to, now, file=target_name, directory=self.send_dir)
        return Outbound(target, stage, protect, cfg.pre_send == "copy", final)

    def commit(self, c: Candidate, node_id: str, when: datetime, *, error: bool) -> Commit:
        cfg = self.config
        assert self.receive_dir is not None
        stamped = archive_name(c.name, node_id, when)
        if error:
            return Commit(join(self.error, stamped))
        if cfg.post_receive == "rename":
            return Commit(self._expand(cfg.post_receive_to, when, file=c.name, directory=self.receive_dir)
                          if cfg.post_receive_to else join(self.archive_dir, stamped))
        if self.select is not None:
            # delete: commit by a rename inside the select directory (decidable after a crash),
            # delete once the result is out
            return Commit(join(self.select, stamped), cleanup=True)
        return Commit("")  # read in place: the delete is the commit

    def reply(self, c: Candidate, node_id: str, when: datetime, op_id: str, *,
              error: bool, type: str | None = None, size: int | None = None) -> Outbound | None:
        if error:
            return None
        if self.send_pattern is None:
            self.report(c.name, "handler returned a result but the transfer has no send_to; dropped")
            return None
        return self.plan(op_id, node_id, file=c.name, directory=self.receive_dir)


def sorted_wildcards(values: Mapping[str, Value]) -> list[str]:
    """What each ``%*`` matched, in order, from a candidate's values (``%*0``, ``%*1`` ...)."""
    found = {int(k[2:]): str(v) for k, v in values.items() if k.startswith("%*") and k[2:].isdigit()}
    return [found[i] for i in sorted(found)]


#: seconds a completion marker must be found without its file, claimed or not, before it is
#: logged as lone (a file's commit and its marker's removal are a round trip apart)
LONE_AFTER = 3.0
#: completion markers one listing holds at most (a directory flooded with them does not grow a
#: node's memory without bound)
MAX_MARKERS = 100_000

#: journal and lock names of transfers; ':' cannot occur in an endpoint name, so none collide
KEY_PREFIX = "transfer:"
