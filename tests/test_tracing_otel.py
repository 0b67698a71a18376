"""OpenTelemetry tracing (ftpbc.tracing, docs/tracing-otel.md): spans per the messaging
conventions, and the W3C trace context carried from a sender to the handler in the message's
``traceparent`` and ``tracestate`` properties.

The request test crosses two processes: a client here, with the SDK's in-memory exporter, and a
real ``ftpbc serve`` node whose handler module (tests/otel_handlers.py) sets an SDK tracer
provider exporting its spans to a JSON-lines file.  Routing and fan-out run on in-process nodes.
All of it sits above the transport (spans and properties, not FTP commands), so one server,
pyftpdlib, is enough.  Without the extra, ``import ftpbc`` and a served request never import
opentelemetry: checked in a subprocess where a meta-path finder refuses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from ftpbc import tracing
from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.envelope import Headers, codec_for
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import (
    REPO_ROOT,
    SERVER,
    ServeCluster,
    Started,
    in_process_config,
    node_section,
    write_config,
)
from tests.otel_spans import SPANS_ENV, span_record
from tests.servers.handle import ServerHandle
from tests.support import wait_until

FAST = {"poll_interval": 0.02, "timeout": 30}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A global SDK tracer provider exporting to memory, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # opentelemetry sets its global provider once per process; the tests that run after this
        # one in the same process must find none (tracing off, names without trace properties)
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


def record(span: ReadableSpan) -> dict[str, Any]:
    return span_record(span)


def only(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [r for r in records if r["name"] == name]
    assert len(found) == 1, (name, [r["name"] for r in records])
    return found[0]


def messaging(record: dict[str, Any], destination: str, operation_type: str, operation: str) -> None:
    """The messaging attributes every ftpbc span has."""
    attrs = record["attributes"]
    assert attrs["messaging.system"] == "ftpbc"
    assert attrs["messaging.destination.name"] == destination
    assert attrs["messaging.operation.type"] == operation_type
    assert attrs["messaging.operation.name"] == operation


# --------------------------------------------------------------------------- the properties


@pytest.mark.parametrize("naming", ["ftpbc", "dropboxmq"])
def test_trace_properties_survive_both_name_grammars(naming: str) -> None:
    codec = codec_for(naming)
    headers = Headers(id="4d4f6177-f085-456b-94d1-1ed22baae814", kind="oneway")
    props = {tracing.TRACEPARENT: TRACEPARENT, tracing.TRACESTATE: TRACESTATE}
    name = codec.encode(f"msg.{headers.id}", headers, props)
    assert "/" not in name and "~" not in name
    env = codec.decode(name, direction="in")
    assert env is not None and dict(env.properties) == props


def test_a_send_without_room_for_the_trace_context_goes_without_it(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    base = pyftpdlib_server.fresh_dir()
    config = in_process_config(pyftpdlib_server, tmp_path, "n1", {"q": {"repository": f"{base}/q", **FAST}})
    roomy = {"note": "x" * 60}
    tight = {"note": "x" * 150}  # fits alone, not with a traceparent beside it
    caller = trace.get_tracer("test").start_as_current_span("caller")
    with Client(config.with_node_id("n1.client0")) as client, caller:
        client.send("q", b"a", properties=roomy)
        client.send("q", b"b", properties=tight)
        client.send("q", b"c", properties={"traceparent": "mine"})  # the application's own wins
    names = sorted(p.name for p in pyftpdlib_server.local(f"{base}/q/inbox").iterdir())
    props = [dict(env.properties) for env in (codec_for("ftpbc").decode(n, direction="in") for n in names)
             if env is not None]
    by_note = {len(str(p.get("note", ""))): p for p in props}
    sends = [record(s) for s in spans.get_finished_spans() if s.name == "send q"]
    assert len(sends) == 3 and all(r["kind"] == "PRODUCER" for r in sends)
    traced = by_note[60]["traceparent"]
    assert isinstance(traced, str) and traced.split("-")[2] in {r["span_id"] for r in sends}
    assert "traceparent" not in by_note[150]
    assert by_note[0]["traceparent"] == "mine"


def test_installed_without_a_tracer_provider_nothing_is_added(pyftpdlib_server: ServerHandle,
                                                              tmp_path: Path) -> None:
    base = pyftpdlib_server.fresh_dir()
    config = in_process_config(pyftpdlib_server, tmp_path, "n1", {"q": {"repository": f"{base}/q", **FAST}})
    assert not tracing.enabled()
    with Client(config.with_node_id("n1.client0")) as client, \
            trace.get_tracer("test").start_as_current_span("caller"):  # the API's no-op: no context
        sent = client.send("q", b"a")
    # the plain name: no trace properties, nothing else either
    name = sent.rsplit("/", 1)[-1]
    assert name.startswith("msg.") and ";" not in name
    assert [p.name for p in pyftpdlib_server.local(f"{base}/q/inbox").iterdir()] == [name]


# --------------------------------------------------------------------------- across two processes


def test_a_request_is_one_trace_from_caller_through_a_serving_node_and_back(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    base = pyftpdlib_server.fresh_dir()
    echo = {"repository": f"{base}/echo", "handler": "otel_handlers:echo", **FAST}
    config_path = write_config(tmp_path / "ftpbc.yaml", pyftpdlib_server, tmp_path, {"echo": echo})
    document = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    document["node"]["handler_path"] = [str(REPO_ROOT / "tests")]
    config_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    node_spans = tmp_path / "node-spans.jsonl"
    config = Config.model_validate({**document, "node": {**document["node"], "id": "caller"}})
    with ServeCluster(config_path, tmp_path, env={SPANS_ENV: str(node_spans)}) as cluster, \
            Client.with_identity(config) as client:
        cluster.start(["server-a"], ready_timeout=60)
        with trace.get_tracer("test").start_as_current_span("caller") as caller:
            assert client.request("echo", b"hello", timeout=60) == b"traced:hello"
        caller_ctx = caller.get_span_context()

        def node_records() -> list[dict[str, Any]] | None:
            if not node_spans.exists():
                return None
            found = [json.loads(line) for line in node_spans.read_text(encoding="utf-8").splitlines()]
            return found if {"process echo", "handler work"} <= {r["name"] for r in found} else None

        served = wait_until(node_records, timeout=30, what="the node's spans in its export file")
        assert cluster.stop() == {"server-a": 0}, cluster.logs()
    mine = [record(s) for s in spans.get_finished_spans()]
    trace_id = f"{caller_ctx.trace_id:032x}"
    send, receive = only(mine, "request echo"), only(mine, "receive echo")
    process, work = only(served, "process echo"), only(served, "handler work")

    # the caller's send: a PRODUCER child of the caller's span
    assert send["kind"] == "PRODUCER" and send["trace_id"] == trace_id
    assert send["parent_span_id"] == f"{caller_ctx.span_id:016x}"
    messaging(send, "echo", "send", "request")
    uid = send["attributes"]["messaging.message.id"]
    assert send["attributes"]["messaging.message.body.size"] == 5

    # the node's process span (another process): a CONSUMER child of that send
    assert process["kind"] == "CONSUMER"
    assert (process["trace_id"], process["parent_span_id"]) == (trace_id, send["span_id"])
    messaging(process, "echo", "process", "process")
    assert process["attributes"]["messaging.message.id"] == uid
    assert process["attributes"]["messaging.message.body.size"] == 5
    assert process["attributes"]["messaging.client.id"] == "server-a"
    assert process["status"] == "UNSET"
    # and the handler's own span a child of it
    assert (work["trace_id"], work["parent_span_id"]) == (trace_id, process["span_id"])

    # the reply's receive span: the caller's child, linked back to the request it answers
    assert receive["kind"] == "CONSUMER" and receive["trace_id"] == trace_id
    assert receive["parent_span_id"] == f"{caller_ctx.span_id:016x}"
    assert receive["links"] == [{"trace_id": trace_id, "span_id": send["span_id"]}]
    messaging(receive, "echo", "receive", "receive")
    assert receive["attributes"]["messaging.message.id"] == uid
    assert receive["attributes"]["messaging.message.body.size"] == len(b"traced:hello")


# --------------------------------------------------------------------------- in-process nodes


def test_a_failing_handler_marks_its_span_and_a_hostile_context_is_a_root(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    base = pyftpdlib_server.fresh_dir()
    config = in_process_config(pyftpdlib_server, tmp_path, "n1",
                               {"echo": {"repository": f"{base}/echo", **FAST}})

    def handler(message: Message) -> bytes:
        if message.body == b"fail":
            raise RuntimeError("refused")
        return message.body

    with Started() as started:
        started.add(Node(config, handlers={"echo": handler})).start()
        client = started.add(Client(config.with_node_id("n1.client0")))
        # a context no tracer could have made: served all the same, as a root span
        hostile = {"traceparent": "00-zz%/-x", "tracestate": "=,=" * 10}
        assert client.request("echo", b"ok", properties=hostile, timeout=30) == b"ok"
        with pytest.raises(RemoteHandlerError):
            client.request("echo", b"fail", timeout=30)
    processed = [record(s) for s in spans.get_finished_spans() if s.name == "process echo"]
    assert len(processed) == 2
    hostile = next(r for r in processed if r["status"] == "UNSET")
    failed = next(r for r in processed if r["status"] == "ERROR")
    assert hostile["parent_span_id"] is None
    failed_receive = [record(s) for s in spans.get_finished_spans() if s.name == "receive echo"][-1]
    request = [record(s) for s in spans.get_finished_spans() if s.name == "request echo"][-1]
    assert failed_receive["status"] == "ERROR"
    # no span of the caller's: the reply's receive span is the request's child, in its trace
    assert failed["trace_id"] == failed_receive["trace_id"] == request["trace_id"]
    assert failed["parent_span_id"] == failed_receive["parent_span_id"] == request["span_id"]


def test_routing_carries_the_context_through_the_route_to_the_destination(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    base = pyftpdlib_server.fresh_dir()
    config = Config.model_validate({
        "node": {**node_section(tmp_path, "n1")},
        "servers": {SERVER: pyftpdlib_server.config(name=SERVER)},
        "endpoints": {name: {"server": SERVER, "repository": f"{base}/{name}", **FAST}
                      for name in ("a", "b")},
        "routes": {"r": {"source": "a", "rulesets": [{"name": "all", "uri_template": ["endpoint:b"]}]}},
    })
    with Started() as started:
        started.add(Node(config)).start()
        client = started.add(Client(config.with_node_id("n1.client0")))
        with trace.get_tracer("test").start_as_current_span("caller"):
            client.send("a", b"routed")
        delivery = client.receive("b", timeout=30)
        assert delivery is not None and delivery.body == b"routed"
        carried = delivery.message.properties["traceparent"]
        delivery.ack()
    records = [record(s) for s in spans.get_finished_spans()]
    send, route = only(records, "send a"), only(records, "route a")
    assert route["kind"] == "CONSUMER"
    assert (route["trace_id"], route["parent_span_id"]) == (send["trace_id"], send["span_id"])
    messaging(route, "a", "process", "route")
    assert route["attributes"]["messaging.message.id"] == send["attributes"]["messaging.message.id"]
    # the routed message names the route's span as its parent
    assert isinstance(carried, str) and carried.split("-")[1:3] == [route["trace_id"], route["span_id"]]
    # and the pull consumer's receive span at the destination links to the route's
    receive = only(records, "receive b")
    assert receive["links"] == [{"trace_id": route["trace_id"], "span_id": route["span_id"]}]


def test_fan_out_carries_the_publishers_context_to_every_subscription(
        pyftpdlib_server: ServerHandle, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    base = pyftpdlib_server.fresh_dir()
    config = Config.model_validate({
        "node": {**node_section(tmp_path, "n1")},
        "servers": {SERVER: pyftpdlib_server.config(name=SERVER)},
        "topics": {"orders": {"server": SERVER, "repository": f"{base}/orders", "poll_interval": 0.02,
                              "subscriptions": {"audit": {}, "billing": {}}}},
    })
    with Started() as started:
        started.add(Node(config)).start()
        client = started.add(Client(config.with_node_id("n1.client0")))
        with trace.get_tracer("test").start_as_current_span("caller"):
            client.publish("orders", b"order 1")
        carried = {}
        for sub in ("audit", "billing"):
            delivery = client.receive(f"orders/{sub}", timeout=30)
            assert delivery is not None and delivery.body == b"order 1"
            carried[sub] = delivery.message.properties["traceparent"]
            delivery.ack()
    # the fan-out's span ends once its transaction is committed, a moment after the copies show
    wait_until(lambda: any(s.name == "fanout orders" for s in spans.get_finished_spans()),
               what="the fan-out's span")
    records = [record(s) for s in spans.get_finished_spans()]
    publish, fanout = only(records, "publish orders"), only(records, "fanout orders")
    assert publish["kind"] == "PRODUCER"
    messaging(publish, "orders", "send", "publish")
    assert fanout["kind"] == "CONSUMER"
    assert (fanout["trace_id"], fanout["parent_span_id"]) == (publish["trace_id"], publish["span_id"])
    messaging(fanout, "orders", "process", "fanout")
    # version, trace id, parent id (the flags are the publisher's sampler's)
    expected = ["00", publish["trace_id"], publish["span_id"]]
    assert {sub: str(value).split("-")[:3] for sub, value in carried.items()} == {
        "audit": expected, "billing": expected}
    # each subscriber's receive span links back to the publisher's span
    receives = {r["attributes"]["messaging.destination.name"]: r for r in records
                if r["name"].startswith("receive")}
    assert sorted(receives) == ["orders/audit", "orders/billing"]
    for sub, r in receives.items():
        assert r["kind"] == "CONSUMER" and r["parent_span_id"] is None, sub
        messaging(r, sub, "receive", "receive")
        assert r["links"] == [{"trace_id": publish["trace_id"], "span_id": publish["span_id"]}]
        assert r["attributes"]["messaging.message.body.size"] == len(b"order 1")


# --------------------------------------------------------------------------- without the extra

BLOCKED = textwrap.dedent('''
    import importlib.abc, pathlib, sys
    asked = []

    class Refuse(importlib.abc.MetaPathFinder):
        """opentelemetry is not installed, as far as this process can tell."""
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                asked.append(name)
                raise ImportError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Refuse())
    import ftpbc
    from ftpbc import tracing
    from ftpbc.client import Client
    from ftpbc.embedded import EmbeddedFTPServer
    from ftpbc.node.serve import Node
    from tests.support import embedded_config

    after_import = list(asked)
    tmp = pathlib.Path(sys.argv[1])
    (tmp / "root").mkdir()
    server = EmbeddedFTPServer(tmp / "root", password="pw").start()
    config = embedded_config(server.port, tmp, node={"id": "n1"})
    node = Node(config, handlers={"echo": lambda m: b"re:" + m.body})
    node.start()
    try:
        with Client(config.with_node_id("n1.client0")) as client:
            answers = [client.request("echo", body, timeout=30) for body in (b"one", b"two")]
            client.send("echo", b"three")
    finally:
        node.stop(drain_timeout=5)
        server.stop()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(repr((after_import, asked, loaded, answers, tracing.enabled())))
''')


def test_without_the_extra_nothing_imports_opentelemetry_and_requests_are_served(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKED, str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    after_import, asked, loaded, answers, enabled = eval(result.stdout.strip().splitlines()[-1])
    assert after_import == []  # import ftpbc asks for nothing
    assert asked == ["opentelemetry"]  # the first span that could be opened asks once, then never again
    assert loaded == []
    assert answers == [b"re:one", b"re:two"]
    assert enabled is False
