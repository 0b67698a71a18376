"""Transacted sends: several messages, to one or several endpoints, visible all or none.

    with client.transaction() as tx:
        tx.send("audit", b"...")
        uid = tx.submit("quote", b"...")
    # here every message is in its inbox; had the block raised, none would be

The order of the steps is what makes a crash decidable::

    per member: send record (names the transaction) -> upload to instage/<name>~<node>
      (or, for copies staged together by stage_copies: one ``staging`` record in the
      transaction journal naming them all -> upload each)
    ADMIT: members bound for bounded inboxes counted against them (QueueFull: all rolled back)
    COMMIT: one durable ``commit`` record in the node's transaction journal, naming every member
            (endpoint, op id, stage and target)
    per member: rename stage -> box      (expose)
    end each member's send (copies staged together have none), then end the commit

Before the commit record nothing is visible, and recovery rolls every member back (its staged
file is removed, as for any send that was never acknowledged; members named by a ``staging``
record are removed by the transaction's recovery, a stage never made being fine).  Once the
commit record is on disk, every member is complete in its stage (the record is written only
after the last upload returned), and recovery rolls every member forward (exposes what is
still staged).  A process killed anywhere therefore ends, after ``ftpbc recover`` (or the next
client or node of the same identity), with all members in their boxes or none.

The commit record is self-contained (it is fsynced; the members' send and staging records are
not), so even a machine crash that lost those records is rolled forward from it; without it, the
members' staged files carry this node's id and are removed as orphans.

A transaction may also *settle a claim* (:meth:`Transaction.settle_claim`: a topic's fan-out,
docs/topics.md): the claimed message is named in the commit record, and right after that record
it is renamed to its archive, before any member is exposed.  Finding the claim gone then (a node
that looked dead had it returned to another) undoes the transaction instead: its staged members
are removed, never exposed.  Recovery decides the same way from the server: the claim still
there is settled, its archive there means settled, neither means lost.  So a message fanned
out ends, after any crash and recovery, with every member exposed once and the claim archived,
or with no member and the message back for another node.

Members may go to endpoints on several servers.  The guarantee stays all-or-none *after
recovery*: :meth:`Transaction.commit` that fails while exposing (a server unreachable) has
committed all the same, and the members not yet out are exposed by a retried
:meth:`~Transaction.commit` or by recovery.  Between the first rename and the last, a consumer
may see some members before the others: exposing is one rename per member, never one for all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, BinaryIO, Protocol

from ftpbc.errors import FtpbcError, MessageTooLarge, NotFound, QueueFull, SourceGone
from ftpbc.exchange.bounds import body_length
from ftpbc.exchange.layout import AreaLayout, Outbound
from ftpbc.exchange.lifecycle import Lifecycle, expose_each, op_id_for, rename_resolving
from ftpbc.exchange.pending import Action
from ftpbc.faults import crash_point
from ftpbc.journal import EndpointJournal, Journal
from ftpbc.model.envelope import Kind

log = logging.getLogger("ftpbc.transaction")

#: the journal key of a node's commit records (':' never occurs in an endpoint name)
TX_KEY = "transactions:"


class Sender(Protocol):
    """What a transaction needs of a runtime (:class:`ftpbc.exchange.runtime.Runtime`)."""

    node_id: str
    journal: Journal

    def lifecycle(self, endpoint: str, direction: Any = "in") -> Lifecycle: ...

    @property
    def new_message(self) -> Callable[..., tuple[str, str]]:
        """``(endpoint, kind, **options) -> (file name, uuid)``."""


@dataclass(frozen=True)
class Settlement:
    """A claim a transaction settles: ``claim`` (in ``endpoint``'s select directory, journal op
    ``op_id``) renamed to ``commit`` once the commit record is durable; ``cleanup``: deleted
    from there once every member is exposed (``archive: false``)."""

    endpoint: str
    op_id: str
    claim: str
    commit: str
    cleanup: bool = False

    def to_json(self) -> str:
        return json.dumps({"endpoint": self.endpoint, "op": self.op_id, "claim": self.claim,
                           "commit": self.commit, "cleanup": self.cleanup}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Settlement:
        d = json.loads(text)
        return cls(d["endpoint"], d["op"], d["claim"], d["commit"], bool(d.get("cleanup")))


@dataclass(frozen=True)
class Member:
    """One message of a transaction: its endpoint, its send's journal op id, where it goes."""

    endpoint: str
    op_id: str
    out: Outbound

    def to_json(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "op": self.op_id, **self.out.fields()}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> Member:
        out = Outbound.from_fields(d)
        if out is None:
            raise ValueError(f"transaction member without a target: {d!r}")
        return cls(d["endpoint"], d["op"], out)


