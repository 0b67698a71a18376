"""Dead letters: messages an endpoint filed in ``indead`` instead of delivering them.

They got there because they exhausted ``max_deliveries`` (with ``dead_letter: true``), expired
(with ``expired: dead_letter``) or found their queue full (``on_overflow: dead_letter``).  Each
is ``<name>~<node>~<stamp>`` (its name in the box, the node that filed it, when), with
``<name>~<node>~<stamp>.reason`` beside it.  :class:`DeadLetters` lists them (oldest first,
optionally through a selector), reads one, replays some into the inbox (the delivery count reset,
an expiration dropped, each replay journaled so that one killed at any point is finished by
recovery) and purges some.  ``ftpbc dlq`` is its command line.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ftpbc.errors import ConfigError, FtpbcError, MessageTooLarge, NotFound
from ftpbc.exchange.area import REASON_SUFFIX, parse_archive_name
from ftpbc.exchange.bounds import READ_MARGIN, BoundedSink
from ftpbc.exchange.layout import AreaLayout
from ftpbc.exchange.lifecycle import UNKNOWN_SIZE, Lifecycle, op_id_for
from ftpbc.model.envelope import Envelope
from ftpbc.model.selector import Selector
from ftpbc.paths import join

log = logging.getLogger("ftpbc.dlq")


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter.  ``envelope`` is None when its name cannot be decoded."""

    path: str
    file: str  # <name>~<node>~<stamp>
    name: str  # the message's name in the box
    node: str | None
    filed_at: datetime | None
    size: int
    envelope: Envelope | None
    reason: str | None = None

    @property
    def id(self) -> str:
        """The message's id (its name when the name cannot be decoded)."""
        return self.envelope.headers.id if self.envelope is not None else self.name

    def as_json(self) -> dict[str, Any]:
        """The dead letter as JSON, with its headers and properties (without its body)."""
        out: dict[str, Any] = {"id": self.id, "name": self.name, "file": self.file, "path": self.path,
                               "node": self.node, "size": self.size,
                               "filed_at": self.filed_at.isoformat(timespec="milliseconds")
                               if self.filed_at else None, "reason": self.reason}
        out.update(envelope_json(self.envelope))
        return out


def envelope_json(env: Envelope | None) -> dict[str, Any]:
    """``{"headers": {...}, "properties": {...}}`` of an envelope (datetimes in ISO 8601)."""
    if env is None:
        return {"headers": None, "properties": None}
    headers = type(env.headers).table.json(env.headers)
    return {"headers": headers, "properties": dict(env.properties)}


def read_listed(lc: Lifecycle, path: str, size: int) -> bytes:
    """The bytes of the file at ``path``, listed with ``size`` bytes, read no further than that
    size plus a margin and never more than the endpoint's max_message_bytes (MessageTooLarge
    unread if listed larger): the area is shared, so the file is untrusted."""
    t = lc.transport
    limit = lc.max_message_bytes
    if size > limit:
        raise MessageTooLarge(f"{t.server} {path}", size, limit)
    bound = limit if size == UNKNOWN_SIZE else size + READ_MARGIN
    buf = io.BytesIO()
    t.get(path, BoundedSink(buf, bound, server=t.server, path=path, listed=f"{size} bytes").as_binary())
    return buf.getvalue()


