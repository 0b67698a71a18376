"""OpenTelemetry spans as JSON (tests/test_tracing_otel.py): what the test asserts of a span,
and an exporter appending them to a file, for the serving node's handler module
(tests/otel_handlers.py) to hand its spans to the test across processes.  Importing this sets
nothing up."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

SPANS_ENV = "FTPBC_OTEL_SPANS"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the test asserts of a span, as JSON: ids in hex as W3C writes them."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                  for link in span.links],
    }


class JsonLinesExporter(SpanExporter):
    """Appends each span as one line of JSON to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


