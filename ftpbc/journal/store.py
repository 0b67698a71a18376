"""The operation journal: durable intents before remote writes, so a crashed node can recover.

Layout (one directory per node identity, so nodes sharing a host never touch each other's)::

    <journal_dir>/<node-id>/registry              endpoint <TAB> journal file, one per line
    <journal_dir>/<node-id>/<uuid5>.journal        one endpoint's records
    <journal_dir>/<node-id>/results/<op-id>        large handler results awaiting their response

A record is one line of text a person can read::

    2026-11-22T01:02:03.123Z 7f3c...e1 send stage=/q/instage/req.7f3c..~node-a target=/q/inbox/req.7f3c..

``<time> <op-id> <event> key=value...`` with values percent-encoded (never a space or newline
inside a value).  An operation is *pending* from its first record until its ``end`` record.

What is guaranteed
    :meth:`EndpointJournal.record` with ``durable=True`` returns only after the line is on disk:
    after an ``fsync`` that began once the line was written completed successfully.  Concurrent
    writers share one fsync (group commit: one of them fsyncs for all, the others wait for it,
    at most ``SYNC_WAIT`` seconds); a failed fsync fails every writer whose record it covered,
    with JournalError.  Intents that recovery
    cannot reconstruct from the server (a handler's result, the names a send is about to write)
    are written durably *before* the remote write.

    An append that fails (a full disk) records nothing: the file is cut back to its last whole
    record, or, if that fails, the journal refuses every later record (see
    :meth:`EndpointJournal.record_many`).  A damaged record never stops the node: at opening, a
    torn last record is cut and any other unusable record set aside in a side file (see
    :func:`read_journal` and :func:`journal_problems`, which reports them until removed).

What is not
    Outcome records (``durable=False``) may be lost in a crash.  That is by design: recovery
    decides every pending operation from the journal *plus the server's actual state*, so a lost
    outcome only means recovery re-checks something that had already happened.

Compaction
    When no operation is pending the file is truncated: at once if no fsync ran since it was
    last emptied (a sender's journal), else once it holds ``TRUNCATE_AT`` bytes or when the
    journal is closed; otherwise, past
    ``COMPACT_EVERY`` ended operations it is rewritten (temporary file, fsync, rename) with only
    the pending records.  A file holding only ended operations is correct at any size (recovery
    finds nothing pending in it); truncating it is housekeeping, and costly enough not to do after
    every message (see ``TRUNCATE_AT``).

File modes
    A journal holds message bodies (handler results, inline or in ``results/``), so it is private
    to the node's user: directories are created ``0700`` and files ``0600``, set explicitly
    (``chmod``/``fchmod``, whatever the umask), and a journal left more open by an older version
    is tightened when it is opened (:mod:`ftpbc.private_files`, shared with the state directory
    and the sequence store).
"""

from __future__ import annotations

import base64
import errno
import itertools
import logging
import os
import re
import threading
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from ftpbc.errors import JournalError
from ftpbc.private_files import DIR_MODE, FILE_MODE, open_private, private_dir, tighten
from ftpbc.stamps import WholeSeconds

log = logging.getLogger(__name__)

COMPACT_EVERY = 2000
#: bytes a journal that was fsynced may hold, with nothing pending, before it is truncated.
#: Truncating after every message made each following fsync allocate the file's block again, a
#: metadata commit of the filesystem's own journal (costlier than an fsync of appended data:
#: docs/benchmarks.md, "Tenth pass"), and the truncation waits for that journal while it holds
#: this one's lock.
TRUNCATE_AT = 256 * 1024
#: seconds a durable writer waits for an fsync another writer runs (JournalError after)
SYNC_WAIT = 60.0
INLINE_RESULT_LIMIT = 64 * 1024
_NAMESPACE = uuid.UUID("6f0a2f4e-8a53-4e0c-9a57-5f4d7c0b7e21")


@dataclass
class Operation:
    """A pending operation: its id, the events seen in order, and the merged fields."""

    op_id: str
    events: list[str] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.events[0] if self.events else ""

    @property
    def last(self) -> str:
        return self.events[-1] if self.events else ""


_SAFE = "/:.-_~@"
#: a value made only of characters quote() leaves alone is written as it is (the usual case:
#: paths, UUIDs, names), which saves a quote() call per field, three or four per record
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9/:.\-_~@]*")
#: the characters of names with headers (``msg.<uuid>;s=<stamp>``), of JSON values (a
#: transaction's members) and of base64 (a reply's body, inline: ``+`` and ``=``) that quote()
#: escapes, with their escapes; '%' first.  Without ``+`` every inline reply body went through
#: quote(), a Python call per byte of a record written once per request served.
_COMMON_ESCAPES = tuple((ch, f"%{ord(ch):02X}") for ch in '%;="{}[],+')
#: a value once those are escaped, if it needs nothing more
_PLAIN_ESCAPED = re.compile(r"[A-Za-z0-9/:.\-_~@%]*")


def _quote(value: str) -> str:
    """``quote(value, safe=_SAFE)``, the same text: quote() calls a Python function per byte,
    str.replace per character kind does not."""
    if _PLAIN_VALUE.fullmatch(value):
        return value
    escaped = value
    for ch, escape in _COMMON_ESCAPES:
        if ch in escaped:
            escaped = escaped.replace(ch, escape)
    if _PLAIN_ESCAPED.fullmatch(escaped):
        return escaped
    # surrogatepass: a name listed from the wire may carry lone surrogates (undecodable bytes,
    # kept by surrogateescape); strict UTF-8 would refuse to journal it at all
    return quote(value, safe=_SAFE, errors="surrogatepass")


