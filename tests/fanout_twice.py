"""A node fanning out the one message of a topic twice (``python -m tests.fanout_twice CLUSTER
TOPIC``, run as node ``n0`` with ``FTPBC_CRASH_AT``): the first fan-out is left as a failed
rollback leaves it (its ``staging`` record pending, its copies staged) and the claim goes back
to the inbox; the node claims the message again and commits a second fan-out.

Used by tests/test_topics_chaos.py with ``fanout.after-commit-record``: killed there, the node
leaves both transactions to recovery.
"""

from __future__ import annotations

import io
import sys
import time

from ftpbc.client import Client
from ftpbc.exchange.lifecycle import Claimed
from ftpbc.exchange.topics import Registry, fan_out
from ftpbc.exchange.transaction import Transaction
from tests.chaos import Cluster, load_client_config


def main(cluster: Cluster, topic: str) -> None:
    with Client(load_client_config(cluster, "n0")) as client:
        runtime = client.runtime
        lc = runtime.lifecycle(topic)
        registry = Registry(runtime, topic)

        def claim_and_stage() -> tuple[Claimed, Transaction]:
            [waiting] = lc.waiting()
            [claimed], _ = lc.claim([waiting], "serve")
            body = io.BytesIO()
            lc.read_claim(claimed, body)
            tx, _ = fan_out(runtime, topic, claimed, body.getvalue(), registry.targets(time.monotonic()))
            return claimed, tx

        claimed, _ = claim_and_stage()
        # Its rollback failed (the server away): the staging record stays for recovery, and the
        # claim goes back unchanged, as after any connection fault.
        lc.unclaim(claimed)
        _, second = claim_and_stage()
        second.commit()
    print("not killed")


if __name__ == "__main__":
    main(Cluster.from_json(sys.argv[1]), sys.argv[2])