def encode_members(members: list[Member]) -> str:
    return json.dumps([m.to_json() for m in members], separators=(",", ":"))


def decode_members(text: str) -> list[Member]:
    return [Member.from_json(d) for d in json.loads(text)]


class Transaction:
    """Messages staged now, exposed together by :meth:`commit`, or removed by :meth:`rollback`.

    As a context manager: committed when the block ends normally, rolled back when it raises.
    Not thread-safe: one transaction belongs to one thread (run several for several threads).

    Guarantees: before :meth:`commit` none of the messages is visible.  Once :meth:`commit`
    returns, all are.  If :meth:`commit` raises before its commit record is written, none ever
    will be (rolled back here, or by recovery); after it (a server lost while exposing), all will
    be, by a retried :meth:`commit` or by recovery of this identity.  A process killed at any
    step ends, after recovery, with all or none.
    """

    def __init__(self, sender: Sender, *, on_submit: Callable[[str, str], None] | None = None,
                 points: str = "tx") -> None:
        self.sender = sender
        #: the prefix of this transaction's crash points (``tx``; ``fanout`` for a topic's fan-out)
        self._points = points
        self._settlement: Settlement | None = None
        self._settled = False
        self.id = str(uuidlib.uuid4())
        self.op_id = f"{self.id}.tx"
        self._on_submit = on_submit
        self._members: list[Member] = []
        self._submitted: list[tuple[str, str]] = []
        #: (endpoint, op id) of the members exposed (copies of one message share an op id)
        self._exposed: set[tuple[str, str]] = set()
        #: op id -> the member's size in bytes (None: unknown, a pipe), for bounded inboxes
        self._sizes: dict[str, int | None] = {}
        #: members named by this transaction's ``staging`` record, with no send record of their own
        self._grouped: set[tuple[str, str]] = set()
        #: (member count, their JSON) as last encoded: the commit record names what staging did
        self._encoded: tuple[int, str] = (0, "[]")
        #: open, committed (record written, maybe not all exposed), done, rolled back
        self.state = "open"

    # ------------------------------------------------------------------ staging

    def send(self, endpoint: str, body: bytes | str | BinaryIO, **options: Any) -> str:
        """Stage a one-way message (options as :meth:`Client.send`); return the path it will
        have in the inbox once the transaction commits."""
        return self._stage(endpoint, "oneway", body, options)[1]

    def submit(self, endpoint: str, body: bytes | str | BinaryIO, **options: Any) -> str:
        """Stage a request (options as :meth:`Client.submit`, ``reply_to`` included); return its
        UUID, for ``collect`` once the transaction has committed."""
        uid = self._stage(endpoint, "request", body, options)[0]
        self._submitted.append((options.get("reply_to") or endpoint, uid))
        return uid

    def _stage(self, endpoint: str, kind: Kind, body: bytes | str | BinaryIO,
               options: dict[str, Any]) -> tuple[str, str]:
        if self.state != "open":
            raise RuntimeError(f"transaction {self.id} is {self.state}: no more messages")
        name, uid = self.sender.new_message(endpoint, kind, **options)
        lc = self.sender.lifecycle(endpoint)
        layout = lc.layout
        if not isinstance(layout, AreaLayout):
            raise ValueError(f"{endpoint!r} is not an endpoint: only endpoints' messages can be transacted")
        out = layout.outbound(name, self.sender.node_id, lc.clock())
        self._stage_out(endpoint, lc, out, op_id_for(uid, "send"), kind, body)
        crash_point(f"{self._points}.after-stage")
        return uid, out.where

    def stage_copies(self, copies: Sequence[tuple[str, Outbound]], body: bytes | BinaryIO, *,
                     uid: str) -> None:
        """Stage one message under names and stage paths the caller chose (``(endpoint, out)``
        each: the copies of a message being fanned out keep its name), each exposed at its
        ``out.target`` by :meth:`commit`.  ``body`` is read once per copy, from its start.

        One journal record for all: a ``staging`` record of this transaction naming every
        member so far is written before the first upload, instead of a send record per copy
        (and its end).  Until the commit record, recovery removes every stage it names (those
        never made are fine); after it, the commit rolls them forward as any member.  At most
        once per transaction (a second record would replace the first's list).  Raises
        MessageTooLarge or ValueError (a copy without a stage) before writing anything.

        Internal (the topic fan-out uses it), hidden from the API reference: @private
        """
        if self.state != "open":
            raise RuntimeError(f"transaction {self.id} is {self.state}: no more messages")
        if self._grouped:
            raise RuntimeError(f"transaction {self.id}: copies are staged once per transaction")
        op_id = op_id_for(uid, "send")
        members = [Member(endpoint, op_id, out) for endpoint, out in copies]
        if not members:
            return
        if not isinstance(body, bytes):
            body.seek(0)
        size = body_length(body)  # measured once, before an upload reads it
        lifecycles = [self.sender.lifecycle(m.endpoint) for m in members]
        for m, lc in zip(members, lifecycles, strict=True):
            # Refused before anything is written.
            if m.out.stage is None:
                raise ValueError(f"{lc.name}: {m.out.target} has no stage: it cannot be transacted")
            if size is not None and size > lc.max_message_bytes:
                raise MessageTooLarge(f"{lc.name}: message for {m.out.target}", size, lc.max_message_bytes)
        # Known before the record is written: a rollback removes whatever part of them exists.
        self._members.extend(members)
        self._grouped.update((m.endpoint, m.op_id) for m in members)
        self._sizes[op_id] = size
        # Not fsynced, as a send's record: written before the uploads, it survives a kill of
        # this process; the commit record is fsynced and names every member again.
        self._journal().record(self.op_id, "staging", members=self._members_json())
        crash_point(f"{self._points}.after-intent")
        for m, lc in zip(members, lifecycles, strict=True):
            if not isinstance(body, bytes):
                body.seek(0)
            lc.upload_stage(m.out, body)

    def _stage_out(self, endpoint: str, lc: Lifecycle, out: Outbound, op_id: str, kind: Kind,
                   body: bytes | str | BinaryIO) -> None:
        member = Member(endpoint, op_id, out)
        # Known before its record is written: a rollback removes whatever part of it exists.
        self._members.append(member)
        data = body.encode("utf-8") if isinstance(body, str) else body
        self._sizes[member.op_id] = body_length(data)  # measured before the upload reads it
        lc.stage(out, data, op_id=member.op_id, kind=kind, tx=self.id)

    def settle_claim(self, settlement: Settlement) -> None:
        """Make this transaction settle a claim (see the module's text): its commit renames the
        claim to ``settlement.commit`` before exposing anything, or undoes itself if the claim
        is gone.  At most one per transaction.

        Internal (the topic fan-out uses it), hidden from the API reference: @private
        """
        if self.state != "open" or self._settlement is not None:
            raise RuntimeError(f"transaction {self.id}: a claim can be settled once, while open")
        self._settlement = settlement

    # ------------------------------------------------------------------ the outcome

    def commit(self) -> list[str]:
        """Make every message visible; return where each is, in the order they were staged.

        Retry after an error: a committed transaction exposes what is left and ends.
        """
        if self.state in ("done", "rolled back", "lost"):
            raise RuntimeError(f"transaction {self.id} is {self.state}")
        journal = self._journal()
        with contextlib.ExitStack() as admitted:
            if self.state == "open":
                if not self._members and self._settlement is None:
                    self.state = "done"
                    return []
                try:
                    self._admit(admitted)
                except QueueFull:
                    # Before the commit record: refused as a whole, nothing ever visible.
                    self.rollback()
                    raise
                # Durable: from here on the transaction is committed, whatever happens to this process.
                extra = {} if self._settlement is None else {"claim": self._settlement.to_json()}
                journal.record(self.op_id, "commit", durable=True, members=self._members_json(), **extra)
                self.state = "committed"
                crash_point(f"{self._points}.after-commit-record")
            if self._settlement is not None and not self._settled:
                lc = self.sender.lifecycle(self._settlement.endpoint)
                if not settle(lc, self._settlement):
                    undo(journal, self.op_id, self._settlement, self._members, self.sender.lifecycle)
                    self.state = "lost"
                    return []
                self._settled = True
            # The admitted members stay counted as this process's sends in flight until they
            # are in their boxes: another thread's send must not take their places meanwhile.
            return self._expose_all(journal)

    def _admit(self, admitted: contextlib.ExitStack) -> None:
        """Count the members bound for bounded inboxes against their bounds (docs/queues.md,
        "Bounded queues"): every member fits, or QueueFull for the first endpoint one does not
        fit, with no member admitted.  An endpoint's members are counted together, on one
        listing, so two members do not both take its last place."""
        by_endpoint: dict[str, list[Member]] = {}
        for member in self._members:
            by_endpoint.setdefault(member.endpoint, []).append(member)
        for endpoint, members in by_endpoint.items():
            lc = self.sender.lifecycle(endpoint)
            if lc.capacity is None:
                continue
            sends = []
            for m in members:
                name = m.out.target.rsplit("/", 1)[-1]
                if m.out.target == lc.layout.box_path(name):  # as Lifecycle.send counts them
                    sends.append((name, self._sizes.get(m.op_id)))
            if sends:
                admitted.enter_context(lc.capacity.admit_all(sends))

    def _expose_all(self, journal: EndpointJournal) -> list[str]:
        todo = [m for m in self._members if (m.endpoint, m.op_id) not in self._exposed]
        if todo:
            # The first alone: killed right after it (after-first-expose), one member is out
            # and the others still staged.  The others together: one round trip per server.
            self._expose([todo[0]])
            if len(self._exposed) == 1:
                crash_point(f"{self._points}.after-first-expose")
            self._expose(todo[1:])
        where = [member.out.where for member in self._members]
        for member in self._members:
            if (member.endpoint, member.op_id) not in self._grouped:
                self.sender.lifecycle(member.endpoint).journal.end(member.op_id)
        if self._settlement is not None:
            finish_settlement(self.sender.lifecycle(self._settlement.endpoint), self._settlement)
        journal.end(self.op_id)
        self.state = "done"
        if self._on_submit is not None:
            for endpoint, uid in self._submitted:
                self._on_submit(endpoint, uid)
        return where

    def _expose(self, members: list[Member]) -> None:
        """Expose ``members`` (every one is tried); raise the first failure, if any, once the
        others are out."""
        outcomes = expose_each([(self.sender.lifecycle(m.endpoint), m.out) for m in members])
        failed: FtpbcError | None = None
        for member, outcome in zip(members, outcomes, strict=True):
            if outcome is not None and not (isinstance(outcome, SourceGone) and self._settlement is not None):
                failed = failed or outcome
                continue
            # Out; or, settling a claim, its stage gone: a copy staged before the durable record
            # and gone now was exposed by an earlier attempt whose reply was lost, or purged with
            # its subscription; either way nothing is left to expose.
            self._exposed.add((member.endpoint, member.op_id))
        if failed is not None:
            raise failed

    def rollback(self) -> None:
        """Remove every staged message; none was visible.  Refused once committed."""
        if self.state in ("committed", "done"):
            raise RuntimeError(f"transaction {self.id} is committed: it cannot be rolled back")
        if self.state == "lost":
            raise RuntimeError(f"transaction {self.id} was undone (its claim was lost): nothing to roll back")
        if self.state == "rolled back":
            return
        self.state = "rolled back"
        failed: FtpbcError | None = None
        for member in self._members:
            lc = self.sender.lifecycle(member.endpoint)
            try:
                if member.out.stage:
                    try:
                        lc.transport.delete(member.out.stage)
                    except NotFound:
                        pass  # never uploaded (or its upload failed before the file was made)
                if (member.endpoint, member.op_id) not in self._grouped:
                    lc.journal.end(member.op_id)
            except FtpbcError as exc:
                # Left pending: no commit record, so recovery removes it.
                log.warning("transaction %s: staged %s left for recovery: %s", self.id, member.out.stage, exc)
                failed = failed or exc
        if failed is not None:
            raise failed  # the staging record stays pending too: recovery removes what is left
        if self._grouped:
            self._journal().end(self.op_id)

    def _members_json(self) -> str:
        """Every member so far, as a record names them (encoded once per set of members:
        members are only ever appended)."""
        if self._encoded[0] != len(self._members):
            self._encoded = (len(self._members), encode_members(self._members))
        return self._encoded[1]

    def _journal(self) -> EndpointJournal:
        return self.sender.journal.endpoint(TX_KEY)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            if self.state in ("open", "committed"):
                self.commit()
            return
        if self.state == "open":
            try:
                self.rollback()
            except FtpbcError:
                pass  # logged; the block's own exception is the one to see
        # committed (commit raised while exposing): recovery or a retried commit finishes it


