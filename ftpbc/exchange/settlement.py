"""Settling a claimed message (:mod:`ftpbc.exchange.lifecycle`'s settlement floor): its result
recorded durably (:meth:`SettlementSteps.record_served`, or :meth:`~SettlementSteps.adopt` of a
reply another node staged), then finished (:meth:`~SettlementSteps.finish_served`: reply
staged, claim committed to its archive, error or dead-letter place, reason file, reply exposed);
filings (an error, a duplicate, an expired message) are the same recorded operation; a collected
response archived (:meth:`~SettlementSteps.finish_collect`); a dead letter replayed.

Every finish is idempotent and decided from the server's state, so a retry after a partial
failure and recovery (:mod:`ftpbc.exchange.recovery`) run the very same code.
"""

from __future__ import annotations

import io
import logging

from ftpbc.errors import NotFound, OutcomeUnknown, PermissionDenied, SourceGone
from ftpbc.exchange.area import REASON_SUFFIX, split_stage
from ftpbc.exchange.layout import Commit, Outbound
from ftpbc.exchange.outbound import OutboundSteps
from ftpbc.exchange.steps import (
    HOOKS,
    REMEMBERED_IDS,
    UNFINISHED,
    Claimed,
    Disposition,
    Retry,
    Served,
    message_id_of,
    rename_resolving,
    run_once,
    write_reason,
)
from ftpbc.faults import crash_point
from ftpbc.model.envelope import EXPIRED_TYPE

log = logging.getLogger("ftpbc.lifecycle")


