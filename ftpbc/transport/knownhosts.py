"""OpenSSH ``known_hosts`` files, read in one place, markers included.

paramiko's own ``HostKeys`` is not used to read them: it takes a ``@revoked`` or
``@cert-authority`` line for a host name, and either skips it (so a revoked key would be trusted
through any other line naming it) or raises a bare ``InvalidHostKey`` while loading (a traceback
instead of an error).  This module reads every line the way ``ssh`` does:

* ``host-patterns key-type base64-key [comment]``: a key the host may present.  Patterns are
  comma-separated, with ``*`` and ``?`` wildcards and ``!`` negation, or a hashed name
  (``|1|salt|hash``, as ``ssh-keygen -H`` writes them).  A host on a port other than 22 is
  written ``[host]:port``.
* ``@revoked host-patterns key-type base64-key``: that key must never be accepted, even where
  another line lists it.
* ``@cert-authority host-patterns key-type base64-key``: a CA whose host certificates ssh
  accepts.  Recognised and kept (to say so in errors), but never used: paramiko does not verify
  OpenSSH host certificates, so a host must still be listed by its own key.

Guarantees: :func:`load` never raises anything but :class:`~ftpbc.errors.ConfigError` (an
unreadable file, or a ``@revoked`` line that does not parse: a revocation must not be dropped
silently).  Other malformed lines, lines with an unknown marker and keys of types unknown here
are skipped, as ssh does; keys are compared as raw public-key blobs, so a type paramiko cannot
load still counts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

from ftpbc.errors import ConfigError

Marker = Literal["", "@revoked", "@cert-authority"]
_MARKERS: tuple[Marker, ...] = ("@revoked", "@cert-authority")
#: OpenSSH's prefix of a hashed host name: |1|base64(salt)|base64(HMAC-SHA1(salt, name))
_HASHED = "|1|"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint (base64 without padding) of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    """One key from one line: its type (``ssh-ed25519``...), wire blob and 1-based line."""

    key_type: str
    blob: bytes
    line: int

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


@dataclass(frozen=True)
class KnownLine:
    """One parsed known_hosts line."""

    marker: Marker
    patterns: tuple[str, ...]
    key: KnownKey


@dataclass
class HostKeys:
    """What one known_hosts file says about one host name (``host`` or ``[host]:port``)."""

    path: Path
    host: str
    #: keys the host may present (plain lines)
    keys: list[KnownKey] = field(default_factory=list)
    #: keys that must never be accepted (``@revoked`` lines whose patterns match the host)
    revoked: list[KnownKey] = field(default_factory=list)
    #: certificate authorities for the host (``@cert-authority`` lines), recognised, not used
    authorities: list[KnownKey] = field(default_factory=list)

    def types(self) -> list[str]:
        """The key types listed for the host, sorted, each once."""
        return sorted({k.key_type for k in self.keys})

    def find(self, blob: bytes) -> KnownKey | None:
        """The plain entry holding exactly this key, if any."""
        return next((k for k in self.keys if k.blob == blob), None)

    def revocation(self, blob: bytes) -> KnownKey | None:
        """The ``@revoked`` entry for this key, if any (checked before :meth:`find`)."""
        return next((k for k in self.revoked if k.blob == blob), None)


def parse_line(text: str, lineno: int) -> KnownLine | None:
    """One line as ssh reads it; None for a blank line, a comment, or a line ssh would skip
    (unknown marker, too few fields, bad base64, a blob whose type is not the one named)."""
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker: Marker = ""
    if fields[0].startswith("@"):
        found = next((m for m in _MARKERS if m == fields[0]), None)
        if found is None:
            return None  # ssh ignores a line with a marker it does not know
        marker = found
        fields = fields[1:]
    if len(fields) < 3:
        return None
    hosts, key_type, encoded = fields[:3]
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if _blob_type(blob) != key_type:
        return None
    return KnownLine(marker, tuple(hosts.split(",")), KnownKey(key_type, blob, lineno))


def load(path: Path, host: str) -> HostKeys:
    """The entries of ``path`` that match ``host``; empty when the file does not exist."""
    found = HostKeys(path=path, host=host)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return found
    except OSError as exc:
        raise ConfigError(f"cannot read known_hosts: {exc.strerror}", file=str(path),
                          key="known_hosts") from None
    for lineno, raw in enumerate(text.splitlines(), 1):
        entry = parse_line(raw, lineno)
        if entry is None:
            if raw.split()[:1] == ["@revoked"]:
                # Skipping it would trust the very key the operator meant to shut out.
                raise ConfigError("a @revoked line that cannot be read (expected '@revoked "
                                  "host-patterns key-type base64-key')", file=str(path), line=lineno)
            continue
        if not host_matches(entry.patterns, host):
            continue
        if entry.marker == "@revoked":
            found.revoked.append(entry.key)
        elif entry.marker == "@cert-authority":
            found.authorities.append(entry.key)
        else:
            found.keys.append(entry.key)
    return found


def host_matches(patterns: tuple[str, ...], host: str) -> bool:
    """OpenSSH's rule: some pattern matches and no negated (``!``) pattern does."""
    name = host.lower()
    matched = False
    for pattern in patterns:
        if pattern.startswith(_HASHED):
            matched = matched or _hashed_matches(pattern, host)
        elif pattern.startswith("!"):
            if _glob(pattern[1:].lower()).fullmatch(name):
                return False
        elif _glob(pattern.lower()).fullmatch(name):
            matched = True
    return matched


def line_for(host: str, key_type: str, blob: bytes) -> str:
    """The plain known_hosts line recording ``blob`` for ``host`` (newline included)."""
    return f"{host} {key_type} {base64.b64encode(blob).decode()}\n"


def _hashed_matches(pattern: str, host: str) -> bool:
    try:
        salt_b64, digest_b64 = pattern[len(_HASHED):].split("|", 1)
        salt = base64.b64decode(salt_b64, validate=True)
        digest = base64.b64decode(digest_b64, validate=True)
    except (ValueError, binascii.Error):
        return False
    mine = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mine, digest)


@lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    # Only * and ? are wildcards to ssh; everything else, including the brackets of
    # "[host]:port", is literal (fnmatch would take them for a character class).
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                      re.DOTALL)


def _blob_type(blob: bytes) -> str | None:
    """The key type a public key blob names in its first field (None if it is malformed)."""
    if len(blob) < 4:
        return None
    (n,) = struct.unpack(">I", blob[:4])
    if n == 0 or len(blob) < 4 + n:
        return None
    try:
        return blob[4:4 + n].decode("ascii")
    except UnicodeDecodeError:
        return None


__all__ = ["HostKeys", "KnownKey", "KnownLine", "fingerprint", "host_matches", "line_for", "load",
           "parse_line"]
