"""The message exchange area: its directories and the names files take as they move through it.

A repository (``/exchange/quote``) holds, per the FTP BC spec::

    inbox      requests exposed to providers          outbox      responses exposed to consumers
    instage    requests being uploaded                outstage    responses being uploaded
    inselect   requests claimed by a provider node    outselect   responses claimed by a consumer
    inarchive  requests served                         outarchive  responses collected
    inprotect  requests displaced by a newer one       outprotect  responses displaced
    inerror    requests whose handler failed           outerror    responses that could not be read

Names
    request           ``<request_prefix><expansion of message_name>``      ``req.<uuid>``
    response          ``<response_prefix><uuid>``                          ``resp.<uuid>``
    error reply       ``<response_prefix><uuid>.error`` (body: the reason, UTF-8)
    staged file       ``<name>~<node-id>`` in the stage directory
    claimed file      ``<name>~<node-id>`` in the select directory
    archived file     ``<name>~<node-id>`` in the archive directory: the node that served (in) or
                      collected (out) it.  Uncollected responses archived by a provider's sweep
                      are ``<name>~uncollected``.
    failed request    ``<name>~<node-id>`` in ``inerror``, with ``<name>~<node-id>.reason`` beside
                      it (UTF-8 text, one line: the handler's exception).
    displaced file    ``<name>~<utc-timestamp>`` in the protect directory.

Why the node id travels in the name
    A claim, a stage upload and an archive entry all say who made them, on the server itself.
    A live node can therefore return the claims of a dead one (lease expiry), and a node that was
    only slow learns it lost a claim because its commit rename (select -> archive) finds its
    source gone, so it never sends a second response.  Node ids cannot contain ``~``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ftpbc.transport.base import check_name, join, normalize

Direction = Literal["in", "out"]

KINDS = ("box", "stage", "select", "archive", "protect", "error")

CLAIM_SEPARATOR = "~"
REASON_SUFFIX = ".reason"
ERROR_REPLY_SUFFIX = ".error"


@dataclass(frozen=True)
class ExchangeArea:
    """Paths of one repository's directories.  ``area.dir("in", "select")`` -> ``.../inselect``."""

    repository: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "repository", normalize(self.repository))

    def dir(self, direction: Direction, kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown exchange directory kind {kind!r}")
        return join(self.repository, f"{direction}{kind}")

    def path(self, direction: Direction, kind: str, name: str) -> str:
        return join(self.dir(direction, kind), name)

    def all_dirs(self) -> list[str]:
        return [self.dir(d, k) for d in ("in", "out") for k in KINDS]


def claim_name(name: str, node_id: str) -> str:
    """Name of ``name`` once claimed by ``node_id`` into a select directory."""
    return check_name(f"{name}{CLAIM_SEPARATOR}{node_id}")


def split_claim(claimed: str) -> tuple[str, str | None]:
    """``("req.x", "node-a")`` from ``"req.x~node-a"``; ``(name, None)`` when unclaimed."""
    name, sep, node = claimed.rpartition(CLAIM_SEPARATOR)
    if not sep:
        return claimed, None
    return name, node
