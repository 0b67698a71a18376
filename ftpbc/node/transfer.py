"""A transfer's poller and workers on a serving node, and its sweep of dead nodes' claims.

The poller is the endpoints' (:class:`~ftpbc.node.provider.Poller`): T_LOCK + F_LOCK, claim no
more than there are idle workers, hand claims to the workers.  With ``pre_receive: none`` nothing
is claimed: the poller itself handles each file while it holds the lock, so no other node reads
it meanwhile (one file at a time across the cluster, by design).
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.models import TransferConfig
from ftpbc.errors import NotFound, TransportError
from ftpbc.exchange.message import Message, result_bytes
from ftpbc.exchange.partner import Received, Transfer, key
from ftpbc.node.provider import SPOOL_IN_MEMORY, Poller

log = logging.getLogger("ftpbc.transfer")

Handler = Callable[[Message], object]


class TransferProvider(Poller):
    """Polls ``receive_from`` and calls the handler once per received file."""

    config: TransferConfig

    def __init__(self, transfer: Transfer, handler: Handler) -> None:
        super().__init__(transfer.name, transfer.config, transfer.poll_lock)
        self.transfer = transfer
        self.handler = handler

    def _poll_locked(self, free: int) -> int:
        picks = self.transfer.candidates(free)
        if self.config.pre_receive == "none":
            # Read in place: only holding the lock keeps other nodes off these files.  A file
            # that could not be handled stays and counts 0, so the poller waits before retrying.
            return sum(1 for r in picks if not self._stop.is_set() and self._handle(r))
        claimed, lost = self.transfer.claim(picks)
        for r in claimed:
            self._dispatch(functools.partial(self._serve_claimed, r), r.name)
        return self._claimed_count(len(claimed), lost)

    def _serve_claimed(self, received: Received) -> None:
        self._handle(received)

    def _handle(self, received: Received) -> bool:
        """Read, call the handler, record, commit and send; True once the file is done."""
        started = time.monotonic()
        tr = self.transfer
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            try:
                tr.read(received, spool)  # type: ignore[arg-type]
            except NotFound:
                # A claim vanished: a live node returned it, believing us dead.
                tr.unclaim(received)
                self.stats.add(lost_claims=1)
                return False
            except TransportError as exc:
                log.warning("%s: cannot read %s, leaving it for a later poll: %s", self.name,
                            received.path, exc)
                self._retry(lambda: tr.unclaim(received))
                return False
            uid = received.values.get("%u")
            message = Message(self.name, received.name, str(uid) if uid is not None else None, received.size,
                              spool, dict(received.values))  # type: ignore[arg-type]
            error: str | None = None
            result: bytes | None = None
            try:
                returned = self.handler(message)
                result = None if returned is None else result_bytes(returned)
            except Exception as exc:  # the handler is user code: any failure sends the file to error_dir
                error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:2000]
                log.warning("%s: handler failed on %s: %s", self.name, received.name, error)
        fields = tr.record_received(received, result, error=error)
        attempts = iter(range(1 << 30))
        ok = self._retry(lambda: tr.finish_received(received.op_id, fields, fresh=next(attempts) == 0))
        if ok is False:
            self.stats.add(lost_claims=1)
        elif ok:
            self.stats.add(served=1 if error is None else 0, failed=1 if error is not None else 0)
            with self.stats.lock:
                self.stats.latencies.append(time.monotonic() - started)
        return ok is not None


class TransferSweeper:
    """Returns dead nodes' claims of one transfer; the sweep runs under its own file lock."""

    def __init__(self, transfer: Transfer, state_dir: Path, lease: float) -> None:
        self.endpoint = key(transfer.name)
        self.transfer = transfer
        self.state_dir = state_dir
        self.lease = lease
        self.lock = PollLock(state_dir, f"{self.endpoint}.sweep", "file", holder=transfer.node_id,
                             lease=lease)
        self.returned = 0

    def sweep(self) -> None:
        with self.lock.attempt() as held:
            if held:
                self.returned += self.transfer.sweep(self.state_dir, self.lease)
