"""The message lifecycle, written once above the transport: stage, expose, claim, read, serve,
collect, archive, each remote write preceded by its journal record.

Who calls what
    a client      :meth:`Exchange.send` a request, then :meth:`claim` / :meth:`read` /
                  :meth:`finish_collect` its response;
    a provider    :meth:`claim` / :meth:`read` a request, then :meth:`record_served` and
                  :meth:`finish_served`.

The provider's order is what makes a crash decidable from the server alone::

    served (durable record with the result)  ->  put outstage/resp.X~me
      -> commit: rename inselect/req.X~me -> inarchive/req.X~me~stamp   (ownership)
      -> expose: rename outstage/resp.X~me -> outbox/resp.X

If the commit finds its source gone, another node returned this node's claim (it looked dead)
and may serve the request: this node deletes its staged response instead of exposing it, so a
slow node never causes a second response.  Recovery (``journal/recovery.py``) uses the same order
to decide every pending operation with a few ``stat`` calls.
"""

from __future__ import annotations

import io
import logging
import threading
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO

from ftpbc.errors import IncompleteRead, NotFound, OutcomeUnknown, SourceGone
from ftpbc.exchange.area import (
    ERROR_REPLY_SUFFIX,
    REASON_SUFFIX,
    Direction,
    ExchangeArea,
    archive_name,
    claim_name,
)
from ftpbc.faults import crash_point
from ftpbc.journal import EndpointJournal, Operation
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.lifecycle")

Body = bytes | BinaryIO


#: ``Claimed.size`` of a claim found in the journal rather than in a listing
UNKNOWN_SIZE = -1


@dataclass(frozen=True)
class Claimed:
    """A file this node claimed into a select directory."""

    direction: Direction
    name: str  # the name it had in the box, e.g. req.<uuid>
    path: str  # where it is now, e.g. /q/inselect/req.<uuid>~node-a
    op_id: str
    uuid: str | None
    size: int  # as listed, or UNKNOWN_SIZE


def op_id_for(uuid: str | None, role: str) -> str:
    """Journal operation id: the message's UUID plus its role (one op per role per message)."""
    return f"{uuid or uuidlib.uuid4()}.{role}"


def _stream(body: Body) -> BinaryIO:
    return io.BytesIO(body) if isinstance(body, bytes | bytearray) else body


def rename_resolving(transport: Transport, src: str, dst: str) -> None:
    """Rename, resolving a lost reply (OutcomeUnknown) from the server's state.

    SourceGone propagates when ``src`` was never there.
    """
    try:
        transport.rename(src, dst)
    except OutcomeUnknown:
        if transport.exists(src):
            transport.rename(src, dst)
        # else the first rename happened (the target may already be claimed by a consumer)


def claim_files(transport: Transport, journal: EndpointJournal, plan: Sequence[tuple[str, str, str]],
                *, intent_point: str, rename_point: str, durable: bool = True) -> set[int]:
    """Claim ``(op_id, src, dst)`` files by renaming; return the indexes of the claims won.

    One batch of ``claim`` records (src, dst) comes first, so recovery can return every claim
    (rename dst -> src); ``durable`` makes it one fsync per poll.  A lost race ends its
    operation at once.
    """
    journal.record_many([(op, "claim", {"src": src, "dst": dst}) for op, src, dst in plan],
                        durable=durable)
    crash_point(intent_point)
    won: set[int] = set()
    for i, (op, src, dst) in enumerate(plan):
        try:
            transport.rename(src, dst)
        except SourceGone:
            journal.end(op)
            continue
        except OutcomeUnknown:
            if not transport.exists(dst):
                journal.end(op)
                continue
        crash_point(rename_point)
        won.add(i)
    return won


