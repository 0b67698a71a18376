"""Recovery: replay this node's journal against the server's actual state.

Every pending operation is decided by its last durable record plus a few ``stat`` calls:

``send`` (a request or one-way message being staged and exposed)
    target exists -> done; stage exists -> rolled back (the sender never got an
    acknowledgement, and the staged file may be torn); neither -> done (it was exposed and has
    already been claimed).
``claim`` (a file claimed into a select directory, not yet handled)
    returned to its box for any node to take (requests to ``inbox``, responses to ``outbox``,
    where ``Client.collect`` finds them); a response already handed to its caller
    (``delivered``) is archived instead.
``served`` (the handler returned; its result is in the journal)
    finished by :meth:`Exchange.finish_served`, the very code a live node runs: the handler is
    never called again.

Recovery is idempotent: every step re-checks the server first, so a crash during recovery is
recovered by the next run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ftpbc.errors import NotFound, SourceGone
from ftpbc.exchange.area import split_claim
from ftpbc.exchange.lifecycle import Exchange
from ftpbc.faults import crash_point
from ftpbc.journal.store import EndpointJournal, Operation
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


def recover_endpoint(exchange: Exchange, *, orphans: bool = True) -> list[Action]:
    """Finish or undo every pending operation, then (``orphans``) this node's unjournaled files."""
    actions = []
    for op in exchange.journal.pending():
        crash_point("recover.before-op")
        outcome = _recover_op(exchange, op)
        crash_point("recover.after-op")
        actions.append(Action(exchange.endpoint, op.op_id, op.kind, outcome))
        log.info("recovered %s", actions[-1])
    if orphans:
        actions.extend(recover_orphans(exchange))
    return actions


def recover_orphans(ex: Exchange) -> list[Action]:
    """Stage and select files carrying this node's id that no pending operation accounts for.

    Send and claim intents are written before their remote step but not fsynced (a killed
    process leaves them in the page cache), so only a machine crash can lose them; the files
    they announced still say who made them.  Run after the journal's own operations are done,
    so any such file left now is an orphan: a staged request or one-way message is rolled back,
    a claim is returned to its box.  A staged response is never an orphan (its ``served``
    record is fsynced before the upload) and is left alone.
    """
    actions = []
    t = ex.transport
    for direction in ("in", "out"):
        for kind in ("select", "stage"):
            if kind == "stage" and direction == "out":
                continue
            for entry in t.list(ex.area.dir(direction, kind)):
                name, owner = split_claim(entry.name)
                if owner != ex.node_id:
                    continue
                path = ex.area.path(direction, kind, entry.name)
                if kind == "select":
                    try:
                        t.rename(path, ex.area.path(direction, "box", name))
                        outcome = f"orphan claim returned to {direction}box"
                    except SourceGone:
                        continue
                else:
                    try:
                        t.delete(path)
                        outcome = "orphan staged message rolled back"
                    except NotFound:
                        continue
                actions.append(Action(ex.endpoint, entry.name, "orphan", outcome))
                log.warning("recovered %s", actions[-1])
    return actions


def _recover_op(ex: Exchange, op: Operation) -> str:
    t = ex.transport
    f = op.fields
    if "served" in op.events:
        if ex.finish_served(op.op_id, f):
            return "finished: recorded result delivered, handler not run again"
        return "claim had been returned by another node; reply withheld"
    if op.kind == "send":
        stage, target = f["stage"], f["target"]
        if t.exists(target):
            outcome = "already exposed"
        elif t.exists(stage):
            try:
                t.delete(stage)
            except NotFound:
                pass
            outcome = "rolled back: staged file removed, never exposed"
        else:
            outcome = "already exposed and taken"
        ex.journal.end(op.op_id)
        return outcome
    if op.kind == "claim":
        if "delivered" in op.events:
            ex.finish_collect(ex.collect_claim(op))
            return "response had been delivered: archived"
        return return_claim(t, ex.journal, op)
    ex.journal.end(op.op_id)
    return f"unknown operation {op.kind!r} dropped"


def return_claim(t: Transport, journal: EndpointJournal, op: Operation) -> str:
    """Undo a ``claim`` (rename dst -> src) that never got further; end the operation."""
    src, dst = op.fields["src"], op.fields["dst"]
    try:
        t.rename(dst, src)
        outcome = f"returned to {src.rsplit('/', 2)[-2]}"
    except SourceGone:
        outcome = "claim never made or already returned"
    journal.end(op.op_id)
    return outcome
