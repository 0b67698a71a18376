"""Chaos: three ``ftpbc serve`` nodes, eight clients, 2,000 requests, and a nemesis.

The nemesis SIGKILLs a random node every 0.5 to 2 s and restarts it at once (same node id, so
it recovers its own journal), restarts the FTP server once (at 30 % of the requests) and cuts
every client connection once (at 60 %).  The checker (``tests/chaos.py``) then classifies each
request and counts handler invocations.  Must hold: nothing lost, nothing answered twice,
nothing unexpected, no handler whose result was recorded run again, every stage/box/select
directory empty and every journal empty.  The counts are written to
``bench/results/chaos-<server>.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import dump, make_cluster, run_chaos
from tests.servers.handle import ServerHandle

REQUESTS = 2000
RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_chaos(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password,
                           options=handle.options, repository=handle.fresh_dir(), server_root=handle.root)
    result = run_chaos(cluster, requests=REQUESTS, restart_server=handle.controls["restart"],
                       drop_connections=handle.controls["drop_connections"])
    dump(result, RESULTS / f"chaos-{kind}.json")
    result.assert_held(cluster, REQUESTS, f"chaos {kind}")
