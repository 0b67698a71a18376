"""Free-form transfers: files in a partner's own directory layout (the spec's ``ftp:transfer``).

A transfer receives files matching ``receive_from`` (``/dir/pattern``, wildcard allowed) and sends
files to names expanded from ``send_to``, with the pre/post commands of docs/transfers.md.  It is
the lifecycle of :mod:`ftpbc.lifecycle` on someone else's directories, in the same order, so a
crash is decided the same way from the journal plus the server's state::

    receive   claim (durable batch; rename <dir>/X -> <select>/X~me)        [pre_receive: rename]
              read, handler, durable "received" record (result, every name decided)
              put <stage>/T~me~op  ->  COMMIT: rename the claim to its post_receive place
              -> "exposing" (durable)  ->  pre_send on T  ->  rename stage -> T  ->  post_send
    send      durable "send" intent (names)  ->  put stage  ->  "exposing" -> pre_send -> T -> post_send

Guarantees
    Every name (sequence values, dates) is drawn once, before any remote write, and recorded:
    recovery and retries reuse it.  A handler never runs twice for a file this node committed;
    its result is delivered exactly once unless the claim was lost to another node (then it is
    withheld).  Before ``exposing`` is recorded a client's send is rolled back on recovery; after
    it, rolled forward.

Not guaranteed
    With ``stage: false`` a reader can see a partial target, and a crashed client send may
    leave one.  With ``pre_receive: none`` and ``post_receive: delete`` a node that crashes before
    its delete, while another node processes the same file, gives the result twice.  Literal
    ``send_to`` names: recovery cannot tell this node's target from a later file of the same name.
"""

from __future__ import annotations

import io
import logging
import posixpath
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ftpbc.cluster.heartbeat import is_dead
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.models import TransferConfig, split_pattern_path
from ftpbc.errors import NotFound, OutcomeUnknown, SourceGone
from ftpbc.exchange.area import REASON_SUFFIX, archive_name, claim_name, parse_archive_name
from ftpbc.exchange.lifecycle import claim_files, rename_resolving
from ftpbc.exchange.recovery import Action, return_claim
from ftpbc.faults import crash_point
from ftpbc.journal import EndpointJournal, Operation
from ftpbc.node.provider import SPOOL_IN_MEMORY
from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.patterns.match import Value
from ftpbc.sequences import SequenceStore
from ftpbc.transport.base import Transport, join

if TYPE_CHECKING:
    from ftpbc.exchange.runtime import Runtime

log = logging.getLogger("ftpbc.transfer")

#: journal and lock names of transfers; ':' cannot occur in an endpoint name, so none collide
KEY_PREFIX = "transfer:"

Body = bytes | BinaryIO


def key(name: str) -> str:
    return KEY_PREFIX + name


@dataclass(frozen=True)
class Received:
    """A file taken for handling: claimed into the select directory, or in place."""

    name: str  # its name in the receive directory
    path: str  # where it is now
    op_id: str
    size: int
    values: dict[str, Value] = field(default_factory=dict)


