"""``coordination: server``: the cluster's poll locks, heartbeats and sequences kept on the
FTP/SFTP server itself, for clusters whose hosts share no filesystem.

Nothing but the transport's rename contract is used (``ftpbc.transport.base``): a rename of a
given source succeeds for exactly one of the clients racing for it, the others get
:class:`~ftpbc.errors.SourceGone`.  Files, under ``node.coordination_dir`` (default
``/.ftpbc-cluster``) on ``node.coordination_server``::

    heartbeats/<node-id>                          one per live node, rewritten every heartbeat_interval;
                                                  its mtime (the server's clock) is the last beat; a
                                                  serving node's has a second line: what it serves
    clock/<node-id>                               written once to read the server's clock, when a
                                                  process needs it before its first heartbeat
    locks/<key>/token.<token>                     a poll lock's marker (created once, never renamed)
    locks/<key>/lock.<token>                      the lock, free
    locks/<key>/lock.<token>~<node>+<run>~<ms>    the lock, held by <node> (process <run>) until <ms>,
                                                  milliseconds since 1970 on the server's clock
    sequences.lock/...                            the lock under which a new sequence is created
    sequences/<name>.<N>                          %{name}, whose next value is N
    sequences/<name>~created                      its marker (created once, never renamed)
    endpoint-sequences/<uuid>/sequence<K>.<N>     %{K} of one endpoint (and sequence<K>~created), with
                                                  a file ``endpoint`` holding the endpoint's name

Listings
    A server lists a directory by reading its names, then stat()ing each: a file renamed in
    between is in neither of its names.  So every decision about what exists is made from
    markers, which nobody renames, and a file out of sight is looked for again.

Clocks
    Every time compared is the server's: a heartbeat's age is the server's "now" minus the mtime
    the server gave the file, and a lock's expiry is written in server time.  Each process learns
    how far the server's clock is from its own by writing a file and reading back its mtime (at
    every heartbeat), so the hosts' clocks may differ by any amount; what remains is the error
    of that estimate: the mtime's precision (a second on FTP and SFTP) plus a round trip.

Locks
    Taken by renaming the free token to a held name carrying holder and expiry, given back by
    renaming it back, renewed by the holder (renamed to a later expiry) while held, and taken
    over by anyone once expired: a holder killed while holding it stalls the key for at most
    ``lock_expiry``.  A token is created (put under a fresh id, then marked) only when a listing
    shows no marker; two nodes doing that at once make two tokens, so a token is used only after
    a listing made since its creation showed its marker alone (once per process and token):
    whoever finds a second one deletes its own, unless its id is the smaller (then it gives it
    back, to be used once alone).  Hence two processes never hold a key at once, except when a
    holder is paused (SIGSTOP, swapping) past the expiry: then another takes over, the paused one
    finds its token gone when it gives it back, and says so.  The poll lock guards only
    efficiency (a claim is a rename that exactly one node wins), so that case costs lost races,
    never a message.

Sequences
    A draw renames ``<name>.<N>`` to ``<name>.<N+1>`` and returns N; a process that finds the
    source gone (another node drew N) lists the directory and tries again with the value there.
    A process remembers the value it left, so an uncontended draw is one rename.  A sequence is
    created (its value file ``.0``, then its marker) under a lock: the check for its marker and
    the creation must not interleave with another node's.  A rename whose reply is lost may have
    happened: its value is never used (a gap), so values stay unique.

What is written there is not trusted
    Whoever can write to the directory can forge any of these names and times; what they
    cannot do is make a node wait for ever, crash it, or make it loop.  A lock's expiry is
    believed up to ``lock_expiry`` (plus :data:`CLOCK_SLACK`) past the moment this process
    first saw that name, and a name that is no held name of a node (``lock.<id>`` and anything
    else) is held by nobody known, so a lock nobody renews is taken over within that bound,
    with one warning naming the holder; a marker whose lock file stays out of sight as long
    is removed, and a new token replaces it.  A heartbeat time further in the future than the slack
    counts as written when first seen, so it dies after the lease.  A sequence value is only
    ``<name>.<N>`` with N in decimal, no leading zero, at most 18 digits; a sequence whose
    value file stays out of sight for seconds, or at its largest value, fails its draws with a
    :class:`~ftpbc.errors.SequenceError` naming the file.  Not guaranteed: anything against
    someone who keeps renaming, rewriting or deleting the files (they hold the lock, keep the
    heartbeat alive, set the sequence, as a node would).
"""

