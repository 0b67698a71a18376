"""Replay from the archive: archived messages of an endpoint sent again, as new messages, to its
inbox or another endpoint's (``ftpbc replay``, :meth:`ftpbc.client.Client.replay`;
docs/replay.md).

What is replayed
    The files of the endpoint's ``inarchive`` (``<name>~<node>~<stamp>``: served) whose time
    lies in the window, ``since <= time < until``, and that the selector, if any, selects.
    The time is the stamp the archive name carries (when the message was served); a file
    without one (not archived by ftpbc) is timed by its listed modification time, and one with
    neither is left out.  Headers and properties come from the name alone, so a selector costs
    no read; a body is read only to be sent, bounded by the endpoint's ``max_message_bytes``.
    ``source_dir`` reads ``inerror``, ``inexpired`` or ``indead`` instead (their ``.reason``
    files left out): a copy is sent and the filed message stays where it is (``ftpbc dlq
    replay`` moves a dead letter back instead).  A message that is itself a copy made by this
    same replay is never replayed again.

What a copy is
    A new message of the same kind, headers and properties, with a new id, its delivery count
    reset and its expiration dropped (it would expire at once), and two properties more:
    ``ftpbc_replay_of`` (the original's id) and ``ftpbc_replay_id`` (the replay's).  Its body is
    the original's, byte for byte.  Each copy is an ordinary send (journaled, staged, renamed
    into the inbox), so a bounded inbox may refuse it (QueueFull stops the replay).

Idempotence
    A replay has an id (:func:`replay_id_for`: derived from the endpoint, the target, the window
    and the selector, so the same command is the same replay), and each copy's id is derived
    from the replay's and the original's (:func:`copy_id`), so a rerun names a copy as the first
    run did.  The progress record (:class:`Progress`, a file of this host's ``state_dir``) notes
    each original before its copy is sent and once it is: a rerun skips the done ones, and for
    the one a kill left in doubt looks for its copy's id in the target's directories (inbox,
    claims, archive, error, expired, dead letters) before sending it.  It also keeps the
    window the first run chose (its end: the start of that run when ``until`` is not given), so
    a rerun covers the same messages, and not the copies served meanwhile, even when the
    window was given relative to the time (``--since 2h``: give ``--replay-id`` to rerun it).

    Guaranteed: a replay killed at any point and run again with the same arguments on the same
    host sends each selected original once.  Not guaranteed: when the progress record is lost
    (another host, a deleted ``state_dir``), copies already sent and served are sent again
    (one still waiting in the inbox is replaced under its name); when the target deletes what
    it serves (``archive: false``), the one copy in doubt may be sent twice if it was served
    before the rerun.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from ftpbc.errors import ConfigError, FtpbcError, NotFound, QueueFull
from ftpbc.exchange.area import REASON_SUFFIX, parse_archive_name
from ftpbc.exchange.deadletter import read_listed
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import Lifecycle, op_id_for
from ftpbc.faults import crash_point
from ftpbc.model.envelope import Envelope, PropertyValue
from ftpbc.model.selector import Selector
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.transport.base import Entry

log = logging.getLogger("ftpbc.replay")

#: the property a copy carries its original's id in (``ftpbc trace`` reads it)
REPLAY_OF = "ftpbc_replay_of"
#: the property a copy carries its replay's id in (``ftpbc trace`` reads it)
REPLAY_ID = "ftpbc_replay_id"
#: the directories a replay reads from (``archive``: served; the others: filed, with a
#: ``.reason`` beside each, never replayed itself)
SOURCES = ("archive", "error", "expired", "dead")
Source = Literal["archive", "error", "expired", "dead"]
#: the namespace of replay ids and copies' ids (uuid5)
NAMESPACE = uuidlib.UUID("5b1d6c2e-3f0a-5e43-9c1b-6a7e0d2f4c81")
#: what a replay id given by hand may be: it names a local file and travels in names
REPLAY_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: lines a progress record holds at most (two per original, and its header): a record grown
#: past this is not ours to trust
PROGRESS_LINES = 4_000_000
#: bytes one progress line may have (an original's id is one file name at most)
PROGRESS_LINE_BYTES = 4096


@dataclass(frozen=True)
class Archived:
    """One archived message in the window."""

    path: str
    #: its name in the box (the archive name without ``~<node>~<stamp>``)
    name: str
    size: int
    when: datetime
    envelope: Envelope

    @property
    def id(self) -> str:
        return self.envelope.headers.id


@dataclass
class Plan:
    """What a replay covers: its id, the window, and the archived messages in it, oldest first."""

    replay_id: str
    endpoint: str
    target: str
    since: datetime
    until: datetime
    selector: Selector | None
    messages: list[Archived]
    #: archive entries in the window whose name cannot be decoded (left out, logged once)
    unusable: int = 0

    @property
    def bytes(self) -> int:
        return sum(max(m.size, 0) for m in self.messages)

    @property
    def oldest(self) -> datetime | None:
        return self.messages[0].when if self.messages else None

    @property
    def newest(self) -> datetime | None:
        return self.messages[-1].when if self.messages else None


@dataclass
class Report:
    """What a replay did: per original, ``sent``, ``already`` (a run before sent it) or a
    reason it was not sent (``skipped``)."""

    replay_id: str
    sent: list[tuple[str, str]] = field(default_factory=list)  # (original id, copy's path)
    already: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (original id, why)


def replay_id_for(endpoint: str, target: str, since: datetime, until: datetime | None,
                  selector: Selector | None, source: Source = "archive") -> str:
    """The id of the replay these arguments describe: the same arguments, the same id."""
    parts = [endpoint, target, since.astimezone(UTC).isoformat(),
             until.astimezone(UTC).isoformat() if until is not None else "",
             selector.text if selector is not None else ""]
    if source != "archive":
        parts.append(source)
    return str(uuidlib.uuid5(NAMESPACE, "\n".join(parts)))


def copy_id(replay_id: str, original_id: str) -> str:
    """The id of the copy ``replay_id`` makes of the message ``original_id``."""
    return str(uuidlib.uuid5(NAMESPACE, f"{replay_id}\n{original_id}"))


def check_replay_id(text: str) -> str:
    """``text`` if it can be a replay id (ValueError naming it otherwise)."""
    if not REPLAY_ID_RE.fullmatch(text):
        raise ValueError(f"replay id {text!r}: 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    return text


class Progress:
    """The progress record of one replay: a local file of JSON lines, each fsynced.

    ``{"since": ...}`` and ``{"until": ...}`` first (the window the first run chose), then per original
    ``{"begin": id}`` before its copy is sent and ``{"done": id}`` once it is.  A torn last
    line (a kill mid-write) is ignored; a record that is not one (bad JSON, another replay's)
    is refused with ConfigError naming the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.since: datetime | None = None
        self.until: datetime | None = None
        self.done: set[str] = set()
        #: begun and not done: their copies may or may not be out
        self.in_doubt: set[str] = set()
        self._fh: int | None = None
        if path.exists():
            self._read()

    def open_locked(self) -> None:
        """Open the record for appending, holding its lock until :meth:`close`, and read it
        again (a run that ended meanwhile may have added to it).  ConfigError when another
        process holds it: two runs of one replay at once would both send what neither noted.
        A filesystem without locks (ENOLCK: NFS without lockd) is logged and the run goes on."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"{self.path}: this replay is running in another process (its progress "
                              "record is locked); wait for it to end") from None
        except OSError as exc:
            log.warning("%s: cannot lock the replay's progress record (%s); make sure no other "
                        "process runs this replay", self.path, exc.strerror or exc)
        self._fh = fd
        try:
            self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        self.since = self.until = None
        self.done, self.in_doubt = set(), set()
        with self.path.open("rb") as fh:
            for number, raw in enumerate(fh, 1):
                if number > PROGRESS_LINES or len(raw) > PROGRESS_LINE_BYTES:
                    raise ConfigError(f"{self.path}: line {number}: not a replay progress record (too long)")
                if not raw.endswith(b"\n"):
                    break  # torn by a kill mid-write: the step it announced is in doubt or undone
                try:
                    item = json.loads(raw)
                    if not isinstance(item, dict) or len(item) != 1:
                        raise ValueError("not a one-key object")
                    (key, value), = item.items()
                    if not isinstance(value, str):
                        raise ValueError("value is not text")
                except ValueError as exc:
                    raise ConfigError(f"{self.path}: line {number}: not a replay progress record: "
                                      f"{exc}") from None
                if key in ("since", "until"):
                    try:
                        when = datetime.fromisoformat(value)
                    except ValueError:
                        raise ConfigError(f"{self.path}: line {number}: bad {key} {value!r}") from None
                    if when.tzinfo is None:
                        raise ConfigError(f"{self.path}: line {number}: {key} {value!r} has no offset")
                    setattr(self, key, when)
                elif key == "begin":
                    self.in_doubt.add(value)
                elif key == "done":
                    self.in_doubt.discard(value)
                    self.done.add(value)
                else:
                    raise ConfigError(f"{self.path}: line {number}: unknown key {key!r}")

    def note(self, key: str, value: str) -> None:
        """Append ``{key: value}`` and fsync it (the record is open: :meth:`open_locked`)."""
        if self._fh is None:
            raise RuntimeError(f"{self.path}: the progress record is not open")
        line = json.dumps({key: value}).encode("utf-8") + b"\n"
        os.write(self._fh, line)
        os.fsync(self._fh)
        if key == "begin":
            self.in_doubt.add(value)
        elif key == "done":
            self.in_doubt.discard(value)
            self.done.add(value)

    def close(self) -> None:
        if self._fh is not None:
            os.close(self._fh)
            self._fh = None


def progress_path(state_dir: Path, replay_id: str) -> Path:
    """Where the progress record of ``replay_id`` is kept."""
    return state_dir / "replays" / f"{check_replay_id(replay_id)}.jsonl"


class Replay:
    """One replay: from ``source``'s archive (an endpoint's inbound lifecycle) to ``target``'s
    inbox (the same lifecycle, or another endpoint's)."""

    def __init__(self, source: Lifecycle, target: Lifecycle, state_dir: Path, *, since: datetime,
                 until: datetime | None = None, selector: Selector | None = None,
                 replay_id: str | None = None, source_dir: Source = "archive") -> None:
        for lc in (source, target):
            if not isinstance(lc.layout, AreaLayout) or lc.layout.direction != "in":
                raise ConfigError(f"{lc.layout.display}: only an endpoint's messages can be replayed "
                                  "(a transfer's archive holds a partner's files)")
        if since.tzinfo is None or (until is not None and until.tzinfo is None):
            raise ValueError("since and until must be timezone-aware (archive stamps are UTC)")
        if until is not None and until <= since:
            raise ValueError(f"the window is empty: until {until.isoformat()} is not after since "
                             f"{since.isoformat()}")
        if source_dir not in SOURCES:
            raise ValueError(f"replay from {source_dir!r}: expected one of {', '.join(SOURCES)}")
        self.source = source
        self.source_dir = source_dir
        self.target = target
        self.selector = selector
        self.since = since
        self.replay_id = check_replay_id(replay_id) if replay_id is not None else replay_id_for(
            source.layout.key, target.layout.key, since, until, selector, source_dir)
        self.progress = Progress(progress_path(state_dir, self.replay_id))
        # A rerun covers the window its first run did: a relative --since moved meanwhile, and
        # an open end would take in the copies served since.
        if self.progress.since is not None:
            self.since = self.progress.since
        self.until = self.progress.until if self.progress.until is not None else until

    # ------------------------------------------------------------------ what is in the window

    def plan(self) -> Plan:
        """The archived messages in the window, oldest first (one listing of the archive)."""
        layout = self.source.layout
        assert isinstance(layout, AreaLayout)
        until = self.until if self.until is not None else datetime.now(UTC)
        where = {"archive": layout.archive_dir, "error": layout.error, "expired": layout.expired_dir,
                 "dead": layout.dead_dir}[self.source_dir]
        assert where is not None  # an endpoint's area has every one of them
        directory = where.rstrip("/")
        # Streamed: only what the window and the selector take is kept (by path: a listing
        # retried after a dropped connection may hand an entry over twice).
        found: dict[str, Archived] = {}
        unusable: set[str] = set()

        def visit(e: Entry) -> bool:
            if e.is_dir or (self.source_dir != "archive" and e.name.endswith(REASON_SUFFIX)):
                return True
            name, node, when = parse_archive_name(e.name)
            if node is None or when is None:
                name, when = e.name, e.mtime
            if when is None or not self.since <= when < until:
                return True
            cand = layout.decode_name(name)
            if cand is None:
                unusable.add(e.name)  # the layout logged why, once
                return True
            env = cand.envelope
            if env.properties.get(REPLAY_ID) == self.replay_id:
                return True  # a copy this replay made, served since: never replayed again
            if self.selector is None or self.selector.matches(env.headers, env.properties):
                path = f"{directory}/{e.name}"
                found[path] = Archived(path, name, e.size, when, env)
            return True

        try:
            self.source.transport.scan(where, visit)
        except NotFound:
            pass  # no archive yet: nothing to replay
        messages = sorted(found.values(), key=lambda a: (a.when, a.name, a.path))
        return Plan(self.replay_id, layout.key, self.target.layout.key, self.since, until, self.selector,
                    messages, len(unusable))

    # ------------------------------------------------------------------ sending

    def run(self, plan: Plan, *, each: Callable[[Archived, str], None] | None = None) -> Report:
        """Send a copy of every message of ``plan`` not sent by a run before; ``each(message,
        outcome)`` after each one.  QueueFull (the target's inbox is full) stops the replay, the
        rest left for a rerun; any other failure of one message is reported and the rest go on."""
        self.progress.open_locked()
        try:
            if self.progress.until is None:
                self.progress.note("since", plan.since.isoformat())
                self.progress.note("until", plan.until.isoformat())
            report = Report(self.replay_id)
            present = self._copies_present(plan) if self.progress.in_doubt else set()
            for m in plan.messages:
                outcome = self._one(m, present, report)
                if each is not None:
                    each(m, outcome)
        finally:
            self.progress.close()
        return report

    def _one(self, m: Archived, present: set[str], report: Report) -> str:
        new_id = copy_id(self.replay_id, m.id)
        if m.id in self.progress.done or (m.id in self.progress.in_doubt and new_id in present):
            if m.id not in self.progress.done:
                self.progress.note("done", m.id)
            report.already.append(m.id)
            return "already sent"
        try:
            name, kind = self._copy_name(m, new_id)
            body = read_listed(self.source, m.path, m.size)
        except (FtpbcError, ValueError) as exc:
            report.skipped.append((m.id, str(exc)))
            log.warning("replay %s: %s: not replayed: %s", self.replay_id, m.path, exc)
            return f"not replayed: {exc}"
        self.progress.note("begin", m.id)
        crash_point("archive-replay.after-begin")
        lc = self.target
        layout = lc.layout
        assert isinstance(layout, AreaLayout)
        try:
            where = lc.send(layout.outbound(name, lc.node_id, lc.clock()), body,
                            op_id=op_id_for(new_id, "send"), kind=kind)
        except QueueFull:
            raise
        except FtpbcError as exc:
            # The send rolled itself back or left its intent for recovery: the record keeps
            # the original in doubt, and a rerun looks for the copy before sending it again.
            report.skipped.append((m.id, str(exc)))
            log.warning("replay %s: %s: not replayed: %s", self.replay_id, m.path, exc)
            return f"not replayed: {exc}"
        crash_point("archive-replay.after-send")
        self.progress.note("done", m.id)
        report.sent.append((m.id, where))
        return f"sent as {new_id}"

    def _copy_name(self, m: Archived, new_id: str) -> tuple[str, str]:
        """The copy's file name in the target's inbox, and its kind."""
        layout = self.target.layout
        assert isinstance(layout, AreaLayout)
        cfg = layout.config
        h = m.envelope.headers
        kind = "request" if h.kind == "request" else "oneway"
        properties: dict[str, PropertyValue] = dict(m.envelope.properties)
        properties[REPLAY_OF] = m.id
        properties[REPLAY_ID] = self.replay_id
        headers = m.envelope.replace(id=new_id, kind=kind, delivery_count=0, expiration=None).headers
        base = ""
        if cfg.naming == "ftpbc":
            prefix = cfg.request_prefix if kind == "request" else cfg.oneway_prefix
            rest = new_id if cfg.message_name == "%u" else Pattern.parse(cfg.message_name).expand(
                ExpandContext(endpoint=layout.key, uuid=new_id, tz=cfg.timezone)).name
            base = prefix + rest
        name = layout.name_for(headers, properties, base)
        layout.check_sendable(name, base)
        return name, kind

    def _copies_present(self, plan: Plan) -> set[str]:
        """The ids of the copies of in-doubt originals found in the target's directories."""
        wanted = {copy_id(self.replay_id, m.id) for m in plan.messages if m.id in self.progress.in_doubt}
        layout = self.target.layout
        dirs = [layout.box, layout.select, layout.error, getattr(layout, "archive_dir", None),
                layout.expired_dir, layout.dead_dir]
        found: set[str] = set()

        def visit(e: Entry) -> bool:
            if any(w in e.name for w in wanted):
                # decoded, not only matched: a copy of a copy carries the id as a property
                cand = layout.decode_name(parse_archive_name(e.name)[0])
                if cand is not None and cand.uuid in wanted:
                    found.add(cand.uuid)
            return len(found) < len(wanted)

        for d in dirs:
            if d is None or len(found) == len(wanted):
                continue
            try:
                self.target.transport.scan(d, visit)
            except NotFound:
                continue
        return found
