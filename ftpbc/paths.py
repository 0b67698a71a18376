"""Remote path rules shared by every layer: bare names, normal absolute paths, joins.

Every path ftpbc sends to a server is absolute and POSIX-style.  These functions refuse what
could climb out of a base directory or corrupt a line-based protocol or the journal, before
anything is sent; they never touch a server.
"""

from __future__ import annotations

import posixpath
import re

from ftpbc.errors import UnsafeNameError


def check_name(name: str, *, what: str = "file name") -> str:
    """Return ``name`` if it is a bare file name; raise UnsafeNameError naming it otherwise.

    A bare name has no ``/`` or ``\\``, is not ``.`` or ``..``, is not empty and has no NUL or
    line break (a line break would corrupt FTP's line-based protocol and the journal).
    """
    # One regex search instead of a generator over five characters: this runs several times per
    # message (every stage, claim and archive name), and the generator cost more than the rest.
    if not name or name in (".", "..") or _UNSAFE_IN_NAME.search(name) is not None:
        raise UnsafeNameError(f"{what} {name!r} is not a bare file name (no '/', '..', NUL or newline)")
    return name


def normalize(path: str) -> str:
    """Normalise an absolute remote path; refuse ``..`` segments, NUL and line breaks.

    ``..`` is refused rather than resolved: a path that climbs is never what a configuration
    or a message name should produce, and resolving it could leave the base directory.
    """
    # Substring tests before any regular expression: every remote command of every message
    # passes here, and ``in`` on a short string costs a fraction of a regex search.
    if "\0" in path or "\r" in path or "\n" in path:
        raise UnsafeNameError(f"path {path!r} contains a NUL or line break")
    if (path[:1] == "/" and "//" not in path and (len(path) == 1 or path[-1] != "/")
            and ("/." not in path or _NOT_NORMAL.search(path) is None)):
        return path  # already normal (the usual case): no split and join per call
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeNameError(f"path {path!r} contains '..'")
    return "/" + "/".join(parts)


def join(directory: str, *names: str) -> str:
    """``directory`` joined with bare names, each checked by :func:`check_name`."""
    for n in names:
        check_name(n)
    return normalize(posixpath.join(directory, *names))


_UNSAFE_IN_NAME = re.compile(r"[/\\\0\r\n]")
#: what makes an absolute path not normal: an empty, ``.`` or ``..`` segment, or a trailing slash
_NOT_NORMAL = re.compile(r"//|/\.\.?(?:/|$)|./$")