def _encode(fields: dict[str, str]) -> str:
    return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _decode(parts: Iterable[str]) -> dict[str, str]:
    out = {}
    for part in parts:
        key, _, value = part.partition("=")
        out[key] = unquote(value, errors="surrogatepass")
    return out


_SECONDS = WholeSeconds("%Y-%m-%dT%H:%M:%S.")  # a busy node writes thousands of records a second


def _now() -> str:
    now = time.time()
    second = int(now)
    return f"{_SECONDS.text(second)}{int((now - second) * 1000):03d}Z"


def _apply(pending: dict[str, Operation], op_id: str, event: str, fields: dict[str, str]) -> bool:
    """Fold one record into ``pending``; True if it ended an operation."""
    if event == "end":
        return pending.pop(op_id, None) is not None
    op = pending.setdefault(op_id, Operation(op_id))
    op.events.append(event)
    op.fields.update(fields)
    return False


#: what each event's record must carry; an event not listed here is refused when read
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "send": (),  # a send without its target was never started: recovery ends it
    "claim": ("src", "dst"),
    "served": (),  # and one of _COMMIT_FIELDS, and its body if it has a reply
    "replay": ("src", "dst"),
    "commit": ("members",),  # a transaction's sends, all to be exposed (exchange/transaction.py)
    # a fan-out's copies, named before any is uploaded (exchange/transaction.py, stage_copies)
    "staging": ("members",),
    "delivered": (),
    # a route's message (exchange/route.py): where it goes, then its stage file complete
    "routed": ("claim", "commit", "d_server", "d_target", "d_stage"),
    "staged": (),
    "end": (),
    # written by earlier releases; still read so that an upgrade finishes what they left
    "exposing": (),
    "received": (),
}
#: a ``served`` record carries where the claimed file goes under one of these names
_COMMIT_FIELDS = ("commit", "archived", "commit_to")


def _line(stamp: str, op_id: str, event: str, fields: dict[str, str]) -> bytes:
    """One record as written: its text, then `` #`` and the CRC32 of that text (8 hex digits)."""
    text = (f"{stamp} {op_id} {event} {_encode(fields)}" if fields
            else f"{stamp} {op_id} {event}").encode("utf-8")
    return b"%s #%08x\n" % (text, zlib.crc32(text))


def _refusal(event: str, fields: dict[str, str]) -> str | None:
    """Why a record whose event is unknown or that lacks a field its event needs is refused."""
    required = REQUIRED_FIELDS.get(event)
    if required is None:
        return f"unknown journal event {event!r}"
    missing = [k for k in required if k not in fields]
    if event == "served":
        if not any(k in fields for k in _COMMIT_FIELDS):
            missing.append("commit")
        # A reply was recorded: its body must be there (inline or in results/), never taken as empty.
        if ("target" in fields or "resp_target" in fields) and "body" not in fields \
                and "body_file" not in fields:
            missing.append("body")
    if missing:
        return f"journal record {event!r} lacks {', '.join(missing)}"
    return None


def _has_checksum(raw: bytes) -> bool:
    # Values are %-encoded (no space), so only the checksum makes a record end in " #<8 chars>".
    return raw[-10:-8] == b" #"


def is_legacy(lines: list[bytes]) -> bool:
    """True for the records of a journal file written by the previous release: some record, and
    no checksum on any of them."""
    records = [raw for raw in lines if raw.strip()]
    return bool(records) and not any(_has_checksum(raw) for raw in records)


class _Unusable(Exception):
    """A line that is not a usable record; its text says why (no file, no line number)."""

    def __init__(self, reason: str, *, cut: bool = False) -> None:
        super().__init__(reason)
        #: the bytes are not those written (checksum, none): what a write cut short leaves
        self.cut = cut


def _parse_record(raw: bytes, checked: bool) -> tuple[str, str, dict[str, str]]:
    """``(op_id, event, fields)`` of one record line, or :class:`_Unusable`."""
    if not checked:
        body = raw  # the whole file was written by the previous release
    elif _has_checksum(raw):
        body = raw[:-10]
        try:
            ok = int(raw[-8:], 16) == zlib.crc32(body)
        except ValueError:
            ok = False
        if not ok:
            raise _Unusable("journal record fails its checksum (damaged or cut)", cut=True)
    else:
        raise _Unusable("journal record without its checksum (damaged or cut)", cut=True)
    try:
        line = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusable("journal record is not UTF-8") from None
    parts = line.split(" ")
    if len(parts) < 3 or not parts[1] or any("=" not in p for p in parts[3:]):
        raise _Unusable(f"unreadable journal record {line[:80]!r}")
    _, op_id, event, *rest = parts
    fields = _decode(rest)
    refused = _refusal(event, fields)
    if refused is not None:
        raise _Unusable(refused)
    return op_id, event, fields