class DeadLetters:
    """The dead letters of one endpoint (the inbound lifecycle of its exchange area)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        layout = lifecycle.layout
        if not isinstance(layout, AreaLayout) or layout.dead_dir is None:
            raise ConfigError(f"{layout.display} has no dead letters (only endpoints do)")
        self.lc = lifecycle
        self.layout = layout
        self.directory: str = layout.dead_dir

    def listing(self, selector: Selector | None = None, *, reasons: bool = True) -> list[DeadLetter]:
        """The dead letters, oldest filed first; with ``selector`` only those it selects (a
        letter whose name cannot be decoded is never selected).  ``reasons``: read each one's
        reason file (a round trip each)."""
        t = self.lc.transport
        try:
            entries = t.list(self.directory)
        except NotFound:
            return []
        letters = []
        for e in entries:
            if e.is_dir or e.name.endswith(REASON_SUFFIX):
                continue
            name, node, when = parse_archive_name(e.name)
            if node is None:
                continue  # not filed by ftpbc: left alone
            cand = self.layout.decode_name(name)
            env = cand.envelope if cand is not None else None
            if selector is not None and (env is None or not selector.matches(env.headers, env.properties)):
                continue
            letters.append(DeadLetter(join(self.directory, e.name), e.name, name, node, when, e.size, env))
        letters.sort(key=lambda d: (d.filed_at is None, d.filed_at or datetime.min, d.file))
        if reasons:
            letters = [self._with_reason(d) for d in letters]
        return letters

    def _with_reason(self, d: DeadLetter) -> DeadLetter:
        buf = io.BytesIO()
        try:
            self.lc.transport.get(d.path + REASON_SUFFIX, buf)  # type: ignore[arg-type]
        except NotFound:
            return d
        text = buf.getvalue().decode("utf-8", "replace").strip()
        return DeadLetter(d.path, d.file, d.name, d.node, d.filed_at, d.size, d.envelope, text)

    def find(self, idents: Iterable[str], selector: Selector | None = None) -> list[DeadLetter]:
        """The letters named by ``idents`` (a message id, its name in the box or its file name
        in ``indead``), within ``selector``; ConfigError naming the first that matches none.
        Only the letters found have their reason file read (one round trip each), not every
        letter listed."""
        letters = self.listing(selector, reasons=False)
        found: dict[str, DeadLetter] = {}
        for ident in idents:
            hits = [d for d in letters if ident in (d.id, d.name, d.file)]
            if not hits:
                raise ConfigError(f"no dead letter {ident!r} in {self.directory}"
                                  + (f" selected by {selector.text!r}" if selector else ""))
            found.update((d.file, d) for d in hits)
        ordered = sorted(found.values(),
                         key=lambda d: (d.filed_at is None, d.filed_at or datetime.min, d.file))
        return [self._with_reason(d) for d in ordered]

    def body(self, letter: DeadLetter) -> bytes:
        """The letter's bytes (see :func:`read_listed`)."""
        return read_listed(self.lc, letter.path, letter.size)

    def replay_name(self, letter: DeadLetter) -> str:
        """The name a letter goes back under: its delivery count reset and its expiration
        dropped (it would only expire again at once); a name that cannot be decoded as it was."""
        env = letter.envelope
        if env is None:
            return letter.name
        base = env.base if self.layout.codec.name == "ftpbc" else ""
        try:
            return self.layout.name_for(env.replace(delivery_count=0, expiration=None).headers,
                                        dict(env.properties), base)
        except (FtpbcError, ValueError):
            return letter.name

    def replay(self, letters: Iterable[DeadLetter]) -> list[tuple[DeadLetter, str]]:
        """Put ``letters`` back in the inbox, one journaled rename each; return (letter, outcome)."""
        done = []
        for d in letters:
            op_id = op_id_for(None, "replay")
            try:
                where = self.lc.replay(d.path, self.replay_name(d), op_id=op_id)
                outcome = f"replayed to {where}"
            except FileExistsError as exc:
                outcome = f"not replayed: {exc}"
            log.info("%s: %s: %s", self.layout.display, d.file, outcome)
            done.append((d, outcome))
        return done

    def purge(self, letters: Iterable[DeadLetter]) -> int:
        """Delete ``letters`` and their reason files; how many were there to delete."""
        t = self.lc.transport
        count = 0
        for d in letters:
            try:
                t.delete(d.path)
                count += 1
            except NotFound:
                pass
            try:
                t.delete(d.path + REASON_SUFFIX)
            except NotFound:
                pass
        return count
