"""Synthetic archives for tests and benchmarks, written through ftpbc's own write path.

Each file is put into the stage directory under its staged name and renamed into its archive
folder under the exact names of :mod:`ftpbc.exchange`, as the engine does.  The plan (what was
written) is returned so that a test can compute the expected figures by itself.

A share of the requests (:data:`REPLY_TO_SHARE` of those answered, failed or with an unreadable
reply, when there are several endpoints) carries a ``reply_to`` naming another endpoint: their
reply is archived in that endpoint's outbox folders, named by its response prefix and carrying
``;r=<the request's endpoint>``, as a serving node names it.
"""

from __future__ import annotations

import io
import os
import random
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from ftpbc.analytics.records import UNCOLLECTED
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.exchange.area import ERROR_REPLY_SUFFIX, REASON_SUFFIX, archive_name, claim_name
from ftpbc.model.names import pct
from ftpbc.patterns.expand import ExpandContext, expand
from ftpbc.patterns.grammar import parse

Fate = Literal["answered", "uncollected", "failed", "unanswered", "unreadable"]
FATES: tuple[tuple[Fate, float], ...] = (
    ("answered", 0.80), ("uncollected", 0.05), ("failed", 0.07), ("unanswered", 0.05), ("unreadable", 0.03))
#: of the requests whose reply is archived by a collector, the share answered through reply_to
REPLY_TO_SHARE = 0.10
SERVERS = ("node-a", "node-b")
CLIENTS = ("client-1", "client-2")


@dataclass(frozen=True)
class Message:
    endpoint: str
    uuid: str
    request_name: str
    #: when the client created the request (the name's time, when the pattern has one)
    t0: datetime
    fate: Fate
    server_node: str
    served_at: datetime
    collector: str | None
    collected_at: datetime | None
    request_size: int
    response_size: int
    #: the endpoint whose outbox got the reply (the request's reply_to); None: its own
    reply_to: str | None = None


def plan(sources: Sequence[ArchiveSource], per_endpoint: int, start: datetime, span: timedelta,
         seed: int = 1) -> list[Message]:
    rnd = random.Random(seed)
    out: list[Message] = []
    for src in sources:
        for _ in range(per_endpoint):
            u = str(uuidlib.UUID(int=rnd.getrandbits(128), version=4))
            t0 = start + timedelta(milliseconds=rnd.randrange(int(span.total_seconds() * 1000)))
            fate = rnd.choices([f for f, _ in FATES], [w for _, w in FATES])[0]
            served = t0 + timedelta(milliseconds=rnd.randint(5, 500))
            collected: datetime | None = served + timedelta(milliseconds=rnd.randint(5, 2000))
            collector: str | None = rnd.choice(CLIENTS)
            if fate == "uncollected":
                collector = UNCOLLECTED
            elif fate == "unanswered":
                collector, collected = None, None
            ctx = ExpandContext(endpoint=src.endpoint, now=t0, tz=src.timezone, uuid=u)
            name = src.request_prefix + expand(src.message_name, parse(src.message_name), ctx).name
            others = [s.endpoint for s in sources if s.endpoint != src.endpoint]
            reply_to = None
            if others and fate in ("answered", "failed", "unreadable") and rnd.random() < REPLY_TO_SHARE:
                reply_to = rnd.choice(others)
                name += f";r={pct(reply_to)}"
            out.append(Message(src.endpoint, u, name, t0, fate, rnd.choice(SERVERS), served, collector,
                               collected, rnd.randint(10, 200), rnd.randint(10, 300), reply_to))
    return out


SetMtime = Callable[[str, datetime], None]


def write(transport: object, sources: Sequence[ArchiveSource], messages: Sequence[Message],
          set_mtime: SetMtime | None = None) -> None:
    """Write every message's archived files; ``set_mtime(remote_path, t0)`` dates each request.

    The request's modification time is the client's submit time on a real server (renames keep
    it); a synthetic archive written now needs ``set_mtime`` to say when that was.
    """
    from ftpbc.transport import Transport

    assert isinstance(transport, Transport)
    by_name = {s.endpoint: s for s in sources}
    for s in sources:
        for d in s.area.all_dirs():
            transport.mkdir(d)

    def place(src: ArchiveSource, direction: Literal["in", "out"], folder: str, final: str,
              size: int, node: str) -> str:
        staged = src.area.path(direction, "stage", claim_name(final.split("~")[0], node))
        transport.put(staged, io.BytesIO(b"x" * size))
        target = src.area.path(direction, folder, final)
        transport.rename(staged, target)
        return target

    for m in messages:
        src = by_name[m.endpoint]
        failed = m.fate == "failed"
        archived = archive_name(m.request_name, m.server_node, m.served_at)
        path = place(src, "in", "error" if failed else "archive", archived, m.request_size, m.server_node)
        if set_mtime is not None:
            set_mtime(path, m.t0)
        if failed:
            place(src, "in", "error", archived + REASON_SUFFIX, 40, m.server_node)
        if m.collector is None or m.collected_at is None:
            continue
        # A reply through reply_to is staged in the other endpoint's area, under its naming,
        # saying whose request it answers.
        there = by_name[m.reply_to] if m.reply_to is not None else src
        reply = there.response_prefix + m.uuid + (ERROR_REPLY_SUFFIX if failed else "")
        if m.reply_to is not None:
            reply += f";r={pct(m.endpoint)}"
        folder = "error" if m.fate == "unreadable" else "archive"
        place(there, "out", folder, archive_name(reply, m.collector, m.collected_at), m.response_size,
              m.collector)


def local_mtime_setter(root: str) -> SetMtime:
    """``set_mtime`` for a server whose files live under ``root`` on this machine."""
    def set_mtime(remote: str, when: datetime) -> None:
        ns = int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000
        os.utime(os.path.join(root, remote.lstrip("/")), ns=(ns, ns))
    return set_mtime
