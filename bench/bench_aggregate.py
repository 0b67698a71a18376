"""Time the aggregation's two engines, Spark and plain (in one Python process), on the same archive.

    python3 bench/bench_aggregate.py                    # 10k, 100k, 1M and 2M messages
    python3 bench/bench_aggregate.py --quick            # 10k only (well under 2 minutes)
    python3 bench/bench_aggregate.py --sizes 10000,1000000 --archives /tmp/agg   # keep the archives

Each size: a synthetic archive (3 endpoints; requests, responses, errors, unanswered, replies
never collected or unreadable) written on a local directory through ftpbc's write path; then, in
the same run, each in a fresh process of its own:

* **spark**: ``ftpbc.analytics.job.run`` with ``--engine spark`` and ``local[*]``, as
  ``ftpbc aggregate --engine spark`` runs it: a new SparkSession started while the driver lists
  into Parquet (the time is the whole run's, start included; each phase's time is kept), the
  names parsed by Spark SQL functions in the JVM, every output written (figures and nodes
  Parquet/CSV, the unanswered list, the chart);
* **plain**: the same with ``--engine plain`` (``ftpbc.analytics.plain``): one Python process that
  lists with the same ``listing.scan_chunks``, parses every name with the reference parser
  (``records.parse_record``), pairs requests and replies in dicts, and writes the same outputs.

The outputs of both are compared row by row and column by column, exactly (figures, per-node
figures, unanswered list in its order) before any time is reported, and the engine
``--engine auto`` picks for the archive is recorded.

Memory, each the kernel's own peak (``VmHWM`` in ``/proc/<pid>/status``, not a sample): the
Python driver process, and separately the JVM it started (read just before the session stops).
Spark's Python workers (none are expected any more) are sampled every 0.2 s, summed.
The load average is recorded around each side: the machine may be shared.

Writes bench/results/aggregate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftpbc.analytics.listing import Input
from ftpbc.analytics.sources import ARCHIVE_FOLDERS, ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.transport.local import LocalTransport
from tests import synthetic

MIB = 2**20


def sources_at(root: str) -> list[ArchiveSource]:
    srv = ServerConfig.from_url(f"file://{root}", name="bench")
    return [ArchiveSource("quote", srv, "/ex/quote"),
            ArchiveSource("order", srv, "/ex/order", message_name="%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S"),
            ArchiveSource("stock", srv, "/ex/stock", message_name="%u_%y%y%y%y%M%M%d%d%H%H%m%m%s%s")]


# ----------------------------------------------------------------------------- memory and load

def vm_hwm(pid: int | str = "self") -> int | None:
    """Peak resident set size of a live process, in bytes, as the kernel tracks it (VmHWM)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class WorkerPeak:
    """Sum of the RSS of the driver's Python grandchildren (Spark's workers), sampled."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            try:
                for p in me.children(recursive=True):
                    if "python" in p.name():
                        total += p.memory_info().rss
            except psutil.Error:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.2)

    def __enter__(self) -> WorkerPeak:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ----------------------------------------------------------------------------- the two sides

def _jsonable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as JSON for the parent process; times as naive UTC ISO text (Parquet gives aware ones)."""
    def text(v: Any) -> Any:
        if isinstance(v, datetime):
            return (v.astimezone(UTC).replace(tzinfo=None) if v.tzinfo else v).isoformat()
        return v
    return [{k: text(v) for k, v in r.items()} for r in rows]


def side_spark(root: Path, out: Path) -> dict[str, Any]:
    """``--engine spark`` exactly as the command runs it: the session is started by the job (while
    the driver lists), so the time is the whole run's, start included."""
    from pyspark import SparkContext

    from ftpbc.analytics.job import Options, run

    phases: list[str] = []
    with WorkerPeak() as workers:
        t = time.perf_counter()
        res = run(Options(sources=sources_at(str(root)), out=out, progress=False, print_table=False,
                          engine="spark", report=lambda p: phases.append(p.line())))
        total_s = time.perf_counter() - t
        sc = SparkContext._active_spark_context
        assert sc is not None
        jvm = _java_hwm(sc._gateway.proc.pid)  # type: ignore[union-attr]
        sc.stop()
    return {"total_s": total_s, "phases": phases, "driver_peak_rss": vm_hwm(), "jvm_peak_rss": jvm,
            "workers_peak_rss_sampled": workers.peak, "rows": _outputs(res, out)}


def _outputs(res: Any, out: Path) -> dict[str, list[dict[str, Any]]]:
    """What a run wrote and returned, as JSON rows: figures, nodes, the unanswered list in its order."""
    import pyarrow.parquet as pq

    unanswered = pq.read_table(out / "unanswered").to_pylist()
    return {"figures": _jsonable(res.figures), "nodes": _jsonable(res.nodes),
            "unanswered": _jsonable(unanswered)}


def _java_hwm(launcher_pid: int) -> int | None:
    """VmHWM of the JVM: the java process under the spark-submit launcher (or the launcher itself)."""
    import psutil

    try:
        procs = [psutil.Process(launcher_pid), *psutil.Process(launcher_pid).children(recursive=True)]
    except psutil.Error:
        return None
    java = [p.pid for p in procs if p.name() == "java"]
    return max((vm_hwm(pid) or 0 for pid in java), default=None)


def side_plain(root: Path, out: Path) -> dict[str, Any]:
    from ftpbc.analytics.job import Options, run

    t = time.perf_counter()
    res = run(Options(sources=sources_at(str(root)), out=out, progress=False, print_table=False,
                      engine="plain"))
    job_s = time.perf_counter() - t
    return {"job_s": job_s, "driver_peak_rss": vm_hwm(), "rows": _outputs(res, out)}


