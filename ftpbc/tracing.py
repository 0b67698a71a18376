"""OpenTelemetry tracing, optional (docs/tracing-otel.md): spans for sends, requests, publishes,
handler calls, routing and fan-out, and the W3C trace context carried in message properties.

With the ``otel`` extra installed (``opentelemetry-api``) and a tracer provider set by the
application (``opentelemetry.trace.set_tracer_provider``, an SDK provider for instance), the
client and the serving node open spans following the OpenTelemetry messaging conventions
(``messaging.system`` ``ftpbc``), and a message sent under a span carries the properties
``traceparent`` and ``tracestate`` (W3C Trace Context), so the span of the node that handles it
is a child of the sender's.

Without the extra, or with no tracer provider set, every function here returns at once and
does nothing: no span, no property added, and ``opentelemetry`` is imported at most once (the
first time a span could be opened, to learn whether it is there) and never when it is absent.
Nothing here raises because of tracing: a context that cannot be read is ignored (the span is
a root), a span that cannot be recorded is dropped.

Not guaranteed: that a trace context survives a name with no room for it (the sender then
sends without ``tracestate``, then without both: :func:`with_trace_properties`); that a routed
or fanned-out copy names its hop as parent when its name had no room either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

__all__ = [
    "SYSTEM",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_PROPERTIES",
    "Traced",
    "consuming",
    "current_properties",
    "enabled",
    "producing",
    "received",
    "with_trace_properties",
]

#: the property names of the W3C trace context (https://www.w3.org/TR/trace-context/)
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_PROPERTIES = (TRACEPARENT, TRACESTATE)
#: ``messaging.system`` of every span ftpbc opens
SYSTEM = "ftpbc"
#: a ``traceparent`` of a known version is 55 characters; a longer one from another program is
#: read up to this many (a future version may append fields), never more
MAX_TRACEPARENT = 256
#: the W3C limit of a ``tracestate`` (32 members): a longer one is not read
MAX_TRACESTATE = 512

T = TypeVar("T")

log = logging.getLogger("ftpbc.tracing")


class _Api:
    """The opentelemetry objects ftpbc uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.context = context
        self.kind = SpanKind
        self.status = Status
        self.error = StatusCode.ERROR
        self.inactive = (NoOpTracerProvider, ProxyTracerProvider)
        # W3C trace context always, whatever global propagator the application set: the property
        # names are part of ftpbc's message format
        self.propagator = TraceContextTextMapPropagator()
        self.link = trace.Link
        #: the global provider last seen and its tracer (``_active``)
        self.current: tuple[Any, Any] = (None, None)


_api: _Api | None = None
_tried = False
_lock = threading.Lock()


def _load() -> _Api | None:
    """The opentelemetry API if it can be imported (tried once per process), else None."""
    global _api, _tried
    with _lock:
        if not _tried:
            try:
                _api = _Api()
            except ImportError:
                _api = None  # the extra is not installed: tracing off, quietly
            except Exception as exc:  # an installation that imports but is broken: off, said once
                log.warning("OpenTelemetry tracing is off: opentelemetry failed to load: %s: %s",
                            type(exc).__name__, exc)
                _api = None
            # set once _api is: a thread that sees _tried sees the API too
            _tried = True
    return _api


def _active() -> _Api | None:
    """The API when spans are to be made: installed, and a real tracer provider set (it and
    its tracer then in ``api.current``)."""
    api = _api if _tried else _load()
    if api is None:
        return None
    provider = api.trace.get_tracer_provider()
    if isinstance(provider, api.inactive):
        return None
    if api.current[0] is not provider:
        # A tracer made once per provider: making one costs more than a span.  One tuple, so a
        # thread never pairs a provider with another's tracer.
        try:
            api.current = (provider, provider.get_tracer("ftpbc"))
        except Exception:  # a provider that cannot make a tracer: no span
            return None
    return api


def enabled() -> bool:
    """Whether ftpbc makes spans now: the extra is installed and a tracer provider is set."""
    return _active() is not None


