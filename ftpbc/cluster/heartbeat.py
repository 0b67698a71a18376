"""Node heartbeats in ``state_dir``: how a live node tells that another one is dead.

Each node (serving or client) rewrites ``<state_dir>/heartbeats/<node-id>`` every
``heartbeat_interval``.  A node whose file is older than the lease, or missing, is dead, and a
live node may return its claims and clean its stage files.  Clocks: the file's modification
time is set by the file server that holds ``state_dir``, and compared with this host's clock, so
hosts must keep their clocks within a small fraction of the lease (NTP).

The file's first line is ``<pid> <unix time> <host>``.  A serving node adds a second line, one
JSON object ``{"serves": {"endpoints": [...], "transfers": [...]}}`` (:class:`Serves`), so that
``ftpbc status`` can tell what each node serves.  A serving node that does not serve (yet: its
start-up is still failing) writes ``{"not_serving": "<why>"}`` there instead, with no ``serves``
key, so that no reader, an older one included, lists what it would serve as served.  Readers
split the first line only, so a heartbeat without the second line (a client's, or one written by
an older ftpbc) stays readable and older readers, which split the whole file and use its first
fields, are not disturbed.

A heartbeat whose host is this host and whose pid names no process here is dead whatever its
age (:func:`beat_info`): that node was killed.  This trusts that one host name is one process
namespace, as :func:`live_elsewhere` does.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftpbc.cluster.lease import Lease
from ftpbc.errors import ConfigError
from ftpbc.private_files import private_dir, write_private

log = logging.getLogger("ftpbc.heartbeat")


@dataclass(frozen=True)
class Serves:
    """What a serving node serves: published in its heartbeat for ``ftpbc status``."""

    endpoints: tuple[str, ...] = ()
    transfers: tuple[str, ...] = ()

    def line(self) -> str:
        """The heartbeat's second line.  ASCII only (``ensure_ascii``): the server heartbeat is
        written as ASCII, and a name must not turn into ``?`` on the way."""
        return json.dumps({"serves": {"endpoints": list(self.endpoints), "transfers": list(self.transfers)}},
                          separators=(",", ":"), ensure_ascii=True)

    @classmethod
    def parse(cls, line: str) -> Serves | None:
        """The second line back; None if it is not one (absent, torn, from a later format)."""
        try:
            raw: Any = json.loads(line)
            serves = raw["serves"]
            endpoints, transfers = serves.get("endpoints", []), serves.get("transfers", [])
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        names = (endpoints, transfers)
        if not all(isinstance(x, list) and all(isinstance(n, str) for n in x) for x in names):
            return None
        return cls(tuple(endpoints), tuple(transfers))

    def to_dict(self) -> dict[str, list[str]]:
        return {"endpoints": list(self.endpoints), "transfers": list(self.transfers)}


@dataclass(frozen=True)
class HeartbeatInfo:
    """One node's heartbeat as read by ``ftpbc status``: alive or not, and what it says."""

    node_id: str
    #: seconds since its last beat (on the clock that judges leases)
    age: float
    alive: bool
    pid: int | None = None
    host: str | None = None
    #: what it serves; None for a client, or a heartbeat written before nodes published it
    serves: Serves | None = None
    #: why a serving node does not serve (its start-up keeps failing); None otherwise
    not_serving: str | None = None
    #: its host is this host and its pid names no process here (dead before its lease ran out)
    process_gone: bool = False


def parse_heartbeat(text: str) -> tuple[list[str], Serves | None]:
    """The first line's fields and the :class:`Serves` of the second line (None if absent)."""
    first, _, rest = text.partition("\n")
    second = rest.split("\n", 1)[0].strip()
    return first.split(), Serves.parse(second) if second else None


def _pid_host(fields: list[str], host_field: int) -> tuple[int | None, str | None]:
    pid = int(fields[0]) if fields and fields[0].isdigit() else None
    return pid, fields[host_field] if len(fields) > host_field else None


def not_serving_reason(text: str) -> str | None:
    """The ``not_serving`` of a heartbeat's second line; None if it has none (it serves, or is a
    client's, torn, or from another format)."""
    second = text.partition("\n")[2].split("\n", 1)[0].strip()
    try:
        raw: Any = json.loads(second) if second else None
    except ValueError:
        return None
    why = raw.get("not_serving") if isinstance(raw, dict) else None
    return why if isinstance(why, str) else None


def beat_info(node_id: str, text: str, age: float, lease: float, *, host_field: int) -> HeartbeatInfo:
    """A :class:`HeartbeatInfo` from a heartbeat file's text and age; ``host_field`` is the index
    of the host among the first line's fields (2 in ``state_dir``, 3 on a server).

    Dead when older than ``lease``, or at once when its host is this host and its pid names no
    process here.  A live pid proves nothing (pids are reused): the age decides then."""
    fields, serves = parse_heartbeat(text)
    pid, host = _pid_host(fields, host_field)
    gone = host == _HOST and pid is not None and not process_alive(pid)
    return HeartbeatInfo(node_id, round(max(age, 0.0), 3), age <= lease and not gone, pid, host, serves,
                         not_serving_reason(text), gone)


