"""A node's /metrics, /healthz and /readyz, scraped over HTTP from a real node on a real server."""

from __future__ import annotations

import errno
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ftpbc.client import Client
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.message import Message
from ftpbc.node.health import MetricsServer, serve_metrics
from ftpbc.node.serve import Node
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until


def _handler(message: Message) -> bytes:
    if message.body.startswith(b"fail"):
        raise ValueError("asked to fail")
    return b"re:" + message.body


def _config(handle: ServerHandle, tmp_path: Path, node_id: str) -> Any:
    marker = tmp_path / "area"
    if not marker.exists():
        marker.write_text(handle.fresh_dir())
    cfg = in_process_config(handle, tmp_path, node_id, {"ep": {"repository": f"{marker.read_text()}/ep",
                                                              "poll_interval": 0.02, "timeout": 20}})
    return cfg.model_copy(update={"node": cfg.node.model_copy(update={"heartbeat_interval": 0.2,
                                                                      "lease": 10.0})})


@pytest.fixture
def node_with_metrics(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Iterator[tuple[Node, MetricsServer]]:
    node = Node(_config(pyftpdlib_server, tmp_path, "prov"), handlers={"ep": _handler})
    node.start()
    server = serve_metrics(node, "127.0.0.1", 0)
    try:
        yield node, server
    finally:
        server.close()
        node.stop(drain_timeout=2)


def _get(url: str) -> tuple[int, str]:
    """``(status, body)``; ``(0, why)`` when nothing listens there (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError as exc:
        return 0, str(exc.reason)


def _scrape(server: MetricsServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text = _get(server.url + "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def test_metrics_count_what_was_served(node_with_metrics: tuple[Node, MetricsServer],
                                       pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    _, server = node_with_metrics
    bodies = [f"body {i}".encode() for i in range(12)] + [b"fail 1", b"fail 2"]
    with Client(_config(pyftpdlib_server, tmp_path, "cli")) as client:
        for body in bodies:
            if body.startswith(b"fail"):
                with pytest.raises(RemoteHandlerError):
                    client.request("ep", body)
            else:
                assert client.request("ep", body) == b"re:" + body
    ep = {"endpoint": "ep", "node": "prov"}
    # the failed requests' replies went out before the node counted them: wait for the counters
    wait_until(lambda: _value(_scrape(server), "ftpbc_messages_failed_total", **ep) == 2,
               what="the failed count")
    # the latency is observed just after the failed count moves
    wait_until(lambda: _value(_scrape(server), "ftpbc_message_latency_seconds_count", **ep) == 14,
               what="the latency count")
    samples = _scrape(server)
    assert _value(samples, "ftpbc_messages_served_total", **ep) == 12
    assert _value(samples, "ftpbc_messages_received_total", **ep) == 14
    assert _value(samples, "ftpbc_received_bytes_total", **ep) == sum(len(b) for b in bodies)
    assert _value(samples, "ftpbc_sent_bytes_total", **ep) == sum(len(b) + 3 for b in bodies[:12])
    assert _value(samples, "ftpbc_handler_seconds_count", **ep) == 14
    assert _value(samples, "ftpbc_message_latency_seconds_count", **ep) == 14
    assert _value(samples, "ftpbc_message_latency_seconds_bucket", **ep, le="+Inf") == 14
    assert _value(samples, "ftpbc_polls_total", **ep) > 0
    assert 0 < _value(samples, "ftpbc_listings_total", **ep) <= _value(samples, "ftpbc_polls_total", **ep)
    assert _value(samples, "ftpbc_poll_lock_busy_total", **ep) == 0  # one node: nobody else holds it
    assert _value(samples, "ftpbc_claims_lost_total", **ep) == 0
    assert _value(samples, "ftpbc_claim_races_lost_total", **ep) == 0
    assert _value(samples, "ftpbc_in_flight_messages", **ep) == 0
    assert _value(samples, "ftpbc_inbox_messages", **ep) == 0
    assert _value(samples, "ftpbc_journal_pending_operations", **ep) == 0
    assert 0 <= _value(samples, "ftpbc_last_poll_age_seconds", **ep) < 5
    assert 0 <= _value(samples, "ftpbc_heartbeat_age_seconds", node="prov") < 5
    assert _value(samples, "ftpbc_loop_idle_seconds", loop="poller ep", node="prov") < 5
    assert _value(samples, "ftpbc_ready", node="prov") == 1
    assert _get(server.url + "/healthz") == (200, "ok\n")
    assert _get(server.url + "/nothing")[0] == 404


def test_metrics_see_a_backlog(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """Messages waiting that this node does not take (its workers are busy) are its inbox depth."""
    import threading

    release = threading.Event()

    def slow(message: Message) -> bytes:
        release.wait(20)
        return b"ok"

    cfg = _config(pyftpdlib_server, tmp_path, "busy")
    cfg = cfg.model_copy(update={"endpoints": {"ep": cfg.endpoints["ep"].model_copy(update={"workers": 1})}})
    node = Node(cfg, handlers={"ep": slow})
    node.start()
    server = serve_metrics(node)
    # The poller waits until all four are in the box: a busy node lists no more, so a first
    # listing that saw only m0 (a busy machine sends slowly) would stay its last.
    sent = threading.Event()
    real_attempt = node.providers["ep"].poll_lock.attempt

    def gated(wait: float = 0.0) -> Any:
        sent.wait(20)
        return real_attempt(wait)

    node.providers["ep"].poll_lock.attempt = gated  # type: ignore[method-assign]
    try:
        with Client(_config(pyftpdlib_server, tmp_path, "cli")) as client:
            for i in range(4):
                client.send("ep", f"m{i}".encode())
            sent.set()
            ep = {"endpoint": "ep", "node": "busy"}
            wait_until(lambda: _value(_scrape(server), "ftpbc_in_flight_messages", **ep) == 1,
                       what="one message in flight")
            samples = _scrape(server)
            assert _value(samples, "ftpbc_inbox_messages", **ep) >= 3
            assert _value(samples, "ftpbc_inbox_oldest_message_age_seconds", **ep) >= 0
            assert _value(samples, "ftpbc_journal_pending_operations", **ep) >= 1
            release.set()
            wait_until(lambda: _value(_scrape(server), "ftpbc_messages_served_total", **ep) == 4,
                       timeout=30, what="all four served")
    finally:
        sent.set()
        release.set()
        server.close()
        node.stop(drain_timeout=2)


def test_readyz_turns_503_while_a_poller_is_stuck_and_200_after(
        node_with_metrics: tuple[Node, MetricsServer], monkeypatch: pytest.MonkeyPatch) -> None:
    node, server = node_with_metrics
    wait_until(lambda: _get(server.url + "/readyz")[0] == 200, what="ready")
    broken = {"on": True}
    real = node.providers["ep"].poll_lock.attempt

    def attempt(wait: float = 0.0) -> Any:
        if broken["on"]:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return real(wait)

    monkeypatch.setattr(node.providers["ep"].poll_lock, "attempt", attempt)  # this node's lock only
    _, body = wait_until(lambda: (r := _get(server.url + "/readyz"))[0] == 503 and r,
                              timeout=20, what="/readyz to say 503")
    assert "poller ep made no progress" in body
    assert _get(server.url + "/healthz")[0] == 200  # alive all the same
    assert _value(_scrape(server), "ftpbc_ready", node="prov") == 0
    broken["on"] = False
    wait_until(lambda: _get(server.url + "/readyz")[0] == 200, timeout=40, what="/readyz to say 200 again")


def test_two_nodes_in_one_process_have_registries_of_their_own(pyftpdlib_server: ServerHandle,
                                                                tmp_path: Path) -> None:
    nodes = [Node(_config(pyftpdlib_server, tmp_path, f"n{i}"), handlers={"ep": _handler}) for i in range(2)]
    servers: list[MetricsServer] = []
    try:
        for node in nodes:
            node.start()
            servers.append(serve_metrics(node))
        for i, server in enumerate(servers):
            samples = _scrape(server)
            assert ("ftpbc_messages_served_total", frozenset({"endpoint": "ep", "node": f"n{i}"}.items())) \
                in samples
            assert not any(dict(labels).get("node") == f"n{1 - i}" for _, labels in samples)
    finally:
        for server in servers:
            server.close()
        for node in nodes:
            node.stop(drain_timeout=2)


def test_node_metrics_configuration(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    from pydantic import ValidationError

    from ftpbc.config.models import NodeConfig
    from ftpbc.node.health import serve_configured_metrics

    assert NodeConfig().metrics is None
    assert NodeConfig.model_validate({"metrics": {"port": 9464}}).metrics.port == 9464  # type: ignore[union-attr]
    for bad in ({"port": 70000}, {"port": 1, "bind": "x"}, {}):
        with pytest.raises(ValidationError):
            NodeConfig.model_validate({"metrics": bad})
    cfg = _config(pyftpdlib_server, tmp_path, "conf")
    cfg = cfg.model_copy(update={"node": cfg.node.model_copy(update={
        "metrics": NodeConfig.model_validate({"metrics": {"port": 0, "host": "127.0.0.1"}}).metrics})})
    node = Node(cfg, handlers={"ep": _handler})
    plain = Node(_config(pyftpdlib_server, tmp_path, "none"), {"ep": _handler})
    try:
        assert serve_configured_metrics(plain) is None
    finally:
        plain.stop()
    server = serve_configured_metrics(node)
    assert server is not None
    try:
        assert _get(server.url + "/healthz")[0] == 200
        assert _get(server.url + "/readyz")[0] == 503  # not started yet
        node.start()
        wait_until(lambda: _get(server.url + "/readyz")[0] == 200, what="ready once started")
    finally:
        server.close()
        node.stop(drain_timeout=2)


def test_ftpbc_serve_metrics_port_and_json_logs(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """The real command: ``ftpbc serve --metrics-port N --log-format json``."""
    import json
    import signal
    import subprocess

    from tests.chaos import ENDPOINT, FTPBC, REPO, load_client_config, make_cluster
    from tests.support import free_port

    handle = pyftpdlib_server
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                           repository=handle.fresh_dir(), server_root=handle.root, drain_timeout=1.0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([*FTPBC, "serve", "-c", str(cluster.config), "--node-id", "m",
                                 "--metrics-port", str(port), "--log-format", "json", "--log-level", "info"],
                                cwd=REPO, env=cluster.env("m"), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)
    try:
        wait_until(lambda: _get(url + "/readyz")[0] == 200 or proc.poll() is not None, timeout=30,
                   what="the node ready")
        assert proc.poll() is None, log.read_text()
        with Client(load_client_config(cluster, "c0")) as client:
            for i in range(3):
                assert client.request(ENDPOINT, f"x{i}".encode()) == f"re:x{i}".encode()
        labels = {"endpoint": ENDPOINT, "node": "m"}

        def served() -> float:
            status, text = _get(url + "/metrics")
            assert status == 200
            samples = {(s.name, frozenset(s.labels.items())): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples}
            return _value(samples, "ftpbc_messages_served_total", **labels)

        wait_until(lambda: served() == 3, what="three served in /metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(r["message"].startswith("metrics on http://127.0.0.1:") for r in records)
    assert all(r["node"] == "m" for r in records)


def exposed_metric_names() -> set[str]:
    """Every sample name a node's /metrics can carry (counters' ``_total``, histograms' parts)."""
    from prometheus_client import CollectorRegistry

    from ftpbc.cluster.liveness import Liveness
    from ftpbc.config.models import Config
    from ftpbc.metrics import NodeMetrics
    from ftpbc.node.health import NodeCollector

    class Runtime:
        liveness = Liveness()
        heartbeat = None

    class Stub:
        config = Config.model_validate({"servers": {"s": {"url": "file:///nonexistent"}}})
        providers: dict[str, Any] = {}
        node_id = "n"
        runtime = Runtime()

    registry = CollectorRegistry(auto_describe=False)
    NodeMetrics(registry, "n")
    registry.register(NodeCollector(Stub()))  # type: ignore[arg-type]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {f.name + suffix for f in registry.collect() for suffix in suffixes[f.type]}


def test_docs_name_every_metric() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operating.md").read_text(encoding="utf-8")
    names = exposed_metric_names()
    assert len(names) > 20
    for name in names:
        base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        assert f"`{base}`" in docs, f"docs/operating.md does not list {base}"


# ---------------------------------------------------------------------------- what the brief added


def _samples_at(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text = _get(url + "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of ``name`` over every label set containing ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def test_client_metrics_count_requests_and_their_outcomes(node_with_metrics: tuple[Node, MetricsServer],
                                                          pyftpdlib_server: ServerHandle,
                                                          tmp_path: Path) -> None:
    """``Client(..., metrics=True, metrics_port=0)``: sent, received, error and expiry replies,
    timeouts, round trips and callers in flight, in a registry of the client's own."""
    import threading

    from ftpbc.errors import RequestExpired, RequestTimeout

    node, _ = node_with_metrics
    release = threading.Event()
    real = node.providers["ep"].handler

    def handler(message: Message) -> object:
        if message.body.startswith(b"hold"):
            release.wait(20)  # until the test has seen the caller in flight (or timed out)
        return real(message)

    node.providers["ep"].handler = handler
    with Client(_config(pyftpdlib_server, tmp_path, "plain")) as plain:
        assert plain.metrics_registry is None and plain.metrics_url is None
    client = Client(_config(pyftpdlib_server, tmp_path, "cli"), metrics_port=0)
    try:
        assert client.metrics_registry is not None and client.metrics_url is not None
        ep = {"endpoint": "ep", "node": "cli"}
        for i in range(4):
            assert client.request("ep", f"ok {i}".encode()) == f"re:ok {i}".encode()
        for i in range(2):
            with pytest.raises(RemoteHandlerError):
                client.request("ep", f"fail {i}".encode())
        with pytest.raises(RequestExpired):
            client.request("ep", b"too late", ttl=0.001)  # expired long before any node lists it
        with pytest.raises(RequestTimeout):
            client.request("ep", b"hold 1", timeout=0.2)
        answers: list[bytes] = []
        waiter = threading.Thread(target=lambda: answers.append(client.request("ep", b"hold 2")))
        waiter.start()
        try:
            wait_until(lambda: _total(_samples_at(str(client.metrics_url)), "ftpbc_client_requests_in_flight",
                                      **ep) == 1, what="one caller waiting")
        finally:
            release.set()
            waiter.join(timeout=30)
        assert answers == [b"re:hold 2"]
        samples = _samples_at(str(client.metrics_url))
        assert _total(samples, "ftpbc_client_requests_sent_total", **ep) == 9
        assert _total(samples, "ftpbc_client_responses_received_total", **ep) == 8
        assert _total(samples, "ftpbc_client_error_responses_total", **ep) == 2
        assert _total(samples, "ftpbc_client_requests_expired_total", **ep) == 1
        assert _total(samples, "ftpbc_client_requests_timed_out_total", **ep) == 1
        assert _total(samples, "ftpbc_client_request_seconds_count", **ep) == 8
        assert _total(samples, "ftpbc_client_requests_in_flight", **ep) == 0
        assert not any(n.startswith("ftpbc_messages") for n, _ in samples)  # the node's are not here
        # the same figures straight from the registry, for a process that serves them itself
        from prometheus_client import generate_latest

        assert b"ftpbc_client_requests_sent_total" in generate_latest(client.metrics_registry)
        url = str(client.metrics_url)
    finally:
        release.set()
        client.close()
    assert _get(url + "/metrics")[0] == 0  # close() stopped the server


def _dead_letter_config(handle: ServerHandle, tmp_path: Path, node_id: str) -> Any:
    cfg = _config(handle, tmp_path, node_id)
    ep = cfg.endpoints["ep"].model_copy(update={"max_deliveries": 1, "dead_letter": True,
                                                "expired": "dead_letter"})
    return cfg.model_copy(update={"endpoints": {"ep": ep}})


def test_dead_letters_are_counted(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways into indead: a last delivery that cannot be read (dead_letter: true), and an
    expired message (expired: dead_letter)."""
    from ftpbc.errors import PermissionDenied

    node = Node(_dead_letter_config(pyftpdlib_server, tmp_path, "dl"), handlers={"ep": _handler})
    node.start()
    server = serve_metrics(node)
    try:
        lifecycle = node.providers["ep"].lifecycle

        def unreadable(claimed: Any, sink: Any) -> int:
            raise PermissionDenied("refused by the test", path=claimed.path)

        monkeypatch.setattr(lifecycle, "read", unreadable)  # this node's lifecycle only
        with Client(_dead_letter_config(pyftpdlib_server, tmp_path, "cli")) as client:
            client.send("ep", b"poison 1")
            client.send("ep", b"poison 2")
            client.send("ep", b"stale", ttl=0.001)
            ep = {"endpoint": "ep", "node": "dl"}
            wait_until(lambda: _value(_scrape(server), "ftpbc_messages_dead_lettered_total", **ep) == 3,
                       what="three dead letters counted")
            assert len(client.dead_letters("ep").listing()) == 3
        samples = _scrape(server)
        assert _value(samples, "ftpbc_messages_expired_total", **ep) == 1
        assert _value(samples, "ftpbc_messages_failed_total", **ep) == 0
    finally:
        server.close()
        node.stop(drain_timeout=2)


def test_latency_is_measured_from_the_send_stamp(node_with_metrics: tuple[Node, MetricsServer],
                                                 pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """A name carrying ``s=`` (headers.timestamp) an hour old: the end-to-end latency is an hour,
    though the file itself was written a moment ago."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from ftpbc.exchange.layout import AreaLayout
    from ftpbc.exchange.lifecycle import op_id_for
    from ftpbc.model.envelope import Headers

    _, server = node_with_metrics
    with Client(_config(pyftpdlib_server, tmp_path, "cli")) as client:
        lc = client.runtime.lifecycle("ep")
        layout = lc.layout
        assert isinstance(layout, AreaLayout)
        uid = str(uuid.uuid4())
        stamp = datetime.now(UTC) - timedelta(hours=1)
        name = layout.name_for(Headers(id=uid, kind="oneway", timestamp=stamp), {}, "msg." + uid)
        assert ";s=" in name
        lc.send(layout.outbound(name, client.runtime.node_id, lc.clock()), b"stamped",
                op_id=op_id_for(uid, "send"), kind="oneway")
        ep = {"endpoint": "ep", "node": "prov"}
        wait_until(lambda: _value(_scrape(server), "ftpbc_message_latency_seconds_count", **ep) == 1,
                   what="the stamped message served")
        # mtime would say a few milliseconds; the stamp says an hour (less clock noise)
        assert 3590 < _value(_scrape(server), "ftpbc_message_latency_seconds_sum", **ep) < 3700


def test_a_cluster_of_three_nodes_counts_what_a_client_sent(pyftpdlib_server: ServerHandle,
                                                           tmp_path: Path) -> None:
    """The issue's done-when: /metrics of every node of a running cluster, scraped while it
    serves, adds up to what was sent; the client's own metrics agree."""
    from concurrent.futures import ThreadPoolExecutor

    total, failing = 30, 6
    nodes = [Node(_config(pyftpdlib_server, tmp_path, f"n{i}"), handlers={"ep": _handler}) for i in range(3)]
    servers: list[MetricsServer] = []
    try:
        for node in nodes:
            node.start()
            servers.append(serve_metrics(node))
        bodies = [f"fail {i}".encode() if i % (total // failing) == 0 else f"body {i}".encode()
                  for i in range(total)]
        assert sum(b.startswith(b"fail") for b in bodies) == failing
        with Client(_config(pyftpdlib_server, tmp_path, "cli"), metrics=True) as client:
            def ask(body: bytes) -> str:
                try:
                    return "ok" if client.request("ep", body) == b"re:" + body else "wrong"
                except RemoteHandlerError:
                    return "failed"

            with ThreadPoolExecutor(6) as pool:  # concurrent callers: every node gets work
                outcomes = list(pool.map(ask, bodies))
            assert outcomes.count("ok") == total - failing and outcomes.count("failed") == failing
            assert client.metrics_registry is not None
            got = {(s.name, frozenset(s.labels.items())): s.value
                   for f in client.metrics_registry.collect() for s in f.samples}
            assert _total(got, "ftpbc_client_requests_sent_total", endpoint="ep") == total
            assert _total(got, "ftpbc_client_responses_received_total", endpoint="ep") == total
            assert _total(got, "ftpbc_client_error_responses_total", endpoint="ep") == failing

        def across(name: str) -> float:
            return sum(_total(_samples_at(s.url), name, endpoint="ep") for s in servers)

        # a failed request's reply is out before its node counts it: wait for the last counts
        wait_until(lambda: across("ftpbc_messages_served_total") + across("ftpbc_messages_failed_total")
                   == total, what="every request counted by some node")
        assert across("ftpbc_messages_failed_total") == failing
        assert across("ftpbc_messages_served_total") == total - failing
        assert across("ftpbc_messages_received_total") == total
        assert across("ftpbc_message_latency_seconds_count") == total
        assert across("ftpbc_received_bytes_total") == sum(len(b) for b in bodies)
        for server, node in zip(servers, nodes, strict=True):  # each node reports only itself
            assert all(dict(ls).get("node") in (None, node.node_id) for _, ls in _samples_at(server.url))
    finally:
        for server in servers:
            server.close()
        for node in nodes:
            node.stop(drain_timeout=2)


def client_metric_names() -> set[str]:
    """Every sample name a client's registry can carry."""
    from ftpbc.metrics import ClientMetrics

    metrics = ClientMetrics("c")
    metrics.sent("ep")
    metrics.answered("ep", "ok", 0.1)  # labelled children exist only once used
    metrics.timed_out("ep")
    with metrics.waiting("ep"):
        pass
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {f.name + suffix for f in metrics.registry.collect() for suffix in suffixes[f.type]}


def test_docs_name_every_client_metric() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operating.md").read_text(encoding="utf-8")
    names = client_metric_names()
    assert len(names) >= 9
    for name in names:
        base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        assert f"`{base}`" in docs, f"docs/operating.md does not list {base}"