from __future__ import annotations

import io
import logging
import math
import os
import random
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePath, PurePosixPath

from ftpbc.cluster.coordination import Coordination, Health
from ftpbc.cluster.heartbeat import Heartbeat, HeartbeatInfo, beat_info, process_alive
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.errors import FtpbcError, NotFound, OutcomeUnknown, SequenceError
from ftpbc.sequences import (
    SEQUENCE_NAME_RE,
    SequenceInfo,
    SequenceKind,
    SequenceStore,
    check_sequence_name,
    endpoint_uuid,
)
from ftpbc.transport.base import Entry, Transport

log = logging.getLogger("ftpbc.cluster")

#: a process that lost a lock race lists the lock's directory at most this often (seconds):
#: enough to see an expiry (seconds away) or a new token, without a listing per poll
RESCAN = 1.0
#: how long a clock estimate is trusted before it is measured again (the heartbeat measures it
#: at every beat; this is for processes that do not beat)
CLOCK_RESYNC = 300.0
HOST = socket.gethostname().replace(" ", "-") or "localhost"
#: how far two processes' estimates of the server's clock may differ (an mtime's whole second,
#: plus an upload's round trip): a claimed time is believed up to this far past what it may be
CLOCK_SLACK = 2.0

_TOKEN_RE = re.compile(r"lock\.([0-9a-f]{6,32})(?:~([A-Za-z0-9._-]{1,64})\+([0-9a-f]{1,16})~(\d{1,16}))?")
_TOKEN_ID_RE = re.compile(r"[0-9a-f]{6,32}")
#: a token's lock file missing from this many listings in a row (and for lock_expiry) is gone
LOST_LISTINGS = 3
#: a lock file of a token under a name no node writes (renamed by hand, or by an attacker)
_GARBLED_RE = re.compile(r"lock\.([0-9a-f]{6,32})([^0-9a-f].*)", re.DOTALL)
_SAFE_KEY_RE = re.compile(r"[^A-Za-z0-9._-]")


def _safe_key(key: str) -> str:
    """A lock key as a directory name (a transfer's key ``transfer:x`` has a colon)."""
    return _SAFE_KEY_RE.sub(lambda m: f"+{ord(m[0]):02x}", key)


_DIGITS_RE = re.compile(r"[0-9]{1,9}")


def _beat_stamp(text: str) -> float:
    """The server time a heartbeat's first line says it was written at (for servers without
    file times); 0 (long dead) if it says none, or nothing finite: a ``nan`` would compare as
    neither old nor new."""
    fields = text.split("\n", 1)[0].split()
    try:
        stamp = float(fields[2])
    except (IndexError, ValueError):
        return 0.0
    return stamp if math.isfinite(stamp) else 0.0


def server_seconds(mtime: datetime) -> float:
    """A listing's mtime as seconds: whole seconds (FTP, SFTP) stand for the middle of that second."""
    return mtime.timestamp() + (0.5 if mtime.microsecond == 0 else 0.0)


class ServerClock:
    """The server's clock as seen from this process: this host's time plus a measured offset."""

    def __init__(self, probe: Callable[[], tuple[datetime | None, float, float]], *,
                 host_time: Callable[[], float] = time.time) -> None:
        self._probe = probe
        #: this host's clock (seconds since 1970)
        self.host_time = host_time
        self._offset: float | None = None
        self._measured = -CLOCK_RESYNC
        self._lock = threading.Lock()
        self._warned = False

    def sample(self, mtime: datetime | None, before: float, after: float) -> None:
        """A file was written between ``before`` and ``after`` (this host's time) and the server
        gave it ``mtime``."""
        if mtime is None:
            if not self._warned:
                self._warned = True
                log.warning("the coordination server gives no file times: using this host's clock, "
                            "so the hosts' clocks must agree (see docs/cluster.md)")
            offset = 0.0
        else:
            offset = server_seconds(mtime) - (before + after) / 2
        with self._lock:
            self._offset = offset
            self._measured = time.monotonic()

    def now(self) -> float:
        """The server's time now, in seconds since 1970."""
        if self._offset is None or time.monotonic() - self._measured > CLOCK_RESYNC:
            self.sample(*self._probe())
        return self.host_time() + (self._offset or 0.0)

    @property
    def offset(self) -> float | None:
        """Server minus this host, in seconds (None before the first measurement)."""
        return self._offset


