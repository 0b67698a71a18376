#!/usr/bin/env python3
"""Run one side of one benchmark in a process of its own; the runner (bench/run.py) calls this.

Reads ``{"side": "ftpbc"|"floor"|"kombu"|"state_dir", "case": ..., "target": {...}, "workdir": ...,
"params": {...}}`` as JSON on stdin and prints the figures as one JSON line on stdout.  A process
per run keeps runs independent: no connection, thread, page of memory or GIL contention is
carried from one side to the other, and ``ru_maxrss`` is this run's own peak.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]


def main() -> None:
    # A run that hangs prints every thread's stack to stderr (the runner shows its tail), so
    # a stall says where it is instead of only costing its timeout.
    faulthandler.dump_traceback_later(float(os.environ.get("FTPBC_BENCH_STACKS_AFTER", "120")), exit=False)
    spec = json.load(sys.stdin)
    # "state_dir", "uniform" and "listing" are ftpbc itself as the peer (coordination: server
    # against state_dir, mixed priorities against one, a browse against a bare listing): the
    # same functions, only the parameters differ; "small" is ftpbc with a small backlog,
    # "lock_none" ftpbc's nodes without the cross-process poll lock.
    if spec["side"] in ("ftpbc", "state_dir", "uniform", "listing", "small", "lock_none"):
        import ftpbc_sides as module
    elif spec["side"] == "kombu":
        from floor import kombu_fs as module  # type: ignore[no-redef]
    else:
        from floor import sides as module  # type: ignore[no-redef]
    result = module.CASES[spec["case"]](spec)
    from common import WINDOW

    if len(WINDOW) == 2:
        result.setdefault("window", WINDOW)  # what bench/cpu_split.py accounts CPU over
    print(json.dumps(result))


if __name__ == "__main__":
    main()
