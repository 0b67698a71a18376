"""Cluster-wide sequences on the coordination server: files whose names hold their values
(package docstring: "Sequences"; the ``state_dir`` side is :mod:`ftpbc.sequences`)."""

from __future__ import annotations

import io
import logging
import random
import threading
import time
from collections.abc import Set as AbstractSet
from pathlib import PurePath, PurePosixPath

from ftpbc.cluster.poll_lock import PollLock
from ftpbc.cluster.server.lock import ServerLock, ServerLocks
from ftpbc.cluster.server.names import CREATED, MAX_VALUE, sequence_value, top_value
from ftpbc.errors import NotFound, OutcomeUnknown, SequenceError
from ftpbc.sequences import SEQUENCE_NAME_RE, SequenceInfo, SequenceKind, check_sequence_name, endpoint_uuid
from ftpbc.transport.base import Entry

log = logging.getLogger("ftpbc.cluster")

#: how long a draw waits before listing again a sequence whose value file was out of sight
_LOOK_AGAIN = 0.02


class ServerSequences:
    """Cluster-wide sequences as files whose names hold their values (a
    :class:`~ftpbc.sequences.SharedSequences`; package docstring).

    Beside each value file ``<base>.<N>`` sits its marker ``<base>~created``, written once when
    the sequence is created and never renamed: a listing taken while another node draws may miss
    the value file (between its two names), never the marker, so "no marker" is what "no such
    sequence yet" means, and "a marker but no value" means "list again".
    """

    def __init__(self, coordination: ServerLocks, *, lock_timeout: float = 30.0) -> None:
        self.c = coordination
        self.lock_timeout = lock_timeout
        self._known: dict[str, int] = {}
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._create_lock: PollLock | None = None

    def _where(self, kind: SequenceKind, endpoint: str | None, key: str) -> tuple[str, str]:
        if kind == "global":
            return f"{self.c.dir}/sequences", check_sequence_name(key)
        if kind != "shared":
            raise SequenceError(f"{kind} sequence {key!r} is not kept on the server")
        if not endpoint:
            raise SequenceError(f"shared sequence {key!r} needs an endpoint name")
        if len(key) != 1 or not key.isdigit():
            raise SequenceError(f"shared sequence of endpoint {endpoint!r}: expected a digit 0-9, "
                                f"got {key!r}")
        return f"{self.c.dir}/endpoint-sequences/{endpoint_uuid(endpoint)}", f"sequence{key}"

    def location(self, kind: SequenceKind, endpoint: str | None, key: str) -> PurePath:
        directory, base = self._where(kind, endpoint, key)
        return PurePosixPath(directory) / f"{base}.<value>"

    def _thread_lock(self, path: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(path, threading.Lock())

    # ------------------------------------------------------------------ operations

    def next(self, kind: SequenceKind, endpoint: str | None, key: str) -> int:
        directory, base = self._where(kind, endpoint, key)
        path = f"{directory}/{base}"
        with self._thread_lock(path):
            deadline = time.monotonic() + self.lock_timeout
            value = self._known.pop(path, None)
            lost = 0
            sight = _Sight(path)
            while True:
                if value is None:
                    value, names = self._current(directory, base, endpoint, create=True)
                    sight.check(value, names)
                if value is not None:
                    if value >= MAX_VALUE:
                        raise SequenceError(f"{path}.{value}: the sequence is at its largest value "
                                            f"({MAX_VALUE}); set it lower to draw from it again")
                    try:
                        self.c.transport.rename(f"{path}.{value}", f"{path}.{value + 1}")
                    except NotFound:
                        lost += 1  # another node drew it: read the value there and try again
                    except OutcomeUnknown:
                        lost += 1  # perhaps drawn by this very rename: the value is never used
                    else:
                        self._known[path] = value + 1
                        return value
                value = None
                if time.monotonic() > deadline:
                    raise SequenceError(f"{path}: no value drawn within {self.lock_timeout:g} s "
                                        f"({lost} races lost to other nodes)")
                if lost > 1:
                    # Spread the racers out (a few milliseconds at most).
                    time.sleep(random.uniform(0, min(0.0005 * 2 ** min(lost, 8), 0.05)))
                elif sight.misses:
                    time.sleep(_LOOK_AGAIN)  # out of sight: a rename takes milliseconds

    def get(self, kind: SequenceKind, endpoint: str | None, key: str) -> int:
        directory, base = self._where(kind, endpoint, key)
        deadline = time.monotonic() + self.lock_timeout
        sight = _Sight(f"{directory}/{base}")
        while True:
            value, names = self._current(directory, base, endpoint, create=False)
            if value is not None:
                return value
            sight.check(value, names)
            if time.monotonic() > deadline:
                raise SequenceError(f"{directory}/{base}: its value file stays out of sight")
            time.sleep(_LOOK_AGAIN)

    def set(self, kind: SequenceKind, endpoint: str | None, key: str, value: int) -> None:
        if not 0 <= value <= MAX_VALUE:
            raise SequenceError(f"sequence {key!r}: value must be 0 to {MAX_VALUE}, got {value}")
        directory, base = self._where(kind, endpoint, key)
        path = f"{directory}/{base}"
        with self._thread_lock(path):
            self._known.pop(path, None)
            deadline = time.monotonic() + self.lock_timeout
            sight = _Sight(path)
            while True:
                current, names = self._current(directory, base, endpoint, create=True)
                if current == value:
                    return
                if current is not None:
                    try:
                        self.c.transport.rename(f"{path}.{current}", f"{path}.{value}")
                        return
                    except NotFound:
                        pass
                elif sight.gone(current, names):
                    # Its value file is gone (package docstring): setting it is the repair.
                    self.c.put_bytes(f"{path}.{value}", b"")
                    log.warning("%s: the sequence had no value file; set to %d", path, value)
                    return
                else:
                    time.sleep(_LOOK_AGAIN)
                if time.monotonic() > deadline:
                    raise SequenceError(f"{path}: could not set it within {self.lock_timeout:g} s "
                                        "(other nodes keep drawing from it)")

    # ------------------------------------------------------------------ internals

    def _entries(self, directory: str) -> list[Entry]:
        try:
            return self.c.transport.list(directory)
        except NotFound:
            return []

    def _current(self, directory: str, base: str, endpoint: str | None, *,
                 create: bool) -> tuple[int | None, AbstractSet[str]]:
        """The sequence's value on the server, and the names listed; None if its value file was
        out of sight (being renamed: list again).  A sequence without a marker is 0, or created
        if ``create``.

        Should a second value file ever sit beside the current one (a creation that raced a
        node paused past the creation lock's expiry), the highest value is the current one.
        A name that is no value (``<base>.0005``, ``<base>.x``, twenty digits) is never one.
        """
        names = {e.name for e in self._entries(directory)}
        if base + CREATED in names:
            return top_value(names, base), names
        if not create:
            return 0, names
        return self._create(directory, base, endpoint), names

    def _create(self, directory: str, base: str, endpoint: str | None) -> int | None:
        if self._create_lock is None:
            self._create_lock = PollLock.over(f"{self.c.display}/sequences.lock",
                                              ServerLock(self.c, f"{self.c.dir}/sequences.lock"))
        with self._create_lock.attempt(wait=self.lock_timeout) as held:
            if not held:
                raise SequenceError(f"{directory}/{base}: could not take {self.c.dir}/sequences.lock "
                                    f"within {self.lock_timeout:g} s to create the sequence")
            names = {e.name for e in self._entries(directory)}
            value = top_value(names, base)
            if base + CREATED in names:
                return value
            # Nobody draws from an unmarked sequence, so its value file (if a creation was cut
            # short after writing it) is not moving: this listing shows it.
            self.c.ensure_dir(directory)
            if endpoint is not None and "endpoint" not in names:
                self.c.put_bytes(f"{directory}/endpoint", endpoint.encode("utf-8") + b"\n")
            if value is None:
                value = 0
                self.c.put_bytes(f"{directory}/{base}.0", b"")
            self.c.put_bytes(f"{directory}/{base}{CREATED}", b"")
            log.info("%s/%s: new sequence", directory, base)
            return value

    def list(self) -> list[SequenceInfo]:
        found: list[SequenceInfo] = []
        root = f"{self.c.dir}/endpoint-sequences"
        for ep_dir in sorted(e.name for e in self._entries(root) if e.is_dir):
            directory = f"{root}/{ep_dir}"
            names = {e.name for e in self._entries(directory)}
            endpoint = ep_dir
            if "endpoint" in names:
                buf = io.BytesIO()
                try:
                    self.c.transport.get(f"{directory}/endpoint", buf)
                    endpoint = buf.getvalue().decode("utf-8", "replace").strip() or ep_dir
                except NotFound:
                    pass
            for digit in "0123456789":
                base = f"sequence{digit}"
                if base + CREATED in names:
                    value = top_value(names, base)
                    found.append(SequenceInfo("shared", endpoint, digit,
                                              PurePosixPath(directory) / f"{base}.{value}",
                                              value if value is not None else self.get("shared", endpoint,
                                                                                       digit)))
        directory = f"{self.c.dir}/sequences"
        names = {e.name for e in self._entries(directory)}
        for marker in sorted(n for n in names if n.endswith(CREATED)):
            base = marker[:-len(CREATED)]
            if SEQUENCE_NAME_RE.fullmatch(base):
                value = top_value(names, base)
                if value is None:
                    value = self.get("global", None, base)
                found.append(SequenceInfo("global", None, base, PurePosixPath(directory) / f"{base}.{value}",
                                          value))
        return found



class _Sight:
    """How long a sequence's value file has stayed out of sight.

    A rename takes a value file out of a listing for milliseconds, so a value missing from
    listings for seconds is not being renamed: it was deleted, or renamed to a name that is
    no value (by hand, or by someone writing to the coordination directory).  Then the draw
    fails, naming the sequence and what sits there instead, rather than listing until the lock
    timeout."""

    #: out of sight in this many listings in a row, over this many seconds: gone
    MISSES = 10
    SECONDS = 2.0

    def __init__(self, path: str) -> None:
        self.path = path
        self.misses = 0
        self._since = 0.0

    def gone(self, value: int | None, names: AbstractSet[str]) -> bool:
        """Count one listing (``value`` None: the value file was not in it); True once it has
        been out of sight long enough to be gone."""
        if value is not None:
            self.misses = 0
            return False
        now = time.monotonic()
        if not self.misses:
            self._since = now
        self.misses += 1
        return self.misses >= self.MISSES and now - self._since >= self.SECONDS

    def check(self, value: int | None, names: AbstractSet[str]) -> None:
        """:meth:`gone`, raising :class:`SequenceError` (one line, naming the sequence, its
        directory and what sits in its value's place) once it is gone."""
        if not self.gone(value, names):
            return
        directory, base = self.path.rsplit("/", 1)
        seconds = time.monotonic() - self._since
        strays = sorted(n for n in names if n.startswith(base + ".") and sequence_value(n, base) is None
                        and "." not in n[len(base) + 1:] and "~" not in n[len(base) + 1:])
        found = (f"found instead: {', '.join(repr(n) for n in strays[:3])}" if strays
                 else "nothing in its place")
        raise SequenceError(f"{self.path}: the sequence exists ({base}{CREATED}) but has no value "
                            f"file {base}.<N> (N from 0 to {MAX_VALUE}, no leading zeros) in "
                            f"{self.misses} listings over {seconds:.1f} s; {found} in "
                            f"{directory}; set the sequence to repair it")