class FirstSeen:
    """When this process first saw each of a set of claims, on the server's clock.

    A time written by someone else (a lock's expiry in its name, a heartbeat's mtime) is a
    claim; one too far in the future cannot be checked against the clock, only against how long
    this process has been looking at it.  Per process: a process that starts anew starts
    counting anew.  Bounded: past ``limit`` claims the oldest are forgotten (counted anew).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        return key in self._seen

    def at(self, key: str, now: float) -> float:
        """When ``key`` was first seen; ``now`` if this is the first time."""
        with self._lock:
            first = self._seen.get(key)
            if first is None:
                while len(self._seen) >= self.limit:
                    del self._seen[next(iter(self._seen))]
                first = self._seen[key] = now
            return first

    def forget(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def keep(self, keys: Iterable[str]) -> None:
        """Forget every claim but ``keys`` (those still in sight)."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._seen if k not in wanted]:
                del self._seen[key]


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
        (node ``?``) with no expiry of its own: :meth:`ServerLock._expiry` bounds it."""
        m = _TOKEN_RE.fullmatch(name)
        if m is None:
            g = _GARBLED_RE.fullmatch(name)
            return None if g is None else cls(name, g[1], "?", "?", float("inf"))
        if m[2] is None:
            return cls(name, m[1])
        return cls(name, m[1], m[2], m[3], int(m[4]) / 1000)


class ServerCoordination(Coordination):
    """Locks, heartbeats and sequences in ``directory`` on the server behind ``transport``."""

    def __init__(self, transport: Transport, directory: str, node_id: str, lease: float, *,
                 lock_expiry: float = 10.0, local_sequences: Path, display: str | None = None,
                 lock_timeout: float = 30.0, host_time: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.dir = "/" + "/".join(p for p in directory.split("/") if p)
        self.node_id = node_id
        self.lease = lease
        self.lock_expiry = lock_expiry
        #: this process among the runs of this node id (a restarted node takes its locks back)
        self.run = secrets.token_hex(3)
        self.display = display or f"{transport.server}{self.dir}"
        self.clock = ServerClock(self._probe_clock, host_time=host_time)
        self._made: set[str] = set()
        self._made_lock = threading.Lock()
        self._held: weakref.WeakSet[ServerLock] = weakref.WeakSet()
        self._held_lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self._future_beats = FirstSeen()
        self._sequences = SequenceStore(local_sequences, local_sequences,
                                        shared=ServerSequences(self, lock_timeout=lock_timeout))

    # ------------------------------------------------------------------ the interface

    @property
    def sequences(self) -> SequenceStore:
        return self._sequences

    def poll_lock(self, key: str, mode: str) -> PollLock:
        name = f"{self.display}/locks/{_safe_key(key)}"
        if mode != "file":
            return PollLock.over(name, None)
        return PollLock.over(name, ServerLock(self, f"{self.dir}/locks/{_safe_key(key)}"))

    def heartbeat(self, interval: float, *, health: Health | None = None) -> Heartbeat:
        return ServerHeartbeat(self, interval, health=health)

    def is_dead(self, node_id: str) -> bool:
        return self.heartbeat_age(node_id) is None

    @property
    def where(self) -> str:
        return f"server {self.display}"

    def close(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        self.transport.close()

    # ------------------------------------------------------------------ heartbeats

    def heartbeat_path(self, node_id: str) -> str:
        return f"{self.dir}/heartbeats/{node_id}"

    def heartbeat_age(self, node_id: str) -> float | None:
        """Seconds since ``node_id``'s last beat on the server's clock; None if it has none
        younger than the lease (dead)."""
        try:
            entry = self.transport.stat(self.heartbeat_path(node_id))
        except NotFound:
            return None
        # A server without file times: the beat's own estimate of the server's time.
        stamp = server_seconds(entry.mtime) if entry.mtime is not None else self._written_at(node_id)
        age = self._age(node_id, stamp, self.clock.now())
        return None if age > self.lease else age

    def _age(self, node_id: str, stamp: float, now: float) -> float:
        """A beat's age from the time the server (or, without file times, the beat itself) gives
        it.  A time in the future by more than :data:`CLOCK_SLACK` was not given by a beat (an
        mtime set by hand, a forged line): it counts as written when this process first saw it,
        so it goes stale after the lease like any other beat, however far ahead it claims to be.
        A node that beats again gives its file a time that is not in the future, which ends the
        count.  Counted per node, not per time claimed: a listing and a stat may show the same
        file's time differently (a listing's date alone, for a date far ahead)."""
        if stamp > now + CLOCK_SLACK:
            return now - self._future_beats.at(node_id, now)
        self._future_beats.forget(node_id)
        return max(now - stamp, 0.0)

    def _written_at(self, node_id: str) -> float:
        buf = io.BytesIO()
        try:
            self.transport.get(self.heartbeat_path(node_id), buf)
        except NotFound:
            return 0.0
        return _beat_stamp(buf.getvalue().decode("ascii", "replace"))

    def heartbeats(self) -> list[HeartbeatInfo]:
        """Every heartbeat file in ``heartbeats/``, alive or dead; ages on the server's clock.
        Reading them may write ``clock/<node-id>`` (to learn the server's clock), nothing else."""
        try:
            entries = self.transport.list(f"{self.dir}/heartbeats")
        except NotFound:
            return []
        now = self.clock.now()
        out: list[HeartbeatInfo] = []
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir or e.name.startswith("."):
                continue
            text = self._read_beat(e.name)
            if text is None:
                continue  # removed since the listing: a node that stopped cleanly
            # A server without file times: the beat's own estimate of the server's time.
            stamp = server_seconds(e.mtime) if e.mtime is not None else _beat_stamp(text)
            out.append(beat_info(e.name, text, self._age(e.name, stamp, now), self.lease, host_field=3))
        return out

    def _read_beat(self, node_id: str) -> str | None:
        """A heartbeat file's text; None if it is gone.  A beat is put over the file in place
        (not staged), so a read may catch it half written: a whole one ends with a line break,
        and a torn one is read again (the next beat is an interval away, the write milliseconds)."""
        text = ""
        for _ in range(3):
            buf = io.BytesIO()
            try:
                self.transport.get(self.heartbeat_path(node_id), buf)
            except NotFound:
                return None
            text = buf.getvalue().decode("ascii", "replace")
            if text.endswith("\n"):
                break
        return text

    def live_elsewhere(self) -> str | None:
        """Who else runs this node id (a live heartbeat from another host or process), as a
        sentence; None if nobody does (or the server cannot tell yet)."""
        path = self.heartbeat_path(self.node_id)
        try:
            age = self.heartbeat_age(self.node_id)
            if age is None:
                return None
            buf = io.BytesIO()
            self.transport.get(path, buf)
        except FtpbcError:
            return None
        fields = buf.getvalue().decode("ascii", "replace").split()
        pid = int(fields[0]) if fields and _DIGITS_RE.fullmatch(fields[0]) else 0
        host = fields[3] if len(fields) > 3 else "?"
        if host == HOST and (pid == os.getpid() or not process_alive(pid)):
            return None
        where = f"host {host}" if host != HOST else f"process {pid} of this host"
        return (f"node id {self.node_id!r} is live on {where} (heartbeat {age:.0f} s ago in "
                f"{self.display}/heartbeats); give this node another id (--node-id), or wait "
                f"{self.lease - age:.0f} s if that node is gone")

    # ------------------------------------------------------------------ helpers

    def ensure_dir(self, path: str) -> None:
        """mkdir once per process."""
        if path in self._made:
            return
        self.transport.mkdir(path)
        with self._made_lock:
            self._made.add(path)

    def listing(self, directory: str) -> list[Entry]:
        """The entries of ``directory``, created if missing (then empty)."""
        try:
            return self.transport.list(directory)
        except NotFound:
            self.ensure_dir(directory)
            return []

    def put_bytes(self, path: str, data: bytes) -> None:
        """Write a small file, its directory made first (once per process: servers answer a put
        into a missing directory variously, vsftpd with 553)."""
        self.ensure_dir(path.rsplit("/", 1)[0] or "/")
        self.transport.put(path, io.BytesIO(data))

    def _probe_clock(self) -> tuple[datetime | None, float, float]:
        path = f"{self.dir}/clock/{self.node_id}"
        before = self.clock.host_time()
        self.put_bytes(path, f"{os.getpid()} {before:.3f} {HOST}\n".encode("ascii", "replace"))
        after = self.clock.host_time()
        return self.transport.stat(path).mtime, before, after

    # ------------------------------------------------------------------ lock renewal

    def holding(self, lock: ServerLock) -> None:
        """``lock`` was taken: renew it while it is held (see :meth:`ServerLock.renew`)."""
        with self._held_lock:
            self._held.add(lock)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_loop, name="lock-renewer", daemon=True)
                self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lock_expiry / 6):
            with self._held_lock:
                locks = list(self._held)
            for lock in locks:
                try:
                    lock.renew()
                except Exception as exc:  # the renewer never dies: the lock then expires
                    log.warning("%s: cannot renew: %s: %s", lock.dir, type(exc).__name__, exc)


