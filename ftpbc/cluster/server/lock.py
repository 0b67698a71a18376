"""Poll locks on the coordination server: tokens taken, renewed and given back by renaming
(package docstring: "Locks"; the ``state_dir`` side is :mod:`ftpbc.cluster.poll_lock`)."""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable

from ftpbc.cluster.poll_lock import PollLock
from ftpbc.cluster.server.clock import CLOCK_SLACK, FirstSeen
from ftpbc.cluster.server.heartbeat import ServerHeartbeats
from ftpbc.cluster.server.names import TOKEN_ID_RE, Token, safe_key
from ftpbc.errors import FtpbcError, NotFound, OutcomeUnknown
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.cluster")

#: a process that lost a lock race lists the lock's directory at most this often (seconds):
#: enough to see an expiry (seconds away) or a new token, without a listing per poll
RESCAN = 1.0
#: a token's lock file missing from this many listings in a row (and for lock_expiry) is gone
LOST_LISTINGS = 3


class ServerLocks(ServerHeartbeats):
    """The poll locks of ``locks/<key>``, and the thread that renews those this process holds."""

    def __init__(self, transport: Transport, directory: str, node_id: str, lease: float, *,
                 lock_expiry: float = 10.0, display: str | None = None,
                 host_time: Callable[[], float] = time.time) -> None:
        super().__init__(transport, directory, node_id, lease, lock_expiry=lock_expiry,
                         display=display, host_time=host_time)
        self._held: weakref.WeakSet[ServerLock] = weakref.WeakSet()
        self._held_lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    def poll_lock(self, key: str, mode: str) -> PollLock:
        name = f"{self.display}/locks/{safe_key(key)}"
        if mode != "file":
            return PollLock.over(name, None)
        return PollLock.over(name, ServerLock(self, f"{self.dir}/locks/{safe_key(key)}"))

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

    def stop_renewing(self) -> None:
        """Stop the renewer (the locks still held then expire after ``lock_expiry``)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)


class ServerLock:
    """The poll lock's cross-node part on the server: one token in ``dir`` (package docstring).

    A token is two files: ``token.<id>``, its marker, created once and never renamed, and
    ``lock.<id>``, renamed to take, renew and give back the lock.  Every decision about which
    tokens exist is made from the markers: a listing made while another node renames a file may
    show neither its old name nor its new one (servers read the directory, then stat each
    name), whereas an entry nobody touches is always listed.

    Implements :class:`~ftpbc.cluster.poll_lock.CrossLock`; called under the T_LOCK, so by one
    thread of the process at a time, while the renewer thread may renew a held token.
    """

    def __init__(self, coordination: ServerLocks, directory: str) -> None:
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
            if e.name.startswith("token.") and TOKEN_ID_RE.fullmatch(e.name[6:]):
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
