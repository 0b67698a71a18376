"""FTP listings, parsed: MLSD, MLST and LIST lines into :class:`~ftpbc.transport.base.Entry`.

Pure: no sockets, no files (the ``listing-pure`` import contract holds it to that); whoever
reads a listing off a data or control connection hands its lines here.  Its names are public
within ftpbc, so that anything with an FTP listing in hand (a test, a tool) parses it exactly as
the transport does; like all of ``ftpbc.transport`` it is not part of ftpbc's API
(``docs/api.md``).

What is understood
    ``MLSD`` and ``MLST`` lines (RFC 3659 facts: ``type``, ``size``, ``modify``; the rest is
    ignored) and unix ``ls -l`` style ``LIST`` lines, the format vsftpd, ProFTPD and pure-ftpd
    send (size, type, an mtime to the minute, or to the day for entries older than six months,
    taken as UTC).  ``NLST`` is never used: it gives names without types or sizes.

What is skipped, and why
    * a directory's own entries (``cdir``/``pdir``, a directory named ``.`` or ``..``) and
      ``total N``: not entries;
    * a line that does not parse (``size=²``, ``size=-1``, no ``type`` fact, another format):
      ValueError, which :func:`parse_listing` and :class:`LineParser` log once and skip.  Only a
      listing none of whose lines parse is refused (ProtocolError), as a format ftpbc does not
      understand;
    * a name :func:`~ftpbc.transport.names.listed_name` refuses: :class:`OddName`, logged once
      per name and skipped.  A name holding ``/`` (``sub/req.X``) is refused whole, never cut to
      its last part: acting on ``req.X`` would act on a file the listing does not show in this
      directory.  ``\\``, NUL, line breaks, bytes that are not UTF-8 (decoded as lone
      surrogates), and a *file* called ``.`` or ``..`` are refused the same way.

An MLST reply names the path it was asked about, not a listed name: :func:`parse_mlst_line`
takes the entry's name from its caller instead.  Not guaranteed: times are what the server
says, in UTC as it says it (a server set to local time lists local times).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from contextlib import suppress
from datetime import UTC, datetime

from ftpbc.errors import ProtocolError
from ftpbc.transport.base import Entry
from ftpbc.transport.names import LoggedOnce, OddName, listed_name

__all__ = [
    "PARSED_LINES", "LineParser", "OddName", "ParsedLines", "is_dot_line", "parse_list_line", "parse_listing",
    "parse_mlsd_line", "parse_mlst_line", "parse_time",
]

log = logging.getLogger("ftpbc.ftp")

#: listing lines remembered, parsed, per transport (about 250 bytes each); also the bound on the
#: bad lines and refused names logged once
PARSED_LINES = 20_000


def is_dot_line(line: str | bytes) -> bool:
    """Whether a unix-style listing line is the listed directory's own ``.`` entry: the proof,
    in a LIST or STAT answer, that the directory exists (vsftpd lists a missing one as empty)."""
    return line[:1] in ("d", b"d") and line[-2:] in (" .", b" .")


def parse_listing(lines: Iterable[str], parse: Callable[[str], Entry | None], *, server: str, path: str,
                  command: str, reported: LoggedOnce) -> list[Entry]:
    """Parsed listing lines.  A line that does not parse (a fact like ``size=²``, an odd
    format) is logged once and skipped: one bad entry never hides the others.  Only a listing
    none of whose lines parse is refused, since that is a format ftpbc does not understand.
    An entry whose name is refused by :func:`~ftpbc.transport.names.listed_name` (a path such
    as ``sub/req.X``, ``\\``, a line break, NUL, ``..``, bytes that are not UTF-8) is skipped
    and logged once per name too, but the line did parse."""
    entries: list[Entry] = []
    bad: list[str] = []
    odd: list[OddName] = []
    for line in lines:
        try:
            entry = parse(line)
        except OddName as exc:
            odd.append(exc)
            continue
        except ValueError:
            bad.append(line)
            continue
        if entry is not None:
            entries.append(entry)
    if bad:
        if not entries and not odd and len(bad) >= 2:
            raise ProtocolError(f"cannot parse any {command} line, e.g. {bad[0][:200]!r} (only "
                                "unix-style LIST and RFC 3659 MLSD are understood)",
                                server=server, path=path)
        for line in bad:
            if reported.first(("line", line)):
                log.warning("%s%s: skipped a %s line that does not parse: %r", server, path,
                            command, line[:200])
    for refused in odd:
        if reported.first(("name", refused.name)):
            log.warning("%s%s: skipped a %s entry: %s", server, path, command, refused)
    return entries


class LineParser:
    """:func:`parse_listing` one line at a time, for a listing parsed as it streams in: the
    same rules (a bad line or an unusable name logged once and skipped), and :meth:`finish`
    refuses a listing none of whose lines parsed."""

    def __init__(self, parse: Callable[[str], Entry | None], *, server: str, path: str, command: str,
                 reported: LoggedOnce) -> None:
        self.parse = parse
        self.server, self.path, self.command, self.reported = server, path, command, reported
        self.parsed = 0
        self.bad: list[str] = []
        self.odd = 0

    def feed(self, raw: bytes) -> Entry | None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw:
            return None
        line = raw.decode("utf-8", errors="surrogateescape")
        try:
            entry = self.parse(line)
        except OddName as exc:
            self.odd += 1
            self._report(("name", exc.name), f"skipped a {self.command} entry: {exc}")
            return None
        except ValueError:
            if len(self.bad) < 2:
                self.bad.append(line)  # kept for the "nothing parses" error only
            self._report(("line", line), f"skipped a {self.command} line that does not parse: {line[:200]!r}")
            return None
        if entry is not None:
            self.parsed += 1
        return entry

    def _report(self, key: tuple[str, str], message: str) -> None:
        if self.reported.first(key):
            log.warning("%s%s: %s", self.server, self.path, message)

    def finish(self) -> None:
        if len(self.bad) >= 2 and not self.parsed and not self.odd:
            raise ProtocolError(f"cannot parse any {self.command} line, e.g. {self.bad[0][:200]!r} (only "
                                "unix-style LIST and RFC 3659 MLSD are understood)",
                                server=self.server, path=self.path)


def parse_time(value: str) -> datetime:
    """``YYYYMMDDHHMMSS[.sss]`` (MDTM, MLSD modify=) as UTC.  ValueError if malformed."""
    # Sliced by hand: strptime costs more than the rest of a 10,000-line listing's parsing.
    whole, _, frac = value.partition(".")
    if len(whole) != 14 or not whole.isdigit():
        raise ValueError(f"bad FTP time value {value!r}")
    micro = int(frac[:6].ljust(6, "0")) if frac.isdigit() else 0
    return datetime(int(whole[:4]), int(whole[4:6]), int(whole[6:8]), int(whole[8:10]),
                    int(whole[10:12]), int(whole[12:14]), micro, tzinfo=UTC)


def _facts(line: str) -> tuple[str, str, str, datetime | None] | None:
    """The name, type (lower case, "" if none), size fact and time of one
    ``fact=value;...; name`` line; None for a line without a name.  ValueError for a size fact
    that does not parse."""
    facts_part, sep, name = line.partition(" ")
    if not sep:
        return None
    kind = size = modify = ""
    for fact in facts_part.split(";"):
        key, _, value = fact.partition("=")
        key = key.lower()
        if key == "type":
            kind = value.lower()
        elif key == "size":
            size = value
        elif key == "modify":
            modify = value
    if size and not (size.isascii() and size.isdigit()):
        raise ValueError(f"bad size fact {size!r}")  # str.isdigit() takes '²', int() does not
    mtime = None
    if modify:
        with suppress(ValueError, OverflowError):  # modify=99999999999999: the time is unknown
            mtime = parse_time(modify)
    return name, kind, size, mtime


def _typed(kind: str) -> None:
    if not kind:
        # Not even the type: a file cannot be told from a directory (or a link), so none is
        # guessed.  Every server ftpbc knows sends it.
        raise ValueError("no type fact")


def _sized(kind: str, size: str) -> int:
    # No size fact on a file: -1, "no size given" (a read is then bounded by
    # max_message_bytes), not 0, which would make a read of any byte look too long.
    return int(size) if size else 0 if kind == "dir" else -1


def parse_mlsd_line(line: str) -> Entry | None:
    """One MLSD line: ``fact=value;...; name``.  None for the directory's own entries (``cdir``,
    ``pdir``, or a directory named ``.`` or ``..``) and lines without a name; OddName for a
    name :func:`listed_name` refuses (a path such as ``sub/req.X`` is refused, never cut to
    its last part); ValueError for a fact that does not parse."""
    parsed = _facts(line)
    if parsed is None:
        return None
    name, kind, size, mtime = parsed
    if kind in ("cdir", "pdir") or (kind in ("dir", "") and name in (".", "..")):
        return None
    _typed(kind)
    return Entry(listed_name(name), _sized(kind, size), mtime, kind == "dir")


def parse_mlst_line(line: str, name: str) -> Entry | None:
    """The facts line of an MLST reply, as the entry named ``name``.  The server names the path
    it was asked about there, not a listed name, so that name is not used.  None for a line
    without a name or the type of a directory's own entry; ValueError for a fact that does
    not parse."""
    parsed = _facts(line)
    if parsed is None:
        return None
    _, kind, size, mtime = parsed
    if kind in ("cdir", "pdir"):
        return None
    _typed(kind)
    return Entry(name, _sized(kind, size), mtime, kind == "dir")


class ParsedLines:
    """Listing lines already parsed, and their entries.

    A poller lists the same inbox again and again, and a large listing is mostly the same lines
    each time: parsing them is most of the poller thread's CPU per listing, a lookup per line a
    small part of that.  Bounded: emptied when it outgrows PARSED_LINES.  A LIST
    line's time may depend on the current date (``ls`` prints no year for the last six months),
    so one is remembered only when its entry is dated in the past of the year it was parsed in,
    where it stays the same for the rest of that year.
    """

    def __init__(self) -> None:
        self._mlsx: dict[str, Entry | None] = {}
        self._list: dict[tuple[str, int], Entry | None] = {}

    def mlsx(self, line: str) -> Entry | None:
        try:
            return self._mlsx[line]
        except KeyError:
            pass
        entry = parse_mlsd_line(line)
        if len(self._mlsx) >= PARSED_LINES:
            self._mlsx = {}  # replaced, not cleared: another thread may be reading it
        self._mlsx[line] = entry
        return entry

    def list_line(self, line: str, now: datetime) -> Entry | None:
        key = (line, now.year)
        try:
            return self._list[key]
        except KeyError:
            pass
        entry = parse_list_line(line, now)
        if entry is None or entry.mtime is None or entry.mtime <= now:
            if len(self._list) >= PARSED_LINES:
                self._list = {}
            self._list[key] = entry
        return entry


_LIST_RE = re.compile(
    r"^(?P<type>[-dlbcps])[-rwxsStTl+.@]{9}\S*\s+\d+\s+\S+\s+\S+\s+(?P<size>\d+)\s+"
    r"(?P<mon>[A-Za-z]{3})\s+(?P<day>\d{1,2})\s+(?P<time>\d{1,2}:\d{2}|\d{4})\s(?P<name>.+)$")
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}


def parse_list_line(line: str, now: datetime) -> Entry | None:
    """One unix ``ls -l`` style LIST line (vsftpd, ProFTPD...).

    None for ``total N`` and the directories ``.`` and ``..``; OddName for a name
    :func:`listed_name` refuses; ValueError for a line in any other format.

    Times are taken as UTC (vsftpd's default, ``use_localtime=NO``).  A date without a year is
    in the last twelve months, as ``ls`` prints it.
    """
    m = _LIST_RE.match(line)
    if m is None:
        if line.startswith("total "):
            return None
        raise ValueError(f"not a unix-style LIST line: {line!r}")
    name = m["name"]
    if m["type"] == "l" and " -> " in name:
        name = name.split(" -> ", 1)[0]
    if m["type"] == "d" and name in (".", ".."):
        return None
    listed_name(name)
    mtime: datetime | None = None
    month = _MONTHS.get(m["mon"].lower())
    if month is not None:
        try:
            if ":" in m["time"]:
                hh, mm = (int(x) for x in m["time"].split(":"))
                mtime = datetime(now.year, month, int(m["day"]), hh, mm, tzinfo=UTC)
                if (mtime - now).days > 1:
                    mtime = mtime.replace(year=now.year - 1)
            else:
                mtime = datetime(int(m["time"]), month, int(m["day"]), tzinfo=UTC)
        except ValueError:
            mtime = None
    return Entry(name, int(m["size"]), mtime, m["type"] == "d")