class ServerHeartbeat(Heartbeat):
    """This node's heartbeat file on the coordination server.

    Each beat writes ``heartbeats/<node-id>`` (pid, this host's time, its estimate of the
    server's time, host name; then, for a serving node, what it serves: see
    :class:`~ftpbc.cluster.heartbeat.Serves`) and reads back the mtime the server gave it: other nodes judge
    the beat by that mtime, and this process learns the server's clock from it.
    """

    def __init__(self, coordination: ServerCoordination, interval: float, *,
                 health: Health | None = None) -> None:
        # ``dir`` and ``path`` name the remote file in the base class's messages.
        super().__init__(Path(coordination.dir), coordination.node_id, interval, health=health)
        self.coordination = coordination
        self.remote = coordination.heartbeat_path(coordination.node_id)

    def beat(self) -> None:
        c = self.coordination
        before = c.clock.host_time()
        estimate = before + (c.clock.offset or 0.0)
        line = f"{os.getpid()} {before:.3f} {estimate:.3f} {HOST}\n{self.extra_lines()}"
        c.put_bytes(self.remote, line.encode("ascii", "replace"))
        after = c.clock.host_time()
        c.clock.sample(c.transport.stat(self.remote).mtime, before, after)

    def start(self) -> None:
        if self.lease is not None:
            self.lease.arm()
        try:
            self.leased_beat()
        except FtpbcError as exc:  # a server not reachable yet: the next interval tries again
            log.warning("heartbeat %s: cannot write it yet: %s: %s", self.remote, type(exc).__name__, exc)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.path.name}", daemon=True)
        self._thread.start()

    def stop(self, *, remove: bool = True) -> None:
        super().stop(remove=False)
        if remove:
            try:
                self.coordination.transport.delete(self.remote)
            except NotFound:
                pass
            except FtpbcError as exc:
                log.warning("heartbeat %s: cannot remove it (it goes stale after the lease): %s",
                            self.remote, exc)


