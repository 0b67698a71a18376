"""Compaction: archived messages into a Parquet dataset, then removed from the server, journaled.

Dataset: ``<dataset>/endpoint=<name>/day=<YYYY-MM-DD>/part-<batch>.parquet``, one row per file
(``folder, name, size, mtime_us, mtime_prec_us, body``); ``day`` is the UTC day of the archive
stamp in the name (of the modification time when the name has none).

One batch (at most ``batch_size`` files of one endpoint, folder and day) goes through::

    1. read the bodies into the part, a hidden temporary file, row group by row group; fsync
    2. write the manifest ``<journal_dir>/compaction/<batch>.json`` (part path, remote paths), fsync
    3. rename the part to its final name, fsync the directory      <- the commit point
    4. delete each remote file, appending its path to ``<batch>.done`` as it goes
    5. remove the manifest

Recovery (at the start of every run, before anything new): a manifest whose part exists was
committed, so its remaining deletions are finished (a file already gone is fine); a manifest
whose part does not exist was not, so its temporary file is removed and the files, still on the
server, are compacted again later.  Hence after any interruption and one more run, every file is
in the dataset exactly once and gone from the server.

Memory is bounded by ``row_group_bytes`` (default 8 MiB), not by the bodies: a row group is
written as soon as its bodies reach that budget, and a body listed larger than the budget is read
into an unnamed spool file and becomes a batch of its own, a one-row part whose body is copied
from the spool in 1 MiB pieces (pyarrow would hold three copies of it).  Every read stops at the
listed size plus ``READ_MARGIN`` (:class:`~ftpbc.exchange.bounds.BoundedSink`); a file whose
read comes out at another size is left on the server, with a warning.

Listed names are untrusted (the area is shared): a name that is not a bare, printable, UTF-8 name
of at most ``NAME_LIMIT`` bytes is logged once and left on the server; no path is built from it.

Not guaranteed: two compactions of the same area at the same time (from two nodes) may both
copy a file; run compaction from one node.  A file archived while a folder is compacted waits
for the next run.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ftpbc.analytics.mirror import precision_us
from ftpbc.analytics.onerow import write_single_row_part
from ftpbc.analytics.progress import bar_wanted
from ftpbc.analytics.records import EPOCH, RAW_FIELDS, US, arrow_schema
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import IncompleteRead, JournalError, NotFound, UnsafeNameError
from ftpbc.exchange.area import REASON_SUFFIX, parse_archive_name
from ftpbc.exchange.bounds import READ_MARGIN, BoundedSink
from ftpbc.model.envelope import NAME_LIMIT, UnusableName
from ftpbc.private_files import open_private, private_dir
from ftpbc.transport import Entry, Transport, check_name, open_transport

log = logging.getLogger(__name__)

#: columns as Spark reads them (partition columns included; ``body`` left out on purpose)
COMPACTED_FIELDS: tuple[tuple[str, str], ...] = (*RAW_FIELDS, ("day", "string"))
_FILE_FIELDS = (*((n, t) for n, t in RAW_FIELDS if n != "endpoint"), ("body", "binary"))

#: called at each step with (stage, batch id, count): "written", "committed", "deleted"
Hook = Callable[[str, str, int], None]

#: default budget of one row group's bodies; the compactor holds a few times this, whatever the bodies
ROW_GROUP_BYTES = 8 << 20
#: the largest body a part can hold: one Parquet page (its size is an i32) with its level and
#: length prefixes; a larger file is left on the server with a warning
MAX_BODY_BYTES = (1 << 31) - 1 - 64
#: piece in which a large body goes from its spool to its part
COPY_CHUNK = 1 << 20
#: bad names logged per run (each once); beyond this they are still skipped, silently
REPORTED_LIMIT = 10_000

#: control characters (C0, DEL, C1, line and paragraph separators, bidirectional overrides): a
#: name holding one could forge a log line or repaint a terminal wherever it is shown
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def check_listed_name(name: str) -> str:
    """Return ``name`` if compaction may build a path from it and store it; raise UnsafeNameError
    (``/``, ``\\``, ``..``, empty) or UnusableName (control character, not UTF-8, longer than
    ``NAME_LIMIT`` bytes) otherwise."""
    check_name(name)
    if _CONTROL.search(name) is not None:
        raise UnusableName(name, "contains a control character")
    try:
        length = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable bytes from a local directory (surrogate escapes)
        raise UnusableName(name, "not UTF-8") from None
    if length > NAME_LIMIT:
        raise UnusableName(name, f"{length} bytes, over the limit of {NAME_LIMIT}")
    return name


@dataclass
class CompactStats:
    files: int = 0
    bytes: int = 0
    batches: int = 0
    recovered: int = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _day(entry: Entry) -> str:
    name = entry.name.removesuffix(REASON_SUFFIX)
    _, _, when = parse_archive_name(name)
    when = when or entry.mtime or EPOCH
    return f"{when:%Y-%m-%d}"


class Compactor:
    def __init__(self, sources: Sequence[ArchiveSource], dataset: Path, journal_dir: Path, *,
                 batch_size: int = 2000, hook: Hook | None = None, progress: bool = True,
                 row_group_bytes: int = ROW_GROUP_BYTES,
                 transport_factory: Callable[[ServerConfig], Transport] = open_transport) -> None:
        if row_group_bytes < 1:
            raise ValueError("row_group_bytes must be at least 1")
        self.sources = {s.endpoint: s for s in sources}
        self.dataset = dataset
        self.journal = journal_dir / "compaction"
        self.batch_size = batch_size
        self.row_group_bytes = row_group_bytes
        self.hook = hook or (lambda stage, batch, n: None)
        self.progress = progress
        self._open = transport_factory
        self._transports: dict[object, Transport] = {}
        self._reported: set[tuple[str, str, str]] = set()

    def transport(self, source: ArchiveSource) -> Transport:
        t = self._transports.get(source.server)
        if t is None:
            t = self._transports[source.server] = self._open(source.server)
        return t

    def close(self) -> None:
        for t in self._transports.values():
            t.close()

    # ------------------------------------------------------------------ recovery

    def recover(self) -> int:
        """Finish or undo the batches an earlier run left; returns how many it found."""
        if not self.journal.is_dir():
            return 0
        found = 0
        for manifest in sorted(self.journal.glob("*.json")):
            try:
                m = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise JournalError(f"{manifest}: unreadable compaction manifest: {exc}") from None
            source = self.sources.get(m["endpoint"])
            if source is None:
                continue  # another endpoint's batch: finished when that endpoint is compacted
            found += 1
            part = self.dataset / m["part"]
            done_path = manifest.with_suffix(".done")
            if part.exists():
                done = set(done_path.read_text(encoding="utf-8").splitlines()) \
                    if done_path.exists() else set()
                self._delete(source, [p for p in m["paths"] if p not in done], m["batch"], done_path)
            else:
                (self.dataset / m["tmp"]).unlink(missing_ok=True)
            done_path.unlink(missing_ok=True)
            manifest.unlink()
        # A part being written when the process died has no manifest yet: nothing refers to it.
        for endpoint in self.sources:
            for orphan in (self.dataset / f"endpoint={endpoint}").glob("day=*/.part-*.parquet.tmp"):
                orphan.unlink(missing_ok=True)
        return found

    # ------------------------------------------------------------------ compaction

    def run(self) -> CompactStats:
        from tqdm import tqdm

        stats = CompactStats(recovered=self.recover())
        private_dir(self.journal)  # manifests name remote paths: private, like the journal
        work = [(s, f) for s in self.sources.values() for f in ARCHIVE_FOLDERS]
        for source, folder in tqdm(work, desc="compact", unit="folder", disable=not bar_wanted(self.progress),
                                   leave=False):
            try:
                listed = self.transport(source).list(source.folder_path(folder))
            except NotFound:
                continue
            entries = [e for e in listed if not e.is_dir and self._usable(source, folder, e.name)]
            prec = precision_us(entries)
            by_day: dict[str, list[Entry]] = defaultdict(list)
            for e in entries:
                by_day[_day(e)].append(e)
            for day, group in sorted(by_day.items()):
                for i in range(0, len(group), self.batch_size):
                    self._batch(source, folder, day, group[i:i + self.batch_size], prec, stats)
        return stats

    def _usable(self, source: ArchiveSource, folder: str, name: str) -> bool:
        """Whether ``name`` may be compacted; logs an unusable one once (repr: escaped)."""
        try:
            check_listed_name(name)
        except (UnsafeNameError, UnusableName) as exc:
            key = (source.endpoint, folder, name)
            if key not in self._reported and len(self._reported) < REPORTED_LIMIT:
                self._reported.add(key)
                reason = exc.reason if isinstance(exc, UnusableName) else "not a bare file name"
                log.warning("compact %s %s: %r left on the server, unusable name: %s",
                            source.endpoint, folder, name, reason)
            return False
        return True

    def _batch(self, source: ArchiveSource, folder: str, day: str, entries: list[Entry], prec: int,
               stats: CompactStats) -> None:
        directory = self.dataset / f"endpoint={source.endpoint}" / f"day={day}"
        directory.mkdir(parents=True, exist_ok=True)
        small = [e for e in entries if 0 <= e.size <= self.row_group_bytes]
        if small:
            self._small_part(source, folder, directory, small, prec, stats)
        for e in entries:
            if not 0 <= e.size <= self.row_group_bytes:
                self._large_part(source, folder, directory, e, prec, stats)

    def _row(self, folder: str, e: Entry, size: int, prec: int) -> dict[str, Any]:
        return {"folder": folder, "name": e.name, "size": size,
                "mtime_us": (e.mtime - EPOCH) // US if e.mtime else None,
                "mtime_prec_us": prec if e.mtime else None}

    def _fetch(self, t: Transport, path: str, e: Entry, sink: BinaryIO) -> int | None:
        """Read ``path`` into ``sink``, never more than its listed size plus READ_MARGIN; the byte
        count, or None (with a warning unless it is gone) when it must stay on the server."""
        if e.size > MAX_BODY_BYTES:
            log.warning("compact %s %s: %d bytes, more than a Parquet value can hold; left on the "
                        "server", t.server, path, e.size)
            return None
        bound = MAX_BODY_BYTES if e.size < 0 else e.size + READ_MARGIN
        listed = "no size" if e.size < 0 else f"{e.size} bytes"
        try:
            got = t.get(path, BoundedSink(sink, bound, server=t.server, path=path,
                                          listed=listed).as_binary())
        except NotFound:
            return None  # removed since the listing: not ours to keep
        except IncompleteRead as exc:  # ReadPastSize included: the server sent more than it listed
            log.warning("compact %s %s: left on the server: %s", t.server, path, exc)
            return None
        if e.size >= 0 and got != e.size:
            log.warning("compact %s %s: read %d bytes of a file listed with %d; left on the server",
                        t.server, path, got, e.size)
            return None
        if got > MAX_BODY_BYTES:
            log.warning("compact %s %s: more than %d bytes; left on the server", t.server, path,
                        MAX_BODY_BYTES)
            return None
        return got

    def _small_part(self, source: ArchiveSource, folder: str, directory: Path, entries: list[Entry],
                    prec: int, stats: CompactStats) -> None:
        """Files listed at most ``row_group_bytes`` each, as one part; a row group is written as
        soon as the next body would take its bodies over the budget."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = self.transport(source)
        batch = uuid.uuid4().hex
        final, tmp = directory / f"part-{batch}.parquet", directory / f".part-{batch}.parquet.tmp"
        schema = arrow_schema(_FILE_FIELDS)
        meta = [n for n, _ in _FILE_FIELDS if n != "body"]
        writer: Any = None
        pending: list[dict[str, Any]] = []
        pending_bytes = 0
        paths: list[str] = []
        total = 0

        def flush() -> None:
            nonlocal writer, pending, pending_bytes
            if not pending:
                return
            if writer is None:
                # A path, not a Python file: pyarrow then writes natively, with no copy of each
                # page into a Python bytes object.  Bodies get no dictionary and no statistics
                # (each would keep another copy of them, and neither helps a read by name).
                writer = pq.ParquetWriter(str(tmp), schema, use_dictionary=meta, write_statistics=meta)
            writer.write_table(pa.Table.from_pylist(pending, schema=schema),
                               row_group_size=len(pending))
            pending, pending_bytes = [], 0

        try:
            for e in entries:
                path = source.folder_path(folder) + "/" + e.name
                buf = io.BytesIO()
                got = self._fetch(t, path, e, buf)
                if got is None:
                    continue
                if pending and pending_bytes + got > self.row_group_bytes:
                    flush()
                pending.append({**self._row(folder, e, got, prec), "body": buf.getvalue()})
                pending_bytes += got
                paths.append(path)
                total += got
                del buf
            flush()
            if writer is not None:
                writer.close()
                writer = None
        except BaseException:
            if writer is not None:
                try:
                    writer.close()
                except Exception:  # the first error is the one to report
                    pass
            tmp.unlink(missing_ok=True)
            raise
        if not paths:
            return
        _fsync_file(tmp)
        self._commit(source, directory, batch, final, tmp, paths, total, stats)

    def _large_part(self, source: ArchiveSource, folder: str, directory: Path, e: Entry, prec: int,
                    stats: CompactStats) -> None:
        """One file listed larger than ``row_group_bytes`` (or with no size), as a one-row part
        of its own: spooled to an unnamed file, then copied into the part piece by piece."""
        t = self.transport(source)
        batch = uuid.uuid4().hex
        final, tmp = directory / f"part-{batch}.parquet", directory / f".part-{batch}.parquet.tmp"
        path = source.folder_path(folder) + "/" + e.name
        # Unnamed (O_TMPFILE where the file system has it): a killed run leaves nothing behind.
        with tempfile.TemporaryFile(dir=directory) as spool:
            got = self._fetch(t, path, e, spool)
            if got is None:
                return
            spool.seek(0)
            try:
                with open(tmp, "wb") as fh:
                    write_single_row_part(fh, _FILE_FIELDS, self._row(folder, e, got, prec), "body", spool,
                                          got, chunk=COPY_CHUNK)
                    fh.flush()
                    os.fsync(fh.fileno())
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self._commit(source, directory, batch, final, tmp, [path], got, stats)

    def _commit(self, source: ArchiveSource, directory: Path, batch: str, final: Path, tmp: Path,
                paths: list[str], nbytes: int, stats: CompactStats) -> None:
        """Steps 2-5 for a part written and fsynced at ``tmp``."""
        manifest = {"batch": batch, "endpoint": source.endpoint,
                    "part": str(final.relative_to(self.dataset)), "tmp": str(tmp.relative_to(self.dataset)),
                    "paths": paths}
        mpath = self.journal / f"{batch}.json"
        mtmp = mpath.with_suffix(".json.tmp")
        with open(open_private(mtmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
            fh.write(json.dumps(manifest).encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(mtmp, mpath)
        _fsync_dir(self.journal)
        self.hook("written", batch, len(paths))
        os.replace(tmp, final)
        _fsync_dir(directory)
        self.hook("committed", batch, len(paths))
        done_path = mpath.with_suffix(".done")
        self._delete(source, paths, batch, done_path)
        done_path.unlink(missing_ok=True)
        mpath.unlink()
        stats.files += len(paths)
        stats.bytes += nbytes
        stats.batches += 1

    def _delete(self, source: ArchiveSource, paths: Sequence[str], batch: str, done_path: Path) -> None:
        # Progress marks need no fsync: a lost mark only repeats a delete, which NotFound absorbs.
        t = self.transport(source)
        with open(open_private(done_path, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8") as done:
            for n, path in enumerate(paths, 1):
                try:
                    t.delete(path)
                except NotFound:
                    pass
                done.write(path + "\n")
                done.flush()
                self.hook("deleted", batch, n)


def compact(sources: Sequence[ArchiveSource], dataset: Path, journal_dir: Path, *,
            batch_size: int = 2000, hook: Hook | None = None, progress: bool = True,
            row_group_bytes: int = ROW_GROUP_BYTES) -> CompactStats:
    """Compact every archive folder of ``sources`` (after finishing any interrupted batch)."""
    c = Compactor(sources, dataset, journal_dir, batch_size=batch_size, hook=hook, progress=progress,
                  row_group_bytes=row_group_bytes)
    try:
        return c.run()
    finally:
        c.close()
