"""The journal of remote writes: durable intents a crashed node replays (see store.py).

Recovery, which decides each pending operation from the journal plus the server, belongs to
the exchange layer (:mod:`ftpbc.exchange.recovery`)."""

from ftpbc.journal.store import (
    EndpointJournal,
    Journal,
    Operation,
    discard_unused_made,
    forget_made,
    journal_problems,
)

__all__ = ["EndpointJournal", "Journal", "Operation", "discard_unused_made", "forget_made",
           "journal_problems"]
