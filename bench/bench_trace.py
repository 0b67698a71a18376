"""What a trace of one id costs in an endpoint whose archive holds many messages (docs/tracing.md).

Starts vsftpd (the test rig's, as the other benchmarks do), writes ``--archived`` archived
requests and their collected responses straight into the server's directories (as a day of
traffic leaves them: ``inarchive/req.<uuid>~node-a~<stamp>``, ``outarchive/resp.<uuid>~cli~<stamp>``),
then times ``--runs`` traces of one of those ids through ``Tracer`` (ftpbc's FTP transport, the
16 directories of the endpoint, each listed by the glob ``*<id>*``).  Prints the median and the
slowest trace, the listings and names one trace took, and the machine's load average, which a
figure measured on a busy machine needs beside it.

    python3 bench/bench_trace.py --archived 100000

Needs root and vsftpd.  The target is a trace under 2 s at 100,000 archived messages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import fresh, running, server_config
from ftpbc.config.models import Config
from ftpbc.exchange.trace import Query, Tracer

REPOSITORY = "/exchange/quote"


def fill(root: Path, archived: int) -> str:
    """``archived`` requests and their responses in the archives; returns one id from the middle."""
    area = root / REPOSITORY.lstrip("/")
    kinds = ("box", "stage", "select", "archive", "protect", "error", "expired", "dead")
    for d in (f"{direction}{kind}" for direction in ("in", "out") for kind in kinds):
        (area / d).mkdir(parents=True, exist_ok=True)
        (area / d).chmod(0o777)
    inarchive, outarchive = area / "inarchive", area / "outarchive"
    traced = ""
    for i in range(archived):
        uid = str(uuid.uuid4())
        stamp = f"20261128T{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}.{i % 1000:03d}Z"
        os.close(os.open(inarchive / f"req.{uid}~node-a~{stamp}", os.O_CREAT | os.O_WRONLY, 0o644))
        os.close(os.open(outarchive / f"resp.{uid}~cli~{stamp}", os.O_CREAT | os.O_WRONLY, 0o644))
        if i == archived // 2:
            traced = uid
    return traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archived", type=int, default=100_000,
                        help="archived requests (and as many responses)")
    parser.add_argument("--runs", type=int, default=10, help="traces timed")
    args = parser.parse_args()
    with (tempfile.TemporaryDirectory(prefix="bench-trace-") as work,
          running(["vsftpd"], Path(work)) as servers):
        target = fresh(servers["vsftpd"])
        began = time.perf_counter()
        uid = fill(Path(target["root"]), args.archived)
        took = time.perf_counter() - began
        print(f"wrote {args.archived:,} archived requests and responses in {took:.1f} s")
        config = Config.model_validate({
            "node": {"id": "bench", "state_dir": f"{work}/state", "journal_dir": f"{work}/journals"},
            "servers": {"srv": server_config(target)},
            "endpoints": {"quote": {"server": "srv", "repository": REPOSITORY}},
        })
        times = []
        with Tracer(config) as tracer:
            first = tracer.trace(Query(uid))  # login and the first glob answer (globs known)
            for _ in range(args.runs):
                trace = tracer.trace(Query(uid))
                times.append(trace.seconds)
        events = [s.event for s in trace.sightings]
        assert events == ["served", "collected"], events
        load = os.getloadavg()
        print(f"trace of one id among {args.archived:,} archived (x2 directories) on vsftpd: "
              f"median {statistics.median(times):.3f} s, slowest {max(times):.3f} s, "
              f"first {first.seconds:.3f} s; "
              f"{trace.listings} listings, {trace.names} names handed back; "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
