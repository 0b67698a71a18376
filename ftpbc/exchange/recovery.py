"""Recovery: what a crash of this node left, settled from its journal and the servers' state.
:func:`recover_node` is the one entry point, and the order of its passes is the one that is
safe:

1. **Transactions** (:func:`ftpbc.exchange.transaction.recover_transactions`): a committed
   transaction's members are rolled forward, and their sends ended, before the endpoints' pass,
   which would roll an unended member back; one with no commit record is rolled back.
2. **Each journal's pending operations** (:func:`ftpbc.exchange.pending.recover_pending`):
   sends, claims, served results, replays, and routed messages
   (:func:`ftpbc.exchange.route.recover_route`), each decided by its last durable record; a
   member of a transaction still open is left alone.
3. **Orphans** (:func:`ftpbc.exchange.pending.recover_orphans`): this node's files in select
   and stage directories that no operation accounts for (only a machine crash that lost
   unsynced records leaves one).  Skipped while a committed transaction is still open: its
   staged members are not orphans.

Each pass keeps its type-specific rules in its own module; this one only orders them.  Every
step re-checks the server, so recovery is idempotent, and a crash during it is recovered by the
next run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.exchange.pending import Action, recover_orphans, recover_pending
from ftpbc.exchange.transaction import TX_KEY, open_transactions, recover_transactions
from ftpbc.journal import Journal
from ftpbc.transport.base import Transport

log = logging.getLogger("ftpbc.recovery")

#: a poll lock to hold while one operation is decided (a transfer read in place), or None
RecoveryLock = Callable[[], AbstractContextManager[bool]]


def recover_node(journal: Journal, node_id: str, *, group: Callable[[str], list[Lifecycle] | None],
                 inbound: Callable[[str], Lifecycle | None],
                 lock: Callable[[Lifecycle], RecoveryLock | None],
                 transports: Callable[[str], Transport],
                 orphan_keys: Iterable[str] | None) -> list[Action]:
    """Recover every journal of node ``node_id``, in the order of the module's docstring.

    ``group`` gives the lifecycles that share a journal key (None: not configured; its
    operations are reported, not touched); ``inbound`` an endpoint's inbound lifecycle (for a
    transaction's members); ``lock`` the poll lock to hold while deciding an operation of a
    layout that is read in place; ``transports`` a configured server's transport by name (a
    routed message's destination); ``orphan_keys`` the journal keys whose directories are
    searched for orphans (None: no search).
    """
    actions = recover_transactions(journal, inbound)
    held = open_transactions(journal)
    for key, ops in journal.all_pending().items():
        if key == TX_KEY:
            continue  # reported above
        lifecycles = group(key)
        if lifecycles is None:
            actions.extend(Action(key, op.op_id, op.kind, "skipped: not configured") for op in ops)
            continue
        actions.extend(recover_pending(lifecycles, orphans=False, lock=lock(lifecycles[0]), held=held,
                                       transports=transports))
    if orphan_keys is not None and held:
        # A committed transaction's staged members are not orphans: it is rolled forward by the
        # next recovery, so nothing of this node's is removed until then.
        log.warning("node %s: %d committed transaction(s) left for the next recovery; orphan "
                    "search skipped", node_id, len(held))
    elif orphan_keys is not None:
        for key in orphan_keys:
            for lc in group(key) or ():
                actions.extend(recover_orphans(lc))
    return actions


__all__ = ["Action", "RecoveryLock", "recover_node", "recover_orphans", "recover_pending"]
