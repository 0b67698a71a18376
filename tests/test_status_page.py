"""The status page on a node's metrics port: loaded by a real browser (headless chromium) from a
running ``ftpbc serve``, its numbers checked against the node's /metrics; read-only, escaped,
and listing the exchange area no more than once per its bound age."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ftpbc.client import Client
from ftpbc.cluster.heartbeat import Serves
from ftpbc.model.message import Message
from ftpbc.node.health import serve_metrics
from ftpbc.node.serve import Node
from ftpbc.node.status import ClusterStatus, EndpointStatus, NodeStatus, SubscriptionStatus, TopicStatus
from ftpbc.node.status_page import MAX_AGE, Snapshot, render_html, status_document
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import IN_CI, free_port, wait_until

#: seconds chromium gets to load the page and write its output
BROWSER_TIMEOUT = 90.0


def _get(url: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)
    except urllib.error.URLError as exc:
        return 0, str(exc.reason).encode(), {}


def _metrics(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text, _ = _get(url + "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


class _Keys(HTMLParser):
    """The text of every element with a ``data-key`` attribute, and the element ``id="ready"``."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        key = a.get("data-key") or ("#" + str(a["id"]) if a.get("id") else None)
        if tag in ("meta", "link", "br", "img", "input"):
            return
        self._open.append(key)
        if key is not None:
            self.values[key] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("meta", "link", "br", "img", "input") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for key in self._open:
            if key is not None:
                self.values[key] += data


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    message = "chromium is not installed (apt-get install --no-install-recommends chromium)"
    if IN_CI:
        pytest.fail(f"CI=true but {message}")
    pytest.skip(message)


def _browser(chromium: str, profile: Path, *args: str) -> str:
    """Run headless chromium once; its stdout.  Its own process group, ended whatever happens."""
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BROWSER_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
    return out.decode()