# ---------------------------------------------------------------------- recovery

def open_transactions(journal: Journal) -> set[str]:
    """The ids of this node's committed transactions not yet finished (their members must be
    rolled forward, never back)."""
    if TX_KEY not in journal.registry():
        return set()
    return {op.op_id.rsplit(".", 1)[0] for op in journal.endpoint(TX_KEY).pending() if "commit" in op.events}


def recover_transactions(journal: Journal, inbound: Callable[[str], Lifecycle | None]) -> list[Action]:
    """Roll every committed, unfinished transaction forward: expose each member still staged,
    end the members' sends and the commit; roll back one with a ``staging`` record and no
    commit: remove the stages it names.  ``inbound`` gives an endpoint's inbound lifecycle
    (None: not configured; the transaction is then left pending and reported).

    Run before the endpoints' own operations (:func:`ftpbc.exchange.pending.recover_pending`):
    a member whose transaction has no commit record is an ordinary unacknowledged send there,
    rolled back.  Idempotent: every step re-checks the server.
    """
    if TX_KEY not in journal.registry():
        return []
    txj = journal.endpoint(TX_KEY)
    actions = []
    for op in txj.pending():
        crash_point("recover.before-op")
        if "commit" not in op.events and op.kind == "staging":
            try:
                outcome = _roll_back(txj, op.op_id, decode_members(op.fields["members"]), inbound)
            except FtpbcError as exc:
                outcome = f"left for the next recovery: {exc}"
                log.warning("%s: cannot recover transaction yet: %s", op.op_id, exc)
        elif "commit" not in op.events:
            txj.end(op.op_id)
            outcome = f"unknown operation {op.kind!r} dropped"
        else:
            try:
                settlement = Settlement.from_json(op.fields["claim"]) if "claim" in op.fields else None
                outcome = _roll_forward(txj, op.op_id, decode_members(op.fields["members"]), inbound,
                                        settlement)
            except FtpbcError as exc:
                outcome = f"left for the next recovery: {exc}"
                log.warning("%s: cannot recover transaction yet: %s", op.op_id, exc)
        crash_point("recover.after-op")
        actions.append(Action(TX_KEY, op.op_id, op.kind, outcome))
        log.info("recovered %s", actions[-1])
    return actions


