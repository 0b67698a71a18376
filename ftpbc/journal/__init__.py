"""The journal of remote writes and recovery by replay (see store.py and recovery.py)."""

from ftpbc.journal.store import EndpointJournal, Journal, Operation

__all__ = ["EndpointJournal", "Journal", "Operation"]