class Traced:
    """An open span of ftpbc's (or, when tracing is off, the one that does nothing:
    :data:`NOOP`, its own context manager): what the code around a send or a handler call
    tells it."""

    def __init__(self, api: _Api | None = None, span: Any = None) -> None:
        self._api = api
        self._span = span

    def __bool__(self) -> bool:
        return self._span is not None

    def __enter__(self) -> Traced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def properties(self) -> dict[str, str]:
        """The ``traceparent`` (and ``tracestate``) naming this span as a message's parent;
        empty when tracing is off or the span is not sampled in a way that can be carried."""
        if self._api is None or self._span is None:
            return {}
        carrier: dict[str, str] = {}
        ctx = self._api.trace.set_span_in_context(self._span)
        self._api.propagator.inject(carrier, context=ctx)
        return {k: v for k, v in carrier.items() if k in TRACE_PROPERTIES}

    def message(self, message_id: str | None = None, body_size: int | None = None,
                conversation_id: str | None = None) -> None:
        """Record the message's id, body size and correlation id (what is known)."""
        span = self._span
        if span is None:
            return
        if message_id is not None:
            span.set_attribute("messaging.message.id", message_id)
        if body_size is not None:
            span.set_attribute("messaging.message.body.size", body_size)
        if conversation_id is not None:
            span.set_attribute("messaging.message.conversation_id", conversation_id)

    def failed(self, description: str) -> None:
        """Mark the span failed (an error reply, a handler's error) without an exception."""
        if self._span is not None and self._api is not None:
            self._span.set_status(self._api.status(self._api.error, description[:200]))

    def received(self, destination: str, started_ns: int, *, message_id: str | None = None,
                 body_size: int | None = None, error: str | None = None,
                 client_id: str | None = None) -> None:
        """A ``receive`` span (CONSUMER) for the reply to the message this span sent, from
        ``started_ns`` (``time.time_ns()`` when the wait began) to now: a child of the span
        current at the call (the caller's own), else of this (the request's) span, so it stays
        in the request's trace; linked to this span in either case."""
        api, span = self._api, self._span
        if api is None or span is None:
            return
        try:
            tracer = api.current[1]
            caller = api.trace.get_current_span().get_span_context().is_valid
            parent = None if caller else api.trace.set_span_in_context(span)
            reply = tracer.start_span(f"receive {destination}", context=parent, kind=api.kind.CONSUMER,
                                      start_time=started_ns,
                                      links=[api.link(span.get_span_context())],
                                      attributes=_attributes(destination, "receive", "receive", client_id))
            if message_id is not None:
                reply.set_attribute("messaging.message.id", message_id)
                reply.set_attribute("messaging.message.conversation_id", message_id)
            if body_size is not None:
                reply.set_attribute("messaging.message.body.size", body_size)
            if error is not None:
                reply.set_status(api.status(api.error, error[:200]))
            reply.end()
        except Exception:  # tracing never fails a request
            return


NOOP = Traced()


def _attributes(destination: str, operation_type: str, operation_name: str,
                client_id: str | None) -> dict[str, str]:
    attrs = {"messaging.system": SYSTEM, "messaging.destination.name": destination,
             "messaging.operation.type": operation_type, "messaging.operation.name": operation_name}
    if client_id is not None:
        attrs["messaging.client.id"] = client_id
    return attrs


@contextmanager
def _span(api: _Api, name: str, kind: Any, attributes: dict[str, str], parent: Any) -> Iterator[Traced]:
    try:
        span = api.current[1].start_span(name, context=parent, kind=kind, attributes=attributes)
        # Current while the block runs: a handler's own spans are children of it, and a route's
        # properties name it (current_properties).
        token = api.context.attach(api.trace.set_span_in_context(span))
    except Exception:  # a tracer that fails: the message goes on without its span
        yield NOOP
        return
    try:
        yield Traced(api, span)
    except BaseException as exc:
        _quietly(span.record_exception, exc)
        _quietly(span.set_status, api.status(api.error, f"{type(exc).__name__}: {exc}"[:200]))
        raise
    finally:
        _quietly(api.context.detach, token)
        _quietly(span.end)


def _quietly(call: Callable[..., object], *args: object) -> None:
    """``call(*args)``, whatever it raises dropped: tracing never fails what it observes."""
    try:
        call(*args)
    except Exception:
        return