class Exchange:
    """One endpoint's exchange area as seen by one node."""

    def __init__(self, endpoint: str, area: ExchangeArea, transport: Transport,
                 journal: EndpointJournal, node_id: str, *, archive: bool = True,
                 response_prefix: str = "resp.",
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.endpoint = endpoint
        self.area = area
        self.transport = transport
        self.journal = journal
        self.node_id = node_id
        self.archive = archive
        self.response_prefix = response_prefix
        self.clock = clock
        self._prepared = False
        self._prepare_lock = threading.Lock()

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Create the exchange area's directories that are missing (once per process)."""
        with self._prepare_lock:
            if self._prepared:
                return
            for d in self.area.all_dirs():
                self.transport.mkdir(d)
            self._prepared = True

    # ------------------------------------------------------------------ sending

    def send(self, direction: Direction, name: str, body: Body, *, op_id: str, kind: str) -> str:
        """Stage ``body`` under ``name`` and expose it in the box; return the exposed path.

        ``kind`` is ``request`` or ``oneway``: responses are never sent this way (they are
        staged and exposed by :meth:`finish_served`, whose commit proves the upload complete).
        On return the file is visible, complete, in ``<direction>box``.  If this raises, the
        journal still holds the intent and recovery rolls it back.
        """
        stage = self.area.path(direction, "stage", claim_name(name, self.node_id))
        target = self.area.path(direction, "box", name)
        # Not fsynced: written before the put, it survives a kill of this process (the page
        # cache outlives it); after a machine crash, recovery finds the stage file by the node
        # id in its name instead (recovery.recover_orphans).  Only results need fsync.
        self.journal.record(op_id, "send", kind=kind, stage=stage, target=target)
        crash_point("send.after-intent")
        self.transport.put(stage, _stream(body))
        crash_point("send.after-put")
        try:
            self._rename_resolving(stage, target)
        except SourceGone:
            # A sweeper removed our staged file, judging this node dead (its heartbeat was
            # older than the lease).  The message was never exposed: say so.
            self.journal.end(op_id)
            raise
        crash_point("send.after-expose")
        self.journal.end(op_id)
        return target

    def expose(self, stage: str, target: str) -> None:
        """Rename a staged response into place; a sweeper having done it already is fine."""
        try:
            self._rename_resolving(stage, target)
        except SourceGone:
            log.warning("%s: %s was no longer staged; another node exposed it", self.endpoint, stage)

    def _rename_resolving(self, stage: str, target: str) -> None:
        rename_resolving(self.transport, stage, target)

    # ------------------------------------------------------------------ claiming and reading

    def claim(self, direction: Direction, names: Sequence[tuple[str, str | None, int]],
              role: str) -> tuple[list[Claimed], int]:
        """Claim ``(name, uuid, size)`` files from the box; return (claimed, races lost).

        One journal record batch covers the whole poll.  It is not fsynced: claims carry this
        node's id in their names, so after a machine crash recovery finds them by listing the
        select directory (recovery.recover_orphans); a killed process leaves the records in the
        page cache, which outlives it.
        """
        if not names:
            return [], 0
        plan = [(name, uid, size, op_id_for(uid, role),
                 self.area.path(direction, "box", name),
                 self.area.path(direction, "select", claim_name(name, self.node_id)))
                for name, uid, size in names]
        won = claim_files(self.transport, self.journal, [(op, src, dst) for _, _, _, op, src, dst in plan],
                          intent_point="claim.after-intent" if role == "serve" else "collect.after-intent",
                          rename_point="claim.after-rename" if role == "serve" else "collect.after-claim",
                          durable=False)
        claimed = [Claimed(direction, name, dst, op, uid, size)
                   for i, (name, uid, size, op, _, dst) in enumerate(plan) if i in won]
        return claimed, len(plan) - len(claimed)

    def read(self, claimed: Claimed, sink: BinaryIO) -> int:
        """Read a claimed file into ``sink``; return its size.

        Raises IncompleteRead when the byte count differs from the listed size (``claimed.size``
        unless it is ``UNKNOWN_SIZE``): files are complete when they enter a box and never change
        there, so a short read is a transfer fault even if the server said it succeeded, and a
        handler must not see half a message.
        """
        got = self.transport.get(claimed.path, sink)
        if claimed.size != UNKNOWN_SIZE and got != claimed.size:
            raise IncompleteRead(f"read {got} bytes of a file listed with {claimed.size}",
                                 server=self.transport.server, path=claimed.path)
        return got

    def unclaim(self, claimed: Claimed) -> None:
        """Put a claimed file back in its box for anyone to take (a failed read, a shutdown)."""
        try:
            self.transport.rename(claimed.path, self.area.path(claimed.direction, "box", claimed.name))
        except SourceGone:
            pass
        self.journal.end(claimed.op_id)

    # ------------------------------------------------------------------ provider: completing

    def response_name(self, uuid: str, *, error: bool) -> str:
        return f"{self.response_prefix}{uuid}{ERROR_REPLY_SUFFIX if error else ''}"

    def record_served(self, claimed: Claimed, result: bytes, *, error: str | None,
                      respond: bool) -> dict[str, str]:
        """Durably record the handler's outcome; return the fields :meth:`finish_served` needs.

        ``error`` is the handler's failure reason (the request goes to ``inerror``, the caller
        gets an error reply).  ``respond`` is False for one-way messages.  Once this returns,
        the handler must never run again for this request: recovery sends the recorded result.
        """
        when = self.clock()
        arch_kind = "error" if error is not None else "archive"
        archived = self.area.path("in", arch_kind, archive_name(claimed.name, self.node_id, when))
        fields = {"claim": claimed.path, "archived": archived, "request": claimed.name}
        if respond and claimed.uuid:
            reply = error.encode("utf-8") if error is not None else result
            resp = self.response_name(claimed.uuid, error=error is not None)
            fields["resp_stage"] = self.area.path("out", "stage", claim_name(resp, self.node_id))
            fields["resp_target"] = self.area.path("out", "box", resp)
            fields.update(self.journal.save_result(claimed.op_id, reply))
        if error is not None:
            fields["reason"] = error
        self.journal.record(claimed.op_id, "served", durable=True, **fields)
        crash_point("serve.after-result")
        return fields

    def finish_served(self, op_id: str, fields: dict[str, str], *, fresh: bool = False) -> bool:
        """Carry a ``served`` operation to its end; idempotent, so recovery calls it too.

        ``fresh`` says the caller has just recorded the result and nothing since touched the
        server, so the claim is known to be there and no response staged: the two ``stat`` round
        trips that recovery needs are skipped on the hot path.  Returns False when this node had
        lost the claim (another node serves the request).
        """
        t = self.transport
        claim, archived = fields["claim"], fields["archived"]
        resp_stage, resp_target = fields.get("resp_stage"), fields.get("resp_target")
        staged = False if fresh else resp_stage is not None and t.exists(resp_stage)
        if fresh or t.exists(claim):
            if resp_stage:
                # Uploaded again even when found staged: a node killed mid-upload leaves a torn
                # file there, and only the commit below proves an upload was complete.
                t.put(resp_stage, io.BytesIO(self.journal.load_result(fields)))
                staged = True
                crash_point("serve.after-stage")
            try:
                t.rename(claim, archived)
            except SourceGone:
                return self._lost(op_id, resp_stage if staged else None)
            except OutcomeUnknown:
                # The reply was lost (say, the server restarted): decide from what is there now.
                if not t.exists(archived):
                    if t.exists(claim):
                        raise  # the rename did not happen: the caller retries this whole step
                    return self._lost(op_id, resp_stage if staged else None)
            crash_point("serve.after-commit")
        elif not t.exists(archived):
            # Not in select, not archived: either our claim was returned to the inbox while we
            # looked dead, or (archive off) everything already finished.  Never expose then.
            return self._lost(op_id, resp_stage if staged else None)
        if "reason" in fields:
            reason_path = archived + REASON_SUFFIX
            if not t.exists(reason_path):
                t.put(reason_path, io.BytesIO(fields["reason"].encode("utf-8") + b"\n"))
        if resp_stage and resp_target and staged:
            self.expose(resp_stage, resp_target)
            crash_point("serve.after-expose")
        if not self.archive and "reason" not in fields:
            try:
                t.delete(archived)
            except NotFound:
                pass
        self.journal.end(op_id)
        return True

    def _lost(self, op_id: str, staged_response: str | None) -> bool:
        if staged_response:
            try:
                self.transport.delete(staged_response)
            except NotFound:
                pass
        log.warning("%s: %s: claim lost to another node before commit; reply withheld",
                    self.endpoint, op_id)
        self.journal.end(op_id)
        return False

    # ------------------------------------------------------------------ client: collecting

    def collect_claim(self, op: Operation) -> Claimed:
        """The response claim a pending ``collect`` operation made (for reclaim and recovery)."""
        name = op.fields["src"].rsplit("/", 1)[-1]
        return Claimed("out", name, op.fields["dst"], op.op_id, op.op_id.removesuffix(".collect"),
                       UNKNOWN_SIZE)

    def mark_delivered(self, claimed: Claimed) -> None:
        """Note that a response was handed to its caller but is not archived yet; from now on
        reclaim and recovery archive it rather than return it to the outbox.  Not fsynced:
        after a machine crash the response goes back to the outbox and a later collect delivers
        it again (at least once)."""
        self.journal.record(claimed.op_id, "delivered")

    def finish_collect(self, claimed: Claimed) -> None:
        """Archive (or delete) a response that has been read, and end its operation."""
        if self.archive:
            target = self.area.path("out", "archive", archive_name(claimed.name, self.node_id, self.clock()))
            try:
                self.transport.rename(claimed.path, target)
            except SourceGone:
                pass
        else:
            try:
                self.transport.delete(claimed.path)
            except NotFound:
                pass
        crash_point("collect.after-archive")
        self.journal.end(claimed.op_id)
