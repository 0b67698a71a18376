"""A longer chaos soak with the checker of ``tests/chaos.py``.

Three ``ftpbc serve`` nodes, concurrent clients, a nemesis that SIGKILLs and restarts a random
node every 0.5 to 2 s, restarts the FTP server once and cuts every connection once; it stops
submitting after ``--duration`` seconds (or ``--requests``), lets every request finish, runs a
final recovery per node id and checks: nothing lost, nothing answered twice, nothing
unexpected, no handler re-run after its result was recorded, nothing left in a stage, box or
select directory, every journal empty.  The counts go to ``bench/results/soak-chaos.json``;
the exit status is 1 if any invariant failed.

    python3 bench/soak_chaos.py --duration 600
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftpbc.embedded import EmbeddedFTPServer
from tests.chaos import dump, make_cluster, run_chaos

RESULTS = Path(__file__).resolve().parent / "results" / "soak-chaos.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300, help="seconds of submitting (default 300)")
    ap.add_argument("--requests", type=int, default=10**9, help="stop after this many requests")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--min-gap", type=float, default=0.5)
    ap.add_argument("--max-gap", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    password = secrets.token_urlsafe(12)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "soak").mkdir(parents=True)
        with EmbeddedFTPServer(root, password=password, auth_failed_delay=0) as srv:
            cluster = make_cluster(Path(tmp) / "w", url=srv.url, password=password, options={},
                                   repository="/soak", server_root=root)
            # Server faults happen at a fraction of the requests; with a duration limit that
            # fraction is of an estimate (the request count at which the duration runs out).
            requests = min(args.requests, int(args.duration * 60))
            result = run_chaos(cluster, requests=requests, nodes=args.nodes, clients=args.clients,
                               restart_server=srv.restart, drop_connections=srv.drop_connections,
                               min_gap=args.min_gap, max_gap=args.max_gap, seed=args.seed,
                               deadline=args.duration)
            dump(result, RESULTS)
    print(json.dumps(result.report(), indent=2))
    if not result.verdict.ok:
        print("FAILED: an invariant does not hold (see the counts above)", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