class SettlementSteps(OutboundSteps):
    """Recording results and settling claimed messages (see the module's docstring)."""

    # ------------------------------------------------------------------ serving

    def record_served(self, claimed: Claimed, result: bytes | None, *, error: str | None,
                      commit: Commit | None = None, reply_type: str | None = None,
                      unopened: bool = False, adopted: str | None = None,
                      reason: str | None = None) -> dict[str, str]:
        """Durably record the handler's outcome and every name still to use; return the fields
        :meth:`finish_served` needs.  :meth:`write_served` then :meth:`served_durable`.

        ``error`` is the handler's failure reason (the message goes to the error directory; a
        requester gets an error reply).  ``result`` None means nothing to send.  Once this
        returns the handler must never run again for this message: recovery sends the result.
        ``commit`` overrides where the message goes, ``reply_type`` the type of the error reply.
        ``reason`` (with no ``result`` nor ``error``): filed with that reason beside it and no
        reply at all (a duplicate).
        A result for a request whose reply_to cannot be reached (:meth:`Layout.reply_refusal`)
        is recorded as a failure with that reason: filed as an error, the error reply in the
        request's own outbox.
        """
        return self.served_durable(self.write_served(claimed, result, error=error, commit=commit,
                                                     reply_type=reply_type, unopened=unopened,
                                                     adopted=adopted, reason=reason))

    def write_served(self, claimed: Claimed, result: bytes | None, *, error: str | None,
                     commit: Commit | None = None, reply_type: str | None = None,
                     unopened: bool = False, adopted: str | None = None,
                     reason: str | None = None) -> Served:
        """The first half of :meth:`record_served`: the ``served`` record written (a large
        result's side file fsynced), the record itself not yet known to be on disk.

        Until :meth:`served_durable` of what this returns has returned, the caller must change
        nothing on the server for this message (no stage, no commit): a power loss before then
        may lose the record, and recovery then returns the claim, as if the handler had not run.
        A killed process loses nothing (the page cache outlives it).  The gap lets a worker
        give its handler slot to the next message while the fsync runs, and lets one fsync cover
        the records of every worker that wrote meanwhile (wider group commit).
        """
        layout = self.layout
        when = self.clock()
        if error is None and result is not None:
            # A reply_to this node cannot reach: the caller hears why, from its own outbox.
            refused = layout.reply_refusal(claimed.candidate)
            if refused is not None:
                error, result = refused, None
        commit = commit or layout.commit(claimed.candidate, self.node_id, when, error=error is not None)
        fields = {"claim": claimed.path, "commit": commit.path, "request": claimed.name}
        marker = layout.marker_of(claimed.candidate)
        if marker is not None:
            fields["marker"] = layout.box_path(marker)  # removed once the file is settled
        if commit.cleanup:
            fields["cleanup"] = "1"
        if unopened:
            fields["unopened"] = "1"  # committed by move_refused: never opened nor followed
        body = error.encode("utf-8") if error is not None else (result or b"")
        reply = (layout.reply(claimed.candidate, self.node_id, when, claimed.op_id, error=error is not None,
                              type=reply_type, size=len(body))
                 if result is not None or error is not None else None)
        if reply is not None:
            fields.update(reply.fields())
            fields.update(self.journal.save_result(claimed.op_id, body))
        if adopted is not None:
            fields["adopted"] = adopted  # another node's staged reply, removed once this is done
        if error is not None or reason is not None:
            fields["reason"] = error if error is not None else reason or ""
        seq = self.journal.record_many([(claimed.op_id, "served", fields)], durable=False)
        return Served(claimed, fields, seq)

    def served_durable(self, served: Served) -> dict[str, str]:
        """Wait until ``served``'s record is on disk (fsync, shared with every record written
        before it began); return the fields :meth:`finish_served` needs.  From here on the
        handler must never run again for this message."""
        self.journal.wait_durable(served.seq)
        crash_point("serve.after-result")
        for hook in HOOKS.after_served_durable:
            hook(served)
        return served.fields

    def finish_served(self, op_id: str, fields: dict[str, str], *, fresh: bool = False) -> bool:
        """Carry a ``served`` operation to its end; idempotent, so recovery calls it too.

        ``fresh`` says the caller has just recorded the result and nothing since touched the
        server, so the claim is known to be there and no reply staged: the ``stat`` round trips
        that recovery needs are skipped on the hot path.  Returns False when this node had lost
        the claim (another node serves the message).
        """
        t = self.transport
        f = _current_fields(fields)
        claim, commit = f["claim"], f.get("commit", "")
        out = Outbound.from_fields(f)
        stage = out.stage if out is not None else None
        staged = False if fresh else stage is not None and t.exists(stage)
        if fresh or t.exists(claim):
            if out is not None and stage is not None:
                # Uploaded again even when found staged: a node killed mid-upload leaves a torn
                # file there, and only the commit below proves an upload was complete.
                self.layout.ensure_dir(t, stage)
                self._put_reply(stage, f)
                staged = True
                crash_point("serve.after-stage")
            if not self._commit(claim, commit, unopened=bool(f.get("unopened"))):
                return self._lost(op_id, stage if staged else None)
            crash_point("serve.after-commit")
            if log.isEnabledFor(logging.DEBUG):  # no message id to cut out when nobody reads it
                log.debug("%s: committed %s to %s", self.name, f.get("request", claim), commit or "(deleted)",
                          extra={"message_id": message_id_of(op_id)})
            if self.filed_dead(commit):
                # Counted where the rename happened, whoever runs this (a worker, the sweeper's
                # expiry, recovery): an expired message with ``expired: dead_letter``.
                self.observer.dead_lettered()
        elif commit and not f.get("cleanup") and not t.exists(commit):
            # Not claimed, not committed: our claim was returned while we looked dead.  Never
            # expose then.  (With cleanup, a missing commit means everything finished already.)
            # The result is staged whole all the same, so that whichever node serves the request
            # next delivers it rather than running the handler again.
            if stage is not None and not staged:
                staged = self._stage_for_adoption(stage, f)
            return self._lost(op_id, stage if staged else None)
        if "reason" in f and commit:
            # keep_whole: this runs again after a crash (recovery), when one may be in place
            write_reason(t, commit, f["reason"], stage=self.layout.reason_stage, node_id=self.node_id,
                         keep_whole=True)
        if f.get("marker"):
            self._consume_marker(f["marker"])
        if out is not None:
            self.expose(out, staged=staged, body=lambda: io.BytesIO(self.journal.load_result(f)))
            crash_point("serve.after-expose")
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s: reply to %s out as %s", self.name, f.get("request", claim), out.target,
                          extra={"message_id": message_id_of(op_id)})
        if f.get("cleanup") and commit:
            try:
                t.delete(commit)
            except NotFound:
                pass
        if f.get("adopted"):
            try:
                t.delete(f["adopted"])
            except NotFound:
                pass
        if "request" in f:
            self._note_settled(op_id, f["request"])
        self.journal.end(op_id)
        return True

    def _consume_marker(self, marker: str) -> None:
        """Remove a settled file's completion marker: after the commit, so that a crash between
        the two leaves a marker without a file (never received twice), which recovery's run
        of :meth:`finish_served` removes.  One this node may not remove is left and logged:
        failing the finish for it would hold the file's result back for good."""
        try:
            self.transport.delete(marker)
        except NotFound:
            pass  # removed by an earlier attempt (or by the partner)
        except PermissionDenied as exc:
            log.warning("%s: %s: cannot remove the completion marker; a new file of the same name "
                        "will be received as soon as it is listed: %s", self.name, marker, exc)

    def _commit(self, claim: str, commit: str, *, unopened: bool = False) -> bool:
        """Rename the claim to its commit place (or delete it in place); False if it was lost.
        ``unopened``: the claim is not a regular file (moved as it is, never followed)."""
        t = self.transport
        try:
            if commit:
                self.layout.ensure_dir(t, commit)
                if unopened:
                    t.move_refused(claim, commit)
                else:
                    t.rename(claim, commit)
            else:
                t.delete(claim)
        except NotFound:  # SourceGone included
            return False
        except OutcomeUnknown:
            # The reply was lost (say, the server restarted): decide from what is there now.
            if commit and t.exists(commit):
                return True
            if t.exists(claim):
                raise  # it did not happen: the caller retries this whole step
            return not commit  # deleted in place: gone is done
        return True

    def _lost(self, op_id: str, staged_reply: str | None) -> bool:
        """The claim went to another node before this one committed: never expose.  A staged
        reply whose name carries its size is complete (it was put in full before the commit was
        tried) and stays for the node that serves the request now, which delivers it instead of
        running the handler again (:meth:`adopt`); any other staged reply is removed."""
        if staged_reply and split_stage(staged_reply.rsplit("/", 1)[-1])[2] is not None:
            log.warning("%s: %s: claim lost to another node before commit; the reply stays staged "
                        "for whichever node serves the request now", self.name, op_id)
        else:
            if staged_reply:
                try:
                    self.transport.delete(staged_reply)
                except NotFound:
                    pass
            log.warning("%s: %s: claim lost to another node before commit; reply withheld", self.name, op_id)
        self.journal.end(op_id)
        return False

    def _note_settled(self, op_id: str, name: str) -> None:
        """Remember that the message ``name`` was settled by operation ``op_id``, when that
        operation is named after its message's id (a duplicate's own operation is not)."""
        if not self.layout.unique_ids:
            return
        uid = message_id_of(op_id)
        if uid not in name:
            return
        with self._lock:
            if len(self._settled) >= REMEMBERED_IDS:
                for old in list(self._settled)[:REMEMBERED_IDS // 2]:
                    del self._settled[old]
            self._settled[uid] = name

    # ------------------------------------------------------------------ adopting a staged reply

    def adopt(self, claimed: Claimed) -> dict[str, str] | None:
        """If a complete reply to ``claimed`` is staged on the server (by a node whose claim on
        it went back: it looked dead, or was stopped or cut off after staging), record it as this
        node's result, durably, and return the fields :meth:`finish_served` needs: the handler
        must not run.  None when there is none, or none provably complete (a staged reply is
        complete when its size is the one its name declares), and the handler may run
        (:meth:`~ftpbc.exchange.outbound.OutboundSteps.staged_reply`)."""
        staged = self.staged_reply(claimed)
        if staged is None:
            return None
        log.warning("%s: %s: its reply, staged by node %s, is delivered; the handler does not run "
                    "again", self.name, claimed.name, staged.owner)
        if staged.error:
            return self.record_served(claimed, None, error=staged.body.decode("utf-8", "replace"),
                                      reply_type=staged.reply_type, adopted=staged.path)
        return self.record_served(claimed, staged.body, error=None, adopted=staged.path)

    # ------------------------------------------------------------------ filing

    def file_error(self, claimed: Claimed, reason: str, *, dead: bool = False,
                   refused: bool = False, retry: Retry = run_once) -> Disposition:
        """File a claimed message in the error directory (``dead``: the dead letters, if the
        layout has them) with ``reason`` beside it; a request's caller gets an error reply
        carrying the reason at once.  ``refused``: the claim is no longer a file this node may
        open (a link swapped in after it was claimed): moved as it is, unopened.

        Recorded durably first (a ``served`` operation whose result is the error reply), then
        finished by :meth:`finish_served` under ``retry``: a filing interrupted anywhere
        completes on its next attempt or in recovery, reason file and reply included."""
        dead = dead and bool(self.layout.dead_dir)
        directory = self.layout.dead_dir if dead and self.layout.dead_dir else self.layout.error
        target = self.layout.filed_path(directory, claimed.name, self.node_id, self.clock())
        fields = self.record_served(claimed, None, error=reason, commit=Commit(target), unopened=refused)
        attempts = iter(range(1 << 30))
        done = retry(lambda: self.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if done is None:
            return UNFINISHED
        if not done:
            return Disposition("gone before it could be filed as an error", "gone")
        return Disposition(f"filed in {directory} ({reason})", "dead" if dead else "error")

    def file_duplicate(self, claimed: Claimed, *, retry: Retry = run_once) -> Disposition:
        """File a duplicate (:attr:`Claimed.duplicate`) in the error directory, unread, with its
        reason beside it, and answer nobody: the caller waiting on that id waits for the other
        message's reply, and an error reply would be a second one.  Recorded and finished as
        :meth:`file_error` is."""
        fields = self.record_duplicate(claimed)
        attempts = iter(range(1 << 30))
        done = retry(lambda: self.finish_served(claimed.op_id, fields, fresh=next(attempts) == 0))
        if done is None:
            return UNFINISHED
        if not done:
            return Disposition("gone before it could be filed as a duplicate", "gone")
        return Disposition(f"filed in {self.layout.error} ({claimed.duplicate})", "duplicate")

    def record_duplicate(self, claimed: Claimed) -> dict[str, str]:
        """Durably record the filing of a duplicate (no reply); the fields
        :meth:`finish_served` needs."""
        assert claimed.duplicate is not None
        target = self.layout.filed_path(self.layout.error, claimed.name, self.node_id, self.clock())
        return self.record_served(claimed, None, error=None, commit=Commit(target), reason=claimed.duplicate)

    def record_expired(self, claimed: Claimed) -> dict[str, str]:
        """Record that a claimed message expired (never to be delivered): it goes to the expired
        directory, or the dead letters with ``expired: dead_letter``, with its reason beside
        it, and a request's caller gets a reply of type EXPIRED_TYPE.  Finished like a served
        message (:meth:`finish_served`), so recovery finishes it too.  A duplicate
        (:attr:`Claimed.duplicate`) is filed as one instead (:meth:`record_duplicate`)."""
        if claimed.duplicate is not None:
            return self.record_duplicate(claimed)
        exp = claimed.candidate.envelope.headers.expiration
        when = self.clock()
        reason = (f"expired at {exp.isoformat(timespec='milliseconds') if exp else '?'}, found by node "
                  f"{self.node_id} at {when.isoformat(timespec='milliseconds')}; never delivered")
        layout = self.layout
        directory = layout.dead_dir if self.policy.expired == "dead_letter" else layout.expired_dir
        target = layout.filed_path(directory, claimed.name, self.node_id, when)
        return self.record_served(claimed, None, error=reason, commit=Commit(target), reply_type=EXPIRED_TYPE)

    # ------------------------------------------------------------------ collecting

    def mark_delivered(self, claimed: Claimed) -> None:
        """Note that a response was handed to its caller but is not archived yet; from now on
        reclaim and recovery archive it rather than return it to the outbox.  Not fsynced:
        after a machine crash the response goes back to the outbox and a later collect delivers
        it again (at least once)."""
        self.journal.record(claimed.op_id, "delivered")

    def finish_collect(self, claimed: Claimed) -> None:
        """Archive (or delete) a message that has been read and handed over; end its operation."""
        commit = self.layout.commit(claimed.candidate, self.node_id, self.clock(), error=False)
        t = self.transport
        try:
            if commit.cleanup or not commit.path:
                t.delete(claimed.path)
            else:
                t.rename(claimed.path, commit.path)
        except NotFound:
            pass
        crash_point("collect.after-archive")
        self._note_settled(claimed.op_id, claimed.name)
        self.journal.end(claimed.op_id)

    # ------------------------------------------------------------------ dead letters

    def replay(self, src: str, name: str, *, op_id: str) -> str:
        """Put a filed message (a dead letter at ``src``) back in the box as ``name``; return
        where it went.

        Journaled (durably) before the rename, and :meth:`finish_replay` is what recovery runs:
        killed at any point, the message ends up in the box exactly once, never in both places
        and never in neither (the rename is atomic, and finishing it again is idempotent).
        Refused (FileExistsError) when a message of that name is waiting already.
        """
        dst = self.layout.box_path(name)
        if self.transport.exists(dst):
            raise FileExistsError(f"{dst} exists: a message of that name is waiting already")
        fields = {"src": src, "dst": dst, "reason": src + REASON_SUFFIX}
        self.journal.record(op_id, "replay", durable=True, **fields)
        crash_point("replay.after-intent")
        self.finish_replay(op_id, fields)
        return dst

    def finish_replay(self, op_id: str, fields: dict[str, str]) -> str:
        """Carry a ``replay`` operation to its end (rename, then the reason file); idempotent."""
        t = self.transport
        try:
            rename_resolving(t, fields["src"], fields["dst"])
            outcome = f"returned to {self.layout.box}"
        except SourceGone:
            outcome = "had been returned already"
        crash_point("replay.after-rename")
        try:
            t.delete(fields["reason"])
        except NotFound:
            pass
        self.journal.end(op_id)
        return outcome


def _current_fields(f: dict[str, str]) -> dict[str, str]:
    """Fields of a ``served`` record, also as the previous release wrote them (an upgrade must
    finish what the old version left in its journal)."""
    if "commit" in f:
        return f
    g = dict(f)
    if "archived" in g:  # endpoint: archived, resp_stage, resp_target
        g["commit"] = g.pop("archived")
        if "resp_target" in g:
            g["target"] = g.pop("resp_target")
            g["stage"] = g.pop("resp_stage", "")
    elif "commit_to" in g:  # transfer: commit_to, target, stage, protect, final
        g["commit"] = g.pop("commit_to")
    return g