def producing(operation: str, destination: str, *,
              client_id: str | None = None) -> AbstractContextManager[Traced]:
    """``with producing("send", "quote") as span:`` a PRODUCER span ``<operation>
    <destination>`` (``messaging.operation.type`` ``send``), a child of the current span; its
    :meth:`Traced.properties` go into the message sent.  :data:`NOOP` when tracing is off."""
    api = _active()
    if api is None:
        return NOOP
    return _span(api, f"{operation} {destination}", api.kind.PRODUCER,
                 _attributes(destination, "send", operation, client_id), None)


def consuming(operation: str, destination: str, properties: Mapping[str, object], *,
              client_id: str | None = None) -> AbstractContextManager[Traced]:
    """``with consuming("process", "quote", envelope.properties) as span:`` a CONSUMER span
    ``<operation> <destination>`` (``messaging.operation.type`` ``process``), a child of the
    context the message's properties carry (a root span when they carry none, or one that
    cannot be read).  :data:`NOOP` when tracing is off."""
    api = _active()
    if api is None:
        return NOOP
    return _span(api, f"{operation} {destination}", api.kind.CONSUMER,
                 _attributes(destination, "process", operation, client_id), _extract(api, properties))


def received(destination: str, started_ns: int, properties: Mapping[str, object], *,
             message_id: str | None = None, body_size: int | None = None,
             client_id: str | None = None) -> None:
    """A pull consumer's ``receive`` span (CONSUMER) for one message, from ``started_ns``
    (``time.time_ns()`` when the wait began) to now: a child of the current span, linked to the
    sender's (the context the message's properties carry, when they carry one).  Nothing when
    tracing is off."""
    api = _active()
    if api is None:
        return
    try:
        carried = _extract(api, properties)
        links = [api.link(api.trace.get_current_span(carried).get_span_context())] if carried else []
        span = api.current[1].start_span(f"receive {destination}", kind=api.kind.CONSUMER,
                                         start_time=started_ns, links=links,
                                         attributes=_attributes(destination, "receive", "receive", client_id))
        Traced(api, span).message(message_id, body_size)
        span.end()
    except Exception:  # tracing never fails a delivery
        return


def current_properties() -> dict[str, str]:
    """The trace properties naming the current span (a route's, while it delivers) as the
    parent of a message made now; empty when tracing is off or no span is current."""
    api = _active()
    if api is None:
        return {}
    span = api.trace.get_current_span()
    if not span.get_span_context().is_valid:
        return {}
    return Traced(api, span).properties()


def with_trace_properties(traced: Traced, properties: Mapping[str, Any] | None,
                          make: Callable[[Mapping[str, Any] | None], T],
                          too_long: type[Exception]) -> T:
    """``make(properties)`` with ``traced``'s trace properties added: without ``tracestate``
    when the name has no room for it (``too_long`` raised), then without both.  The
    application's own ``traceparent`` or ``tracestate`` properties, if any, win: nothing added."""
    extra = traced.properties()
    if not extra or (properties and any(k in properties for k in TRACE_PROPERTIES)):
        return make(properties)
    base = dict(properties or {})
    tries = [extra] if TRACESTATE not in extra else [extra, {TRACEPARENT: extra[TRACEPARENT]}]
    for attempt in tries:
        try:
            return make({**base, **attempt})
        except too_long:
            continue
    return make(properties)


def _extract(api: _Api, properties: Mapping[str, object]) -> Any:
    """The context a message's properties carry, or None; hostile values are ignored."""
    parent = properties.get(TRACEPARENT)
    if not isinstance(parent, str) or not parent or len(parent) > MAX_TRACEPARENT:
        return None
    carrier = {TRACEPARENT: parent}
    state = properties.get(TRACESTATE)
    if isinstance(state, str) and state and len(state) <= MAX_TRACESTATE:
        carrier[TRACESTATE] = state
    try:
        ctx = api.propagator.extract(carrier)
    except Exception:  # a value the propagator chokes on: a root span
        return None
    return ctx if api.trace.get_current_span(ctx).get_span_context().is_valid else None


