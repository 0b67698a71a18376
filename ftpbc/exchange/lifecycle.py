"""The message lifecycle, written once above the transport for every layout: stage, expose,
claim, read, serve, commit, respond, archive or delete, error, return; each remote write
preceded by its journal record.

Who calls what
    a sender      :meth:`Lifecycle.send` (a request, a one-way message, a file to a partner);
    a provider    :meth:`claim` / :meth:`read`, the handler, then :meth:`record_served` and
                  :meth:`finish_served` (endpoints and transfers alike);
    a collector   :meth:`claim` / :meth:`read` a response, then :meth:`finish_collect`.

The provider's order is what makes a crash decidable from the server alone::

    served (durable record: the result and every name still to use)
      -> put the reply's stage file                   (a response, or a transfer's outbound file)
      -> COMMIT: rename the claim to its archive / error / post_receive place   (ownership)
      -> expose the reply: protect an existing target, rename stage -> target, post_send rename

If the commit finds its source gone, another node returned this node's claim (it looked dead)
and serves the message: this node never exposes its reply, so a slow node never causes a second
one.  The reply stays staged under a name that declares its size, and the node that serves the
returned request delivers it instead of running the handler again (:meth:`Lifecycle.adopt`).
A commit whose reply is lost is decided from the server (the commit target exists: done; the
claim still exists: retried; neither: lost).  Recovery
(:mod:`ftpbc.exchange.recovery`) runs the very same :meth:`finish_served`.

Delivery count and poison messages
    :meth:`Lifecycle.read_claim` is the one read-failure policy.  A claimed message that was read
    and found unusable (refused, short, longer than listed) goes back to its box with its
    delivery count raised in its name, and no node claims it again for ``redelivery_delay``
    seconds (doubling with each delivery, up to ``max_redelivery_delay``): every node holds a
    returned message back from the moment it first lists it.  At ``max_deliveries`` it goes to
    the error directory with ``<name>.reason`` beside it, and a requester gets an error reply at
    once.  A failure that says nothing about the message (a dropped or dying session, a timeout,
    a server restarting) is not a delivery: the read is tried again on a fresh session, with
    backoff, and the claim goes back unchanged if the server stays away.  A handler's exception is its
    answer: the message goes to the error directory at once (a requester gets the error reply).

Floors
    :class:`Lifecycle` is the top of four classes, each over the one below, each in a module of
    its own: :class:`~ftpbc.exchange.steps.Steps` (the state), :mod:`~ftpbc.exchange.outbound`
    (staging and exposing), :mod:`~ftpbc.exchange.settlement` (recording and settling) and
    :mod:`~ftpbc.exchange.inbound` (listing, claiming, holding, reading).  Callers use
    :class:`Lifecycle` and the names this module exports.

Filing
    Every filing (error directory, dead letters, expiry) is a ``served`` operation whose result
    is the error reply: recorded durably first, then finished by :meth:`finish_served` (reply
    staged, claim renamed into the directory, reason file, reply exposed), so a filing retried
    after a partial failure, or finished by recovery, completes and never loses the message
    nor its caller's answer.  A duplicate (a second file with a message id this node holds or
    settled: :meth:`claim`) is filed the same way, with no reply at all.

Hooks
    :data:`HOOKS` (:class:`Hooks`) holds callbacks a process appends to, called at fixed points
    of the steps (a result durable, a reply staged): instrumentation, such as the crash and
    fault harnesses' logs, without patching any method.
"""

from __future__ import annotations

from ftpbc.exchange.inbound import DUPLICATE_REASON, InboundSteps
from ftpbc.exchange.layout import Commit, Outbound
from ftpbc.exchange.outbound import SPOOL_IN_MEMORY, expose_each
from ftpbc.exchange.steps import (
    HOOKS,
    UNFINISHED,
    UNKNOWN_SIZE,
    Claimed,
    Disposition,
    Hooks,
    Listing,
    Retry,
    Served,
    Unread,
    op_id_for,
    rename_resolving,
    run_once,
)


class Lifecycle(InboundSteps):
    """One layout's messages as seen by one node: every step of :mod:`this module
    <ftpbc.exchange.lifecycle>`, from the floors it is built of.  Thread-safe."""


__all__ = ["DUPLICATE_REASON", "HOOKS", "SPOOL_IN_MEMORY", "UNFINISHED", "UNKNOWN_SIZE", "Claimed", "Commit",
           "Disposition", "Hooks", "Lifecycle", "Listing", "Outbound", "Retry", "Served", "Unread",
           "expose_each", "op_id_for", "rename_resolving", "run_once"]
