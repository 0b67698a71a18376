"""The message exchange area: its directories and the names files take as they move through it.

A repository (``/exchange/quote``) holds, per the FTP BC spec::

    inbox      requests exposed to providers          outbox      responses exposed to consumers
    instage    requests being uploaded                outstage    responses being uploaded
    inselect   requests claimed by a provider node    outselect   responses claimed by a consumer
    inarchive  requests served                         outarchive  responses collected
    inprotect  requests displaced by a newer one       outprotect  responses displaced
    inerror    requests whose handler failed           outerror    responses that could not be read
    inexpired  requests past their expiration          (outexpired, outdead: made, unused)
    indead     dead letters: exhausted deliveries, expired or overflowed, for ``ftpbc dlq``

Names
    request           ``<request_prefix><expansion of message_name>``      ``req.<uuid>``
    response          ``<response_prefix><uuid>``                          ``resp.<uuid>``
    error reply       ``<response_prefix><uuid>.error`` (body: the reason, UTF-8)
    staged file       ``<name>~<node-id>`` in the stage directory
    claimed file      ``<name>~<node-id>`` in the select directory
    archived file     ``<name>~<node-id>~<stamp>`` in the archive directory: the node that served
                      (in) or collected (out) it, and when (UTC, milliseconds, ``20261122T013045.123Z``).
                      Uncollected responses archived by a provider's sweep have the node id
                      ``uncollected``.
    failed request    ``<name>~<node-id>~<stamp>`` in ``inerror``, with the same name plus
                      ``.reason`` beside it (UTF-8 text: the handler's exception).  Expired
                      messages (``inexpired``) and dead letters (``indead``) are named alike.
    displaced file    ``<name>~<utc-timestamp>`` in the protect directory.
    staged reason     ``reason.<digest>~<node-id>`` in ``instage`` while a reason file is
                      uploaded, then renamed beside its message (:func:`staged_reason_name`)

Why the node id travels in the name
    A claim, a stage upload and an archive entry all say who made them, on the server itself.
    A live node can therefore return the claims of a dead one (lease expiry), and a node that was
    only slow learns it lost a claim because its commit rename (select -> archive) finds its
    source gone, so it never sends a second response.  Node ids cannot contain ``~``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from ftpbc.paths import check_name, join, normalize
from ftpbc.stamps import WholeSeconds

Direction = Literal["in", "out"]

KINDS = ("box", "stage", "select", "archive", "protect", "error", "expired", "dead")

CLAIM_SEPARATOR = "~"
#: between a staged reply's node and its size (``resp.<uuid>~node-a=17``); never in a node id
SIZE_SEPARATOR = "="
REASON_SUFFIX = ".reason"
#: the start of a staged reason file's name (:func:`staged_reason_name`)
STAGED_REASON_PREFIX = "reason."
ERROR_REPLY_SUFFIX = ".error"


@dataclass(frozen=True)
class ExchangeArea:
    """Paths of one repository's directories.  ``area.dir("in", "select")`` -> ``.../inselect``."""

    repository: str
    #: every directory, computed once: paths are built several times per message
    _dirs: dict[tuple[str, str], str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "repository", normalize(self.repository))
        object.__setattr__(self, "_dirs", {(d, k): join(self.repository, f"{d}{k}")
                                           for d in ("in", "out") for k in KINDS})

    def dir(self, direction: Direction, kind: str) -> str:
        try:
            return self._dirs[direction, kind]
        except KeyError:
            raise ValueError(f"unknown exchange directory {direction!r} {kind!r}") from None

    def path(self, direction: Direction, kind: str, name: str) -> str:
        # A normal directory plus a checked bare name is normal already: no normalize() again.
        d = self.dir(direction, kind)
        return f"{'' if d == '/' else d}/{check_name(name)}"

    def all_dirs(self) -> list[str]:
        return [self.dir(d, k) for d in ("in", "out") for k in KINDS]


STAMP_FORMAT = "%Y%m%dT%H%M%S"