# ----------------------------------------------------------------------------- the run

def ensure_archive(n: int, base: Path) -> tuple[Path, float | None]:
    """The archive of ``n`` messages under ``base``, written unless a complete one is there."""
    root = base / f"archive-{n}"
    marker = base / f"archive-{n}.complete"
    if marker.exists():
        return root, None
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t = time.perf_counter()
    sources = sources_at(str(root))
    msgs = synthetic.plan(sources, n // 3 + 1, datetime(2026, 3, 1, tzinfo=UTC), timedelta(hours=24))[:n]
    synthetic.write(LocalTransport(root, durable=False), sources, msgs,
                    synthetic.local_mtime_setter(str(root)))
    marker.write_text(str(n))
    return root, time.perf_counter() - t


def run_side(side: str, root: Path, out: Path) -> dict[str, Any]:
    """One side in a fresh process: its peak memory is its own, its JVM starts cold."""
    before = load()
    cmd = [sys.executable, __file__, "--side", side, "--root", str(root), "--side-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{side} side failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load_before"], result["load_after"] = before, load()
    return result


def compare(spark_rows: dict[str, list[dict[str, Any]]], plain_rows: dict[str, list[dict[str, Any]]]) -> None:
    """Both sides computed the very same outputs (else the timing compares different work):
    figures, per-node figures and the unanswered list, row by row, every column, exactly."""
    for what in ("figures", "nodes", "unanswered"):
        a, b = spark_rows[what], plain_rows[what]
        assert len(a) == len(b), (what, len(a), len(b))
        for ra, rb in zip(a, b, strict=True):
            assert ra == rb, (what, ra, rb)


def one_size(n: int, archives: Path, work: Path) -> dict[str, Any]:
    root, gen_s = ensure_archive(n, archives)
    files = sum(len(os.listdir(p)) for p in root.glob("ex/*/*") if p.name in ARCHIVE_FOLDERS)
    spark = run_side("spark", root, work / f"spark-{n}")
    plain = run_side("plain", root, work / f"plain-{n}")
    compare(spark.pop("rows"), plain.pop("rows"))
    total_s = spark["total_s"]
    mib = lambda v: round(v / MIB) if v else None  # noqa: E731
    from ftpbc.analytics.job import Options, choose_engine

    inputs = [Input("dir", str(p), p.parent.name, p.name) for p in sorted(root.glob("ex/*/*"))
              if p.name in ARCHIVE_FOLDERS and any(p.iterdir())]
    return {
        "messages": n, "files": files, "generate_s": round(gen_s, 1) if gen_s is not None else "reused",
        "auto_picks": choose_engine(Options(sources=[], out=work), inputs)[0],
        "spark_total_s": round(total_s, 2), "spark_phases": spark["phases"],
        "plain_s": round(plain["job_s"], 2),
        "spark_total_over_plain": round(total_s / plain["job_s"], 2),
        "spark_driver_peak_rss_mib": mib(spark["driver_peak_rss"]),
        "spark_jvm_peak_rss_mib": mib(spark["jvm_peak_rss"]),
        "spark_workers_peak_rss_mib_sampled": mib(spark["workers_peak_rss_sampled"]),
        "plain_peak_rss_mib": mib(plain["driver_peak_rss"]),
        "load_1m": {"spark": [spark["load_before"][0], spark["load_after"][0]],
                    "plain": [plain["load_before"][0], plain["load_after"][0]]},
    }


def crossover(rows: list[dict[str, Any]], key: str) -> str:
    """The first measured size from which Spark (start included) stays faster, or why there is none."""
    wins = [r["spark_" + key + "_over_plain"] < 1 for r in rows]
    for i, r in enumerate(rows):
        if all(wins[i:]):
            return f"Spark faster from {r['messages']:,} messages (ratio {r['spark_' + key + '_over_plain']})"
    best = min(rows, key=lambda r: r["spark_" + key + "_over_plain"])
    return (f"Spark never faster up to {rows[-1]['messages']:,} messages (best ratio "
            f"{best['spark_' + key + '_over_plain']} at {best['messages']:,})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k messages only")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--archives", type=Path, default=None,
                    help="keep the generated archives here and reuse them (default: a temporary directory)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "aggregate.json"))
    ap.add_argument("--side", choices=["spark", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        fn = side_spark if args.side == "spark" else side_plain
        print(json.dumps(fn(args.root, args.side_out)), flush=True)
        return
    sizes = args.sizes or ([10_000] if args.quick else [10_000, 100_000, 1_000_000, 2_000_000])
    began, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="bench-agg-") as d:
        archives = args.archives or Path(d) / "archives"
        for n in sizes:
            rows.append(one_size(n, archives, Path(d)))
            print(json.dumps(rows[-1]), flush=True)
            if args.archives is None:
                shutil.rmtree(archives / f"archive-{n}")
                (archives / f"archive-{n}.complete").unlink()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": {"cpus": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
                          "python": platform.python_version(), "java": _java_version()},
              "seconds": round(time.perf_counter() - began, 1),
              "crossover": crossover(rows, "total"),
              "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(report["crossover"] + " (Spark's start included)")
    print(f"wrote {args.out}")


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
    except OSError:
        return "none"
    return out.splitlines()[0] if out else "unknown"


if __name__ == "__main__":
    main()