class ServerLock:
    """The poll lock's cross-node part on the server: one token in ``dir`` (module docstring).

    A token is two files: ``token.<id>``, its marker, created once and never renamed, and
    ``lock.<id>``, renamed to take, renew and give back the lock.  Every decision about which
    tokens exist is made from the markers: a listing made while another node renames a file may
    show neither its old name nor its new one (servers read the directory, then stat each
    name), whereas an entry nobody touches is always listed.

    Implements :class:`~ftpbc.cluster.poll_lock.CrossLock`; called under the T_LOCK, so by one
    thread of the process at a time, while the renewer thread may renew a held token.
    """

    def __init__(self, coordination: ServerCoordination, directory: str) -> None:
        self.c = coordination
        self.dir = directory
        self._token: str | None = None  # id of the token as last seen
        self._held: str | None = None   # its held name while this process holds it
        self._renew_at = 0.0
        self._scanned = -RESCAN
        self._rescan = RESCAN
        self._alone: set[str] = set()   # tokens a listing has shown alone since their creation
        self._mutex = threading.Lock()  # between the holder's release and the renewer
        self._warned: str | None = None
        self._seen = FirstSeen()  # held names whose expiry this process could not believe, lost files
        self._unseen: dict[str, int] = {}  # marked tokens: listings in a row without their file

    # ------------------------------------------------------------------ CrossLock

    def acquire(self, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while True:
            if self._try():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.05 + random.uniform(0, 0.05), left))  # the wait= of recovery only

    def bypass(self) -> bool:
        return False  # an expired token is taken over in acquire()

    def release(self) -> None:
        with self._mutex:
            held, self._held = self._held, None
            if held is None or self._token is None:
                return
            try:
                self.c.transport.rename(f"{self.dir}/{held}", f"{self.dir}/lock.{self._token}")
            except NotFound:
                log.warning("%s: the lock was taken over while this node held it (held past its "
                            "expiry: a paused process?)", self.dir)
            except FtpbcError as exc:
                log.warning("%s: cannot give the lock back (others take it over after %g s): %s",
                            self.dir, self.c.lock_expiry, exc)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ taking it

    def _held_name(self, token: str) -> str:
        expiry = int((self.c.clock.now() + self.c.lock_expiry) * 1000)
        return f"lock.{token}~{self.c.node_id}+{self.c.run}~{expiry}"

    def _try(self) -> bool:
        if self._token is not None:
            token = self._token
            held = self._held_name(token)
            try:
                self.c.transport.rename(f"{self.dir}/lock.{token}", f"{self.dir}/{held}")
            except NotFound:
                if time.monotonic() - self._scanned < self._rescan:
                    return False
            except OutcomeUnknown:
                pass  # perhaps ours now: the listing tells (a token held by this very run)
            else:
                return self._hold(token, held)
        return self._from_listing()

    def _scan(self) -> tuple[set[str], dict[str, Token]]:
        """The marked token ids, and the lock files of those seen."""
        self._scanned = time.monotonic()
        self._rescan = RESCAN * random.uniform(0.5, 1.5)  # racing nodes fall out of step
        marked: set[str] = set()
        movers: dict[str, Token] = {}
        for e in self.c.listing(self.dir):
            if e.name.startswith("token.") and _TOKEN_ID_RE.fullmatch(e.name[6:]):
                marked.add(e.name[6:])
            elif (t := Token.parse(e.name)) is not None:
                movers[t.id] = t
        movers = {i: t for i, t in movers.items() if i in marked}
        self._seen.keep([t.name for t in movers.values()] + [f"token.{i}" for i in marked - movers.keys()])
        return marked, movers

    def _lost_files(self, unseen: set[str]) -> set[str]:
        """Of the marked tokens whose lock file this listing did not show, those whose file is
        gone: out of sight in :data:`LOST_LISTINGS` listings in a row over ``lock_expiry`` plus
        :data:`CLOCK_SLACK` (a rename hides a file for milliseconds; this one was deleted, or
        renamed to a name that is no lock file).  Their markers are deleted, so that a new token
        replaces them, rather than the key waiting for a file that never comes back."""
        for i in list(self._unseen):
            if i not in unseen:
                del self._unseen[i]
        now = self.c.clock.now()
        lost: set[str] = set()
        for i in sorted(unseen):
            self._unseen[i] = self._unseen.get(i, 0) + 1
            first = self._seen.at(f"token.{i}", now)
            if self._unseen[i] < LOST_LISTINGS or now - first <= self.c.lock_expiry + CLOCK_SLACK:
                continue
            try:
                self.c.transport.delete(f"{self.dir}/token.{i}")
            except NotFound:
                pass  # another node removed it
            except FtpbcError as exc:
                log.warning("%s: cannot remove token.%s, whose lock file is gone: %s", self.dir, i, exc)
                continue
            log.warning("%s: the lock file of token %s is gone (in no listing for %.0f s): "
                        "removed its marker, a new token replaces it", self.dir, i, now - first)
            del self._unseen[i]
            lost.add(i)
        return lost

    def _expiry(self, t: Token, now: float) -> float:
        """When held token ``t`` expires, on the server's clock: the expiry its name says, but
        never later than ``lock_expiry`` (plus :data:`CLOCK_SLACK`) after this process first saw
        that name.  No node writes an expiry further ahead than that, so a name that claims
        more was not written by a node; and a holder that renews changes its name, so the
        bound never shortens a live holder's lock.  Guaranteed: a name nobody renews (a forged
        expiry, or a garbled name) is taken over at most ``lock_expiry`` plus the slack after
        this process first listed it.  Not guaranteed: anything against someone who keeps
        renaming the file (they hold the lock, as a node would)."""
        horizon = self.c.lock_expiry + CLOCK_SLACK
        if t.expiry <= now + horizon and t.name not in self._seen:
            return t.expiry
        return min(t.expiry, self._seen.at(t.name, now) + horizon)

    def _from_listing(self) -> bool:
        marked, movers = self._scan()
        marked -= self._lost_files(marked - movers.keys())
        if not marked:
            token = secrets.token_hex(8)
            self.c.put_bytes(f"{self.dir}/lock.{token}", b"")
            self.c.put_bytes(f"{self.dir}/token.{token}", b"")  # after: a token is used once marked
            marked, movers = {token}, {token: Token(f"lock.{token}", token)}
        if len(marked) > 1:
            marked = self._prune(marked, movers)
        now = self.c.clock.now()

        def rank(t: Token) -> int:
            if t.node == self.c.node_id:
                return 0  # ours: a lost reply, or a previous run of this node (dead: ids are unique)
            return 1 if not t.held else 2 if self._expiry(t, now) <= now else 3

        for t in sorted((movers[i] for i in marked if i in movers), key=rank):
            if rank(t) == 3:
                break
            held = self._held_name(t.id)
            try:
                self.c.transport.rename(f"{self.dir}/{t.name}", f"{self.dir}/{held}")
            except NotFound:
                continue
            except FtpbcError as exc:
                if self._warned != t.name:  # a name the server will not rename: the next try
                    self._warned = t.name
                    log.warning("%s: cannot take over %s: %s: %s", self.dir, t.name,
                                type(exc).__name__, exc)
                continue
            if rank(t) == 2 and self._warned != t.name:
                self._warned = t.name
                self._took_over(t, now)
            return self._hold(t.id, held)
        self._token = min(marked)
        return False

    def _took_over(self, t: Token, now: float) -> None:
        """Say once which holder lost the lock, and why it was judged gone."""
        try:
            alive = t.node not in (None, "?") and self.c.heartbeat_age(t.node or "") is not None
        except FtpbcError:
            alive = False
        beat = "with a live heartbeat" if alive else "without a live heartbeat"
        holder = f"node {t.node} (process {t.run}), {beat}" if t.node != "?" else "nobody known"
        if t.expiry <= now:
            why = f"expired {now - t.expiry:.1f} s ago"
        elif t.node == "?":
            why = "its name is none a node writes"
        else:
            why = (f"its name claims an expiry {t.expiry - now:.0f} s ahead, more than lock_expiry "
                   f"{self.c.lock_expiry:g} s: believed for lock_expiry only")
        log.warning("%s: took over %s, held by %s: %s", self.dir, t.name, holder, why)

    def _drop(self, token: str, held: str) -> None:
        """Delete a token this process holds: its marker first (a crash in between leaves an
        unmarked lock file, which nobody uses), then the lock file."""
        for name in (f"token.{token}", held):
            try:
                self.c.transport.delete(f"{self.dir}/{name}")
            except NotFound:
                pass

    def _prune(self, marked: set[str], movers: dict[str, Token]) -> set[str]:
        """Of several tokens (created at once), the one with the smallest id stays: every other
        free one is taken (so that nobody holds it) and deleted.  Held ones are left to their
        holders, who delete them when they find the smaller one (:meth:`_hold`)."""
        keep = min(marked)
        left = set(marked)
        for i in sorted(marked - {keep}):
            t = movers.get(i)
            if t is None or t.held:
                continue
            held = self._held_name(i)
            try:
                self.c.transport.rename(f"{self.dir}/{t.name}", f"{self.dir}/{held}")
            except NotFound:
                continue
            self._drop(i, held)
            left.discard(i)
            log.info("%s: removed the extra lock token %s", self.dir, i)
        return left

    def _hold(self, token: str, held: str) -> bool:
        if token not in self._alone:
            # Is it the only token?  Two nodes that both found none made one each: the smallest
            # id stays (given back free, to be used once alone), the others are deleted by
            # their holders.  Only a holder deletes a token, never one in use, so a token in
            # use is always marked, and of two tokens in use one would have seen the other.
            marked, movers = self._scan()
            others = marked - {token}
            if others and token < min(others):
                # Ours is the token to keep: remove the free extra ones now.  Leaving that to
                # their holders is not enough: a holder that once saw its extra token alone
                # never checks again, so after it stopped using the lock nobody would remove
                # it, and this node would give its own token back on every try, for ever (four
                # hosts racing to create one sequence: a 30 s lock timeout).  A token another
                # node holds stays with it, and this node waits.
                others = self._prune(marked, movers) - {token}
            if others:
                try:
                    if token < min(others):
                        self.c.transport.rename(f"{self.dir}/{held}", f"{self.dir}/lock.{token}")
                    else:
                        self._drop(token, held)
                        log.info("%s: two lock tokens (created at once); removed %s", self.dir, token)
                except NotFound:
                    pass
                self._token = min(marked | {token})
                return False
            self._alone.add(token)
        with self._mutex:
            self._token = token
            self._held = held
            self._renew_at = time.monotonic() + self.c.lock_expiry / 3
        self.c.holding(self)
        return True

    def renew(self) -> None:
        """Push a held token's expiry forward once a third of it has passed (renewer thread)."""
        with self._mutex:
            if self._held is None or self._token is None or time.monotonic() < self._renew_at:
                return
            new = self._held_name(self._token)
            try:
                self.c.transport.rename(f"{self.dir}/{self._held}", f"{self.dir}/{new}")
            except NotFound:
                log.warning("%s: the lock was taken over while this node held it (held past its "
                            "expiry: a paused process?)", self.dir)
                self._held = None
                return
            self._held = new
            self._renew_at = time.monotonic() + self.c.lock_expiry / 3


