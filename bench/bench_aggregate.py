"""Time the Spark aggregation against a plain single-process Python pass over the same archive.

    python3 bench/bench_aggregate.py            # 10k, 100k and 1,000,000 messages
    python3 bench/bench_aggregate.py --quick    # 10k and 100k

Each size: a synthetic archive (3 endpoints; requests, responses, errors, unanswered) written
on a local directory through ftpbc's write path; then, in the same run, (1) the job with
``local[*]`` (Spark lists the directories itself) and (2) one Python process that lists with
``os.scandir``, parses every name with the same parser and computes the same figures with dicts.
Both totals are compared.  Peak memory: RSS of the driver (Python + its JVM), sampled every 0.1 s.
Writes bench/results/aggregate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftpbc.analytics import synthetic
from ftpbc.analytics.records import UNCOLLECTED, parse_record
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.transport.local import LocalTransport

HOUR_US = 3_600_000_000


class PeakRSS:
    """Peak resident memory of this process and its children (the JVM), sampled."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                rss = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))
            except psutil.Error:
                rss = 0
            self.peak = max(self.peak, rss)
            self._stop.wait(0.1)

    def __enter__(self) -> PeakRSS:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def sources_at(root: str) -> list[ArchiveSource]:
    srv = ServerConfig.from_url(f"file://{root}", name="bench")
    return [ArchiveSource("quote", srv, "/ex/quote"),
            ArchiveSource("order", srv, "/ex/order", message_name="%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S"),
            ArchiveSource("stock", srv, "/ex/stock", message_name="%u_%y%y%y%y%M%M%d%d%H%H%m%m%s%s")]


def plain_pass(sources: list[ArchiveSource]) -> dict[str, Any]:
    """The same figures, one process, no Spark: scandir, parse, pair in dicts, sort for percentiles."""
    req: dict[tuple[str, str], dict[str, Any]] = {}
    rep: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for s in sources:
        naming = s.naming()
        for folder in ARCHIVE_FOLDERS:
            path = Path(s.server.base) / s.folder_path(folder).lstrip("/")
            if not path.is_dir():
                continue
            with os.scandir(path) as it:
                for de in it:
                    st = de.stat()
                    r = parse_record({"endpoint": s.endpoint, "folder": folder, "name": de.name,
                                      "size": st.st_size, "mtime_us": st.st_mtime_ns // 1000,
                                      "mtime_prec_us": 1}, naming)
                    key = (s.endpoint, r["uuid"])
                    if r["kind"] == "request":
                        req[key] = r
                    elif r["kind"] in ("response", "error_reply"):
                        rep[key][r["folder"]] = r
    groups: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"requests": 0, "unanswered": 0, "latency": []})
    for key, r in req.items():
        t0 = r["name_time_us"] if r["name_time_us"] is not None else r["mtime_us"]
        g = groups[(key[0], t0 - t0 % HOUR_US)]
        g["requests"] += 1
        reply = rep.get(key)
        if not reply:
            g["unanswered"] += 1
            continue
        out = reply.get("outarchive")
        if out is not None and out["node"] != UNCOLLECTED:
            g["latency"].append((out["stamp_us"] - t0) / 1000)
    result = {}
    for (ep, b), g in groups.items():
        lat = sorted(g.pop("latency"))
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [0.0] * 99
        result[f"{ep}@{b}"] = {**g, "p50": q[49], "p95": q[94], "p99": q[98]}
    return result


def one_size(n: int, spark: Any, workdir: Path) -> dict[str, Any]:
    from ftpbc.analytics.job import Options, run

    root = workdir / f"archive-{n}"
    root.mkdir()
    sources = sources_at(str(root))
    t = time.perf_counter()
    msgs = synthetic.plan(sources, n // 3 + 1, datetime(2026, 3, 1, tzinfo=UTC), timedelta(hours=24))[:n]
    setter = synthetic.local_mtime_setter(str(root))
    synthetic.write(LocalTransport(root, durable=False), sources, msgs, setter)
    files = sum(1 for _ in root.rglob("*~*"))
    gen_s = time.perf_counter() - t
    del msgs

    with PeakRSS() as mem:
        t = time.perf_counter()
        res = run(Options(sources=sources, out=workdir / f"out-{n}", progress=False, print_table=False),
                  spark=spark)
        spark_s = time.perf_counter() - t
    with PeakRSS() as pmem:
        t = time.perf_counter()
        plain = plain_pass(sources)
        plain_s = time.perf_counter() - t
    spark_req = sum(r["requests"] for r in res.figures)
    plain_req = sum(g["requests"] for g in plain.values())
    assert spark_req == plain_req == n, (spark_req, plain_req, n)
    shutil.rmtree(root)
    return {"messages": n, "files": files, "generate_s": round(gen_s, 1),
            "spark_s": round(spark_s, 2), "plain_python_s": round(plain_s, 2),
            "spark_over_plain": round(spark_s / plain_s, 2),
            "spark_peak_rss_mib": round(mem.peak / 2**20), "plain_peak_rss_mib": round(pmem.peak / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k and 100k messages only")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "aggregate.json"))
    args = ap.parse_args()
    sizes = args.sizes or ([10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000])
    from ftpbc.analytics.figures import session

    t = time.perf_counter()
    spark = session("local[*]")
    start_s = time.perf_counter() - t
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-agg-") as d:
        for n in sizes:
            rows.append(one_size(n, spark, Path(d)))
            print(json.dumps(rows[-1]), flush=True)
    spark.stop()
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
              "python": platform.python_version(), "spark_session_start_s": round(start_s, 1),
              "load_average_1m_at_end": os.getloadavg()[0], "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
