"""One journal's pending operations, for every layout: the rules for sends, claims, served
results, routed messages (:func:`ftpbc.exchange.route.recover_route`) and replays, then this
node's unjournaled files.  :func:`ftpbc.exchange.recovery.recover_node` runs them, in order
with the transactions'.

Every pending operation is decided by its last durable record plus a few ``stat`` calls:

``send`` (a message or a partner's file being staged and exposed)
    stage exists -> rolled back (the sender never got an acknowledgement, and the staged file
    may be torn); target or final name exists -> done (a post_send rename left undone is
    finished; a message filed as a dead letter gets its reason file if it lacks it); neither ->
    done (it was exposed and has already been taken).
``claim`` (a file claimed, not yet handled)
    returned to its box with its delivery count raised (a message that kills the node that
    reads it ends in the error directory after ``max_deliveries``); a response already handed
    to its caller (``delivered``) is archived instead.
``served`` (the handler returned; its result is in the journal)
    finished by :meth:`Lifecycle.finish_served`, the very code a live node runs: the handler is
    never called again.
    A member of a transaction (its record names it: ``tx``) is decided so only when the
    transaction has no open commit record: without one it was never committed.
``routed`` (a route's message on its way to a destination: :mod:`ftpbc.exchange.route`)
    not staged: rolled back (stage removed, claim returned); staged: renamed into place if it
    is not already, then committed.
``replay`` (``ftpbc dlq replay``: a dead letter going back to its box)
    finished by :meth:`Lifecycle.finish_replay`: renamed if still a dead letter, its reason
    file removed.

Recovery is idempotent: every step re-checks the server first, so a crash during recovery is
recovered by the next run.  One operation that cannot be decided (a server error, an odd
record) is logged and left pending for the next run; it never stops the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ftpbc.errors import FtpbcError, NotFound, SourceGone
from ftpbc.exchange.area import is_staged_reason, split_claim
from ftpbc.exchange.layout import Outbound
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.exchange.route import ROUTED, recover_route
from ftpbc.exchange.steps import write_reason
from ftpbc.faults import crash_point
from ftpbc.journal import Operation
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.recovery")


@dataclass(frozen=True)
class Action:
    endpoint: str
    op_id: str
    kind: str
    outcome: str

    def __str__(self) -> str:
        return f"{self.endpoint}: {self.op_id} ({self.kind}): {self.outcome}"


def recover_pending(lifecycles: Sequence[Lifecycle], *, orphans: bool = True,
                    lock: Callable[[], AbstractContextManager[bool]] | None = None,
                    held: Collection[str] = (),
                    transports: Callable[[str], Transport] | None = None) -> list[Action]:
    """Finish or undo every pending operation of one journal, then (``orphans``) this node's
    unjournaled files in these lifecycles' directories.

    ``lifecycles`` share one journal (an endpoint's two directions, or one transfer); each
    operation goes to the one whose directories it names.  ``lock``: each operation is decided
    while holding it (a transfer that reads in place: only the poll lock keeps pollers off the
    file); one that cannot be had defers the operation to the next recovery.  ``held``: the
    transactions whose commit record is still open; their members' sends are left alone (they
    are rolled forward by :func:`ftpbc.exchange.transaction.recover_transactions`, never back).
    ``transports``: a configured server's transport by name, for routed messages' destinations.
    """
    main = lifecycles[0]
    actions = []
    for op in main.journal.pending():
        crash_point("recover.before-op")
        lc = _owner(lifecycles, op)
        with lock() if lock is not None else nullcontext(True) as locked:
            if op.fields.get("tx", "") in held:
                outcome = "left for its transaction: committed, to be rolled forward"
            elif not locked:
                outcome = "deferred: poll lock busy"
            else:
                try:
                    outcome = _recover_op(lc, op, transports)
                except FtpbcError as exc:
                    outcome = f"left for the next recovery: {exc}"
                    log.warning("%s: %s: cannot recover %s yet: %s", lc.name, op.op_id, op.kind, exc)
        crash_point("recover.after-op")
        actions.append(Action(main.layout.key, op.op_id, op.kind, outcome))
        log.info("recovered %s", actions[-1])
    if orphans:
        for lc in lifecycles:
            actions.extend(recover_orphans(lc))
    return actions


def _owner(lifecycles: Sequence[Lifecycle], op: Operation) -> Lifecycle:
    """The lifecycle whose directories an operation names (its claim's source box)."""
    src = op.fields.get("src", "")
    for lc in lifecycles:
        if src.startswith(lc.layout.box.rstrip("/") + "/"):
            return lc
    return lifecycles[0]


def _recover_op(lc: Lifecycle, op: Operation, transports: Callable[[str], Transport] | None = None) -> str:
    t, f = lc.transport, op.fields
    if ROUTED in op.events:
        # a routed message (exchange/route.py): its destination's transport by server name
        return recover_route(lc, op, transports)
    if "served" in op.events or "received" in op.events:
        if lc.finish_served(op.op_id, f):
            return "finished: recorded result delivered, handler not run again"
        return ("claim had been returned by another node; reply withheld (a reply staged whole stays "
                "for the node that serves the request now)")
    if op.kind == "send":
        out = Outbound.from_fields(f)
        if out is None:
            lc.journal.end(op.op_id)
            return "nothing to do"
        if out.stage and t.exists(out.stage) and "exposing" not in op.events:
            try:
                t.delete(out.stage)
            except NotFound:
                pass
            outcome = "rolled back: staged file removed, never exposed"
        elif "exposing" in op.events or (out.final and t.exists(out.target)):
            # the previous release recorded "exposing" before a partner's send went into place
            outcome = f"rolled forward: in place at {lc.expose(out, staged=True, body=None)}"
        elif t.exists(out.where):
            outcome = "already exposed"
            if "reason" in f:
                # a send filed as a dead letter (an overflow) whose reason file a crash may have
                # cut off: written unless a whole one is there
                written = write_reason(t, out.where, f["reason"], stage=lc.layout.reason_stage,
                                       node_id=lc.node_id, keep_whole=True)
                outcome += ", its reason file written" if written else ", its reason file whole already"
        else:
            # Nothing records that the upload began, so a send cut off before it looks the same.
            outcome = "already exposed and taken, or never uploaded (neither staged nor in place)"
        lc.journal.end(op.op_id)
        return outcome
    if op.kind == "replay":
        return "replay finished: " + lc.finish_replay(op.op_id, f)
    if op.kind == "claim":
        claimed = lc.claim_from_journal(op)
        if "delivered" in op.events:
            lc.finish_collect(claimed)
            return "response had been delivered: archived"
        if claimed.path == f["src"]:
            lc.journal.end(op.op_id)  # read in place: nothing was moved
            return "read in place: left where it is"
        if not t.exists(claimed.path):
            lc.journal.end(op.op_id)
            return "claim never made or already returned"
        if lc.layout.direction == "out":
            lc.unclaim(claimed)
            return f"returned to {lc.layout.box}"
        return lc.redeliver(claimed, "the node stopped before finishing it")
    lc.journal.end(op.op_id)
    return f"unknown operation {op.kind!r} dropped"


def recover_orphans(lc: Lifecycle) -> list[Action]:
    """Select and stage files carrying this node's id that no pending operation accounts for.

    Send and claim intents are written before their remote step but not fsynced (a killed
    process leaves them in the page cache), so only a machine crash can lose them; the files
    they announced still say who made them.  Run after the journal's own operations are done,
    so any such file left now that no operation still pending names is an orphan: a staged
    message is rolled back, a claim is returned to its box.  A staged reply is never an orphan
    (its ``served`` record is fsynced before the upload) and is left alone.  A staged reason file
    of this node's (:func:`~ftpbc.exchange.steps.write_reason`) is removed: an operation still
    pending writes its reason again, and one filed without an operation (a refused entry) keeps
    its message without a reason rather than a partial one.
    """
    actions = []
    t, layout = lc.transport, lc.layout
    # Files a still-pending operation names are its own (one left for the next recovery when
    # its server failed meanwhile), never orphans.
    accounted = {v for op in lc.journal.pending() for v in op.fields.values()}
    dirs = [("select", layout.select)] if layout.select else []
    dirs += [("stage", d) for d in layout.orphan_stages]
    if layout.reason_stage not in layout.orphan_stages:
        dirs.append(("reason", layout.reason_stage))
    for kind, directory in dirs:
        try:
            entries = t.list(directory)
        except NotFound:
            continue
        for entry in entries:
            if f"{directory.rstrip('/')}/{entry.name}" in accounted:
                continue
            try:
                action = _orphan(lc, kind, directory, entry.name)
            except FtpbcError as exc:  # one bad entry never stops the rest
                layout.report(entry.name, f"orphan left for the next recovery: {exc}")
                continue
            if action is not None:
                actions.append(action)
                log.warning("recovered %s", action)
    return actions


def _orphan(lc: Lifecycle, kind: str, directory: str, claimed: str) -> Action | None:
    t, layout = lc.transport, lc.layout
    name, owner = split_claim(claimed)
    if kind != "select" and is_staged_reason(claimed):
        kind = "reason"
    elif kind == "reason":
        return None  # a reason stage shared with other files (a transfer's send stage)
    if kind == "stage" and owner is not None and owner != lc.node_id:
        name, owner = split_claim(name)  # a partner's stage name: <target>~<node>~<op>
    if owner != lc.node_id:
        return None
    path = f"{directory.rstrip('/')}/{claimed}"
    if kind == "select":
        if not layout.is_claim(claimed):
            return None  # a committed file (name~node~stamp) waits in select for its cleanup
        try:
            t.rename(path, layout.box_path(name))
        except SourceGone:
            return None
        outcome = f"orphan claim returned to {layout.box}"
    else:
        try:
            t.delete(path)
        except NotFound:
            return None
        outcome = ("orphan staged reason file removed" if kind == "reason"
                   else "orphan staged message rolled back")
    return Action(layout.key, claimed, "orphan", outcome)