class ServerSequences:
    """Cluster-wide sequences as files whose names hold their values (a
    :class:`~ftpbc.sequences.SharedSequences`; module docstring).

    Beside each value file ``<base>.<N>`` sits its marker ``<base>~created``, written once when
    the sequence is created and never renamed: a listing taken while another node draws may miss
    the value file (between its two names), never the marker, so "no marker" is what "no such
    sequence yet" means, and "a marker but no value" means "list again".
    """

    def __init__(self, coordination: ServerCoordination, *, lock_timeout: float = 30.0) -> None:
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
                    # Its value file is gone (module docstring): setting it is the repair.
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
        if base + _CREATED in names:
            return _top(names, base), names
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
            value = _top(names, base)
            if base + _CREATED in names:
                return value
            # Nobody draws from an unmarked sequence, so its value file (if a creation was cut
            # short after writing it) is not moving: this listing shows it.
            self.c.ensure_dir(directory)
            if endpoint is not None and "endpoint" not in names:
                self.c.put_bytes(f"{directory}/endpoint", endpoint.encode("utf-8") + b"\n")
            if value is None:
                value = 0
                self.c.put_bytes(f"{directory}/{base}.0", b"")
            self.c.put_bytes(f"{directory}/{base}{_CREATED}", b"")
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
                if base + _CREATED in names:
                    value = _top(names, base)
                    found.append(SequenceInfo("shared", endpoint, digit,
                                              PurePosixPath(directory) / f"{base}.{value}",
                                              value if value is not None else self.get("shared", endpoint,
                                                                                       digit)))
        directory = f"{self.c.dir}/sequences"
        names = {e.name for e in self._entries(directory)}
        for marker in sorted(n for n in names if n.endswith(_CREATED)):
            base = marker[:-len(_CREATED)]
            if SEQUENCE_NAME_RE.fullmatch(base):
                value = _top(names, base)
                if value is None:
                    value = self.get("global", None, base)
                found.append(SequenceInfo("global", None, base, PurePosixPath(directory) / f"{base}.{value}",
                                          value))
        return found


