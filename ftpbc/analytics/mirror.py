"""An incremental local mirror of remote archive listings, for Spark to read.

Why a mirror (see docs/aggregate.md): Spark's own ``ftp://`` filesystem logs in once per file
(about 60 files/s), rounds modification times to the minute and puts the password in every path
it returns.  ftpbc's transport lists a whole directory over one pooled connection (MLSD: times
to the second), so the driver lists, and Spark reads what was listed from local files.

Layout under the mirror root, per area (``ArchiveSource.key``) and folder::

    <key>/<folder>/seen.txt        names already mirrored, one per line (append-only)
    <key>/<folder>/part-*.jsonl    raw records (records.RAW_FIELDS), at most CHUNK lines each

A run lists each folder once and writes only entries whose names are not in ``seen.txt``.
A part is written to a temporary name, fsynced and renamed before its names are appended to
``seen.txt``: a crash in between mirrors those entries again next run, so a record can appear
twice in the parts, never be missing.  Readers de-duplicate on (endpoint, folder, name).

What is kept: history.  A file removed from the server (by compaction or by hand) stays in the
mirror; the figures are about what went through, not what is still there.

Not guaranteed: a listing is a snapshot; files archived while a folder is listed appear in the
next run.  The driver holds one folder's listing (and its ``seen`` set) at a time, never the
whole archive.  No credential is written: records hold names, sizes and times only.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ftpbc.analytics.progress import bar_wanted
from ftpbc.analytics.records import EPOCH, US
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import NotFound
from ftpbc.transport import Entry, Transport, open_transport

CHUNK = 100_000


@dataclass
class MirrorStats:
    listed: int = 0
    new: int = 0
    folders: int = 0
    missing: list[str] = field(default_factory=list)


def precision_us(entries: Sequence[Entry]) -> int:
    """The coarsest time unit consistent with every mtime of one listing (1 us, 1 s or 1 min).

    Servers do not say how precise their times are; a listing whose times all fall on whole
    seconds is taken as second-precise (MLSD, SFTP), on whole minutes as minute-precise (LIST).
    """
    times = [e.mtime for e in entries if e.mtime is not None]
    if any(t.microsecond for t in times):
        return 1
    if any(t.second for t in times) or not times:
        return 1_000_000
    return 60_000_000


def folder_dir(root: Path, source: ArchiveSource, folder: str) -> Path:
    return root / source.key / folder


def part_files(root: Path, sources: Iterable[ArchiveSource],
               folders: Sequence[str] = ARCHIVE_FOLDERS) -> list[str]:
    """Every part file of these sources' ``folders``, for ``spark.read.json(paths, schema=...)``."""
    out: list[str] = []
    for s in sources:
        for folder in folders:
            d = folder_dir(root, s, folder)
            if d.is_dir():
                out.extend(str(p) for p in sorted(d.glob("part-*.jsonl")))
    return out


def _write_durably(path: Path, lines: Iterable[str], *, append: bool = False) -> None:
    tmp = path if append else path.with_name(f".{path.name}.tmp")
    with open(tmp, "a" if append else "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    if not append:
        os.replace(tmp, path)


def mirror_folder(transport: Transport, source: ArchiveSource, folder: str, root: Path,
                  stats: MirrorStats) -> None:
    """Mirror the entries of one folder that are not mirrored yet."""
    target = folder_dir(root, source, folder)
    target.mkdir(parents=True, exist_ok=True)
    seen_path = target / "seen.txt"
    seen: set[str] = set()
    if seen_path.exists():
        with open(seen_path, encoding="utf-8") as fh:
            seen = {line.rstrip("\n") for line in fh}
    try:
        entries = transport.list(source.folder_path(folder))
    except NotFound:
        stats.missing.append(f"{source.endpoint}/{folder}")
        return
    files = [e for e in entries if not e.is_dir]
    stats.listed += len(files)
    stats.folders += 1
    fresh = [e for e in files if e.name not in seen]
    del seen
    prec = precision_us(files)
    run = uuid.uuid4().hex[:12]
    for i in range(0, len(fresh), CHUNK):
        chunk = fresh[i:i + CHUNK]
        lines = (json.dumps({
            "endpoint": source.endpoint, "folder": folder, "name": e.name, "size": e.size,
            "mtime_us": (e.mtime - EPOCH) // US if e.mtime is not None else None,
            "mtime_prec_us": prec if e.mtime is not None else None}, separators=(",", ":")) + "\n"
            for e in chunk)
        _write_durably(target / f"part-{run}-{i // CHUNK:05d}.jsonl", lines)
        _write_durably(seen_path, (e.name + "\n" for e in chunk), append=True)
        stats.new += len(chunk)


def update_mirror(root: Path, sources: Sequence[ArchiveSource], *, progress: bool = True,
                  folders: Sequence[str] = ARCHIVE_FOLDERS,
                  on_folder: Callable[[str], None] | None = None) -> MirrorStats:
    """Bring the mirror of ``sources``' ``folders`` up to date; one transport per server, closed
    at the end.  ``progress``: a tqdm bar on a terminal; ``on_folder`` is told, after each
    folder, what the bar's label says (for a display of its own)."""
    from tqdm import tqdm

    stats = MirrorStats()
    transports: dict[ServerConfig, Transport] = {}
    try:
        work = [(s, f) for s in sources for f in folders]
        # Counted by hand, not by iterating the bar: its iterator keeps the count to itself
        # between redraws, so the postfix's redraw showed 0/32 throughout.
        with tqdm(total=len(work), desc="mirror", unit="folder", disable=not bar_wanted(progress),
                  leave=False) as bar:
            for source, folder in work:
                t = transports.get(source.server)
                if t is None:
                    t = transports[source.server] = open_transport(source.server)
                before = stats.new
                mirror_folder(t, source, folder, root, stats)
                # Set once the folder is done: set before, it would show the previous folders'
                # count against this folder's name.
                label = f"{source.endpoint}/{folder} new={stats.new - before} total={stats.new}"
                bar.set_postfix_str(label, refresh=False)
                if on_folder is not None:
                    on_folder(label)
                bar.update(1)
    finally:
        for t in transports.values():
            t.close()
    return stats