def stamp(when: datetime) -> str:
    """``20261122T013045.123Z`` for an aware datetime (converted to UTC)."""
    utc = when.astimezone(UTC)
    return f"{_SECONDS.text((utc - _EPOCH) // _ONE_SECOND)}.{utc.microsecond // 1000:03d}Z"


_SECONDS = WholeSeconds(STAMP_FORMAT)  # every archived message takes a stamp
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)


def parse_stamp(text: str) -> datetime | None:
    try:
        base, _, ms = text.rstrip("Z").partition(".")
        return datetime.strptime(base, STAMP_FORMAT).replace(tzinfo=UTC, microsecond=int(ms or 0) * 1000)
    except ValueError:
        return None


def archive_name(name: str, node_id: str, when: datetime) -> str:
    """Name of ``name`` once archived (or failed) by ``node_id`` at ``when``."""
    return check_name(f"{name}{CLAIM_SEPARATOR}{node_id}{CLAIM_SEPARATOR}{stamp(when)}")


def parse_archive_name(archived: str) -> tuple[str, str | None, datetime | None]:
    """``(name, node_id, when)`` from an archived name; missing parts are None."""
    rest, sep, last = archived.rpartition(CLAIM_SEPARATOR)
    if not sep:
        return archived, None, None
    when = parse_stamp(last)
    if when is None:
        return rest, last, None  # "<name>~<node>" without a stamp
    name, sep2, node = rest.rpartition(CLAIM_SEPARATOR)
    if not sep2:
        return rest, None, when
    return name, node, when


def claim_name(name: str, node_id: str) -> str:
    """Name of ``name`` once claimed by ``node_id`` into a select directory."""
    return check_name(f"{name}{CLAIM_SEPARATOR}{node_id}")


def split_claim(claimed: str) -> tuple[str, str | None]:
    """``("req.x", "node-a")`` from ``"req.x~node-a"``; ``(name, None)`` when unclaimed."""
    name, sep, node = claimed.rpartition(CLAIM_SEPARATOR)
    if not sep:
        return claimed, None
    return name, node


def sized_stage_name(name: str, node_id: str, size: int) -> str:
    """Name of a reply ``name`` staged by ``node_id`` with ``size`` bytes: the size in the name
    is what proves a staged reply complete to another node (a node killed mid-upload leaves a
    shorter file), so the node that takes the request over can deliver it instead of running
    the handler again."""
    return check_name(f"{name}{CLAIM_SEPARATOR}{node_id}{SIZE_SEPARATOR}{size}")


def split_stage(staged: str) -> tuple[str, str | None, int | None]:
    """``(name, node, size)`` of a staged file's name; size None when the name carries none
    (a staged message, a transfer's file, a reply staged by an older release)."""
    name, owner = split_claim(staged)
    if owner is None:
        return name, None, None
    node, sep, size = owner.partition(SIZE_SEPARATOR)
    if not sep:
        return name, owner, None
    if not size.isdigit() or len(size) > 15:
        return name, node, None  # not one of ours: never taken for complete
    return name, node, int(size)


def staged_reason_name(reason_path: str, node_id: str) -> str:
    """Name under which ``node_id`` uploads the reason file ``reason_path`` before renaming it
    into place: ``reason.<digest>~<node-id>``.

    The same path always gives the same name, so a retry (recovery) replaces what an earlier
    attempt left rather than adding a file; the digest keeps the name short whatever the reason
    path's length (a filed name already uses most of the server's limit), and carries no message
    id, so nothing that looks for a message by its id or name mistakes it for one.  The node id
    at its end is what lets the orphan search and the sweeper remove one a crash left."""
    digest = hashlib.sha256(reason_path.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return check_name(f"{STAGED_REASON_PREFIX}{digest}{CLAIM_SEPARATOR}{node_id}")


def is_staged_reason(name: str) -> bool:
    """Whether a stage directory's entry ``name`` is a staged reason (of any node)."""
    base, owner = split_claim(name)
    return owner is not None and base.startswith(STAGED_REASON_PREFIX)