_CREATED = "~created"
#: the largest value a sequence holds: its value file's name has at most 18 digits
MAX_VALUE = 10 ** 18 - 1
_VALUE_RE = re.compile(r"0|[1-9][0-9]{0,17}")
#: how long a draw waits before listing again a sequence whose value file was out of sight
_LOOK_AGAIN = 0.02


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
        strays = sorted(n for n in names if n.startswith(base + ".") and _value(n, base) is None
                        and "." not in n[len(base) + 1:] and "~" not in n[len(base) + 1:])
        found = (f"found instead: {', '.join(repr(n) for n in strays[:3])}" if strays
                 else "nothing in its place")
        raise SequenceError(f"{self.path}: the sequence exists ({base}{_CREATED}) but has no value "
                            f"file {base}.<N> (N from 0 to {MAX_VALUE}, no leading zeros) in "
                            f"{self.misses} listings over {seconds:.1f} s; {found} in "
                            f"{directory}; set the sequence to repair it")


def _value(name: str, base: str) -> int | None:
    """The value a sequence's file name holds; None if it holds none (only the names a draw
    writes count: ASCII digits, no leading zero, at most 18 of them)."""
    if not name.startswith(base + "."):
        return None
    digits = name[len(base) + 1:]
    return int(digits) if _VALUE_RE.fullmatch(digits) else None


def _top(names: Iterable[str], base: str) -> int | None:
    values = [v for n in names if (v := _value(n, base)) is not None]
    return max(values) if values else None
