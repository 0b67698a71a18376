#!/usr/bin/env python3
"""Where a request's CPU goes: the client process, the serving node and the server, per request.

    python3 bench/cpu_split.py --servers vsftpd --runs 5

Runs the quick set's request/response row (8 client threads, ``--nodes`` nodes, 4 s) for
ftpbc and for its floor alternately, each in a fresh process as bench/run.py does, while a
sampler reads every process's CPU time from /proc ten times a second.  For each run it prints
the milliseconds of CPU (user and system apart) that each party spent per request over the
side's own measured window (the requests it counts; warm-up, start and shutdown left out),
process by process: a process that starts inside the window counts from zero, one that ends
inside it up to its last sample (a server session closed early must not subtract its whole
life's CPU from the sum, as a difference of sums did):

* ``client``: the side process (ftpbc's Client or the floor's client threads, all in one);
* ``node``: the serving node processes (forked by the side);
* ``server``: the FTP server's processes (vsftpd's sessions; pyftpdlib's one process);
* ``kernel``: kernel threads (writeback, journal commits, softirq), whoever caused them.

On a machine the run saturates, the rate is what the CPU per request allows, so these figures
say which party to make cheaper; the medians over ``--runs`` runs a side come last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from run import Variant, run_side, variants  # noqa: E402
from servers import running  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KERNEL_THREADS = ("jbd2", "kworker", "ksoftirqd", "rcu")


def _processes() -> dict[int, tuple[str, int, int, int]]:
    """pid -> (command, parent pid, user ticks, system ticks) of every process now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        command = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(entry)] = (command, int(fields[1]), int(fields[11]), int(fields[12]))
    return out


def _descends(pid: int, ancestor: int, procs: dict[int, tuple[str, int, int, int]]) -> bool:
    """Whether ``pid`` is ``ancestor`` or below it (vsftpd: listener, session, its helper)."""
    for _ in range(4):
        if pid == ancestor:
            return True
        if pid not in procs:
            return False
        pid = procs[pid][1]
    return False


def _party(pid: int, procs: dict[int, tuple[str, int, int, int]], server_pid: int) -> str | None:
    command, parent = procs[pid][0], procs[pid][1]
    if _descends(pid, server_pid, procs):
        return "server"
    if parent == os.getpid():
        return "client"  # the side process (bench/side.py)
    if parent in procs and procs[parent][1] == os.getpid():
        return "node"  # forked by the side
    if command.startswith(KERNEL_THREADS):
        return "kernel"
    return None


def _ticks(server_pid: int) -> dict[int, tuple[str, int, int]]:
    """pid -> (party, user ticks, system ticks) of every process of a party now."""
    procs = _processes()
    out = {}
    for pid, (_, _, user, system) in procs.items():
        party = _party(pid, procs, server_pid)
        if party is not None:
            out[pid] = (party, user, system)
    return out


def _spent(samples: list[tuple[float, dict[int, tuple[str, int, int]]]]) -> Counter[str]:
    """Ticks each party spent from the first sample to the last, process by process."""
    first = samples[0][1]
    last_seen: dict[int, tuple[str, int, int]] = {}
    for _, procs in samples:
        last_seen.update(procs)  # a process that ended keeps its last sample
    totals: Counter[str] = Counter()
    for pid, (party, user, system) in last_seen.items():
        _, user0, system0 = first.get(pid, (party, 0, 0))
        totals[f"{party} user"] += user - user0
        totals[f"{party} sys"] += system - system0
    return totals


def measure(side: str, v: Variant, target: dict[str, Any], workdir: Path) -> tuple[float, dict[str, float]]:
    """One run of ``side``: its rate and the CPU ms per request of each party, steady part only."""
    samples: list[tuple[float, dict[int, tuple[str, int, int]]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            samples.append((time.monotonic(), _ticks(target["pid"])))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_side(side, v, target, workdir, getattr(v, side))
    finally:
        done.set()
        sampler.join()
    begin, end = result["window"]
    steady = [(t, procs) for t, procs in samples if begin <= t <= end]
    if len(steady) < 2 or not any(party == "node" for party, _, _ in steady[-1][1].values()):
        raise RuntimeError("no node process was seen in the window: is this machine's /proc readable?")
    requests = result["rate"] * (steady[-1][0] - steady[0][0])
    split = {k: ticks / TICK * 1000 / requests for k, ticks in _spent(steady).items()}
    split["total"] = sum(split.values())
    return result["rate"], split


def _line(split: dict[str, float]) -> str:
    keys = [f"{party} {kind}" for party in ("client", "node", "server", "kernel") for kind in ("user", "sys")]
    return "  ".join(f"{k} {split.get(k, 0.0):.2f}" for k in [*keys, "total"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="vsftpd", help="vsftpd and/or pyftpdlib")
    parser.add_argument("--runs", type=int, default=5, help="runs a side, alternating")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2, 4))
    args = parser.parse_args()
    row = next(v for v in variants(True, args.runs) if v.fn == "reqresp" and v.ftpbc.get("clients") == 8
               and v.ftpbc.get("nodes") == args.nodes)
    for p in (row.ftpbc, row.floor):
        p["seconds"] = 4.0
    kinds = args.servers.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="ftpbc-cpu-"))
    with running(kinds, workdir) as targets:
        for kind in kinds:
            runs: dict[str, list[tuple[float, dict[str, float]]]] = {"ftpbc": [], "floor": []}
            for i in range(args.runs):
                for side in ("ftpbc", "floor") if i % 2 == 0 else ("floor", "ftpbc"):
                    rate, split = measure(side, row, targets[kind], workdir)
                    runs[side].append((rate, split))
                    print(f"{kind} {side:5} {rate:5.0f} req/s  {_line(split)}", flush=True)
            print(f"\n{kind}, {args.nodes} node(s): medians of {args.runs} runs, CPU ms per request")
            for side, results in runs.items():
                medians = {k: statistics.median(s.get(k, 0.0) for _, s in results) for k in results[0][1]}
                print(f"  {side:5} {statistics.median(r for r, _ in results):5.0f} req/s  {_line(medians)}")


if __name__ == "__main__":
    main()
