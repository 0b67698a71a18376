"""A handler of tests/test_tracing_otel.py, imported by ``ftpbc serve`` through
``node.handler_path`` as ``otel_handlers``.

Importing it sets an OpenTelemetry SDK tracer provider for the serving process, as an
application's handler module would, with an exporter that appends every ended span as one
JSON line to the file ``FTPBC_OTEL_SPANS`` names (tests/otel_spans.py): the test reads the
node's spans from there.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ftpbc.model.message import Message
from tests.otel_spans import SPANS_ENV, JsonLinesExporter

_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ[SPANS_ENV])))
trace.set_tracer_provider(_provider)


def echo(message: Message) -> bytes:
    """Answers ``traced:<body>``, inside a span of its own (a child of ftpbc's ``process`` span)."""
    with trace.get_tracer("tests.otel_handlers").start_as_current_span("handler work"):
        return b"traced:" + message.body