def _remove_stage(m: Member, lc: Lifecycle) -> int:
    """Delete member ``m``'s stage file; 1 if it was there, 0 if it was never made or is gone."""
    if not m.out.stage:
        return 0
    try:
        lc.transport.delete(m.out.stage)
    except NotFound:
        return 0
    return 1


def _roll_back(txj: EndpointJournal, op_id: str, members: list[Member],
               inbound: Callable[[str], Lifecycle | None]) -> str:
    """A transaction with a ``staging`` record and no commit: remove every stage it names (the
    uploads may have been cut anywhere: a stage never made is fine), then end it."""
    lifecycles = [inbound(m.endpoint) for m in members]
    missing = sorted({m.endpoint for m, lc in zip(members, lifecycles, strict=True) if lc is None})
    if missing:
        return f"skipped: endpoint {', '.join(missing)} not configured (left pending)"
    removed = sum(_remove_stage(m, lc) for m, lc in zip(members, lifecycles, strict=True) if lc is not None)
    txj.end(op_id)
    return f"not committed: rolled back, {removed} of {len(members)} staged member(s) removed, none exposed"


def _roll_forward(txj: EndpointJournal, op_id: str, members: list[Member],
                  inbound: Callable[[str], Lifecycle | None], settlement: Settlement | None = None) -> str:
    lifecycles = [inbound(m.endpoint) for m in members]
    claim_lc = inbound(settlement.endpoint) if settlement is not None else None
    missing = sorted({m.endpoint for m, lc in zip(members, lifecycles, strict=True) if lc is None}
                     | ({settlement.endpoint} if settlement is not None and claim_lc is None else set()))
    if missing:
        return f"skipped: endpoint {', '.join(missing)} not configured (left pending)"
    if settlement is not None:
        assert claim_lc is not None
        if not settle(claim_lc, settlement):
            removed = undo(txj, op_id, settlement, members, lambda e: _known(inbound, e))
            return (f"claim gone (returned to another node, or finished and cleaned up): {removed} staged "
                    "member(s) removed, none exposed here")
    exposed = 0
    for m, lc in zip(members, lifecycles, strict=True):
        assert lc is not None
        # The stage is complete: the commit record was written after the last upload returned.
        if m.out.stage and lc.transport.exists(m.out.stage):
            lc.expose(m.out, staged=True, body=None)
            exposed += 1
    for m, lc in zip(members, lifecycles, strict=True):
        assert lc is not None
        if _pending(lc.journal, m.op_id):
            lc.journal.end(m.op_id)
    if settlement is not None:
        assert claim_lc is not None
        finish_settlement(claim_lc, settlement)
    txj.end(op_id)
    return (f"committed: rolled forward, {exposed} of {len(members)} member(s) exposed now, "
            "the others were out already")