#: where a record begins: its time stamp and the space after it (see _now)
_RECORD_START = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def _salvage(raw: bytes) -> tuple[int, tuple[str, str, dict[str, str]]] | None:
    """A whole record written behind a cut one on the same line: where it begins, and it.

    An older release appended behind a record that a full disk had cut, so the two share a
    line.  The checksum of the candidate decides (a false match is a 1 in 2**32 chance).
    """
    for match in _RECORD_START.finditer(raw, 1):
        try:
            return match.start(), _parse_record(raw[match.start():], True)
        except _Unusable:
            continue
    return None


@dataclass
class Damage:
    """Bytes of a journal file that are not a usable record: where they begin and why."""

    line: int
    offset: int
    raw: bytes
    reason: str

    def where(self) -> str:
        return f"line {self.line} at offset {self.offset}"


def _where(damaged: list[Damage]) -> str:
    """Where the first few of ``damaged`` are, for a one-line message."""
    return ", ".join(d.where() for d in damaged[:5]) + (", ..." if len(damaged) > 5 else "")


@dataclass
class Reading:
    """What :func:`read_journal` found in one file."""

    pending: dict[str, Operation]
    #: unusable records before the last one, in file order: set aside, never guessed at
    damaged: list[Damage] = field(default_factory=list)
    #: the last record, cut by a write that did not finish (no newline, or its checksum fails)
    torn: Damage | None = None


