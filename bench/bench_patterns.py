#!/usr/bin/env python3
"""Expansions per second of ``req.%u.%y%y%y%y%M%M%d%d-%H%H%m%m%s%s.%{bench}`` with 1 and 4 processes.

Every expansion draws a UUID, formats a date run and increments one shared sequence file under
its file lock (fsync + rename + directory fsync).  Also measured: the same with ``durable=False``
(no fsync), expansion without a sequence, ``match`` on the names produced, and the durable
sequence from 4 processes of ``--threads`` threads each (draws of one process waiting at the same
moment share one lock and fsync: a node's workers naming files at once).

    python3 bench/bench_patterns.py [--seconds 3] [--threads 8] [--dir DIR]

Prints a table and writes bench/results/patterns.json.  DIR (default: a temporary directory under
bench/results) must be on the disk you want to measure: /tmp may be tmpfs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftpbc.patterns import ExpandContext, Pattern
from ftpbc.sequences import SequenceStore

PATTERN = "req.%u.%y%y%y%y%M%M%d%d-%H%H%m%m%s%s.%{bench}"
NO_SEQ = "req.%u.%y%y%y%y%M%M%d%d-%H%H%m%m%s%s"
RESULTS = Path(__file__).resolve().parent / "results"
#: durable cluster-wide draws a second aimed at
AIM = 2000


def _worker(text: str, directory: str, durable: bool, seconds: float, threads: int, start: Any,
            out: Any) -> None:
    pattern = Pattern.parse(text)
    store = SequenceStore(f"{directory}/local", f"{directory}/shared", durable=durable)
    ctx = ExpandContext(endpoint="bench", store=store)
    counts = [0] * threads
    values: list[list[int]] = [[] for _ in range(threads)]

    def draw(k: int, deadline: float) -> None:
        while time.perf_counter() < deadline:
            made = pattern.expand(ctx)
            counts[k] += 1
            if "%{bench}" in made.values:
                values[k].append(int(made.values["%{bench}"]))

    start.wait()
    deadline = time.perf_counter() + seconds
    if threads == 1:
        draw(0, deadline)
    else:
        pool = [threading.Thread(target=draw, args=(k, deadline)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    out.put((sum(counts), [v for vs in values for v in vs]))


def expansions_per_second(text: str, directory: str, processes: int, durable: bool,
                          seconds: float, threads: int = 1) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(processes + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(text, directory, durable, seconds, threads, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    start.wait()
    began = time.perf_counter()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join(timeout=30)
    total = sum(c for c, _ in results)
    drawn = sorted(v for _, vs in results for v in vs)
    # every value distinct: the lock held under contention
    assert len(drawn) == len(set(drawn)), "a sequence value was drawn twice"
    # and consecutive: a draw that returned is never skipped without a crash
    assert not drawn or drawn == list(range(drawn[0], drawn[0] + len(drawn))), "a value was skipped"
    return {"pattern": text, "processes": processes, "threads": threads, "durable": durable,
            "expansions": total,
            "seconds": round(elapsed, 3), "per_second": round(total / elapsed)}


def match_per_second(seconds: float) -> dict[str, Any]:
    pattern = Pattern.parse(NO_SEQ)
    names = [pattern.expand().name for _ in range(1000)] + ["resp.x", "req.not-a-uuid.1"] * 500
    count = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for name in names:
            pattern.match(name)
        count += len(names)
    elapsed = time.perf_counter() - began
    return {"pattern": NO_SEQ, "operation": "match", "per_second": round(count / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=8,
                        help="threads per process of the threaded row (default 8)")
    parser.add_argument("--dir", default=None, help="where the sequence files go")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = args.dir or tempfile.mkdtemp(prefix="seq-", dir=RESULTS)
    rows: list[dict[str, Any]] = []
    try:
        for text, durable in ((PATTERN, True), (PATTERN, False), (NO_SEQ, True)):
            for processes in (1, 4):
                directory = tempfile.mkdtemp(dir=base)
                rows.append(expansions_per_second(text, directory, processes, durable, args.seconds))
        if args.threads > 1:
            for durable in (True, False):
                directory = tempfile.mkdtemp(dir=base)
                rows.append(expansions_per_second(PATTERN, directory, 4, durable, args.seconds,
                                                  args.threads))
        matching = match_per_second(args.seconds)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{'pattern':<50} {'procs':>5} {'thr':>3} {'fsync':>5} {'expansions/s':>13}")
    for r in rows:
        print(f"{r['pattern']:<50} {r['processes']:>5} {r['threads']:>3} "
              f"{'yes' if r['durable'] else 'no':>5} {r['per_second']:>13,}")
    print(f"match() on the names above: {matching['per_second']:,} names/s (1 process)")
    rate = {(r["processes"], r["threads"], r["durable"]): r["per_second"] for r in rows
            if r["pattern"] == PATTERN}
    for procs, threads in sorted({(p, t) for p, t, _ in rate}):
        on, off = rate.get((procs, threads, True)), rate.get((procs, threads, False))
        if on is not None and off:
            print(f"durable %{{bench}}, {procs} x {threads} thread(s): {on / AIM:.2f} of the aim "
                  f"({AIM:,}/s), {on / off:.2f} of the same without fsync")
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "system": platform.platform()},
              "directory": base, "expand": rows, "match": matching}
    (RESULTS / "patterns.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS / 'patterns.json'}")


if __name__ == "__main__":
    main()
