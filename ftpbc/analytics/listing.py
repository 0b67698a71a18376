"""Local archive folders listed by the driver into Parquet files that Spark reads.

Why the driver: parsing every name with ftpbc's Python name parser in Spark's Python workers would
be most of the job's time (docs/aggregate.md, "Performance"), so names are parsed in the JVM
(:mod:`ftpbc.analytics.sqlnames`) and Python only lists.  The driver lists each folder
(``os.scandir`` + ``lstat``: names, sizes, modification times, never contents) and writes the raw
records (:data:`~ftpbc.analytics.records.RAW_FIELDS`) with pyarrow, :data:`CHUNK` records per
Parquet file, under the run's staging directory: a file rather than a Python list handed to
``createDataFrame``, which would send every row through the Py4J socket and pickle it.  So no Python
runs on the executors: on a cluster they need a JVM and Spark only (and the staging directory, under
``--out``, on shared storage).

What the driver holds: one chunk (:data:`CHUNK` records) at a time, whatever the folder's size.

Bounds on untrusted names: a name that is not UTF-8 (undecodable bytes from a local directory)
is left out of the listing, on both the Spark side and the plain pass, since neither Parquet
nor the engine could carry it; its count is returned.  Names longer than the file system allows
cannot exist here.

Mirror parts (FTP, FTPS, SFTP areas; JSON lines) and compacted parts (Parquet) are files already:
Spark reads them directly (:func:`ftpbc.analytics.figures.read_inputs`).

No pyspark import here: the plain Python reference pass lists through :func:`scan_chunks` too,
so both sides see the same records with the same inferred precision.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ftpbc.analytics.records import RAW_FIELDS, arrow_schema

#: records per Parquet file, and the most the driver holds at once while listing
CHUNK = 100_000

InputKind = Literal["dir", "mirror", "compacted"]


@dataclass(frozen=True)
class Input:
    """One unit of listing work: a folder to list, or a file of records to read."""

    kind: InputKind
    path: str
    #: the endpoint the records belong to
    endpoint: str = ""
    #: the archive folder of a ``dir`` input
    folder: str = ""


@dataclass
class Chunk:
    """Up to :data:`CHUNK` entries of one folder, as columns, and the precision of their times."""

    names: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    mtimes_us: list[int] = field(default_factory=list)
    precision_us: int = 60_000_000


def listing_precision_us(times_us: Iterable[int]) -> int:
    """The coarsest unit (1 us, 1 ms, 1 s or 1 min) that every one of these mtimes is a multiple of.

    A file system does not say how precise its times are (ext4: ns; some NFS servers: 1 s), so it
    is read off the values, as the mirror does for FTP and SFTP listings.
    """
    unit = 60_000_000
    for t in times_us:
        while unit > 1 and t % unit:
            unit = {60_000_000: 1_000_000, 1_000_000: 1_000, 1_000: 1}[unit]
        if unit == 1:
            break
    return unit


def scan_chunks(path: str, skipped: list[int] | None = None) -> Iterator[Chunk]:
    """The regular files of one local folder, :data:`CHUNK` at a time, precision per chunk.

    Entries that are not regular files (directories, symbolic links) are not messages; a file
    gone between the listing and its ``lstat`` (compacted meanwhile) was not there.  A name that
    is not UTF-8 is left out and counted in ``skipped[0]``.
    """
    chunk = Chunk()
    with os.scandir(path) as it:
        for de in it:
            if not de.is_file(follow_symlinks=False):
                continue
            name = de.name
            if not name.isascii():
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError:
                    if skipped is not None:
                        skipped[0] += 1
                    continue
            try:
                st = de.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            chunk.names.append(name)
            chunk.sizes.append(st.st_size)
            chunk.mtimes_us.append(st.st_mtime_ns // 1000)
            if len(chunk.names) >= CHUNK:
                chunk.precision_us = listing_precision_us(chunk.mtimes_us)
                yield chunk
                chunk = Chunk()
    if chunk.names:
        chunk.precision_us = listing_precision_us(chunk.mtimes_us)
        yield chunk


def write_dir(inp: Input, directory: str, index: int, skipped: list[int] | None = None) -> int:
    """List ``inp`` (a ``dir`` input) into Parquet files ``<directory>/part-<index>-<n>.parquet``;
    returns the number of records written.

    Each file is written under a hidden temporary name and renamed, so Spark never reads half
    a file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    schema = arrow_schema(RAW_FIELDS)
    total = 0
    for i, c in enumerate(scan_chunks(inp.path, skipped)):
        n = len(c.names)
        table = pa.table({"endpoint": pa.repeat(pa.scalar(inp.endpoint, pa.string()), n),
                          "folder": pa.repeat(pa.scalar(inp.folder, pa.string()), n),
                          "name": pa.array(c.names, pa.string()),
                          "size": pa.array(c.sizes, pa.int64()),
                          "mtime_us": pa.array(c.mtimes_us, pa.int64()),
                          "mtime_prec_us": pa.repeat(pa.scalar(c.precision_us, pa.int64()), n)},
                         schema=schema)
        path = os.path.join(directory, f"part-{index:05d}-{i:05d}.parquet")
        tmp = os.path.join(directory, f".part-{index:05d}-{i:05d}.parquet.tmp")
        pq.write_table(table, tmp, compression="snappy")
        os.replace(tmp, path)
        total += n
    return total


def staging_dirs(staging: Path, endpoints: Iterable[str]) -> dict[str, Path]:
    """One staging directory per endpoint, named by its rank (endpoint names need no escaping)."""
    return {e: staging / f"endpoint-{i}" for i, e in enumerate(sorted(endpoints))}


def stage_dirs(inputs: Sequence[Input], endpoints: Iterable[str], staging: Path,
               on_folder: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """List every ``dir`` input into its endpoint's staging directory (:func:`write_dir`);
    returns the records written per endpoint (endpoints without any left out).

    ``on_folder(label, total)`` is told after each folder: ``<endpoint>/<folder>`` and the
    records written so far.
    """
    where = staging_dirs(staging, endpoints)
    written: dict[str, int] = {}
    total = 0
    for i, inp in enumerate(inputs):
        if inp.kind != "dir":
            continue
        n = write_dir(inp, str(where[inp.endpoint]), i)
        total += n
        if n:
            written[inp.endpoint] = written.get(inp.endpoint, 0) + n
        if on_folder is not None:
            on_folder(f"{inp.endpoint}/{inp.folder}", total)
    return written
