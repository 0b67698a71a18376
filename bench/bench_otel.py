"""What OpenTelemetry tracing costs a request (docs/tracing-otel.md).

    python3 bench/bench_otel.py                  # 5 rounds of 200 requests per mode
    python3 bench/bench_otel.py --rounds 3 --requests 100

Two measures, each with the tracing off (opentelemetry installed, no tracer provider set: what
every ftpbc process without tracing pays) and on (an SDK tracer provider, every span sampled,
handed to a BatchSpanProcessor whose exporter drops them: the cost of making the spans, not of
shipping them):

* **calls**: the tracing calls one request makes (the client's send span, its trace properties,
  the node's process span, the receive span), timed alone in a loop of this process: CPU time
  per request, independent of any server;
* **round trips**: sequential requests from one client to an in-process node through an
  in-process pyftpdlib server, the rounds of the two modes alternating so that a change of the
  machine's load hits both; the median round trip of each mode.

The load average is recorded before and after: the machine may be shared.  Writes
bench/results/otel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.util._once import Once

from ftpbc import tracing
from ftpbc.client import Client
from ftpbc.embedded import EmbeddedFTPServer
from ftpbc.node.serve import Node
from tests.support import embedded_config

RESULTS = Path(__file__).resolve().parent / "results" / "otel.json"


class Drop(SpanExporter):
    """Takes every span and keeps none."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def tracing_on() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    return provider


def tracing_off(provider: TracerProvider | None) -> None:
    if provider is not None:
        provider.shutdown()
    # opentelemetry sets its global provider once per process: unset again for the next round
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


def calls_per_request(count: int) -> float:
    """CPU microseconds the tracing calls of one request take, in a loop of ``count`` (CPU time
    of this process, not wall time: a loaded machine delays the loop, not its CPU use)."""
    started = time.process_time()
    for _ in range(count):
        with tracing.producing("request", "echo", client_id="bench.client0") as span:
            props = span.properties()
            if span:
                span.message("4d4f6177-f085-456b-94d1-1ed22baae814", 5, None)
        with tracing.consuming("process", "echo", props, client_id="bench") as served:
            if served:
                served.message("4d4f6177-f085-456b-94d1-1ed22baae814", 5, None)
        span.received("echo", time.time_ns(), message_id="4d4f6177-f085-456b-94d1-1ed22baae814",
                      body_size=5, client_id="bench.client0")
    return (time.process_time() - started) / count * 1e6


def round_trips(client: Client, count: int) -> list[float]:
    seconds = []
    for i in range(count):
        started = time.perf_counter()
        client.request("echo", f"m{i}".encode(), timeout=60)
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    load_before = os.getloadavg()
    calls = {"off": calls_per_request(args.calls)}
    provider = tracing_on()
    calls["on"] = calls_per_request(args.calls)
    tracing_off(provider)
    trips: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        server = EmbeddedFTPServer(root, password="pw").start()
        config = embedded_config(server.port, Path(tmp), node={"id": "bench"}, endpoint={"workers": 4})
        node = Node(config, handlers={"echo": lambda m: m.body})
        node.start()
        try:
            with Client(config.with_node_id("bench.client0")) as client:
                round_trips(client, 20)  # connections, directories, caches
                for _ in range(args.rounds):
                    trips["off"] += round_trips(client, args.requests)
                    provider = tracing_on()
                    try:
                        trips["on"] += round_trips(client, args.requests)
                    finally:
                        tracing_off(provider)
        finally:
            node.stop(drain_timeout=10)
            server.stop()
    load_after = os.getloadavg()
    median = {mode: statistics.median(s) * 1e3 for mode, s in trips.items()}
    result: dict[str, Any] = {
        "calls_us_per_request": {k: round(v, 2) for k, v in calls.items()},
        "round_trip_median_ms": {k: round(v, 3) for k, v in median.items()},
        "round_trip_overhead_ms": round(median["on"] - median["off"], 3),
        "requests_per_mode": len(trips["off"]),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
