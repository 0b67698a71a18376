"""What goes out (:mod:`ftpbc.exchange.lifecycle`'s outbound floor): a message or a partner's
file staged and exposed (:meth:`OutboundSteps.send`), a transaction's members staged for their
commit (:meth:`~OutboundSteps.stage`), a staged file put in place, its target protected first
(:meth:`~OutboundSteps.expose`, :func:`expose_each`), and a recorded reply staged whole for the
node that serves a returned request (:meth:`~OutboundSteps.staged_reply` finds one).

Each send is journaled before its upload; on return it is visible and complete, and if it
raises, recovery rolls it back from the journal.
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from ftpbc.errors import NotFound, OutcomeUnknown, QueueFull, SourceGone, TransportError
from ftpbc.exchange.area import split_stage
from ftpbc.exchange.bounds import READ_MARGIN, BoundedSink, body_length, check_body
from ftpbc.exchange.layout import AreaLayout, Outbound
from ftpbc.exchange.steps import HOOKS, Claimed, Steps, rename_resolving, write_reason
from ftpbc.faults import crash_point
from ftpbc.model.envelope import EXPIRED_TYPE
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.lifecycle")

Body = bytes | BinaryIO
#: handler results and files this large stay in memory; larger ones spool to disk
SPOOL_IN_MEMORY = 4 * 1024 * 1024


@dataclass(frozen=True)
class StagedReply:
    """A complete reply another node staged (:meth:`OutboundSteps.staged_reply`)."""

    path: str
    #: the node that staged it
    owner: str
    body: bytes
    #: an error reply (its body is the reason), of ``reply_type`` (None: the plain error type)
    error: bool
    reply_type: str | None


def _stream(body: Body) -> BinaryIO:
    return io.BytesIO(body) if isinstance(body, bytes | bytearray) else body


def expose_each(items: Sequence[tuple[OutboundSteps, Outbound]]) -> list[TransportError | None]:
    """:meth:`OutboundSteps.expose` of several complete staged files (``staged=True``), with the
    renames of those on one server sent together (:meth:`Transport.rename_each`: one round trip
    on FTP where one each takes one).  Per item, in order: None once it is in place, or the
    TransportError exposing it raised (SourceGone: its stage file was not there).  Every item is
    tried whatever happens to the others; one with a protect or final step is exposed alone.
    """
    outcomes: list[TransportError | None] = [None] * len(items)
    #: transport id -> (the transport, indexes of the items renamed there together)
    together: dict[int, tuple[Transport, list[int]]] = {}
    for i, (lc, out) in enumerate(items):
        if out.stage is None or out.protect or out.final:
            try:
                lc.expose(out, staged=True, body=None)
            except TransportError as exc:
                outcomes[i] = exc
            continue
        try:
            lc.layout.ensure_dir(lc.transport, out.target)
        except TransportError as exc:
            outcomes[i] = exc
            continue
        together.setdefault(id(lc.transport), (lc.transport, []))[1].append(i)
    for t, indexes in together.values():
        pairs = []
        for i in indexes:
            stage = items[i][1].stage
            assert stage is not None  # checked above
            pairs.append((stage, items[i][1].target))
        for i, (src, dst), outcome in zip(indexes, pairs, t.rename_each(pairs), strict=True):
            if isinstance(outcome, OutcomeUnknown):
                try:  # as rename_resolving: the stage still there means it did not happen
                    if t.exists(src):
                        rename_resolving(t, src, dst)
                    outcome = None
                except TransportError as exc:
                    outcome = exc
            outcomes[i] = outcome
    return outcomes


class OutboundSteps(Steps):
    """Sending, staging and exposing (see the module's docstring)."""

    # ------------------------------------------------------------------ sending

    def send(self, out: Outbound, body: Body, *, op_id: str, kind: str) -> str:
        """Stage ``body`` and expose it at ``out``; return where it is once in place.

        On return the file is visible and complete.  If this raises, the journal still holds the
        intent and recovery rolls it back (a staged file is removed: the sender never got an
        acknowledgement).

        A send to a bounded inbox counts it first (:mod:`ftpbc.exchange.capacity`): when full,
        QueueFull is raised before anything is staged or journaled, or (``on_overflow:
        dead_letter``) the message goes the same way into the dead letters instead, and a
        request raises QueueFull once it is filed there (no reply can come).
        """
        check_body(body, self.max_message_bytes, f"{self.name}: message for {out.target}")
        name = out.target.rsplit("/", 1)[-1]
        if self.capacity is None or out.target != self.layout.box_path(name):
            return self._send(out, body, op_id=op_id, kind=kind)
        with self.capacity.admit(name, body_length(body)) as full:
            if full is None:
                return self._send(out, body, op_id=op_id, kind=kind)
        when = self.clock()
        # The same stage, another target: journaled and recovered like any send, and the name
        # keeps every header the sender gave.
        dead = Outbound(self.layout.filed_path(self.layout.dead_dir, name, self.node_id, when), out.stage)
        this = f" and this message has {full.size} bytes" if full.limit == "max_bytes" and full.size else ""
        reason = (f"overflow: {full.messages} message(s) of {full.waiting_bytes} bytes waiting in "
                  f"{self.layout.box}, {full.limit} is {full.bound}{this}; filed by node {self.node_id} "
                  f"at {when.isoformat(timespec='milliseconds')}, never delivered")
        where = self._send(dead, body, op_id=op_id, kind=kind, reason=reason)
        log.warning("%s: queue full (%s %d): %s filed as a dead letter", self.name, full.limit,
                    full.bound, name)
        if kind == "request":
            raise QueueFull(full.endpoint, full.limit, full.bound, full.messages, full.waiting_bytes,
                            full.size, filed=where)
        return where

    def _send(self, out: Outbound, body: Body, *, op_id: str, kind: str, reason: str | None = None) -> str:
        """:meth:`send` once its bound is decided.  ``reason``: the message is being filed (a
        dead letter); ``<where>.reason`` is put beside it once it is in place, and the reason is
        in the journal record, so recovery puts it when a crash came first."""
        # Not fsynced: written before the put, it survives a kill of this process (the page
        # cache outlives it); after a machine crash, recovery finds the stage file by the node
        # id in its name instead (recovery.recover_orphans).  Only results need fsync.
        fields = {"kind": kind, **out.fields(), **({"reason": reason} if reason is not None else {})}
        self.journal.record_many([(op_id, "send", fields)], durable=False)
        crash_point("send.after-intent")
        if out.stage:
            self.layout.ensure_dir(self.transport, out.stage)
            self.transport.put(out.stage, _stream(body))
            crash_point("send.after-put")
        try:
            where = self.expose(out, staged=True, body=lambda: _stream(body))
        except SourceGone:
            # A sweeper removed our staged file, judging this node dead (its heartbeat was
            # older than the lease).  The message was never exposed: say so.
            self.journal.end(op_id)
            raise
        crash_point("send.after-expose")
        if reason is not None:
            if self.filed_dead(where):
                self.observer.dead_lettered()
            try:
                write_reason(self.transport, where, reason, stage=self.layout.reason_stage,
                             node_id=self.node_id)
            except TransportError as exc:
                # The message is filed: failing the send now would have it sent again.
                log.warning("%s: %s: could not write its reason file: %s", self.name, where, exc)
        self.journal.end(op_id)
        return where

    def stage(self, out: Outbound, body: Body, *, op_id: str, kind: str, tx: str) -> None:
        """The first half of :meth:`send` for a member of transaction ``tx``: journal the send
        (its record names the transaction), upload to the stage; nothing is exposed.

        The transaction (:mod:`ftpbc.exchange.transaction`) exposes its members with
        :meth:`expose` once its commit record is durable.  Until then recovery rolls the member
        back like any staged send; after it, the transaction's recovery rolls it forward.
        """
        if not out.stage:
            raise ValueError(f"{self.name}: {out.target} has no stage: it cannot be sent in a transaction")
        check_body(body, self.max_message_bytes, f"{self.name}: message for {out.target}")
        # Not fsynced, as a send's record: the commit record is, and it names every member.
        self.journal.record_many([(op_id, "send", {"kind": kind, "tx": tx, **out.fields()})], durable=False)
        self.layout.ensure_dir(self.transport, out.stage)
        self.transport.put(out.stage, _stream(body))

    def upload_stage(self, out: Outbound, body: Body) -> None:
        """Upload ``body`` to ``out.stage``, journaling and checking nothing: for a transaction
        whose own record named this stage before the upload, so that its recovery removes it,
        and that checked the body's size against :attr:`max_message_bytes` before that record
        (a fan-out's copies: :meth:`Transaction.stage_copies
        <ftpbc.exchange.transaction.Transaction.stage_copies>`)."""
        if not out.stage:
            raise ValueError(f"{self.name}: {out.target} has no stage: it cannot be sent in a transaction")
        self.layout.ensure_dir(self.transport, out.stage)
        self.transport.put(out.stage, _stream(body))

    def expose(self, out: Outbound, *, staged: bool, body: Callable[[], BinaryIO] | None) -> str:
        """From a complete staged file (or, unstaged, from ``body``) to target and final names.

        ``staged``: the stage file is known to hold the whole message.  Idempotent: after a crash
        or a lost reply, a step whose source is gone had happened already.
        """
        t, layout = self.transport, self.layout
        if out.stage:
            if staged:
                self._protect(out)
                layout.ensure_dir(t, out.target)
                rename_resolving(t, out.stage, out.target)
        elif body is not None:
            self._protect(out)
            layout.ensure_dir(t, out.target)
            t.put(out.target, body())
        if out.final:
            layout.ensure_dir(t, out.final)
            try:
                rename_resolving(t, out.target, out.final)
            except SourceGone:
                if not t.exists(out.final):
                    log.warning("%s: %s was gone before its post_send rename to %s (taken already?)",
                                self.name, out.target, out.final)
        return out.where

    def _protect(self, out: Outbound) -> None:
        """Move (or copy) an existing target aside before a new file takes its name."""
        if not out.protect:
            return
        t = self.transport
        self.layout.ensure_dir(t, out.protect)
        if not out.protect_copy:
            try:
                rename_resolving(t, out.target, out.protect)
            except SourceGone:
                pass  # no existing target: nothing to protect
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            try:
                t.get(out.target, spool)  # type: ignore[arg-type]
            except NotFound:
                return
            spool.seek(0)
            t.put(out.protect, spool)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ replies staged for another node

    def staged_reply(self, claimed: Claimed) -> StagedReply | None:
        """A complete reply to ``claimed`` staged on the server by a node whose claim on it went
        back (it looked dead, or was stopped or cut off after staging), or None: there is none,
        or none provably complete (a staged reply is complete when its size is the one its name
        declares).  :meth:`~ftpbc.exchange.settlement.SettlementSteps.adopt` records it.

        Only requests that came back (a delivery count above zero) can have one, so only those
        cost the listing of the stage directory; a duplicate never takes one."""
        c = claimed.candidate
        if (c.envelope.headers.delivery_count <= 0 or c.envelope.headers.kind != "request"
                or not isinstance(self.layout, AreaLayout) or claimed.duplicate is not None):
            return None  # (a transfer's reply name may draw a sequence number: never asked here)
        when = self.clock()
        variants: dict[str, tuple[bool, str | None]] = {}
        stage_dir = None
        for error, rtype in ((False, None), (True, None), (True, EXPIRED_TYPE)):
            out = self.layout.reply(c, self.node_id, when, claimed.op_id, error=error, type=rtype)
            if out is None or out.stage is None:
                return None
            variants[out.target.rsplit("/", 1)[-1]] = (error, rtype)
            stage_dir = out.stage.rsplit("/", 1)[0]
        assert stage_dir is not None
        t = self.transport
        try:
            entries = t.list(stage_dir)
        except NotFound:
            return None
        for e in entries:
            name, owner, size = split_stage(e.name)
            if owner is None or size is None or name not in variants or e.size != size or e.is_dir:
                continue
            path = f"{stage_dir}/{e.name}"
            buf = io.BytesIO()
            try:
                got = t.get(path, BoundedSink(buf, size + READ_MARGIN, server=t.server, path=path,
                                              listed=f"{size} bytes").as_binary())
            except NotFound:
                continue  # removed meanwhile: not there to adopt
            if got != size:
                continue
            error, rtype = variants[name]
            return StagedReply(path, owner, buf.getvalue(), error, rtype)
        return None

    def _put_reply(self, stage: str, fields: dict[str, str]) -> None:
        """Upload the reply a ``served`` record holds to ``stage`` (the hooks around it)."""
        body = io.BytesIO(self.journal.load_result(fields))
        for hook in HOOKS.before_reply_staged:
            hook(stage)
        self.transport.put(stage, body)
        for hook in HOOKS.after_reply_staged:
            hook(stage)

    def _stage_for_adoption(self, stage: str, fields: dict[str, str]) -> bool:
        """Put a recorded reply at its stage name when that name declares its size (else
        nothing: no other node could tell it complete); True if it is there now."""
        if split_stage(stage.rsplit("/", 1)[-1])[2] is None:
            return False
        t = self.transport
        try:
            self.layout.ensure_dir(t, stage)
            self._put_reply(stage, fields)
        except TransportError as exc:
            log.warning("%s: %s: could not stage the recorded reply for another node: %s", self.name, stage,
                        exc)
            return False
        return True