class Heartbeat:
    """Rewrites this node's heartbeat every ``interval`` while ``health()`` says all is well.

    ``health`` returns None while the node's loops make progress, else the reason (see
    :class:`~ftpbc.cluster.liveness.Liveness`): the heartbeat then stops, so that other nodes
    take this node's work over after the lease, and starts again once the loops recover.
    """

    def __init__(self, state_dir: Path, node_id: str, interval: float, *,
                 health: Callable[[], str | None] | None = None) -> None:
        self.dir = Path(state_dir) / "heartbeats"
        self.path = self.dir / node_id
        self.interval = interval
        self.health = health
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: str | None = None
        self._failing: str | None = None
        #: what this node serves, written in every beat (set by a serving node before start)
        self.serves: Serves | None = None
        #: why this serving node does not serve yet; written instead of :attr:`serves` while set
        self.not_serving: str | None = None
        #: this node's lease, renewed by every beat written (set by the runtime before start)
        self.lease: Lease | None = None
        #: called from the heartbeat thread after each interval: with None once a beat was
        #: written, with the reason when the beat was held (a stuck loop); never after a write
        #: that failed.  What one raises is logged once and does not stop the heartbeat.
        self.observers: list[Callable[[str | None], None]] = []
        self._observer_failed: str | None = None

    def extra_lines(self) -> str:
        """What follows the first line: the :class:`Serves` line of a serving node, or its
        ``not_serving`` line while it does not serve."""
        why = self.not_serving
        if why is not None:
            # ASCII (ensure_ascii) as Serves.line, and one line whatever the reason holds
            return json.dumps({"not_serving": why}, separators=(",", ":"), ensure_ascii=True) + "\n"
        return f"{self.serves.line()}\n" if self.serves is not None else ""

    def beat(self) -> None:
        # 0700/0600 whatever the umask: another local user able to write here could keep a dead
        # node looking alive, or make a live one look dead.
        private_dir(self.dir)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        write_private(tmp, f"{os.getpid()} {time.time():.3f} {_HOST}\n{self.extra_lines()}".encode())
        os.replace(tmp, self.path)

    def leased_beat(self) -> None:
        """:meth:`beat`, then renew :attr:`lease` from the time taken before the write was
        issued (a slow write counts against the lease); a failed write renews nothing."""
        if self.lease is None:
            self.beat()
            return
        started = self.lease.now()
        self.beat()
        self.lease.renewed(started)

    def start(self) -> None:
        if self.lease is not None:
            self.lease.arm()
        try:
            self.leased_beat()
        except OSError as exc:
            # The first write into state_dir: a path below a file, a read-only or full disk is
            # the operator's to fix, said in one line rather than a traceback.
            raise ConfigError(f"cannot write {exc.filename or self.dir}: {exc.strerror or exc}",
                              key="node.state_dir") from None
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat_if_healthy()
            except Exception as exc:  # never dies: the next interval tries again
                if str(exc) != self._failing:
                    log.warning("heartbeat %s: cannot write it: %s: %s (other nodes will take this "
                                "node's work over after the lease)", self.path, type(exc).__name__, exc)
                self._failing = str(exc)

    def _beat_if_healthy(self) -> None:
        why = self.health() if self.health is not None else None
        if why is not None:
            if why.split(" made no progress", 1)[0] != (self._held or "").split(" made no progress", 1)[0]:
                log.error("heartbeat stopped: %s; other nodes will take this node's work over after "
                          "the lease", why)
            self._held = why
            self._tell(why)
            return
        if self._held is not None:
            log.warning("heartbeat resumed: every loop makes progress again")
            self._held = None
        self.leased_beat()
        if self._failing is not None:
            log.warning("heartbeat %s: written again", self.path)
            self._failing = None
        self._tell(None)

    def _tell(self, held: str | None) -> None:
        for observer in list(self.observers):
            try:
                observer(held)
            except Exception as exc:  # an observer's fault is not the heartbeat's
                if str(exc) != self._observer_failed:
                    log.warning("heartbeat %s: an observer failed: %s: %s", self.path,
                                type(exc).__name__, exc)
                self._observer_failed = str(exc)

    def stop(self, *, remove: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def live_elsewhere(state_dir: Path, node_id: str, lease: float) -> str | None:
    """Who else holds ``node_id`` (a heartbeat younger than ``lease`` from another host, or from
    another live process of this host), as a sentence; None if nobody does."""
    path = Path(state_dir) / "heartbeats" / node_id
    try:
        age = time.time() - path.stat().st_mtime
        fields = path.read_text(encoding="utf-8", errors="replace").split()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if age > lease or len(fields) < 2:
        return None
    host = fields[2] if len(fields) > 2 else _HOST
    pid = int(fields[0]) if fields[0].isdigit() else 0
    if host == _HOST and (pid == os.getpid() or not process_alive(pid)):
        return None
    where = f"host {host}" if host != _HOST else f"process {pid} of this host"
    return (f"node id {node_id!r} is live on {where} (heartbeat {age:.0f} s ago in {path.parent}); give "
            f"this node another id (--node-id), or wait {lease - age:.0f} s if that node is gone")


def process_alive(pid: int) -> bool:
    """Whether a process of this host with that pid exists (another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HOST = socket.gethostname().replace(" ", "-") or "localhost"


def read_heartbeats(state_dir: Path, lease: float, *, now: float | None = None) -> list[HeartbeatInfo]:
    """Every heartbeat in ``state_dir`` (serving nodes and clients), alive or dead, by node id."""
    directory = Path(state_dir) / "heartbeats"
    now = time.time() if now is None else now
    out: list[HeartbeatInfo] = []
    if not directory.is_dir():
        return out
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue  # .<id>.tmp: a beat being written (renamed into place whole)
        try:
            age = now - path.stat().st_mtime
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue  # removed meanwhile: a node that stopped cleanly
        out.append(beat_info(path.name, text, age, lease, host_field=2))
    return out


def is_dead(state_dir: Path, node_id: str, lease: float) -> bool:
    """True if ``node_id`` has no heartbeat younger than ``lease`` seconds."""
    try:
        age = time.time() - (Path(state_dir) / "heartbeats" / node_id).stat().st_mtime
    except FileNotFoundError:
        return True
    return age > lease
