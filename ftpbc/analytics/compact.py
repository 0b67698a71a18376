"""Compaction: archived messages into a Parquet dataset, then removed from the server, journaled.

Dataset: ``<dataset>/endpoint=<name>/day=<YYYY-MM-DD>/part-<batch>.parquet``, one row per file
(``folder, name, size, mtime_us, mtime_prec_us, body``); ``day`` is the UTC day of the archive
stamp in the name (of the modification time when the name has none).

One batch (at most ``batch_size`` files of one endpoint, folder and day) goes through::

    1. read the bodies; write the part to a hidden temporary file, fsync
    2. write the manifest ``<journal_dir>/compaction/<batch>.json`` (part path, remote paths), fsync
    3. rename the part to its final name, fsync the directory      <- the commit point
    4. delete each remote file, appending its path to ``<batch>.done`` as it goes
    5. remove the manifest

Recovery (at the start of every run, before anything new): a manifest whose part exists was
committed, so its remaining deletions are finished (a file already gone is fine); a manifest
whose part does not exist was not, so its temporary file is removed and the files, still on the
server, are compacted again later.  Hence after any interruption and one more run, every file is
in the dataset exactly once and gone from the server.

Not guaranteed: two compactions of the same area at the same time (from two nodes) may both
copy a file; run compaction from one node.  A file archived while a folder is compacted waits
for the next run.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftpbc.analytics.mirror import precision_us
from ftpbc.analytics.records import EPOCH, RAW_FIELDS, US, arrow_schema
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.errors import JournalError, NotFound
from ftpbc.exchange.area import REASON_SUFFIX, parse_archive_name
from ftpbc.transport import Entry, Transport, open_transport

#: columns as Spark reads them (partition columns included; ``body`` left out on purpose)
COMPACTED_FIELDS: tuple[tuple[str, str], ...] = (*RAW_FIELDS, ("day", "string"))
_FILE_FIELDS = (*((n, t) for n, t in RAW_FIELDS if n != "endpoint"), ("body", "binary"))

#: called at each step with (stage, batch id, count): "written", "committed", "deleted"
Hook = Callable[[str, str, int], None]


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


def _day(entry: Entry) -> str:
    name = entry.name.removesuffix(REASON_SUFFIX)
    _, _, when = parse_archive_name(name)
    when = when or entry.mtime or EPOCH
    return f"{when:%Y-%m-%d}"


class Compactor:
    def __init__(self, sources: Sequence[ArchiveSource], dataset: Path, journal_dir: Path, *,
                 batch_size: int = 2000, hook: Hook | None = None, progress: bool = True) -> None:
        self.sources = {s.endpoint: s for s in sources}
        self.dataset = dataset
        self.journal = journal_dir / "compaction"
        self.batch_size = batch_size
        self.hook = hook or (lambda stage, batch, n: None)
        self.progress = progress
        self._transports: dict[object, Transport] = {}

    def transport(self, source: ArchiveSource) -> Transport:
        t = self._transports.get(source.server)
        if t is None:
            t = self._transports[source.server] = open_transport(source.server)
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
        return found

    # ------------------------------------------------------------------ compaction

    def run(self) -> CompactStats:
        from tqdm import tqdm

        stats = CompactStats(recovered=self.recover())
        self.journal.mkdir(parents=True, exist_ok=True)
        work = [(s, f) for s in self.sources.values() for f in ARCHIVE_FOLDERS]
        for source, folder in tqdm(work, desc="compact", unit="folder", disable=not self.progress,
                                   leave=False):
            try:
                entries = [e for e in self.transport(source).list(source.folder_path(folder)) if not e.is_dir]
            except NotFound:
                continue
            prec = precision_us(entries)
            by_day: dict[str, list[Entry]] = defaultdict(list)
            for e in entries:
                by_day[_day(e)].append(e)
            for day, group in sorted(by_day.items()):
                for i in range(0, len(group), self.batch_size):
                    self._batch(source, folder, day, group[i:i + self.batch_size], prec, stats)
        return stats

    def _batch(self, source: ArchiveSource, folder: str, day: str, entries: list[Entry], prec: int,
               stats: CompactStats) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = self.transport(source)
        batch = uuid.uuid4().hex
        rows: list[dict[str, Any]] = []
        paths: list[str] = []
        for e in entries:
            path = source.folder_path(folder) + "/" + e.name
            buf = io.BytesIO()
            try:
                t.get(path, buf)
            except NotFound:
                continue  # removed since the listing: not ours to keep
            rows.append({"folder": folder, "name": e.name, "size": e.size,
                         "mtime_us": (e.mtime - EPOCH) // US if e.mtime else None,
                         "mtime_prec_us": prec if e.mtime else None, "body": buf.getvalue()})
            paths.append(path)
        if not rows:
            return
        directory = self.dataset / f"endpoint={source.endpoint}" / f"day={day}"
        directory.mkdir(parents=True, exist_ok=True)
        final, tmp = directory / f"part-{batch}.parquet", directory / f".part-{batch}.parquet.tmp"
        with open(tmp, "wb") as fh:
            pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(_FILE_FIELDS)), fh)
            fh.flush()
            os.fsync(fh.fileno())
        manifest = {"batch": batch, "endpoint": source.endpoint,
                    "part": str(final.relative_to(self.dataset)), "tmp": str(tmp.relative_to(self.dataset)),
                    "paths": paths}
        mpath = self.journal / f"{batch}.json"
        mtmp = mpath.with_suffix(".json.tmp")
        mtmp.write_text(json.dumps(manifest), encoding="utf-8")
        with open(mtmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(mtmp, mpath)
        _fsync_dir(self.journal)
        self.hook("written", batch, len(rows))
        os.replace(tmp, final)
        _fsync_dir(directory)
        self.hook("committed", batch, len(rows))
        done_path = mpath.with_suffix(".done")
        self._delete(source, paths, batch, done_path)
        done_path.unlink(missing_ok=True)
        mpath.unlink()
        stats.files += len(rows)
        stats.bytes += sum(int(r["size"]) for r in rows)
        stats.batches += 1

    def _delete(self, source: ArchiveSource, paths: Sequence[str], batch: str, done_path: Path) -> None:
        # Progress marks need no fsync: a lost mark only repeats a delete, which NotFound absorbs.
        t = self.transport(source)
        with open(done_path, "a", encoding="utf-8") as done:
            for n, path in enumerate(paths, 1):
                try:
                    t.delete(path)
                except NotFound:
                    pass
                done.write(path + "\n")
                done.flush()
                self.hook("deleted", batch, n)


def compact(sources: Sequence[ArchiveSource], dataset: Path, journal_dir: Path, *,
            batch_size: int = 2000, hook: Hook | None = None, progress: bool = True) -> CompactStats:
    """Compact every archive folder of ``sources`` (after finishing any interrupted batch)."""
    c = Compactor(sources, dataset, journal_dir, batch_size=batch_size, hook=hook, progress=progress)
    try:
        return c.run()
    finally:
        c.close()
