"""Recovery: replay this node's journal against the server's actual state.

Every pending operation is decided by its last durable record plus a few ``stat`` calls:

``send`` (a request, one-way message or response being staged and exposed)
    target exists -> done; stage exists -> requests and one-way messages are rolled back (the
    sender never got an acknowledgement), responses rolled forward; neither -> done (it was
    exposed and has already been claimed).
``claim`` (a file claimed into a select directory, not yet handled)
    returned to its box for any node to take (requests to ``inbox``, responses to ``outbox``,
    where ``Client.collect`` finds them).
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
from ftpbc.faults import crash_point
from ftpbc.journal.store import EndpointJournal, Operation
from ftpbc.lifecycle import Exchange
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


def recover_endpoint(exchange: Exchange) -> list[Action]:
    actions = []
    for op in exchange.journal.pending():
        crash_point("recover.before-op")
        outcome = _recover_op(exchange, op)
        crash_point("recover.after-op")
        actions.append(Action(exchange.endpoint, op.op_id, op.kind, outcome))
        log.info("recovered %s", actions[-1])
    return actions


def _recover_op(ex: Exchange, op: Operation) -> str:
    t = ex.transport
    f = op.fields
    if "served" in op.events:
        if ex.finish_served(op.op_id, f):
            return "finished: recorded result delivered, handler not run again"
        return "claim had been returned by another node; reply withheld"
    if op.kind == "send":
        stage, target, kind = f["stage"], f["target"], f.get("kind", "request")
        if t.exists(target):
            outcome = "already exposed"
        elif t.exists(stage):
            if kind == "response":
                ex.expose(stage, target)
                outcome = "rolled forward: exposed"
            else:
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