def _pending(journal: EndpointJournal, op_id: str) -> bool:
    return journal.is_pending(op_id)


def _known(inbound: Callable[[str], Lifecycle | None], endpoint: str) -> Lifecycle:
    lc = inbound(endpoint)
    assert lc is not None  # checked by the caller
    return lc


def settle(lc: Lifecycle, s: Settlement) -> bool:
    """Rename a settlement's claim to its commit place; True if it is there (now or already),
    False if the claim is gone and was never committed (lost to another node).  Idempotent."""
    t = lc.transport
    try:
        lc.layout.ensure_dir(t, s.commit)
        rename_resolving(t, s.claim, s.commit)
    except NotFound:  # SourceGone included: settled by an earlier attempt, or lost
        return t.exists(s.commit)
    return True


def finish_settlement(lc: Lifecycle, s: Settlement) -> None:
    """After every member is exposed: delete the committed claim if it is not archived, and end
    the claim's operation in its endpoint's journal."""
    if s.cleanup:
        try:
            lc.transport.delete(s.commit)
        except NotFound:
            pass
    if _pending(lc.journal, s.op_id):
        lc.journal.end(s.op_id)


def undo(txj: EndpointJournal, op_id: str, s: Settlement, members: list[Member],
         lifecycle: Callable[[str], Lifecycle]) -> int:
    """The claim was lost: remove every staged member (none was exposed: exposing comes after
    the claim is settled), end every operation; how many staged files were removed."""
    removed = 0
    for m in members:
        lc = lifecycle(m.endpoint)
        removed += _remove_stage(m, lc)
        if _pending(lc.journal, m.op_id):
            lc.journal.end(m.op_id)
    claim_lc = lifecycle(s.endpoint)
    if _pending(claim_lc.journal, s.op_id):
        claim_lc.journal.end(s.op_id)
    txj.end(op_id)
    log.warning("transaction %s: claim %s lost to another node before it was settled; %d staged "
                "member(s) removed", op_id, s.claim, removed)
    return removed


__all__ = ["TX_KEY", "Member", "Settlement", "Transaction", "open_transactions", "recover_transactions"]
