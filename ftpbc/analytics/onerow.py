"""A Parquet file of exactly one row, its one large binary value copied from a stream piece by piece.

Why not pyarrow: its writer holds a binary value three times over while it writes it (the array,
the encoded values, the page they are concatenated into; docs/aggregate.md), and a Parquet value
cannot be split across pages.  A one-row file is simple enough to write by hand, so compaction's
memory stays bounded whatever the size of a body.

What is written (Parquet format 2, readable by pyarrow and Spark alike): one row group, one
uncompressed ``DATA_PAGE`` (v1) per column, PLAIN values, every column ``OPTIONAL`` (as pyarrow
writes nullable Arrow fields) so parts written by either writer share one schema; no statistics,
no dictionary.  Column types: ``string`` (BYTE_ARRAY, UTF8/String), ``long`` (INT64),
``binary`` (BYTE_ARRAY), the type names of :data:`ftpbc.analytics.records.RAW_FIELDS`.
The Thrift structures are written in the compact protocol, field by field, as parquet.thrift
numbers them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import BinaryIO

MAGIC = b"PAR1"
#: parquet-mr parses ``created_by`` as "<app> version <semver> (build <id>)"
CREATED_BY = "ftpbc version 1.0.0 (build compact)"
#: a page's sizes are i32
MAX_PAGE = (1 << 31) - 1

# Thrift compact protocol field types
_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12
# parquet.thrift enums
_INT64, _BYTE_ARRAY = 2, 6
_OPTIONAL = 1
_UTF8 = 0
_PLAIN, _RLE = 0, 3
_DATA_PAGE = 0
_UNCOMPRESSED = 0

#: definition levels of one row (max level 1), v1 page: 4-byte length, then one RLE run
#: (header ``count << 1`` = 2, then the value in one byte)
_DEFINED = struct.pack("<I", 2) + b"\x02\x01"
_NULL = struct.pack("<I", 2) + b"\x02\x00"

_Field = tuple[int, int, bytes]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(n: int) -> bytes:
    """i32 or i64: zigzag, then varint."""
    return _varint((n << 1) ^ (n >> 63))


def _bin(data: bytes) -> bytes:
    return _varint(len(data)) + data


def _list(etype: int, items: Sequence[bytes]) -> bytes:
    n = len(items)
    head = bytes([(n << 4) | etype]) if n < 15 else bytes([0xF0 | etype]) + _varint(n)
    return head + b"".join(items)


def _struct(fields: Sequence[_Field]) -> bytes:
    """Fields (id, type, encoded value) in increasing id order, then STOP."""
    out = bytearray()
    last = 0
    for fid, ftype, value in fields:
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | ftype)
        else:
            out.append(ftype)
            out += _int(fid)
        out += value
        last = fid
    out.append(0)
    return bytes(out)


def _schema_element(name: str, kind: str) -> bytes:
    if kind == "long":
        return _struct([(1, _I32, _int(_INT64)), (3, _I32, _int(_OPTIONAL)),
                        (4, _BINARY, _bin(name.encode()))])
    fields: list[_Field] = [(1, _I32, _int(_BYTE_ARRAY)), (3, _I32, _int(_OPTIONAL)),
                            (4, _BINARY, _bin(name.encode()))]
    if kind == "string":
        string_type = _struct([(1, _STRUCT, _struct([]))])  # LogicalType union: STRING
        fields += [(6, _I32, _int(_UTF8)), (10, _STRUCT, string_type)]
    elif kind != "binary":
        raise ValueError(f"unsupported column type {kind!r}")
    return _struct(fields)


def _page_header(size: int) -> bytes:
    data_page = _struct([(1, _I32, _int(1)), (2, _I32, _int(_PLAIN)), (3, _I32, _int(_RLE)),
                         (4, _I32, _int(_RLE))])
    return _struct([(1, _I32, _int(_DATA_PAGE)), (2, _I32, _int(size)), (3, _I32, _int(size)),
                    (5, _STRUCT, data_page)])


def write_single_row_part(out: BinaryIO, fields: Sequence[tuple[str, str]],
                          row: Mapping[str, str | int | bytes | None], body_field: str,
                          body: BinaryIO, body_size: int, *, chunk: int = 1 << 20) -> int:
    """Write a Parquet file of one row to ``out`` (positioned at 0); return its size.

    ``fields`` are (name, type) in column order; ``row`` holds every value but ``body_field``'s,
    which is the next ``body_size`` bytes of ``body``, copied ``chunk`` bytes at a time.
    ValueError if the body does not fit one page or ``body`` ends early.
    """
    if body_size + len(_DEFINED) + 4 > MAX_PAGE:
        raise ValueError(f"a body of {body_size} bytes does not fit one Parquet page")
    out.write(MAGIC)
    pos = len(MAGIC)
    chunks: list[bytes] = []
    for name, kind in fields:
        if name == body_field:
            values_size = 4 + body_size
            levels = _DEFINED
        else:
            value = row[name]
            if value is None:
                encoded, levels = b"", _NULL
            elif kind == "long":
                encoded, levels = struct.pack("<q", int(value)), _DEFINED
            else:
                raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]
                encoded, levels = struct.pack("<I", len(raw)) + raw, _DEFINED
            values_size = len(encoded)
        page_size = len(levels) + values_size
        header = _page_header(page_size)
        offset = pos
        out.write(header)
        out.write(levels)
        if name == body_field:
            out.write(struct.pack("<I", body_size))
            left = body_size
            while left:
                piece = body.read(min(chunk, left))
                if not piece:
                    raise ValueError(f"the body ended {left} bytes early")
                out.write(piece)
                left -= len(piece)
        else:
            out.write(encoded)
        total = len(header) + page_size
        pos += total
        meta = _struct([
            (1, _I32, _int(_INT64 if kind == "long" else _BYTE_ARRAY)),
            (2, _LIST, _list(_I32, [_int(_PLAIN), _int(_RLE)])),
            (3, _LIST, _list(_BINARY, [_bin(name.encode())])),
            (4, _I32, _int(_UNCOMPRESSED)),
            (5, _I64, _int(1)),
            (6, _I64, _int(total)),
            (7, _I64, _int(total)),
            (9, _I64, _int(offset)),
        ])
        chunks.append(_struct([(2, _I64, _int(offset)), (3, _STRUCT, meta)]))
    row_group = _struct([(1, _LIST, _list(_STRUCT, chunks)), (2, _I64, _int(pos - len(MAGIC))),
                         (3, _I64, _int(1))])
    root = _struct([(4, _BINARY, _bin(b"schema")), (5, _I32, _int(len(fields)))])
    schema = [root, *(_schema_element(n, k) for n, k in fields)]
    footer = _struct([(1, _I32, _int(1)), (2, _LIST, _list(_STRUCT, schema)), (3, _I64, _int(1)),
                      (4, _LIST, _list(_STRUCT, [row_group])),
                      (6, _BINARY, _bin(CREATED_BY.encode()))])
    out.write(footer)
    out.write(struct.pack("<I", len(footer)))
    out.write(MAGIC)
    return pos + len(footer) + 4 + len(MAGIC)
