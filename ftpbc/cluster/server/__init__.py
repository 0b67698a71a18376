"""``coordination: server``: the cluster's poll locks, heartbeats and sequences kept on the
FTP/SFTP server itself, for clusters whose hosts share no filesystem.

One module per job, as for ``state_dir``: :mod:`.names` (the names written there, and how
they are read), :mod:`.clock` (the server's clock), :mod:`.area` (the directory and its
connection), :mod:`.heartbeat`, :mod:`.lock` (poll locks and their renewal), :mod:`.sequences`,
and :mod:`.coordination`, which puts them together as a
:class:`~ftpbc.cluster.coordination.Coordination`.

Nothing but the transport's rename contract is used (``ftpbc.transport.base``): a rename of a
given source succeeds for exactly one of the clients racing for it, the others get
:class:`~ftpbc.errors.SourceGone`.  Files, under ``node.coordination_dir`` (default
``/.ftpbc-cluster``) on ``node.coordination_server``::

    heartbeats/<node-id>                          one per live node, rewritten every heartbeat_interval;
                                                  its mtime (the server's clock) is the last beat; a
                                                  serving node's has a second line: what it serves
    clock/<node-id>                               written once to read the server's clock, when a
                                                  process needs it before its first heartbeat
    locks/<key>/token.<token>                     a poll lock's marker (created once, never renamed)
    locks/<key>/lock.<token>                      the lock, free
    locks/<key>/lock.<token>~<node>+<run>~<ms>    the lock, held by <node> (process <run>) until <ms>,
                                                  milliseconds since 1970 on the server's clock
    sequences.lock/...                            the lock under which a new sequence is created
    sequences/<name>.<N>                          %{name}, whose next value is N
    sequences/<name>~created                      its marker (created once, never renamed)
    endpoint-sequences/<uuid>/sequence<K>.<N>     %{K} of one endpoint (and sequence<K>~created), with
                                                  a file ``endpoint`` holding the endpoint's name

Listings
    A server lists a directory by reading its names, then stat()ing each: a file renamed in
    between is in neither of its names.  So every decision about what exists is made from
    markers, which nobody renames, and a file out of sight is looked for again.

Clocks
    Every time compared is the server's: a heartbeat's age is the server's "now" minus the mtime
    the server gave the file, and a lock's expiry is written in server time.  Each process learns
    how far the server's clock is from its own by writing a file and reading back its mtime (at
    every heartbeat), so the hosts' clocks may differ by any amount; what remains is the error
    of that estimate: the mtime's precision (a second on FTP and SFTP) plus a round trip.

Locks
    Taken by renaming the free token to a held name carrying holder and expiry, given back by
    renaming it back, renewed by the holder (renamed to a later expiry) while held, and taken
    over by anyone once expired: a holder killed while holding it stalls the key for at most
    ``lock_expiry``.  A token is created (put under a fresh id, then marked) only when a listing
    shows no marker; two nodes doing that at once make two tokens, so a token is used only after
    a listing made since its creation showed its marker alone (once per process and token):
    whoever finds a second one deletes its own, unless its id is the smaller (then it gives it
    back, to be used once alone).  Hence two processes never hold a key at once, except when a
    holder is paused (SIGSTOP, swapping) past the expiry: then another takes over, the paused one
    finds its token gone when it gives it back, and says so.  The poll lock guards only
    efficiency (a claim is a rename that exactly one node wins), so that case costs lost races,
    never a message.

Sequences
    A draw renames ``<name>.<N>`` to ``<name>.<N+1>`` and returns N; a process that finds the
    source gone (another node drew N) lists the directory and tries again with the value there.
    A process remembers the value it left, so an uncontended draw is one rename.  A sequence is
    created (its value file ``.0``, then its marker) under a lock: the check for its marker and
    the creation must not interleave with another node's.  A rename whose reply is lost may have
    happened: its value is never used (a gap), so values stay unique.

What is written there is not trusted
    Whoever can write to the directory can forge any of these names and times; what they
    cannot do is make a node wait for ever, crash it, or make it loop.  A lock's expiry is
    believed up to ``lock_expiry`` (plus :data:`~.clock.CLOCK_SLACK`) past the moment this process
    first saw that name, and a name that is no held name of a node (``lock.<id>`` and anything
    else) is held by nobody known, so a lock nobody renews is taken over within that bound,
    with one warning naming the holder; a marker whose lock file stays out of sight as long
    is removed, and a new token replaces it.  A heartbeat time further in the future than the slack
    counts as written when first seen, so it dies after the lease.  A sequence value is only
    ``<name>.<N>`` with N in decimal, no leading zero, at most 18 digits; a sequence whose
    value file stays out of sight for seconds, or at its largest value, fails its draws with a
    :class:`~ftpbc.errors.SequenceError` naming the file.  Not guaranteed: anything against
    someone who keeps renaming, rewriting or deleting the files (they hold the lock, keep the
    heartbeat alive, set the sequence, as a node would).
"""

from ftpbc.cluster.server.area import ServerArea
from ftpbc.cluster.server.clock import CLOCK_RESYNC, CLOCK_SLACK, FirstSeen, ServerClock, server_seconds
from ftpbc.cluster.server.coordination import ServerCoordination
from ftpbc.cluster.server.heartbeat import ServerHeartbeat, ServerHeartbeats
from ftpbc.cluster.server.lock import LOST_LISTINGS, RESCAN, ServerLock, ServerLocks
from ftpbc.cluster.server.names import HOST, MAX_VALUE, Token, beat_stamp, safe_key
from ftpbc.cluster.server.sequences import ServerSequences

__all__ = [
    "CLOCK_RESYNC", "CLOCK_SLACK", "HOST", "LOST_LISTINGS", "MAX_VALUE", "RESCAN", "FirstSeen",
    "ServerArea", "ServerClock", "ServerCoordination", "ServerHeartbeat", "ServerHeartbeats",
    "ServerLock", "ServerLocks", "ServerSequences", "Token", "beat_stamp", "safe_key", "server_seconds",
]