def test_a_browser_shows_what_metrics_count(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                            report_figures: Any) -> None:
    """``ftpbc serve`` with messages served, one dead letter, messages waiting on an endpoint
    nobody serves and a topic's subscription backlog: headless chromium renders ``/``, writes a
    screenshot, and the numbers in its DOM are the node's /metrics (and what was sent)."""
    from tests.chaos import FTPBC, REPO, load_client_config, make_cluster

    chromium = _chromium()
    handle = pyftpdlib_server
    repo = handle.fresh_dir()
    cluster = make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                           repository=f"{repo}/echo", server_root=handle.root, drain_timeout=1.0,
                           heartbeat=0.5, lease=10.0)
    doc = yaml.safe_load(cluster.config.read_text())
    doc["endpoints"]["echo"].update({"dead_letter": True, "expired": "dead_letter"})
    doc["endpoints"]["parked"] = {"server": "s", "repository": f"{repo}/parked"}  # no handler: waits
    doc["topics"] = {"news": {"server": "s", "repository": f"{repo}/news", "poll_interval": 0.05,
                              "subscriptions": {"audit": {}}}}
    cluster.config.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([*FTPBC, "serve", "-c", str(cluster.config), "--node-id", "m",
                                 "--metrics-port", str(port)],
                                cwd=REPO, env=cluster.env("m"), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)
    try:
        wait_until(lambda: _get(url + "/readyz")[0] == 200 or proc.poll() is not None, timeout=60,
                   what="the node ready")
        assert proc.poll() is None, log.read_text()
        with Client(load_client_config(cluster, "c0")) as client:
            for i in range(3):
                assert client.request("echo", f"x{i}".encode()) == f"re:x{i}".encode()
            client.send("echo", b"stale", ttl=0.001)
            for i in range(4):
                client.send("parked", f"waiting {i}".encode())
            for i in range(2):
                client.publish("news", f"news {i}".encode())
        echo = frozenset({"endpoint": "echo", "node": "m"}.items())
        wait_until(lambda: _metrics(url).get(("ftpbc_messages_dead_lettered_total", echo)) == 1, timeout=60,
                   what="the stale message dead-lettered")

        def settled() -> bool:
            status = json.loads(_get(url + "/status.json")[1])
            cluster_doc = status["cluster"]
            if cluster_doc is None:
                return False
            areas = {e["name"]: e for e in cluster_doc["endpoints"]}
            subs = {s["name"]: s for t in cluster_doc["topics"] for s in t["subscriptions"]}
            return bool(areas["parked"]["depth"]["inbox"] == 4 and areas["echo"]["depth"]["indead"] == 1
                        and "audit" in subs and subs["audit"]["backlog"] == 2)

        wait_until(settled, timeout=60, interval=0.5, what="the listing to show every message")
        before = _metrics(url)
        profile = tmp_path / "profile"
        screenshot = tmp_path / "status-page.png"
        _browser(chromium, profile, f"--screenshot={screenshot}", "--window-size=1280,900", url + "/")
        assert screenshot.stat().st_size > 10_000 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        artefacts = os.environ.get("FTPBC_TEST_ARTEFACTS")
        if artefacts:
            Path(artefacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(screenshot, Path(artefacts) / screenshot.name)
        dom = _browser(chromium, profile, "--dump-dom", url + "/")
        after = _metrics(url)
        listing = json.loads(_get(url + "/status.json")[1])["cluster_listing_seconds"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    parser = _Keys()
    parser.feed(dom)
    seen = parser.values
    checked = []

    def check(key: str, expected: float | str, source: str) -> None:
        shown = seen.get(key)
        assert shown is not None, f"{key} is not on the page; keys: {sorted(seen)}"
        assert shown.strip() == str(expected), f"{key}: page shows {shown!r}, {source} says {expected!r}"
        checked.append(f"{key} = {shown.strip()} ({source})")

    for name in ("ftpbc_messages_served_total", "ftpbc_messages_dead_lettered_total",
                 "ftpbc_messages_failed_total", "ftpbc_in_flight_messages"):
        value = before[name, echo]
        assert after[name, echo] == value, f"{name} moved while the browser loaded the page"
        check(f"echo/{name}", int(value), "/metrics")
    check("echo/indead", int(before["ftpbc_messages_dead_lettered_total", echo]), "/metrics dead letters")
    check("echo/inbox", 0, "all answered")
    check("parked/inbox", 4, "sent")
    check("news/audit/backlog", 2, "published")
    check("m/state", "alive", "its heartbeat")
    check("m/claims", 0, "nothing in flight")
    # Readiness is judged afresh each time: the page's must be what /metrics said just before or
    # just after it (a loaded machine may stall a loop past its interval in between).
    node_label = frozenset({"node": "m"}.items())
    readiness = {"ready" if m["ftpbc_ready", node_label] == 1 else "not ready" for m in (before, after)}
    shown_ready = seen.get("#ready", "").strip()
    assert shown_ready.split(":")[0] in readiness, f"page says {shown_ready!r}, /metrics {readiness}"
    checked.append(f"#ready = {shown_ready} (/metrics ftpbc_ready)")
    report_figures(f"status page screenshot: {screenshot}\none listing of the cluster (2 endpoints, "
                   f"1 topic, 1 subscription on pyftpdlib): {listing} s\nchecked in chromium's DOM:\n  "
                   + "\n  ".join(checked))
    print("\n".join(checked))


# ---------------------------------------------------------------------------- in-process


def _handler(message: Message) -> bytes:
    return b"re:" + message.body


def test_the_page_is_read_only_and_lists_once_per_max_age(pyftpdlib_server: ServerHandle,
                                                          tmp_path: Path) -> None:
    """GET and HEAD only (405 naming them otherwise); the exchange area is listed once however
    many requests come within the cache's age; the page forbids scripts and outside assets."""
    area = pyftpdlib_server.fresh_dir()
    cfg = in_process_config(pyftpdlib_server, tmp_path, "ro", {"ep": {"repository": f"{area}/ep",
                                                                      "poll_interval": 0.05}})
    node = Node(cfg, handlers={"ep": _handler})
    node.start()
    server = serve_metrics(node)
    try:
        server.status.max_age = 3600.0  # this test counts listings: none may expire meanwhile
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"):
            for path in ("/", "/status.json", "/metrics"):
                status, body, headers = _get(server.url + path, method)
                assert status == 405, (method, path, status)
                assert headers.get("Allow") == "GET, HEAD"
        for _ in range(5):
            status, body, headers = _get(server.url + "/")
            assert status == 200 and b"<table" in body
        assert server.status.computations == 1
        assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none' forbids them
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        status, body, headers = _get(server.url + "/", "HEAD")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
        status, body, headers = _get(server.url + "/status.css")
        assert status == 200 and headers["Content-Type"].startswith("text/css") and b"table" in body
        doc = json.loads(_get(server.url + "/status.json")[1])
        assert doc["node"]["id"] == "ro" and doc["max_age_seconds"] == MAX_AGE
        assert [e["name"] for e in doc["cluster"]["endpoints"]] == ["ep"]
        assert server.status.computations == 1
    finally:
        server.close()
        node.stop(drain_timeout=2)


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>&amp;'


def test_every_value_is_escaped() -> None:
    """Names and errors from partners (heartbeats, selectors, server replies) appear as text:
    no element, attribute or entity of theirs reaches the page."""
    ep = EndpointStatus(HOSTILE, HOSTILE, HOSTILE, depth={"inbox": 1}, claims={HOSTILE: 1})
    broken = EndpointStatus("broken", "s", "/r", error=HOSTILE)
    sub = SubscriptionStatus(HOSTILE, False, HOSTILE, HOSTILE, "now", 1, ep)
    status = ClusterStatus(HOSTILE, 10.0, "now",
                           [NodeStatus(HOSTILE, True, 0.1, 1, HOSTILE, Serves((HOSTILE,), ()).to_dict()),
                            NodeStatus("n2", False, 30.0, not_serving=HOSTILE)],
                           [ep, broken], coordination=HOSTILE,
                           topics=[TopicStatus(HOSTILE, HOSTILE, HOSTILE, ep, [sub]),
                                   TopicStatus("t2", "s", "/r", error=HOSTILE)])
    snap = Snapshot(status, 1.0, error=HOSTILE)
    figures = {HOSTILE: {"ftpbc_messages_served_total": 1.0}}
    page = render_html(status_document(HOSTILE, [HOSTILE], figures, snap), snap, figures, [HOSTILE])
    assert "<script" not in page and "<img" not in page and "&amp;amp;" in page
    assert page.count("&lt;script&gt;") >= 10
    parser = _Keys()
    parser.feed(page)
    assert parser.values[f"{HOSTILE}/ftpbc_messages_served_total"] == "1"


def _cluster(label: str) -> ClusterStatus:
    return ClusterStatus("/state", 10.0, label, [], [])


def test_the_cache_lists_once_for_concurrent_requests_and_keeps_the_last_figures() -> None:
    """Requests at once share one computation; a failing one keeps the previous figures up,
    with the error; a first computation that hangs holds the others no longer than ``wait``."""
    import threading

    from ftpbc.node.status_page import StatusCache

    gate = threading.Event()
    outcomes = ["first", "fail", "third"]
    calls = []

    def compute() -> ClusterStatus:
        calls.append(1)
        gate.wait(30)
        outcome = outcomes[len(calls) - 1]
        if outcome == "fail":
            raise OSError("server down")
        return _cluster(outcome)

    cache = StatusCache(compute, max_age=3600.0, wait=0.3)
    results: list[Snapshot] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get())) for _ in range(8)]
    for t in threads:
        t.start()
    # Seven give up on the hung first computation after ``wait`` and get nothing yet.
    wait_until(lambda: len(results) == 7, timeout=10, what="the waiting requests to give up")
    assert all(r.status is None for r in results) and len(calls) == 1
    gate.set()
    for t in threads:
        t.join(10)
    assert len(results) == 8 and len(calls) == 1
    assert cache.get().status is not None and cache.get().status.time == "first"  # type: ignore[union-attr]
    cache.max_age = 0.0
    failed = cache.get()
    assert failed.status is not None and failed.status.time == "first"
    assert failed.error == "OSError: server down"
    page = render_html(status_document("n", [], {}, failed), failed, {}, [])
    assert "the last listing failed: OSError: server down" in page
    # max_age 0: every request lists again
    assert cache.get().status.time == "third" and len(calls) == 3  # type: ignore[union-attr]
