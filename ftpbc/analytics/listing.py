"""One listing pass over every input, in Spark's Python workers, into one Parquet dataset.

Why (measured, docs/aggregate.md "Performance"): the first version gave Spark one ``binaryFile``
read per archive folder (12 for 3 endpoints), unioned them, sent every row back to Python to
parse names, and parsed again into a DataFrame.  Each folder cost a driver-side listing and its
own scan in the plan, the JVM driver held every file's status, and every row crossed the
JVM/Python boundary twice.  Now each *input* is one task:

``dir``        a local (or NFS) archive folder: ``os.scandir`` + ``stat``, the way the plain pass does
``mirror``     one JSON-lines part of the listing mirror (FTP, FTPS, SFTP areas)
``compacted``  one Parquet part of the compacted dataset (metadata columns only, never bodies)

A task lists or reads its input, parses every name with ftpbc's parser
(:func:`ftpbc.analytics.records.parse_record`) and writes parsed records
(:data:`~ftpbc.analytics.records.PARSED_FIELDS`) as Parquet files of at most :data:`CHUNK`
rows under one staging directory, which Spark then reads once with an explicit schema.
Nothing is collected to the driver but a count per input: the driver never holds the names,
and a task holds at most one chunk.

Files are written to a hidden temporary name and renamed, under names made of the input's
index and the chunk number: a task Spark retries rewrites the same files, so no record is
written twice.

No pyspark import here: this module runs inside Spark's Python workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ftpbc.analytics.records import PARSED_FIELDS, arrow_schema, parse_record

#: records per Parquet file, and the most a task holds at once (its memory bound: the bench saw
#: Spark's Python workers at under 300 MiB each, whatever the archive size)
CHUNK = 100_000
#: the columns of a compacted part that are metadata (``endpoint`` is its directory's name)
_COMPACTED_COLUMNS = ["folder", "name", "size", "mtime_us", "mtime_prec_us"]

InputKind = Literal["dir", "mirror", "compacted"]


@dataclass(frozen=True)
class Input:
    """One unit of listing work: a folder to list, or a file of records to read."""

    kind: InputKind
    path: str
    #: the endpoint the records belong to (``mirror`` records carry their own)
    endpoint: str = ""
    #: the archive folder of a ``dir`` input
    folder: str = ""


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


def _dir_records(inp: Input) -> Iterator[list[dict[str, Any]]]:
    """Raw records of one local folder, in chunks; the precision is inferred per chunk."""
    chunk: list[dict[str, Any]] = []

    def flush() -> list[dict[str, Any]]:
        prec = listing_precision_us(r["mtime_us"] for r in chunk)
        for r in chunk:
            r["mtime_prec_us"] = prec
        return chunk

    with os.scandir(inp.path) as it:
        for de in it:
            if not de.is_file(follow_symlinks=False):
                continue
            try:
                st = de.stat(follow_symlinks=False)
            except FileNotFoundError:  # archived away (compacted) while we listed: not there
                continue
            chunk.append({"endpoint": inp.endpoint, "folder": inp.folder, "name": de.name,
                          "size": st.st_size, "mtime_us": st.st_mtime_ns // 1000, "mtime_prec_us": 0})
            if len(chunk) >= CHUNK:
                yield flush()
                chunk = []
    if chunk:
        yield flush()


def _mirror_records(inp: Input) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    with open(inp.path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                chunk.append(json.loads(line))
                if len(chunk) >= CHUNK:
                    yield chunk
                    chunk = []
    if chunk:
        yield chunk


def _compacted_records(inp: Input) -> Iterator[list[dict[str, Any]]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(inp.path)
    for batch in pf.iter_batches(batch_size=CHUNK, columns=_COMPACTED_COLUMNS):
        rows = batch.to_pylist()
        for r in rows:
            r["endpoint"] = inp.endpoint
        yield rows


_READERS = {"dir": _dir_records, "mirror": _mirror_records, "compacted": _compacted_records}


def _write_chunk(rows: list[dict[str, Any]], namings: Mapping[str, Mapping[str, str]], path: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [n for n, _ in PARSED_FIELDS]
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for raw in rows:
        parsed = parse_record(raw, namings[raw["endpoint"]])
        for n in names:
            columns[n].append(parsed[n])
    table = pa.Table.from_pydict(columns, schema=arrow_schema(PARSED_FIELDS))
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return len(rows)


def run_inputs(indexed: Iterable[tuple[int, Input]], namings: Mapping[str, Mapping[str, str]],
               staging: str) -> Iterator[tuple[int, int]]:
    """List/read, parse and write each input; yields (input index, records written).

    The body of a Spark task (``mapPartitions``): ``indexed`` is this partition's inputs.
    """
    os.makedirs(staging, exist_ok=True)
    for index, inp in indexed:
        n = 0
        for i, rows in enumerate(_READERS[inp.kind](inp)):
            n += _write_chunk(rows, namings, os.path.join(staging, f"part-{index:06d}-{i:05d}.parquet"))
        yield index, n
