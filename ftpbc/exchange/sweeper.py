"""Housekeeping a serving node does for the whole cluster, every ``lease / 3`` seconds.

* Claims and stage files of dead nodes (no heartbeat younger than the lease): claims go back to
  their box; a staged request is removed (its sender never got an acknowledgement); a staged
  response is exposed only if the dead node had committed its request (the request sits in
  ``inarchive`` or ``inerror`` under that node's name), and removed otherwise.  Commit is the
  only proof that the upload was complete: a node killed mid-upload leaves a torn file, and a
  node that lost its claim (it looked dead, the request went to another node) leaves a reply
  that must not replace the other node's.
* Responses nobody collected within ``uncollected_after``: archived as ``~uncollected``.

The sweep runs under the endpoint's file lock, whatever the endpoint's lock mode, so two nodes
never sweep one endpoint at once (deciding a staged response needs a consistent view).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from ftpbc.cluster.heartbeat import is_dead
from ftpbc.cluster.poll_lock import PollLock
from ftpbc.config.models import EndpointConfig
from ftpbc.errors import NotFound, SourceGone
from ftpbc.exchange.area import archive_name, parse_archive_name, split_claim
from ftpbc.exchange.lifecycle import Exchange
from ftpbc.patterns import Pattern

log = logging.getLogger("ftpbc.sweeper")

UNCOLLECTED = "uncollected"


class Sweeper:
    def __init__(self, endpoint: str, config: EndpointConfig, exchange: Exchange, state_dir: Path,
                 lease: float) -> None:
        self.endpoint = endpoint
        self.config = config
        self.exchange = exchange
        self.state_dir = state_dir
        self.lease = lease
        self.lock = PollLock(state_dir, f"{endpoint}.sweep", "file", holder=exchange.node_id, lease=lease)
        self.request_pattern = Pattern.parse(config.request_prefix + config.message_name)
        self.uncollected = 0
        self.returned = 0

    def _dead(self, owner: str | None, cache: dict[str, bool]) -> bool:
        if owner is None or owner == self.exchange.node_id:
            return False
        if owner not in cache:
            cache[owner] = is_dead(self.state_dir, owner, self.lease)
        return cache[owner]

    def sweep(self) -> None:
        with self.lock.attempt() as held:
            if held:
                self._sweep()

    def _sweep(self) -> None:
        ex, t = self.exchange, self.exchange.transport
        dead: dict[str, bool] = {}
        inselect = {e.name for e in t.list(ex.area.dir("in", "select"))}
        claimed_uuids = {}
        for claimed in inselect:
            name, owner = split_claim(claimed)
            m = self.request_pattern.match(name)
            if m is not None and m.uuid:
                claimed_uuids[m.uuid] = claimed
        # Staged responses first: whether to expose one depends on its request's claim.
        committers: dict[str, set[str]] | None = None
        for e in t.list(ex.area.dir("out", "stage")):
            name, owner = split_claim(e.name)
            if owner is None or not self._dead(owner, dead):
                continue
            uid = name[len(self.config.response_prefix):].removesuffix(".error")
            stage = ex.area.path("out", "stage", e.name)
            if uid in claimed_uuids and split_claim(claimed_uuids[uid])[1] == owner:
                self._delete(stage, "staged response of an uncommitted request")
                continue
            if committers is None:
                # Listing the archives is costly, so only here: a dead node's response staged
                # without its claim happens after crashes, not per message.
                committers = self._committers()
            if owner in committers.get(uid, ()):
                ex.expose(stage, ex.area.path("out", "box", name))
                log.info("%s: exposed %s staged by dead node %s", self.endpoint, name, owner)
            else:
                self._delete(stage, f"staged by dead node {owner}, which never committed its request")
        for direction in ("in", "out"):
            select = inselect if direction == "in" else {e.name for e in t.list(ex.area.dir("out", "select"))}
            for claimed in select:
                name, owner = split_claim(claimed)
                if not self._dead(owner, dead):
                    continue
                try:
                    t.rename(ex.area.path(direction, "select", claimed), ex.area.path(direction, "box", name))
                    self.returned += 1
                    log.warning("%s: returned %s claimed by dead node %s", self.endpoint, name, owner)
                except SourceGone:
                    pass
        for e in t.list(ex.area.dir("in", "stage")):
            if self._dead(split_claim(e.name)[1], dead):
                self._delete(ex.area.path("in", "stage", e.name), "staged request of a dead sender")
        self._archive_uncollected()

    def _committers(self) -> dict[str, set[str]]:
        """uuid -> the nodes that committed a request with that uuid (archived it, or filed it
        as an error)."""
        ex = self.exchange
        out: dict[str, set[str]] = {}
        for kind in ("archive", "error"):
            for e in ex.transport.list(ex.area.dir("in", kind)):
                name, node, _ = parse_archive_name(e.name)
                m = self.request_pattern.match(name)
                if m is not None and m.uuid and node:
                    out.setdefault(m.uuid, set()).add(node)
        return out

    def _archive_uncollected(self) -> None:
        ex, t = self.exchange, self.exchange.transport
        now = datetime.now(UTC)
        for e in t.list(ex.area.dir("out", "box")):
            if e.mtime is None or (now - e.mtime).total_seconds() < self.config.uncollected_after:
                continue
            try:
                t.rename(ex.area.path("out", "box", e.name),
                         ex.area.path("out", "archive", archive_name(e.name, UNCOLLECTED, now)))
                self.uncollected += 1
                log.warning("%s: %s uncollected for %.0f s; archived", self.endpoint, e.name,
                            (now - e.mtime).total_seconds())
            except SourceGone:
                pass

    def _delete(self, path: str, why: str) -> None:
        try:
            self.exchange.transport.delete(path)
            log.info("%s: removed %s (%s)", self.endpoint, path, why)
        except NotFound:
            pass
