"""The rule every transport's listing applies to the names a server hands it.

A listing comes from the shared exchange area, which anyone with write access to it (or the
server itself, if hostile) fills: a name there is untrusted input.  :func:`listed_name` lets a
name through only if it is a bare file name ftpbc can address; anything else is refused whole,
never shortened or repaired.  A name holding ``/`` (``sub/req.X``) is refused rather than cut to
its last part, since acting on ``req.X`` would act on a file the listing never showed in this
directory.  ``\\`` is refused as a path separator of another system, NUL and line breaks because
they would end or split an FTP command, ``.`` and ``..`` because they are directories, not
files, and lone surrogates because the name was not UTF-8 and no command could carry it back.

A refused name is left out of the listing, and the rest of the listing goes on.  Logging it is
the caller's, once per name (:class:`LoggedOnce`), not once per poll.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Hashable

__all__ = ["MAX_NAME", "LoggedOnce", "OddName", "listed_name"]

#: characters a listed name may never hold: a path separator (either kind), NUL, a line break
_NOT_IN_NAME = re.compile(r"[/\\\0\r\n]")
#: characters a listed name may hold at most (no file system ftpbc knows allows more)
MAX_NAME = 4096


class OddName(ValueError):
    """A listed name ftpbc cannot use: the entry is skipped, not the listing.  ``name`` is the
    name as listed (the key to log it once by); the message says why it is refused."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(why)
        self.name = name


def listed_name(name: str) -> str:
    """``name`` if it is a bare file name ftpbc can address; :class:`OddName` saying why not.

    Guaranteed: what comes back has no ``/``, ``\\``, NUL or line break, is not empty, ``.`` or
    ``..``, is at most MAX_NAME characters and encodes as UTF-8, so it can be joined to the
    listed directory and sent in a command as it is.  Not judged here: whether it is a name of
    a message (the exchange layer decodes that).
    """
    if not name:
        raise OddName(name, "an empty name")
    if name in (".", ".."):
        raise OddName(name, f"name {name!r} is a directory's own entry, not a file's name")
    found = _NOT_IN_NAME.search(name)
    if found is not None:
        if found.group() in "/\\":
            raise OddName(name, f"name {name[:200]!r} is a path ({found.group()!r} in it): refused whole, "
                                "never shortened to its last part")
        raise OddName(name, f"name {name[:200]!r} holds {found.group()!r} (NUL and line breaks would "
                            "end an FTP command): refused")
    if len(name) > MAX_NAME:
        raise OddName(name, f"name {name[:200]!r}... is {len(name)} characters long")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise OddName(name, f"name {name[:200]!r} is not UTF-8") from None
    return name


class LoggedOnce:
    """Keys already reported, so that a problem is logged the first time it is seen, not at
    every poll.  Bounded: once ``limit`` keys are held, nothing more is reported (what is
    refused stays refused; it is only no longer logged).  Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (while there is room): the caller logs it then."""
        with self._lock:
            if key in self._seen or len(self._seen) >= self.limit:
                return False
            self._seen.add(key)
            return True

    def __len__(self) -> int:
        return len(self._seen)