class Transfer:
    """One transfer as seen by one node.  Thread-safe."""

    def __init__(self, name: str, config: TransferConfig, transport: Transport, journal: EndpointJournal,
                 sequences: SequenceStore, node_id: str, poll_lock: PollLock,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.name = name
        self.config = config
        self.transport = transport
        self.journal = journal
        self.sequences = sequences
        self.node_id = node_id
        self.poll_lock = poll_lock
        self.clock = clock
        self.receive_dir: str | None = None
        self.receive_pattern: Pattern | None = None
        if config.receive_from is not None:
            self.receive_dir, pattern = split_pattern_path("receive_from", config.receive_from)
            self.receive_pattern = Pattern.parse(pattern)
        self.send_dir: str | None = None
        self.send_pattern: Pattern | None = None
        if config.send_to is not None:
            self.send_dir, pattern = split_pattern_path("send_to", config.send_to)
            self.send_pattern = Pattern.parse(pattern)
        rdir, sdir = self.receive_dir or "/", self.send_dir or "/"
        self.select_dir = config.select_dir or join(rdir, ".ftpbc-select")
        self.error_dir = config.error_dir or join(rdir, ".ftpbc-error")
        self.archive_dir = join(rdir, ".ftpbc-archive")
        self.stage_dir = config.stage_dir or join(sdir, ".ftpbc-stage")
        self.protect_dir = join(sdir, ".ftpbc-protect")
        self._made: set[str] = set()
        self._made_lock = threading.Lock()

    @classmethod
    def from_runtime(cls, runtime: Runtime, name: str) -> Transfer:
        """The transfer ``name`` of ``runtime``'s configuration; ConfigError if there is none."""
        config = runtime.config
        if name not in config.transfers:
            from ftpbc.errors import ConfigError

            known = ", ".join(sorted(config.transfers)) or "none"
            raise ConfigError(f"unknown transfer {name!r} (defined: {known})", file=config.source)
        tc = config.transfers[name]
        return cls(name, tc, runtime.transport(tc.server), runtime.journal.endpoint(key(name)),
                   runtime.sequences, runtime.node_id,
                   PollLock(Path(config.node.state_dir), key(name), tc.lock, holder=runtime.node_id,
                            lease=config.node.lease))

    # ------------------------------------------------------------------ names

    def _ensure_dir(self, path: str) -> None:
        """Create ``path``'s directory once per process (mkdir of an existing one is harmless)."""
        directory = posixpath.dirname(path)
        with self._made_lock:
            if directory in self._made:
                return
        self.transport.mkdir(directory)
        with self._made_lock:
            self._made.add(directory)

    def _expand(self, text: str, now: datetime, *, file: str | None = None,
                directory: str | None = None) -> str:
        ctx = ExpandContext(endpoint=self.name, store=self.sequences, now=now, tz=self.config.timezone,
                            file=file, directory=directory)
        return Pattern.parse(text).expand(ctx).name

    def plan(self, op_id: str, *, file: str | None = None, directory: str | None = None) -> dict[str, str]:
        """Every name of one outbound file, decided now (draws sequence values once).

        ``file``/``directory`` feed ``%f``/``%p`` in ``send_to`` (a received file's).
        """
        cfg = self.config
        if self.send_pattern is None or self.send_dir is None:
            from ftpbc.errors import ConfigError

            raise ConfigError(f"transfer {self.name!r} has no send_to", key=f"transfers.{self.name}.send_to")
        now = self.clock()
        ctx = ExpandContext(endpoint=self.name, store=self.sequences, now=now, tz=cfg.timezone,
                            file=file, directory=directory)
        target_name = self.send_pattern.expand(ctx).name
        target = join(self.send_dir, target_name)
        fields = {"target": target}
        if cfg.stage:
            op_short = op_id.split(".", 1)[0][:8]
            fields["stage"] = join(self.stage_dir, f"{claim_name(target_name, self.node_id)}~{op_short}")
        if cfg.pre_send != "none":
            fields["protect"] = (
                self._expand(cfg.pre_send_to, now, file=target_name, directory=self.send_dir)
                if cfg.pre_send_to else join(self.protect_dir, archive_name(target_name, self.node_id, now)))
        if cfg.post_send == "rename":
            assert cfg.post_send_to is not None  # validated with the configuration
            fields["final"] = self._expand(cfg.post_send_to, now, file=target_name, directory=self.send_dir)
        return fields

    # ------------------------------------------------------------------ sending

    def send(self, body: Body) -> str:
        """Send one file to ``send_to``; return its path once it is in place (after post_send).

        If this raises, nothing was exposed unless the error came after ``exposing`` was
        recorded, in which case recovery completes the send.
        """
        op_id = f"{uuidlib.uuid4()}.send"
        fields = self.plan(op_id)
        self.journal.record(op_id, "send", durable=True, **fields)
        stream = io.BytesIO(body) if isinstance(body, bytes | bytearray) else body
        stage = fields.get("stage")
        if stage:
            self._ensure_dir(stage)
            try:
                self.transport.put(stage, stream)
            except Exception:
                self._discard(stage)
                self.journal.end(op_id)
                raise
            crash_point("transfer.after-stage")
        path = self._expose(op_id, fields, lambda: stream)
        self.journal.end(op_id)
        return path

    def _expose(self, op_id: str, f: dict[str, str], body: Callable[[], BinaryIO] | None) -> str:
        """From a complete staged file (or, unstaged, from ``body``) to target and final names.

        Idempotent once ``exposing`` is recorded: a retry or recovery re-checks the server.
        ``body`` is None in recovery of a client's send (its body was never journaled).
        """
        t = self.transport
        stage, target, final = f.get("stage"), f["target"], f.get("final")
        first = "exposing" not in f
        if first:
            self.journal.record(op_id, "exposing", durable=True)
            f["exposing"] = "1"
            crash_point("transfer.before-expose")
        if stage:
            if first or t.exists(stage):
                self._protect(f)
                self._ensure_dir(target)
                try:
                    rename_resolving(t, stage, target)
                except SourceGone:
                    if first:
                        raise
            # else: the rename into place had happened before a crash or a lost reply
        elif body is not None:
            if first:
                self._protect(f)
            self._ensure_dir(target)
            t.put(target, body())
        else:
            log.warning("%s: %s was written in place (stage: false) when the node stopped; it may be "
                        "incomplete", self.name, target)
        crash_point("transfer.after-expose")
        if not final:
            return target
        self._ensure_dir(final)
        try:
            rename_resolving(t, target, final)
        except SourceGone:
            if not t.exists(final):
                log.warning("%s: %s was gone before its post_send rename to %s (taken already?)",
                            self.name, target, final)
        return final

    def _protect(self, f: dict[str, str]) -> None:
        """pre_send: move (rename) or copy an existing target to its protect path."""
        protect, target = f.get("protect"), f["target"]
        if not protect:
            return
        self._ensure_dir(protect)
        if self.config.pre_send == "rename":
            try:
                rename_resolving(self.transport, target, protect)
            except SourceGone:
                pass  # no existing target: nothing to protect
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            try:
                self.transport.get(target, spool)  # type: ignore[arg-type]
            except NotFound:
                return
            spool.seek(0)
            self.transport.put(protect, spool)  # type: ignore[arg-type]

    def _discard(self, path: str) -> None:
        try:
            self.transport.delete(path)
        except NotFound:
            pass

    # ------------------------------------------------------------------ receiving

    def prepare(self) -> None:
        """Create this transfer's working directories that are missing."""
        if self.receive_dir is not None:
            for d in (self.receive_dir, self.error_dir,
                      *((self.select_dir,) if self.config.pre_receive == "rename" else ())):
                self.transport.mkdir(d)

    def candidates(self, limit: int) -> list[Received]:
        """Up to ``limit`` matching files of the receive directory, oldest first (not yet taken)."""
        assert self.receive_dir is not None and self.receive_pattern is not None
        picks = []
        entries = self.transport.list(self.receive_dir)
        epoch = datetime.min.replace(tzinfo=UTC)
        for e in sorted(entries, key=lambda e: (e.mtime or epoch, e.name)):
            if e.is_dir:
                continue
            m = self.receive_pattern.match(e.name)
            if m is None:
                continue
            values = dict(m.values)
            values.update({f"%*{i}": w for i, w in enumerate(m.wildcards)})
            picks.append(Received(e.name, join(self.receive_dir, e.name), f"{uuidlib.uuid4()}.receive",
                                  e.size, values))
            if len(picks) >= limit:
                break
        return picks

    def claim(self, picks: list[Received]) -> tuple[list[Received], int]:
        """pre_receive rename: claim ``picks`` into the select directory; (claimed, races lost)."""
        if not picks:
            return [], 0
        plan = [(r.op_id, r.path, join(self.select_dir, claim_name(r.name, self.node_id))) for r in picks]
        won = claim_files(self.transport, self.journal, plan, intent_point="transfer.after-claim",
                          rename_point="transfer.after-claim")
        claimed = [Received(r.name, plan[i][2], r.op_id, r.size, r.values)
                   for i, r in enumerate(picks) if i in won]
        return claimed, len(picks) - len(claimed)

    def read(self, received: Received, sink: BinaryIO) -> int:
        return self.transport.get(received.path, sink)

    def unclaim(self, received: Received) -> None:
        """Give a claimed file back to the receive directory (a failed read) and end its claim."""
        if self.config.pre_receive == "rename" and self.receive_dir is not None:
            try:
                self.transport.rename(received.path, join(self.receive_dir, received.name))
            except SourceGone:
                pass
            self.journal.end(received.op_id)

    def record_received(self, received: Received, result: bytes | None, *,
                        error: str | None) -> dict[str, str]:
        """Durably record the handler's outcome and every name still to use; return the fields.

        Once this returns the handler must not run again for this file: recovery delivers
        the recorded result.
        """
        cfg = self.config
        assert self.receive_dir is not None
        now = self.clock()
        fields = {"claim": received.path, "name": received.name}
        stamped = archive_name(received.name, self.node_id, now)
        if error is not None:
            fields["commit_to"] = join(self.error_dir, stamped)
            fields["reason"] = error
        elif cfg.post_receive == "rename":
            fields["commit_to"] = (
                self._expand(cfg.post_receive_to, now, file=received.name, directory=self.receive_dir)
                if cfg.post_receive_to else join(self.archive_dir, stamped))
        elif cfg.pre_receive == "rename":
            # delete: commit by a rename inside the select directory (decidable after a crash),
            # delete once the result is out
            fields["commit_to"] = join(self.select_dir, stamped)
            fields["cleanup"] = "1"
        else:
            fields["commit_to"] = ""  # delete in place is the commit
        if result is not None and error is None:
            if self.send_pattern is None:
                log.warning("%s: handler returned a result for %s but the transfer has no send_to; "
                            "dropped", self.name, received.name)
            else:
                fields.update(self.plan(received.op_id, file=received.name, directory=self.receive_dir))
                fields.update(self.journal.save_result(received.op_id, result))
        self.journal.record(received.op_id, "received", durable=True, **fields)
        crash_point("transfer.after-result")
        return fields

    def finish_received(self, op_id: str, f: dict[str, str], *, fresh: bool = False) -> bool:
        """Carry a ``received`` operation to its end; idempotent, so recovery calls it too.

        ``fresh``: nothing touched the server since the record, so the claim is known to be
        there and nothing staged.  False when the claim had been lost to another node.
        """
        t = self.transport
        claim, commit_to = f["claim"], f.get("commit_to", "")
        outbound, stage = "target" in f, f.get("stage")
        if fresh or t.exists(claim):
            if outbound and stage and "exposing" not in f and (fresh or not t.exists(stage)):
                self._ensure_dir(stage)
                t.put(stage, io.BytesIO(self.journal.load_result(f)))
                crash_point("transfer.after-stage")
            if commit_to:
                self._ensure_dir(commit_to)
            try:
                if commit_to:
                    t.rename(claim, commit_to)
                else:
                    t.delete(claim)
            except NotFound:
                return self._lost(op_id, stage if outbound and "exposing" not in f else None)
            except OutcomeUnknown:
                if not commit_to or not t.exists(commit_to):
                    return self._lost(op_id, stage if outbound and "exposing" not in f else None)
            crash_point("transfer.after-commit")
        elif commit_to and not t.exists(commit_to):
            return self._lost(op_id, stage if outbound and "exposing" not in f else None)
        if "reason" in f and not t.exists(commit_to + REASON_SUFFIX):
            t.put(commit_to + REASON_SUFFIX, io.BytesIO(f["reason"].encode("utf-8") + b"\n"))
        if outbound:
            self._expose(op_id, f, lambda: io.BytesIO(self.journal.load_result(f)))
        if f.get("cleanup"):
            self._discard(commit_to)
        self.journal.end(op_id)
        return True

    def _lost(self, op_id: str, staged: str | None) -> bool:
        if staged:
            self._discard(staged)
        log.warning("%s: %s: file taken back by another node before commit; result withheld",
                    self.name, op_id)
        self.journal.end(op_id)
        return False

    # ------------------------------------------------------------------ recovery and sweeping

    def recover(self) -> list[Action]:
        """Decide every pending operation of this transfer (see the module docstring)."""
        actions = []
        for op in self.journal.pending():
            crash_point("recover.before-op")
            if "received" in op.events and self.config.pre_receive == "none":
                # The file is in the partner's directory: decide only while no poller reads it.
                with self.poll_lock.attempt(wait=60.0) as held:
                    outcome = self._recover_op(op) if held else "deferred: poll lock busy"
            else:
                outcome = self._recover_op(op)
            crash_point("recover.after-op")
            actions.append(Action(key(self.name), op.op_id, op.kind, outcome))
            log.info("recovered %s", actions[-1])
        return actions

    def _recover_op(self, op: Operation) -> str:
        f = op.fields
        if "received" in op.events:
            if self.finish_received(op.op_id, f):
                return "finished: recorded result delivered, handler not run again"
            return "claim had been returned by another node; result withheld"
        if op.kind == "claim":
            return return_claim(self.transport, self.journal, op)
        if op.kind == "send":
            if "exposing" not in f:
                if f.get("stage"):
                    self._discard(f["stage"])
                outcome = "rolled back: never exposed"
            else:
                outcome = f"rolled forward: in place at {self._expose(op.op_id, f, None)}"
            self.journal.end(op.op_id)
            return outcome
        self.journal.end(op.op_id)
        return f"unknown operation {op.kind!r} dropped"

    def sweep(self, state_dir: Path, lease: float) -> int:
        """Return claims of dead nodes (no heartbeat within ``lease``) to the receive directory.

        Only bare claims (``<name>~<node>``) move; committed files (with a stamp) wait for their
        node's recovery.  Returns how many were returned.
        """
        if self.receive_dir is None or self.config.pre_receive != "rename":
            return 0
        returned = 0
        dead: dict[str, bool] = {}
        for e in self.transport.list(self.select_dir):
            name, owner, when = parse_archive_name(e.name)
            if when is not None or owner is None or owner == self.node_id:
                continue
            if owner not in dead:
                dead[owner] = is_dead(state_dir, owner, lease)
            if not dead[owner]:
                continue
            try:
                self.transport.rename(join(self.select_dir, e.name), join(self.receive_dir, name))
                returned += 1
                log.warning("%s: returned %s claimed by dead node %s", self.name, name, owner)
            except SourceGone:
                pass
        return returned
