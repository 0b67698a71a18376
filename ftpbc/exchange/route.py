"""A routed message's one journaled operation: from the source's claim to its place at the
destination, exactly once across crashes (docs/routing.md).

The steps, each remote write preceded by its journal record::

    claim           the source message, into the source's select directory (Lifecycle.claim)
    DECIDE          durable ``routed`` record: destination server, stage, target, where the
                    claim commits to                                     -> route.after-decide
    stage           put the body to the destination's stage file; ``staged`` record
                                                                        -> route.after-stage
    expose          rename stage -> target at the destination           -> route.after-expose
    COMMIT          rename the claim to the source's archive             -> route.after-commit

The rename into place comes before the commit, so that the source copy (the claim) exists until
the message is at its destination: whatever happens, a copy remains.  Recovery
(:func:`recover_route`) decides from the last record and the servers' state:

* no ``staged`` record: nothing was exposed.  The stage file (maybe torn) is removed and the
  claim goes back to the source's inbox with its delivery count raised; the route decides
  again (a message that kills the node that routes it ends in the source's error directory
  after ``max_deliveries``).
* ``staged``: rolled forward.  A stage file still there is renamed into place; a stage file
  gone was renamed already (the put was recorded, so only the rename removes it).  Then the
  claim is committed; a claim gone was committed already.

Guaranteed: a node killed at any point, then restarted (``ftpbc serve`` or ``ftpbc recover``),
leaves exactly one copy at the destination and none in the source's inbox.  Not guaranteed: a
node that merely looked dead (stuck past the lease) while its claim was returned to the inbox by
another node may deliver a message that the other node delivers too (at least once, never
lost); a stage file of a node whose journal was lost with its disk stays behind.

Stage files live in a ``.ftpbc-route`` directory beside where the message goes (in an endpoint's
``instage``, or in the destination directory), named ``<name>~<node>``: an endpoint's sweeper and
orphan search leave that directory alone (only this node's journal can say whether such a file
was committed).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from ftpbc.errors import ConfigError, NotFound, SourceGone
from ftpbc.exchange.layout import Commit
from ftpbc.exchange.lifecycle import Claimed, Lifecycle, rename_resolving
from ftpbc.exchange.steps import write_reason
from ftpbc.faults import crash_point
from ftpbc.journal import Operation
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.route")

#: the journal events of a route operation (after the source's ``claim``)
ROUTED = "routed"
STAGED = "staged"
#: the directory stage files of routed messages go to, beside their target
STAGE_DIR = ".ftpbc-route"


@dataclass(frozen=True)
class Delivery:
    """Where one routed message goes: a path on a configured server (its credentials)."""

    #: the configured server's name (``servers:``)
    server: str
    target: str
    stage: str
    #: an existing target is moved here first (an endpoint with ``protect: true``)
    protect: str | None = None
    #: written as ``<target>.reason`` once the message is in place (a failure to a directory)
    reason: str | None = None
    #: what the destination is called in logs and ``ftpbc status`` (``endpoint:audit``...)
    label: str = ""

    def fields(self) -> dict[str, str]:
        # Every key, empty when unset: a later decision (to the failure outlink) must replace
        # every field of an earlier one when the journal merges the records.
        return {"d_server": self.server, "d_target": self.target, "d_stage": self.stage,
                "d_protect": self.protect or "", "d_reason": self.reason or "", "d_label": self.label}

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> Delivery:
        return cls(f["d_server"], f["d_target"], f["d_stage"], f.get("d_protect") or None,
                   f.get("d_reason") or None, f.get("d_label", ""))


def decide(lc: Lifecycle, claimed: Claimed, delivery: Delivery, commit: Commit) -> dict[str, str]:
    """Durably record where a claimed message goes (again, to change an earlier decision that
    was never staged); return the fields :func:`finish` needs."""
    fields = {"claim": claimed.path, "commit": commit.path, "cleanup": "1" if commit.cleanup else "",
              **delivery.fields()}
    lc.journal.record(claimed.op_id, ROUTED, durable=True, **fields)
    crash_point("route.after-decide")
    return fields


def stage(lc: Lifecycle, op_id: str, transport: Transport, delivery: Delivery, body: BinaryIO) -> None:
    """Put the body to the stage file at the destination and record that it is complete.

    Not fsynced: a killed process leaves the record in the page cache; after a machine crash a
    lost ``staged`` record makes recovery roll the message back, so a message already renamed
    into place may be delivered again (at least once), never lost."""
    transport.put(delivery.stage, body)
    lc.journal.record(op_id, STAGED)
    crash_point("route.after-stage")


def finish(lc: Lifecycle, op_id: str, fields: dict[str, str], transport: Transport) -> str:
    """Carry a staged route operation to its end: expose, reason file, commit, end.  Idempotent
    (recovery runs it too); returns what was done, for the log."""
    d = Delivery.from_fields(fields)
    # Only while the stage file is there: once it was renamed, the target is this very message.
    if d.protect and transport.exists(d.stage):
        try:
            rename_resolving(transport, d.target, d.protect)
        except SourceGone:
            pass  # nothing to move aside
    try:
        rename_resolving(transport, d.stage, d.target)
        outcome = f"delivered to {d.label or d.target}"
    except SourceGone:
        # Its put was recorded, so only the rename removed the stage file: it is in place
        # (and perhaps taken from there already).
        outcome = f"had been delivered to {d.label or d.target}"
    crash_point("route.after-expose")
    if d.reason is not None:
        # staged beside the message's own stage file; keep_whole: recovery runs this again
        write_reason(transport, d.target, d.reason, stage=posixpath.dirname(d.stage), node_id=lc.node_id,
                     keep_whole=True)
    claim, commit = fields["claim"], fields["commit"]
    if lc._commit(claim, commit):
        crash_point("route.after-commit")
    elif commit and not fields.get("cleanup") and not lc.transport.exists(commit):
        # Neither claimed nor committed: the claim was returned while this node looked dead
        # (another node may route it again: at least once).
        log.warning("%s: %s: claim returned by another node after delivery; the message may be "
                    "delivered twice", lc.name, op_id)
    if fields.get("cleanup") and commit:
        try:
            lc.transport.delete(commit)
        except NotFound:
            pass
    lc.journal.end(op_id)
    return outcome


def roll_back(lc: Lifecycle, claimed: Claimed, transport: Transport | None, delivery: Delivery | None,
              reason: str, *, count: bool = True) -> str:
    """Undo a route operation that was never staged completely: remove its stage file (when
    ``transport`` can reach it), then return the claim to the source's inbox (``count``: with
    its delivery count raised).  Returns what was done."""
    if transport is not None and delivery is not None:
        try:
            transport.delete(delivery.stage)
        except NotFound:
            pass
    if not lc.transport.exists(claimed.path):
        lc.journal.end(claimed.op_id)
        return "claim gone (returned by another node); nothing to roll back"
    if count:
        return f"rolled back: {lc.redeliver(claimed, reason)}"
    lc.unclaim(claimed)
    return f"rolled back: returned to {lc.layout.box}"


def recover_route(lc: Lifecycle, op: Operation, transport_of: Callable[[str], Transport] | None) -> str:
    """Decide a pending route operation (see the module's docstring); returns what was done."""
    f = op.fields
    delivery = Delivery.from_fields(f)
    if transport_of is None:
        raise ConfigError(f"{op.op_id}: a routed message needs the destination's transport to recover")
    try:
        transport = transport_of(delivery.server)
    except KeyError:
        raise ConfigError(f"{op.op_id}: destination server {delivery.server!r} is not configured any "
                          "more; left pending") from None
    if STAGED in op.events:
        return "rolled forward: " + finish(lc, op.op_id, f, transport)
    return roll_back(lc, lc.claim_from_journal(op), transport, delivery,
                     "the node stopped before routing it")
