"""systemd's notify protocol for ``ftpbc serve`` under ``Type=notify`` (deploy/systemd/).

systemd passes ``$NOTIFY_SOCKET``, a datagram socket (a path, or ``@name`` in the abstract
namespace); each message is one datagram of ``KEY=value`` lines.  A node says:

* ``READY=1`` once it really serves (its start-up succeeded: what ``/readyz`` answers 200 for),
  never before, however long its servers keep it waiting;
* ``WATCHDOG=1`` after each heartbeat it writes, and only then: a node whose loops are stuck
  stops its heartbeat, so it stops petting the watchdog too, and systemd acts on it after
  ``WatchdogSec``;
* ``STOPPING=1`` when it starts draining;
* ``STATUS=...`` on each change of what it is doing: ``not serving: <why>`` while its start-up
  fails, ``serving ...``, ``heartbeat stopped: <why>``, ``draining``.

Guaranteed: nothing is sent without ``$NOTIFY_SOCKET`` (a node run by hand behaves as before);
a message that cannot be sent (no listener, a full socket buffer) is dropped and logged once,
never raised into the node.  Not guaranteed: that systemd received anything (datagrams are not
acknowledged), nor that ``WatchdogSec`` suits the heartbeat interval (:func:`watchdog_warning`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping

log = logging.getLogger("ftpbc.systemd")

#: systemd reads at most this much of a STATUS= value usefully; longer reasons are cut
MAX_STATUS = 1000


def notify_address(value: str) -> str | bytes:
    """The address of ``$NOTIFY_SOCKET``: a filesystem path, or ``@name`` in the abstract
    namespace (a leading NUL byte on the wire).  Raises ValueError for anything else."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    raise ValueError(f"NOTIFY_SOCKET: {value!r} is neither an absolute path nor an @abstract name")


def one_line(text: str) -> str:
    """``text`` as one bounded line: a STATUS= value may hold no newline."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_STATUS else flat[: MAX_STATUS - 3] + "..."


class Notifier:
    """Sends notify messages to ``$NOTIFY_SOCKET``; does nothing without it.  Thread-safe."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address: str | bytes | None = None
        raw = env.get("NOTIFY_SOCKET", "")
        if raw:
            try:
                self.address = notify_address(raw)
            except ValueError as exc:
                log.warning("%s; not notifying systemd", exc)
        #: systemd's watchdog timeout for this process in seconds (WATCHDOG_USEC), None if off
        self.watchdog: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog = int(usec) / 1e6
        self._lock = threading.Lock()
        self._status: str | None = None
        self._stopping = False
        self._failed: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send ``lines`` as one datagram; True if it left this process."""
        if self.address is None:
            return False
        data = "\n".join(lines).encode("utf-8", errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(1.0)  # a full receive buffer must not hold the heartbeat up
                sock.sendto(data, self.address)
        except OSError as exc:
            with self._lock:
                if str(exc) != self._failed:
                    log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET", ""), exc)
                self._failed = str(exc)
            return False
        return True

    def status(self, text: str) -> None:
        """``STATUS=text``, sent only when it differs from the last one sent, and not once the
        node drains (the heartbeat goes on beating meanwhile; ``draining`` stays the status)."""
        line = one_line(text)
        with self._lock:
            if line == self._status or self._stopping:
                return
            self._status = line
        self.send(f"STATUS={line}")

    def ready(self, status: str) -> None:
        with self._lock:
            self._status = one_line(status)
        self.send("READY=1", f"STATUS={one_line(status)}")

    def watchdog_ping(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        with self._lock:
            self._status, self._stopping = "draining", True
        self.send("STOPPING=1", "STATUS=draining")


def watchdog_warning(watchdog: float | None, heartbeat_interval: float) -> str | None:
    """Why systemd's watchdog would kill a healthy node (it is pet once per heartbeat), or None."""
    if watchdog is None or watchdog >= 3 * heartbeat_interval:
        return None
    return (f"WatchdogSec ({watchdog:g} s) is less than three heartbeat intervals "
            f"(node.heartbeat_interval {heartbeat_interval:g} s): systemd may kill a healthy node; "
            f"raise WatchdogSec or lower heartbeat_interval")