def read_journal(path: Path) -> Reading:
    """Read journal file ``path`` (nothing pending if it does not exist); never writes.

    Every record must be whole to be used: its checksum right, its text UTF-8, its event known
    and the fields that event needs present.  A record that is not is never guessed at: it is
    reported, and its operation is decided as if it had not been written.

    * The last record, when it has no newline or fails its checksum, is :attr:`Reading.torn`:
      a write that did not finish (a kill, a full disk), so before the step it announced.
    * Any other unusable record is in :attr:`Reading.damaged`; every record around it is used.
      A cut record with a whole one written behind it on the same line (what an older release
      left after a full disk) gives up only its cut part.

    A file of the previous release has no checksum on any record and is read as such (opening it
    for writing rewrites it with checksums at once).  A file with one checksummed record is of
    this release throughout: a record without its checksum there is damage, not age.
    Raises JournalError only when the file cannot be read at all.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Reading({})
    except OSError as exc:
        raise JournalError(f"{path}: cannot read journal: {exc.strerror}") from None
    reading = Reading({})
    lines = data.split(b"\n")
    complete = lines[:-1]  # the piece after the last newline is empty or a torn record
    if lines[-1]:
        reading.torn = Damage(len(lines), len(data) - len(lines[-1]), lines[-1],
                              "last record without its newline (cut mid-write)")
    last = max((i for i, raw in enumerate(complete) if raw.strip()), default=-1)
    checked = not is_legacy(complete)
    offset = 0
    for index, raw in enumerate(complete):
        here = offset
        offset += len(raw) + 1
        if not raw.strip():
            continue
        try:
            record = _parse_record(raw, checked)
        except _Unusable as exc:
            salvaged = _salvage(raw) if exc.cut and checked else None
            if salvaged is not None:
                start, record = salvaged
                reading.damaged.append(Damage(index + 1, here, raw[:start],
                                              "cut record, a whole one written behind it"))
            elif exc.cut and index == last and reading.torn is None:
                reading.torn = Damage(index + 1, here, raw, str(exc))
                break
            else:
                reading.damaged.append(Damage(index + 1, here, raw, str(exc)))
                continue
        _apply(reading.pending, *record)
    return reading


def parse_journal(path: Path) -> dict[str, Operation]:
    """The pending operations recorded in journal file ``path``, read by :func:`read_journal`
    (unusable records left out)."""
    return read_journal(path).pending


#: a side file of damaged records: ``<journal file>.damaged-<UTC stamp>[.<n>]``
_SIDE_FILE = re.compile(r"(?P<journal>.+\.journal)\.damaged-\d{8}T\d{6}Z(\.\d+)?")


def _new_side_file(path: Path) -> tuple[Path, int]:
    """A new side file beside journal file ``path`` (never an existing one), opened to write."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in itertools.count():
        side = path.with_name(f"{path.name}.damaged-{stamp}" + (f".{n}" if n else ""))
        try:
            return side, open_private(side, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            continue
    raise AssertionError("unreachable")  # itertools.count() never ends


class EndpointJournal:
    """The journal of one endpoint on one node.  Thread-safe."""

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        self.results_dir = path.parent / "results"
        self._lock = threading.Lock()
        # Group commit (see _sync_through): records are appended under _lock; one writer at a
        # time, the leader, fsyncs outside it while the others wait on _synced_cond for an fsync
        # that covers their batch.  Compaction (which swaps the file) runs only under _lock and
        # while no fsync runs (_syncing), so no fsync ever runs on a file being replaced.
        self._synced_cond = threading.Condition(self._lock)
        self._syncing = False
        #: batches appended, and the last one an fsync made durable (batch sequence numbers)
        self._written = 0
        self._synced = 0
        #: batches an fsync failed to make durable, as ``(synced before, written through, why)``
        self._unsynced: list[tuple[int, int, str]] = []
        #: fsyncs of the journal file started for writers (the group commit's counter)
        self.fsyncs = 0
        #: how long a writer waits for another writer's fsync to cover its batch
        self.sync_wait = SYNC_WAIT
        #: why no record is appended any more (the file may end in bytes that could not be cut)
        self._broken: str | None = None
        #: what start-up could not put right, for :func:`journal_problems`
        self._problems: list[str] = []
        self._pending: dict[str, Operation] = {}
        self._ended_since_compaction = 0
        #: :meth:`close` is truncating the file whatever its size
        self._closing = False
        #: an fsync ran since the file was last emptied (see _truncate_due)
        self._fsynced_since_empty = False
        self._load()
        if self._pending and self._legacy():
            self._rewrite()  # every record from here on carries its checksum (see read_journal)
        try:
            # Unbuffered binary: one write() system call per record batch and nothing else (a text
            # file's encode, flush, tell and seek cost as much again, per record).
            self._fh = open(open_private(path, os.O_WRONLY | os.O_APPEND), "ab",  # noqa: SIM115
                            buffering=0)  # lives as long as the journal
            self._size = os.fstat(self._fh.fileno()).st_size
        except OSError as exc:
            raise JournalError(f"{path}: cannot open journal: {exc.strerror}") from None

    # ------------------------------------------------------------------ reading

    def _load(self) -> None:
        """Read the file and put right what a reader must not trip over twice.

        A torn last record is cut off (or the next append would be glued to it); damaged
        records are moved to a side file and the file rewritten without them.  Neither stops
        the journal: if the damage cannot be moved it stays where it is (reported by
        :func:`journal_problems`), and only a torn record that cannot be cut makes the
        journal refuse records.
        """
        reading = read_journal(self.path)
        self._pending = reading.pending
        if reading.damaged and self._set_aside(reading.damaged):
            if reading.torn is not None:  # the rewrite left it out
                self._warn_torn(reading.torn)
            return
        if reading.torn is not None:
            try:
                with open(self.path, "r+b") as fh:
                    fh.truncate(reading.torn.offset)
            except OSError as exc:
                self._refuse(f"cannot cut its torn last record at offset {reading.torn.offset}: "
                             f"{exc.strerror}")
                return
            self._warn_torn(reading.torn)

    def _warn_torn(self, torn: Damage) -> None:
        log.warning("%s: torn last record (%s, %d bytes: %s) cut off; its operation is taken as "
                    "unrecorded", self.path, torn.where(), len(torn.raw), torn.reason)

    def _set_aside(self, damaged: list[Damage]) -> bool:
        """Copy ``damaged`` to a new side file, then rewrite the journal without them.

        The side file (``<journal>.damaged-<UTC stamp>``, 0600: it may hold message bodies)
        keeps the bytes as they were, one per line, for a person to inspect; it is never read
        back.  False, having logged why, when either step fails (a full disk): the file is then
        left as it was and its damage set aside at a later start-up.
        """
        where = _where(damaged)
        side: Path | None = None
        try:
            side, fd = _new_side_file(self.path)
            with open(fd, "wb") as out:
                out.write(b"".join(d.raw + b"\n" for d in damaged))
                out.flush()
                os.fsync(out.fileno())
            self._rewrite()
        except OSError as exc:
            if side is not None:
                side.unlink(missing_ok=True)
            why = (f"{len(damaged)} damaged record(s) ({where}) could not be set aside "
                   f"({exc.strerror}); every other record is used")
            self._problems.append(f"journal {self.path}: {why}")
            log.error("%s: %s", self.path, why)
            return False
        log.error("%s: %d damaged record(s) (%s: %s) set aside in %s; every other record is used",
                  self.path, len(damaged), where, damaged[0].reason, side)
        return True

    def _refuse(self, why: str) -> None:
        """Refuse every record from now on: appending behind bytes that are not a whole record
        would make the next start-up take them for damage and set good records aside."""
        self._broken = why
        log.error("%s: %s; the journal refuses records until the node restarts", self.path, why)

    def problems(self) -> list[str]:
        """What this journal could not put right, one line each (see :func:`journal_problems`)."""
        broken = [f"journal {self.path}: refuses records: {self._broken}"] if self._broken else []
        return [*self._problems, *broken]

    def _legacy(self) -> bool:
        try:
            return is_legacy(self.path.read_bytes().split(b"\n"))
        except OSError:
            return False

    def _apply(self, op_id: str, event: str, fields: dict[str, str]) -> None:
        if _apply(self._pending, op_id, event, fields):
            self._ended_since_compaction += 1

    def pending(self) -> list[Operation]:
        """Operations begun and not ended, in the order they began."""
        with self._lock:
            return [Operation(o.op_id, list(o.events), dict(o.fields)) for o in self._pending.values()]

    def is_pending(self, op_id: str) -> bool:
        """Whether operation ``op_id`` is begun and not ended (no copy of every pending one)."""
        with self._lock:
            return op_id in self._pending

    # ------------------------------------------------------------------ writing

    def record(self, op_id: str, event: str, *, durable: bool = False, **fields: str) -> None:
        """Append one record; with ``durable`` return only once it is on disk."""
        self.record_many([(op_id, event, fields)], durable=durable)

    def record_many(self, records: list[tuple[str, str, dict[str, str]]], *, durable: bool) -> int:
        """Append several records with at most one fsync (a poll's batch of claims).

        Returns the batch's sequence number: with ``durable`` False, :meth:`wait_durable` of it
        returns once the batch is on disk (the caller's own group commit, see there).

        A batch is appended whole or not at all: a write that fails (a full disk, an I/O error)
        raises JournalError after cutting the file back to the end of the batch before, so
        nothing of it is recorded and the next batch (once there is room) follows a whole
        record.  If that cut fails too, the journal refuses every later record (JournalError)
        rather than append behind the remains.  Batches of other writers are never touched:
        they were appended whole before this one, under the same lock.
        """
        if not records:
            return 0
        stamp = _now()
        data = b"".join([_line(stamp, op_id, event, fields) for op_id, event, fields in records])
        with self._lock:
            if self._broken is not None:
                raise JournalError(f"{self.path}: journal refuses records: {self._broken}")
            try:
                done = 0
                while done < len(data):  # a regular file takes it all at once, save on a full disk
                    n = self._fh.write(memoryview(data)[done:])
                    if not n:
                        raise OSError(errno.ENOSPC, "no byte written")
                    done += n
            except OSError as exc:
                self._cut_back()
                raise JournalError(f"{self.path}: cannot write journal: {exc.strerror}") from None
            self._size += done
            self._written += 1
            seq = self._written
            for op_id, event, fields in records:
                self._apply(op_id, event, dict(fields))
            # Only a batch that ended operations can leave nothing pending or make compaction
            # due; any other skips taking the lock again below (every record of every message).
            due = ((not self._pending and self._truncate_due())
                   or self._ended_since_compaction >= COMPACT_EVERY)
        if durable and self.durable:
            self._sync_through(seq)
        if due:
            # Compaction is housekeeping: skipped while an fsync runs rather than waited for.
            with self._lock:
                if not self._syncing:
                    self._maybe_compact()
        return seq

    def wait_durable(self, seq: int) -> None:
        """Return once record batch ``seq`` (from :meth:`record_many`) is on disk.

        What ``record(..., durable=True)`` does in one call, in two: a caller that has other
        things to do between writing a record and needing it durable (a worker handing its
        handler slot to the next message) writes it with ``durable=False`` and waits here
        later.  Every batch written before the fsync starts rides on it, so the longer the
        gap, the more records one fsync covers.  A no-op for a journal with ``durable`` off.
        """
        if self.durable:
            self._sync_through(seq)

    def _cut_back(self) -> None:
        """After a failed append (under ``_lock``): cut the file back to the end of the last
        whole batch, whatever part of the failed one reached it; refuse records if that fails."""
        try:
            os.ftruncate(self._fh.fileno(), self._size)
        except OSError as exc:
            self._refuse(f"a failed append could not be cut back to offset {self._size}: {exc.strerror}")

    def _sync_through(self, seq: int) -> None:
        """Return once record batch ``seq`` (and every one before it) is on disk: group commit.

        A writer whose batch is not yet durable either becomes the leader, when no fsync runs:
        it fsyncs for every batch appended so far, its own and those of writers waiting; or it
        waits (on a condition, at most :attr:`sync_wait` seconds) for the running fsync and then
        looks again, leading the next one if the running one started before its batch was
        appended.  So a caller returns only after an fsync that began after its batch was
        written completed successfully; concurrent writers share one fsync.

        JournalError if an fsync covering the batch failed, for every writer whose batch it
        covered, also for one that asks again later: Linux may drop the pages it could not write
        and report that once, so a later fsync that succeeds says nothing about them.  Batches
        written after a failed fsync are made durable by the next one as usual.  JournalError too
        when no fsync covering the batch completed within :attr:`sync_wait` (a disk or NFS mount
        that hangs): the batch is then of unknown durability, and said to have failed.  Not
        bounded: the leader's own fsync, a system call that cannot be interrupted.
        """
        deadline = time.monotonic() + self.sync_wait
        with self._lock:
            while True:
                for after, through, why in self._unsynced:
                    if after < seq <= through:
                        raise JournalError(f"{self.path}: cannot sync journal: an fsync of this "
                                           f"record failed ({why})")
                if self._synced >= seq:
                    return  # an fsync that started after our write covered it
                if not self._syncing:
                    break  # lead the next fsync
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JournalError(f"{self.path}: cannot sync journal: no fsync covering this "
                                       f"record finished within {self.sync_wait:g} s")
                self._synced_cond.wait(left)
            self._syncing = True
            before = self._synced
            target = self._written
            fd = self._fh.fileno()
            self.fsyncs += 1
            self._fsynced_since_empty = True
        failed: OSError | None = None
        try:
            os.fsync(fd)
        except OSError as exc:
            failed = exc
        finally:
            with self._lock:
                self._syncing = False
                if failed is None:
                    self._synced = target
                else:
                    why = failed.strerror or str(failed)
                    last = self._unsynced[-1] if self._unsynced else None
                    if last is not None and last[0] == before:
                        self._unsynced[-1] = (before, target, why)  # the same gap, grown
                    else:
                        self._unsynced.append((before, target, why))
                self._synced_cond.notify_all()
        if failed is not None:
            raise JournalError(f"{self.path}: cannot sync journal: {failed.strerror}") from None

    def end(self, op_id: str) -> None:
        """The operation is complete; its records (and a side file of its result) may go."""
        with self._lock:
            op = self._pending.get(op_id)
            side_file = op.fields.get("body_file") if op is not None else None
            alone = op is not None and len(self._pending) == 1
        if not (alone and self._end_last(op_id)):
            self.record(op_id, "end")
        if side_file:
            # Only large results have a side file: no unlink attempt per message otherwise.
            self.drop_result(side_file)

    def _end_last(self, op_id: str) -> bool:
        """End ``op_id`` by emptying the file, if it is the only pending operation.

        Its end record would be truncated away at once with everything else, so it is not
        written: one system call fewer per message for a sender or a node working one message
        at a time.  A kill before the truncation leaves the operation's records without their end,
        which recovery re-checks like any lost end record.  Skipped while an fsync runs (see
        compaction): then the end record is appended as usual.
        """
        with self._lock:
            if (self._syncing or len(self._pending) != 1 or op_id not in self._pending
                    or self._broken is not None or not self._truncate_due()):
                return False
            self._apply(op_id, "end", {})
            self._maybe_compact()
            return self._size == 0  # else the end record is appended after all

    def _truncate_due(self) -> bool:
        """Whether a file with nothing pending is to be emptied now (under ``_lock``): when it is
        not empty and either no fsync ran since it was last emptied (a truncation costs little
        but the fsync after it: a sender's journal, which never fsyncs, stays empty when idle)
        or it holds ``TRUNCATE_AT`` bytes."""
        return self._size > 0 and (not self._fsynced_since_empty or self._size >= TRUNCATE_AT)

    def _maybe_compact(self) -> None:
        """Compact if due (under ``_lock``, no fsync running).  Housekeeping: a compaction that fails (a full
        disk) is logged and leaves every record in the file, to be tried again after as many
        ended operations; a journal refusing records is left as it is."""
        if self._broken is not None:
            return
        try:
            self._compact()
        except OSError as exc:
            self._ended_since_compaction = 0
            log.warning("%s: cannot compact the journal (%s); every record is kept", self.path, exc.strerror)

    def _compact(self) -> None:
        if not self._pending:
            # Truncation needs no fsync: a resurrected stale record after a crash only makes
            # recovery re-check a finished operation, which is idempotent.
            # O_APPEND: the next write goes to the new end, no seek needed.
            if self._truncate_due() or self._closing:
                self._fh.truncate(0)
                self._size = 0
                self._fsynced_since_empty = False
            self._ended_since_compaction = 0
            return
        if self._ended_since_compaction < COMPACT_EVERY:
            return
        self._rewrite()
        try:
            fh = open(open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab",  # noqa: SIM115
                      buffering=0)
        except OSError as exc:
            # The old handle writes to the file the rename replaced: records there would be lost.
            self._refuse(f"cannot reopen the journal after compacting it: {exc.strerror}")
            return
        self._fh.close()
        self._fh = fh
        self._size = os.fstat(self._fh.fileno()).st_size
        self._ended_since_compaction = 0

    def _rewrite(self) -> None:
        """Replace the file by the records of the pending operations only (fsynced, renamed)."""
        tmp = self.path.with_suffix(".compact")
        try:
            with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as out:
                stamp = _now()
                for op in self._pending.values():
                    for event in op.events:
                        out.write(_line(stamp, op.op_id, event, op.fields))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk: give back what the copy took
            raise
        if self.durable:
            # The rename itself on disk too: a record written just before the compaction (its
            # writer waits for wait_durable) is in the new file only once the directory says so.
            fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ results

    def save_result(self, op_id: str, body: bytes) -> dict[str, str]:
        """Fields that keep ``body`` durable: inline (base64) when small, else a side file.

        The side file is fsynced here; the record that names it must be written durably after.
        Its CRC32 goes into the record (``body_crc``), so a damaged side file is refused by
        :meth:`load_result` instead of being delivered (an inline body is covered by the
        record's own checksum).  JournalError if the side file cannot be written (a full disk),
        and no part of it is left.
        """
        if len(body) <= INLINE_RESULT_LIMIT:
            return {"body": base64.b64encode(body).decode("ascii")}
        path = self.results_dir / op_id
        try:
            if not self.results_dir.is_dir():
                private_dir(self.results_dir)
            with open(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
                fh.write(body)
                fh.flush()
                if self.durable:
                    os.fsync(fh.fileno())
        except OSError as exc:
            path.unlink(missing_ok=True)  # a full disk: no part of a result stays behind
            raise JournalError(f"{path}: cannot save the result: {exc.strerror}") from None
        return {"body_file": path.name, "body_crc": f"{zlib.crc32(body):08x}"}

    def load_result(self, fields: dict[str, str]) -> bytes:
        if "body" in fields:
            return base64.b64decode(fields["body"])
        if "body_file" in fields:
            path = self.results_dir / fields["body_file"]
            try:
                body = path.read_bytes()
            except OSError as exc:
                raise JournalError(f"{path}: {exc.strerror}") from None
            # Side files of the previous release carry no checksum; they are taken as written.
            if "body_crc" in fields and f"{zlib.crc32(body):08x}" != fields["body_crc"]:
                raise JournalError(f"{path}: recorded result fails its checksum (damaged): not delivered")
            return body
        return b""

    def drop_result(self, name: str) -> None:
        try:
            (self.results_dir / name).unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Close the file, truncated first when nothing is pending (a node stopped cleanly
        leaves empty journals behind)."""
        with self._lock:
            if not self._pending and self._size > 0 and not self._syncing and self._broken is None:
                self._closing = True
                self._maybe_compact()
            self._fh.close()


class _Shared:
    """Process-wide sharing of one node's journal files, and the lock that keeps other processes out.

    Two objects appending to one journal file with separate pending-sets would truncate each
    other's records, so within a process every opener of a node's journal shares the same
    :class:`EndpointJournal` objects; across processes a lock file refuses a second process
    with the same node id (two ``ftpbc serve --node-id a`` would corrupt each other's recovery).
    """

    lock = threading.Lock()
    users: dict[Path, int] = {}
    lock_fds: dict[Path, int] = {}
    endpoints: dict[Path, EndpointJournal] = {}
    #: node directories a :class:`Journal` of this process created since :func:`forget_made`,
    #: and the journal directories above them it created: what :func:`discard_unused_made` may remove
    made_nodes: list[Path] = []
    made_parents: list[Path] = []


def _read_registry(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    entries = {}
    for line in text.splitlines():
        if "\t" in line:
            name, file = line.split("\t", 1)
            entries[name] = file
    return entries


def _acquire_node(directory: Path, node_id: str) -> bool:
    """Register one more user of ``directory``; True if it is the first in this process."""
    key = directory.resolve()
    with _Shared.lock:
        if _Shared.users.get(key, 0) == 0:
            _Shared.lock_fds[key] = _lock_node(key, node_id)
        _Shared.users[key] = _Shared.users.get(key, 0) + 1
        return _Shared.users[key] == 1


def _lock_node(key: Path, node_id: str) -> int:
    """The descriptor of ``key/.lock``, flock-ed.  A lock file that another process removed
    meanwhile, with the unused directory it discarded (:func:`discard_unused_made`), is no
    lock: the directory and the file are made again and locked afresh."""
    import fcntl

    for _ in range(10):
        try:
            fd = open_private(key / ".lock", os.O_RDWR)
        except FileNotFoundError:  # the directory was removed meanwhile
            private_dir(key)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise JournalError(
                f"{key}: node id {node_id!r} is in use by another process on this host "
                "(give each node its own --node-id)") from None
        try:
            same = os.stat(key / ".lock").st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        private_dir(key)
    raise JournalError(f"{key}: cannot lock the journal directory: it keeps being removed")


def forget_made() -> None:
    """Start afresh: the directories made so far are no longer :func:`discard_unused_made`'s
    to remove (a command starting in a process that ran others before it)."""
    with _Shared.lock:
        _Shared.made_nodes.clear()
        _Shared.made_parents.clear()


def discard_unused_made() -> list[Path]:
    """Remove the node directories a :class:`Journal` of this process created (since
    :func:`forget_made`) that hold no record, and the journal directory above one if this
    process created that too and it is left empty.  Returns those removed.

    For a start that failed (``ftpbc serve`` interrupted before it served, a command that
    ended in an error): the directory it made would otherwise turn up among the node ids
    ``ftpbc journal`` and ``ftpbc recover`` know.  Not called when a node or a client
    closes normally: a node that served nothing keeps its directory.

    A node directory is kept when a :class:`Journal` of this process still holds it, another
    process holds its lock, or anything in it is more than its lock, its registry and the
    empty journal files the registry names (a record, ended or not, a result, damage set
    aside, a file of a newer version).  It is removed under its lock, the lock file last: a
    process that opened the lock file before it went finds, once it has the lock, that the
    file is gone, and makes the directory again (:func:`_lock_node`).  Best effort: what
    cannot be removed stays.
    """
    removed: list[Path] = []
    with _Shared.lock:
        nodes, parents = list(_Shared.made_nodes), list(_Shared.made_parents)
        _Shared.made_nodes.clear()
        _Shared.made_parents.clear()
        for node in nodes:
            if not _Shared.users.get(node, 0) and _remove_unused_node(node):
                removed.append(node)
        for parent in parents:
            try:
                parent.rmdir()  # only if nothing is left in it
            except OSError:
                continue
            removed.append(parent)
    return removed


def _remove_unused_node(key: Path) -> bool:
    """Remove node directory ``key`` if it holds no record (see :func:`discard_unused_made`)."""
    import fcntl

    try:
        fd = os.open(key / ".lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(key / ".lock").st_ino != os.fstat(fd).st_ino:
            return False
        registered = set(_read_registry(key / "registry").values())
        with os.scandir(key) as it:
            entries = list(it)
        for e in entries:
            if e.name in (".lock", "registry"):
                continue
            if e.name not in registered or not e.is_file(follow_symlinks=False) \
                    or e.stat(follow_symlinks=False).st_size:
                return False
        for e in entries:
            if e.name != ".lock":
                os.unlink(e.path)
        os.unlink(key / ".lock")
        os.rmdir(key)
        return True
    except OSError:  # locked by another process, or a file came or could not go: it stays
        return False
    finally:
        os.close(fd)


def _release_node(directory: Path) -> None:
    key = directory.resolve()
    with _Shared.lock:
        left = _Shared.users.get(key, 0) - 1
        if left > 0:
            _Shared.users[key] = left
            return
        _Shared.users.pop(key, None)
        for path in [p for p in _Shared.endpoints if p.parent == key]:
            _Shared.endpoints.pop(path).close()
        fd = _Shared.lock_fds.pop(key, None)
        if fd is not None:
            os.close(fd)  # releases the flock


def _tighten_contents(directory: Path) -> None:
    """Make a node's existing journal files 0600 and its results directory 0700 (older versions
    left them to the umask, typically 0644 and 0755)."""
    with os.scandir(directory) as it:
        for entry in it:
            if entry.is_file(follow_symlinks=False):
                tighten(Path(entry.path), FILE_MODE)
    results = directory / "results"
    if results.is_dir():
        tighten(results, DIR_MODE)
        with os.scandir(results) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    tighten(Path(entry.path), FILE_MODE)


class Journal:
    """All endpoint journals of one node, with the registry mapping endpoints to files.

    ``first`` is True for the first opener in this process: only it should run recovery, since
    a later opener (a Client beside a Node of the same id) would act on the first one's work.
    """

    def __init__(self, journal_dir: Path, node_id: str, *, durable: bool = True) -> None:
        self.dir = Path(journal_dir) / node_id
        self.durable = durable
        made_node, made_parent = not self.dir.exists(), not self.dir.parent.exists()
        try:
            private_dir(self.dir)
            _tighten_contents(self.dir)
        except OSError as exc:
            raise JournalError(f"{self.dir}: cannot create journal directory: {exc.strerror}") from None
        self.first = _acquire_node(self.dir, node_id)
        with _Shared.lock:
            if made_node and self.dir.resolve() not in _Shared.made_nodes:
                _Shared.made_nodes.append(self.dir.resolve())
            if made_parent and self.dir.parent.resolve() not in _Shared.made_parents:
                _Shared.made_parents.append(self.dir.parent.resolve())
        self._closed = False
        self._lock = threading.Lock()
        self.registry_path = self.dir / "registry"
        # Resolved once: endpoint() runs several times per message, and resolve() is an lstat
        # per path component each time.
        self._resolved = self.dir.resolve()
        #: endpoint name -> its journal, as endpoint() returned it (dropped by close)
        self._endpoints: dict[str, EndpointJournal] = {}

    def registry(self) -> dict[str, str]:
        return _read_registry(self.registry_path)

    def endpoint(self, name: str) -> EndpointJournal:
        # No lock for the cache: one dict read is atomic, and an entry stays until close().
        journal = self._endpoints.get(name)
        if journal is not None:
            return journal
        file = f"{uuid.uuid5(_NAMESPACE, name)}.journal"
        path = self._resolved / file
        with _Shared.lock:
            journal = _Shared.endpoints.get(path)
            if journal is not None:
                self._endpoints[name] = journal
                return journal
            registry = self.registry()
            if registry.get(name) != file:
                registry[name] = file
                tmp = self.registry_path.with_suffix(".tmp")
                with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as out:
                    out.write("".join(f"{k}\t{v}\n" for k, v in sorted(registry.items())))
                os.replace(tmp, self.registry_path)
            journal = EndpointJournal(path, durable=self.durable)
            _Shared.endpoints[path] = journal
            self._endpoints[name] = journal
            return journal

    def all_pending(self) -> dict[str, list[Operation]]:
        """Pending operations of every registered endpoint (the endpoints need not be configured)."""
        return {name: ops for name in sorted(self.registry()) if (ops := self.endpoint(name).pending())}

    @staticmethod
    def read_problems(journal_dir: Path, node_id: str) -> list[str]:
        """:func:`journal_problems`, and the damaged records still in the journal files (set
        aside when the node next opens them), read from disk like :meth:`read_pending`.

        A torn last record is not reported: a record being written looks just like it."""
        directory = Path(journal_dir) / node_id
        out = journal_problems(journal_dir, node_id)
        registry = _read_registry(directory / "registry")
        for name in sorted(registry):
            path = directory / registry[name]
            damaged = read_journal(path).damaged
            if damaged:
                out.append(f"journal {path}: {len(damaged)} damaged record(s) ({_where(damaged)}: "
                           f"{damaged[0].reason}), set aside when the node next opens the journal")
        return out

    @staticmethod
    def read_pending(journal_dir: Path, node_id: str) -> dict[str, list[Operation]]:
        """What :meth:`all_pending` would say, read from disk without opening the journal.

        For ``ftpbc journal`` while the node runs: no lock is taken, nothing is written, so the
        answer is a snapshot that may be a moment old.
        """
        directory = Path(journal_dir) / node_id
        registry = _read_registry(directory / "registry")
        out = {}
        for name in sorted(registry):
            ops = list(parse_journal(directory / registry[name]).values())
            if ops:
                out[name] = ops
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._endpoints.clear()
        _release_node(self.dir)


def journal_problems(journal_dir: Path, node_id: str) -> list[str]:
    """What an operator must look at in node ``node_id``'s journal, one line each; empty if
    nothing.  Cheap enough for every ``/readyz``: a directory listing and the side files.

    * Every side file of damaged records (:func:`read_journal`): ``journal <file>: N damaged
      record(s) set aside in <side file>``, for as long as the side file is there.  The node
      went on without those records; removing the file (once inspected) clears the line.
    * Journals of this process that refuse records, or whose damage could not be set aside.
    """
    directory = Path(journal_dir) / node_id
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        match = _SIDE_FILE.fullmatch(name)
        if match is None:
            continue
        side = directory / name
        try:
            count = side.read_bytes().count(b"\n")
        except OSError:
            continue  # removed meanwhile
        out.append(f"journal {directory / match['journal']}: {count} damaged record(s) set aside in {side}")
    try:
        key = directory.resolve()
    except OSError:
        return out
    with _Shared.lock:
        journals = [journal for path, journal in _Shared.endpoints.items() if path.parent == key]
    for journal in journals:
        out.extend(journal.problems())
    return out
