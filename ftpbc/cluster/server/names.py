"""What the files in the coordination directory are called, and what their names and lines say.

Everything here reads what anyone who can write to the directory may have planted (the package
docstring: "What is written there is not trusted"): each parser accepts only what a node writes,
bounded in length, and answers anything else without raising.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

#: this host's name, as heartbeats and clock probes carry it
HOST = socket.gethostname().replace(" ", "-") or "localhost"

_TOKEN_RE = re.compile(r"lock\.([0-9a-f]{6,32})(?:~([A-Za-z0-9._-]{1,64})\+([0-9a-f]{1,16})~(\d{1,16}))?")
#: a token's id, as its marker ``token.<id>`` names it
TOKEN_ID_RE = re.compile(r"[0-9a-f]{6,32}")
#: a lock file of a token under a name no node writes (renamed by hand, or by an attacker)
_GARBLED_RE = re.compile(r"lock\.([0-9a-f]{6,32})([^0-9a-f].*)", re.DOTALL)
_SAFE_KEY_RE = re.compile(r"[^A-Za-z0-9._-]")


def safe_key(key: str) -> str:
    """A lock key as a directory name (a transfer's key ``transfer:x`` has a colon)."""
    return _SAFE_KEY_RE.sub(lambda m: f"+{ord(m[0]):02x}", key)


def beat_stamp(text: str) -> float:
    """The server time a heartbeat's first line says it was written at (for servers without
    file times); 0 (long dead) if it says none, or nothing finite: a ``nan`` would compare as
    neither old nor new."""
    fields = text.split("\n", 1)[0].split()
    try:
        stamp = float(fields[2])
    except (IndexError, ValueError):
        return 0.0
    return stamp if math.isfinite(stamp) else 0.0


@dataclass(frozen=True)
class Token:
    """One lock token file, as listed."""

    name: str
    id: str
    node: str | None = None
    run: str | None = None
    #: server time, seconds
    expiry: float = 0.0

    @property
    def held(self) -> bool:
        return self.node is not None

    @classmethod
    def parse(cls, name: str) -> Token | None:
        """The token a lock file's name shows; None if it is no lock file.  A name no node
        writes (``lock.<id>`` and anything else after it) is a token held by nobody known
        (node ``?``) with no expiry of its own:
        :meth:`~ftpbc.cluster.server.lock.ServerLock._expiry` bounds it."""
        m = _TOKEN_RE.fullmatch(name)
        if m is None:
            g = _GARBLED_RE.fullmatch(name)
            return None if g is None else cls(name, g[1], "?", "?", float("inf"))
        if m[2] is None:
            return cls(name, m[1])
        return cls(name, m[1], m[2], m[3], int(m[4]) / 1000)


#: the marker beside a sequence's value file, written once when it is created
CREATED = "~created"
#: the largest value a sequence holds: its value file's name has at most 18 digits
MAX_VALUE = 10 ** 18 - 1
_VALUE_RE = re.compile(r"0|[1-9][0-9]{0,17}")


def sequence_value(name: str, base: str) -> int | None:
    """The value a sequence's file name holds; None if it holds none (only the names a draw
    writes count: ASCII digits, no leading zero, at most 18 of them)."""
    if not name.startswith(base + "."):
        return None
    digits = name[len(base) + 1:]
    return int(digits) if _VALUE_RE.fullmatch(digits) else None


def top_value(names: Iterable[str], base: str) -> int | None:
    """The highest value among a sequence's file names; None if none holds one."""
    values = [v for n in names if (v := sequence_value(n, base)) is not None]
    return max(values) if values else None
