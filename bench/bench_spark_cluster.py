"""Time ``ftpbc aggregate --engine spark`` on a standalone cluster of one worker, then two.

    python3 bench/bench_spark_cluster.py                 # 300,000 messages
    python3 bench/bench_spark_cluster.py --quick         # 100,000 messages
    python3 bench/bench_spark_cluster.py --messages 1000000 --archives /tmp/agg

One synthetic archive (as ``bench/bench_aggregate.py`` writes it), then for 1 and 2 workers: a
Spark standalone cluster on loopback (a master and one-core workers, started from the installed
pyspark as ``tests/spark_cluster.py`` does), and the job run against it from a fresh driver
process (``--master spark://...``), start included.  The cluster is stopped between the two.
Both runs' outputs (figures, per-node figures, the unanswered list) must be identical before a
time is reported.  Prints the two times and their ratio (two workers / one: below 1 is faster)
and writes bench/results/spark_cluster.json.

On one machine the workers share its cores with the driver, the master and the OS: two one-core
workers can at best use both cores while the driver lists; what the ratio shows here is whether
the job's work divides at all, not what a cluster of separate hosts would gain.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import bench_aggregate as agg  # noqa: E402

from tests.spark_cluster import LOOPBACK, running_spark_cluster  # noqa: E402

WORKER_MEMORY = "2g"


def side(root: Path, out: Path, master: str) -> dict[str, Any]:
    """The job against ``master``, as ``ftpbc aggregate --engine spark --master`` runs it."""
    from pyspark import SparkContext

    from ftpbc.analytics.job import Options, run

    phases: list[str] = []
    t = time.perf_counter()
    res = run(Options(sources=agg.sources_at(str(root)), out=out, progress=False, print_table=False,
                      engine="spark", master=master, report=lambda p: phases.append(p.line())))
    total_s = time.perf_counter() - t
    sc = SparkContext._active_spark_context
    if sc is not None:
        sc.stop()
    return {"total_s": total_s, "phases": phases, "rows": agg._outputs(res, out)}


def run_on(workers: int, root: Path, work: Path) -> dict[str, Any]:
    """A cluster of ``workers`` one-core workers, the job run against it from a fresh process."""
    with running_spark_cluster(work / f"cluster-{workers}", workers=workers, memory=WORKER_MEMORY,
                               decoy=False) as cluster:
        before = agg.load()
        cmd = [sys.executable, __file__, "--side", cluster.master_url, "--root", str(root),
               "--side-out", str(work / f"out-{workers}")]
        env = {**os.environ, "SPARK_LOCAL_IP": LOOPBACK}
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"the job on {workers} worker(s) failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        result["load_1m"] = [before[0], agg.load()[0]]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100,000 messages")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--archives", type=Path, default=None,
                    help="keep the generated archive here and reuse it (default: a temporary directory)")
    ap.add_argument("--out", default=str(BENCH / "results" / "spark_cluster.json"))
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(side(args.root, args.side_out, args.side)), flush=True)
        return
    n = args.messages or (100_000 if args.quick else 300_000)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-spark-cluster-") as d:
        root, gen_s = agg.ensure_archive(n, args.archives or Path(d) / "archives")
        one = run_on(1, root, Path(d))
        two = run_on(2, root, Path(d))
    agg.compare(one.pop("rows"), two.pop("rows"))
    ratio = two["total_s"] / one["total_s"]
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
              "messages": n, "generate_s": round(gen_s, 1) if gen_s is not None else "reused",
              "one_worker": {**one, "total_s": round(one["total_s"], 2)},
              "two_workers": {**two, "total_s": round(two["total_s"], 2)},
              "two_over_one": round(ratio, 2), "seconds": round(time.perf_counter() - began, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{n:,} messages: one worker {one['total_s']:.1f} s, two workers {two['total_s']:.1f} s, "
          f"two / one {ratio:.2f} (outputs identical; load {one['load_1m']} / {two['load_1m']})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
