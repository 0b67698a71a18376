"""What journaling costs: request/response throughput with ``node.durable_journal`` on and off.

One ``ftpbc serve`` node (a real subprocess, ``workers`` handler threads) and ``clients``
client threads (each its own :class:`ftpbc.client.Client`, one request at a time) against an
embedded pyftpdlib server on loopback.  Both settings run in the same invocation, alternately,
``rounds`` times each; the medians and their ratio go to ``bench/results/journal.json``.
Durable on means every journal record that announces a remote write is fsynced first (node and
clients); off means the records are still written, just not fsynced.

    python3 bench/bench_journal.py --requests 1000 --rounds 3

``--alone SECONDS`` measures the journal by itself instead: ``--threads`` threads each writing
durable records to one endpoint journal (group commit), then the same records not fsynced, the
rounds interleaved; it prints records/s, fsyncs per record (a wrapper around ``os.fsync``) and
the ratio to the unsynced rate, and writes ``bench/results/journal_alone.json``.

    python3 bench/bench_journal.py --alone 3 --threads 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftpbc.client import Client
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.journal import Journal
from tests.chaos import ENDPOINT, NodeProcess, load_client_config, make_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "journal.json"


def one_run(work: Path, srv: EmbeddedFTPServer, password: str, *, durable: bool, requests: int,
            clients: int, workers: int) -> float:
    repo = f"/r-{secrets.token_hex(4)}"
    (srv.root / repo.lstrip("/")).mkdir()
    cluster = make_cluster(work / repo.lstrip("/"), url=srv.url, password=password, options={},
                           repository=repo, server_root=srv.root, durable=durable, workers=workers,
                           poll_interval=0.05, lease=10, heartbeat=1)
    node = NodeProcess(cluster, "bench")
    node.start()
    try:
        deadline = time.monotonic() + 60
        while not node.ready():
            if time.monotonic() > deadline or not node.alive:
                raise SystemExit(f"node did not start: {node.log.read_text()[-2000:]}")
            time.sleep(0.05)
        counter = iter(range(requests))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def client(k: int) -> None:
            try:
                with Client(load_client_config(cluster, f"c{k}"), connections=2) as c:
                    c.request(ENDPOINT, b"warm-up", timeout=30)
                    barrier.wait()
                    while True:
                        with lock:
                            i = next(counter, None)
                        if i is None:
                            return
                        c.request(ENDPOINT, str(i).encode(), timeout=30)
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        barrier = threading.Barrier(clients + 1)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise errors[0]
        return requests / elapsed
    finally:
        node.stop()


def journal_alone(work: Path, *, durable: bool, threads: int, seconds: float) -> dict[str, float]:
    """Records/s and fsyncs per record of ``threads`` threads writing to one endpoint journal."""
    journal = Journal(work / f"j-{secrets.token_hex(4)}", "bench", durable=durable)
    ep = journal.endpoint("bench")
    real = os.fsync
    fsyncs = [0]

    def counting(fd: int) -> None:
        fsyncs[0] += 1
        real(fd)

    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def writer(k: int) -> None:
        barrier.wait()
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            op_id = f"{k}.{i}.send"
            # an intent that stays pending: no compaction or truncation in the way
            ep.record(op_id, "send", durable=True, kind="request", stage=f"/q/instage/req.{op_id}~n",
                      target=f"/q/inbox/req.{op_id}")
            i += 1
        counts[k] = i

    os.fsync = counting  # type: ignore[assignment]
    try:
        pool = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - started
    finally:
        os.fsync = real
        journal.close()
    records = sum(counts)
    return {"records_per_s": records / elapsed, "fsyncs_per_record": fsyncs[0] / max(records, 1)}


def alone_main(args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, float]]] = {"durable": [], "not_durable": []}
    with tempfile.TemporaryDirectory(dir=RESULTS.parent if RESULTS.parent.is_dir() else None) as tmp:
        for r in range(args.rounds):
            for durable in (True, False) if r % 2 == 0 else (False, True):
                run = journal_alone(Path(tmp), durable=durable, threads=args.threads, seconds=args.alone)
                runs["durable" if durable else "not_durable"].append(run)
                print(f"round {r + 1}: durable={durable}: {run['records_per_s']:.0f} records/s, "
                      f"{run['fsyncs_per_record']:.2f} fsyncs a record", flush=True)
    on = statistics.median(x["records_per_s"] for x in runs["durable"])
    off = statistics.median(x["records_per_s"] for x in runs["not_durable"])
    per = statistics.median(x["fsyncs_per_record"] for x in runs["durable"])
    result = {"threads": args.threads, "seconds": args.alone, "rounds": args.rounds,
              "durable_records_per_s": round(on), "not_durable_records_per_s": round(off),
              "fsyncs_per_durable_record": round(per, 3), "durable_over_not_durable": round(on / off, 3),
              "load": os.getloadavg()[0]}
    (RESULTS.parent / "journal_alone.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--alone", type=float, default=0.0, metavar="SECONDS",
                    help="measure the journal alone for SECONDS a run (no server, no node)")
    ap.add_argument("--threads", type=int, default=8, help="writer threads with --alone")
    args = ap.parse_args()
    if args.alone > 0:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        alone_main(args)
        return
    password = secrets.token_urlsafe(12)
    rates: dict[str, list[float]] = {"durable": [], "not_durable": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        with EmbeddedFTPServer(root, password=password, auth_failed_delay=0) as srv:
            for r in range(args.rounds):
                for durable in (True, False) if r % 2 == 0 else (False, True):
                    rate = one_run(Path(tmp), srv, password, durable=durable, requests=args.requests,
                                   clients=args.clients, workers=args.workers)
                    rates["durable" if durable else "not_durable"].append(rate)
                    print(f"round {r + 1}: durable_journal={durable}: {rate:.0f} requests/s", flush=True)
    on, off = statistics.median(rates["durable"]), statistics.median(rates["not_durable"])
    result = {"server": "pyftpdlib (embedded, loopback)", "requests_per_run": args.requests,
              "clients": args.clients, "workers": args.workers, "rounds": args.rounds,
              "durable_on_rps": round(on, 1), "durable_off_rps": round(off, 1),
              "on_over_off": round(on / off, 3),
              "runs": {k: [round(x, 1) for x in v] for k, v in rates.items()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
