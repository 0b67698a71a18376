"""Housekeeping a serving node does for the whole cluster, every ``lease / 3`` seconds, for every
endpoint and transfer it serves.

* Claims of dead nodes (no heartbeat younger than the lease) go back to their box with their
  delivery count raised (a message that kills every node that reads it ends in the error
  directory after ``max_deliveries``).
* Staged files of dead nodes: a staged message is removed (its sender never got an
  acknowledgement); a staged response is exposed if the dead node had committed its request
  (the request sits in ``inarchive`` or ``inerror`` under that node's name).  A complete staged
  response (its name declares its size, and the file has it) whose request still waits or is
  claimed stays, whoever staged it: the node that serves the request delivers it rather than
  running the handler again.  Any other is removed: a node killed mid-upload leaves a torn
  file, and a reply to a request served meanwhile must not replace the other node's.  A partner's staged
  files wait for their node's own recovery (their targets are only in its journal), and so do
  responses staged here for another endpoint's request (reply_to: their names say so).
* Responses nobody collected within ``uncollected_after``: archived as ``~uncollected``.

The sweep runs under its own cluster lock (the coordination's: a file lock in ``state_dir``,
or a token on the server), whatever the poll lock mode, so two nodes never sweep
one endpoint at once (deciding a staged response needs a consistent view).  One entry that
cannot be handled is logged once and skipped: it never stops the sweep of the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from ftpbc.cluster.coordination import Coordination
from ftpbc.errors import FtpbcError, NotFound, SourceGone
from ftpbc.exchange.area import archive_name, parse_archive_name, split_claim, split_stage
from ftpbc.exchange.layout import AreaLayout, Candidate, Layout, Outbound
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.transport.base import Entry

log = logging.getLogger("ftpbc.sweeper")

UNCOLLECTED = "uncollected"


class Sweeper:
    """Sweeps the lifecycles of one endpoint (both directions) or one transfer."""

    def __init__(self, lifecycles: Sequence[Lifecycle], coordination: Coordination, *,
                 uncollected_after: float | None = None) -> None:
        self.lifecycles = list(lifecycles)
        main = self.lifecycles[0]
        self.endpoint = main.layout.key
        self.node_id = main.node_id
        self.coordination = coordination
        self.lease = coordination.lease
        self.uncollected_after = uncollected_after
        self.lock = coordination.poll_lock(f"{self.endpoint}.sweep", "file")
        self.uncollected = 0
        self.returned = 0
        self.expired = 0
        self._dead: dict[str, bool] = {}
        #: complete staged responses of live nodes -> when this sweeper first saw them (monotonic):
        #: a server's listing times may be rounded to the minute, so age is judged here
        self._staged_seen: dict[str, float] = {}

    def sweep(self) -> None:
        with self.lock.attempt() as held:
            if held:
                self._dead = {}
                self._sweep()

    def _is_dead(self, owner: str | None) -> bool:
        if owner is None or owner == self.node_id:
            return False
        if owner not in self._dead:
            self._dead[owner] = self.coordination.is_dead(owner)
        return self._dead[owner]

    def _sweep(self) -> None:
        inbound = self.lifecycles[0]
        if isinstance(inbound.layout, AreaLayout):
            self._staged_responses(inbound, self.lifecycles[1] if len(self.lifecycles) > 1 else None)
        for lc in self.lifecycles:
            self._return_claims(lc)
            for stage in lc.layout.orphan_stages:
                self._each(lc, stage, self._staged_message)
        if self.uncollected_after is not None and len(self.lifecycles) > 1:
            self._archive_uncollected(self.lifecycles[1])
        if inbound.policy.expires:
            self._expire(inbound)

    def _each(self, lc: Lifecycle, directory: str, step: Callable[[Lifecycle, str, Entry], None]) -> None:
        """``step`` for every entry of ``directory``; one that fails is logged once and skipped."""
        try:
            entries = lc.transport.list(directory)
        except NotFound:
            return
        for e in entries:
            try:
                step(lc, directory, e)
            except FtpbcError as exc:
                lc.layout.report(e.name, f"sweep skipped it: {exc}")

    # ------------------------------------------------------------------ claims and stage files

    def _return_claims(self, lc: Lifecycle) -> None:
        if lc.layout.select is not None:
            self._each(lc, lc.layout.select, self._return_claim)

    def _return_claim(self, lc: Lifecycle, directory: str, e: Entry) -> None:
        layout = lc.layout
        if not layout.is_claim(e.name):
            return  # a committed file (<name>~<node>~<stamp>) waits for its node's cleanup
        name, owner = split_claim(e.name)
        if not self._is_dead(owner):
            return
        target = layout.box_path(_redelivered(layout, name))
        try:
            lc.transport.rename(f"{directory}/{e.name}", target)
        except SourceGone:
            return
        self.returned += 1
        log.warning("%s: returned %s claimed by dead node %s", layout.display, name, owner)

    def _staged_message(self, lc: Lifecycle, directory: str, e: Entry) -> None:
        name, owner = split_claim(e.name)
        if owner is not None and not self._is_dead(owner) and owner != self.node_id:
            name, owner = split_claim(name)  # a partner's stage name: <target>~<node>~<op>
        if isinstance(lc.layout, AreaLayout) and self._is_dead(owner):
            self._delete(lc, f"{directory}/{e.name}", "staged message of a dead sender")

    def _staged_responses(self, inbound: Lifecycle, outbound: Lifecycle | None) -> None:
        """Decide the staged responses whose node cannot finish them: a dead node's, and any
        complete one (its size in its name) left staged longer than the lease.

        A dead node's response is exposed if that node committed the request.  A complete one
        whose request still waits or is claimed stays: the node that serves the request
        delivers it instead of running the handler again (:meth:`Lifecycle.adopt`).  The rest
        are removed: a torn upload, or a reply to a request that was served meanwhile."""
        if outbound is None:
            return
        layout = inbound.layout
        assert isinstance(layout, AreaLayout)
        listed = _listing(outbound, outbound.layout.stages[0])
        now = time.monotonic()
        seen = self._staged_seen
        self._staged_seen = {e.name: seen.get(e.name, now) for e in listed if _complete(e)}
        staged = [e for e in listed if self._undecided(e, now)]
        if not staged:
            return
        claims: dict[str, str | None] = {}  # uuid of a request waiting or claimed -> its claimer
        # Box, select, box again: a request claimed (box -> select) or given back (select -> box)
        # while this lists is seen in one of them.
        for directory in filter(None, (layout.box, layout.select, layout.box if layout.select else None)):
            for e in _listing(inbound, directory):
                name, owner = split_claim(e.name) if directory == layout.select else (e.name, None)
                cand = _decoded(layout, name)
                if cand is not None:
                    claims.setdefault(cand.uuid, owner)
        committers: dict[str, set[str]] | None = None
        for e in staged:
            try:
                name, owner, _ = split_stage(e.name)
                resp = _decoded(outbound.layout, name)
                if resp is None or owner is None or resp.envelope.headers.reply_to is not None:
                    # A reply_to response: its request was another endpoint's, whose archives
                    # this sweep does not list; it waits for its node's own recovery.
                    continue
                uid = resp.envelope.headers.correlation_id or resp.uuid
                stage = f"{outbound.layout.stages[0]}/{e.name}"
                complete = _complete(e)
                if uid in claims:
                    if not complete:
                        self._delete(outbound, stage, "staged response of an uncommitted request")
                    continue  # its request's next claimer delivers it
                if committers is None:
                    # Listing the archives is costly, so only here: a response staged without its
                    # claim happens after crashes and lost claims, not per message.
                    committers = self._committers(inbound)
                if owner in committers.get(uid, ()):
                    if self._is_dead(owner):
                        outbound.expose(_as_outbound(outbound, stage, name), staged=True, body=None)
                        log.info("%s: exposed %s staged by dead node %s", layout.display, name, owner)
                    continue  # a live node exposes what it committed
                who = f"dead node {owner}" if self._is_dead(owner) else f"node {owner}"
                self._delete(outbound, stage, f"staged by {who}, which never committed its request")
            except FtpbcError as exc:
                outbound.layout.report(e.name, f"sweep skipped it: {exc}")

    def _undecided(self, e: Entry, now: float) -> bool:
        """Whether a staged response's node cannot finish it: the node is dead, or the
        response is complete and this sweeper has seen it staged for over a lease (its node may
        have lost the claim; one that did not still holds it, or committed it, and the sweep
        leaves it alone).  An upload under way is never complete, so never taken."""
        _, owner, _ = split_stage(e.name)
        if self._is_dead(owner):
            return True
        first = self._staged_seen.get(e.name)
        return first is not None and now - first > self.lease

    def _committers(self, inbound: Lifecycle) -> dict[str, set[str]]:
        """uuid -> the nodes that committed a request with that uuid (archived it, or filed it
        as an error)."""
        layout = inbound.layout
        assert isinstance(layout, AreaLayout)
        out: dict[str, set[str]] = {}
        filed = (layout.archive_dir, layout.error, layout.expired_dir, layout.dead_dir)
        for directory in filter(None, filed):
            for e in _listing(inbound, directory):
                name, node, _ = parse_archive_name(e.name)
                cand = _decoded(layout, name)
                if cand is not None and node:
                    out.setdefault(cand.uuid, set()).add(node)
        return out

    # ------------------------------------------------------------------ expired messages

    def _expire(self, inbound: Lifecycle) -> None:
        """File the inbox's expired messages (those no consumer's selector takes included)."""
        try:
            inbound.listing(keep=0)  # sets the expired ones aside; keeps nothing else (a box may be huge)
        except NotFound:
            return
        filed = inbound.expire(inbound.take_expired())
        if filed:
            self.expired += filed
            log.info("%s: %d expired message(s) filed", inbound.layout.display, filed)

    # ------------------------------------------------------------------ uncollected responses

    def _archive_uncollected(self, outbound: Lifecycle) -> None:
        layout = outbound.layout
        assert isinstance(layout, AreaLayout) and self.uncollected_after is not None
        now = datetime.now(UTC)
        for e in _listing(outbound, layout.box):
            if e.mtime is None or (now - e.mtime).total_seconds() < self.uncollected_after:
                continue
            try:
                outbound.transport.rename(layout.box_path(e.name),
                                          f"{layout.archive_dir}/{archive_name(e.name, UNCOLLECTED, now)}")
            except SourceGone:
                continue
            except FtpbcError as exc:
                layout.report(e.name, f"cannot archive it as uncollected: {exc}")
                continue
            self.uncollected += 1
            log.warning("%s: %s uncollected for %.0f s; archived", layout.display, e.name,
                        (now - e.mtime).total_seconds())

    def _delete(self, lc: Lifecycle, path: str, why: str) -> None:
        try:
            lc.transport.delete(path)
            log.info("%s: removed %s (%s)", lc.layout.display, path, why)
        except NotFound:
            pass


def _complete(e: Entry) -> bool:
    """Whether a staged file's size is the one its name declares."""
    size = split_stage(e.name)[2]
    return size is not None and e.size == size and not e.is_dir


def _listing(lc: Lifecycle, directory: str) -> list[Entry]:
    try:
        return lc.transport.list(directory)
    except NotFound:
        return []


def _decoded(layout: Layout, name: str) -> Candidate | None:
    return layout.decode_name(name)


def _redelivered(layout: Layout, name: str) -> str:
    """``name`` with its delivery count raised (as it was if it cannot carry one)."""
    cand = _decoded(layout, name)
    if cand is None:
        return name
    return layout.with_delivery_count(cand, cand.envelope.headers.delivery_count + 1)


def _as_outbound(lc: Lifecycle, stage: str, name: str) -> Outbound:
    return Outbound(lc.layout.box_path(name), stage)
