#!/usr/bin/env python3
"""Selector evaluations per second (ftpbc.model.selector), one thread.

Each selector is compiled once, then evaluated over a ring of 1,000 messages whose headers and
properties vary (so about half match); the figure is evaluations per second over ``--seconds``.
The first row is the JMS specification's example, the acceptance figure (target >= 200,000/s).

    python3 bench/bench_selector.py [--seconds 2]

Prints a table and writes bench/results/selector.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ftpbc.model.envelope import Envelope, Headers
from ftpbc.model.selector import compile_selector

RESULTS = Path(__file__).resolve().parent / "results"

SELECTORS = [
    "JMSType = 'car' AND color = 'blue' AND weight > 2500",
    "JMSPriority >= 5",
    "age BETWEEN 15 AND 19",
    "Country IN ('UK', 'US', 'France')",
    "phone LIKE '12%3'",
    "prop_name IS NULL OR (weight * 2 + 1 > 4000 AND NOT color = 'red')",
]


def messages(n: int) -> list[Envelope]:
    rnd = random.Random(7)
    out = []
    for i in range(n):
        props = {"color": rnd.choice(["blue", "red", "green"]), "weight": rnd.randrange(5000),
                 "age": rnd.randrange(10, 25), "Country": rnd.choice(["UK", "US", "France", "Peru"]),
                 "phone": rnd.choice(["123", "12993", "1234", "999"])}
        if rnd.random() < 0.5:
            props["prop_name"] = "set"
        out.append(Envelope(Headers(id=f"m{i}", type=rnd.choice(["car", "bike"]), priority=rnd.randrange(10)),
                            props, f"msg.m{i}"))
    return out


def measure(text: str, ring: list[Envelope], seconds: float) -> tuple[float, float]:
    selector = compile_selector(text)
    pairs = [(e.headers, e.properties) for e in ring]
    matches = selector.matches
    count = hits = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for h, p in pairs:
            if matches(h, p):
                hits += 1
        count += len(pairs)
    elapsed = time.perf_counter() - started
    return count / elapsed, hits / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    ring = messages(1000)
    rows = []
    print(f"{'evaluations/s':>14}  {'matched':>7}  selector")
    for text in SELECTORS:
        rate, share = measure(text, ring, args.seconds)
        rows.append({"selector": text, "evaluations_per_second": round(rate), "matched": round(share, 3)})
        print(f"{rate:14,.0f}  {share:7.1%}  {text}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "selector.json").write_text(json.dumps({
        "python": platform.python_version(), "machine": platform.machine(), "seconds": args.seconds,
        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
