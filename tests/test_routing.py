"""Routes (docs/routing.md) against real servers: the DeliverNode example rewritten for ftpbc,
idle destinations retired, retries then the failure outlink, SIGKILL at every route crash point,
hostile properties."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import yaml

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.journal import Journal
from ftpbc.model.envelope import codec_for
from ftpbc.node.router import REASON_PROPERTY, Router, status_dir
from ftpbc.node.serve import Node
from ftpbc.node.status import cluster_status, render
from tests.servers.handle import ServerHandle
from tests.support import FTPBC, free_port, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
FAST = {"poll_interval": 0.05, "redelivery_delay": 0.05}
ROUTE_POINTS = ["route.after-decide", "route.after-stage", "route.after-expose", "route.after-commit"]
#: crash points of recovery itself: the node is first killed after a stage, then recovery killed here
RECOVERY_POINTS = ["recover.before-op", "recover.after-op"]


def node_section(workdir: Path, node_id: str = "n1") -> dict[str, Any]:
    return {"id": node_id, "state_dir": str(workdir / "state"), "journal_dir": str(workdir / "journals"),
            "heartbeat_interval": 0.5, "lease": 5}


def prefix_of(handle: ServerHandle, base: str) -> str:
    """The URL of remote directory ``base`` on ``handle``'s server (no password)."""
    if handle.kind == "local":
        return f"file://{handle.root}{base}"
    return handle.url.rstrip("/") + base


def deliver_example(handle: ServerHandle, base: str) -> list[dict[str, Any]]:
    """The DeliverNode example's rulesets, rewritten for ftpbc destinations on ``handle``."""
    prefix = prefix_of(handle, base)
    if handle.kind == "local":
        wmq: list[str | None] = [f"{prefix}/queues/##QueueName##"]
        subs: list[str | None] = []
        port: dict[str, Any] = {}
    else:
        url = urlsplit(handle.url)
        root = url.path.rstrip("/")
        wmq = [f"{url.scheme}://##HostName##", ":##port##", f"{root}{base}/queues/##QueueName##"]
        subs = [None, "s/^:$//"]
        port = {"port": url.port}
    asset = {"asset": "^[^:]*$"}
    return [
        {"name": "tcp", "capacity": 2, "max_idle": 1800,
         "properties": [{**asset, "uri": "^(ftp|ftps|sftp|file)://"}], "uri_template": ["##uri##"],
         "allow": [f"{prefix}/tcp"]},
        {"name": "agent", "capacity": 2, "max_idle": 1800,
         "properties": [{"short_name": "^Agent$", **asset}],
         "uri_template": [f"{prefix}/agents/", "##asset##"], "allow": [f"{prefix}/agents"]},
        {"name": "flow", "capacity": 2, "max_idle": 1800,
         "properties": [{"short_name": "^Flow$", **asset}], "uri_template": ["endpoint:flow"]},
        {"name": "console", "capacity": 2, "max_idle": 1800,
         "properties": [{"short_name": "^Console$", **asset}],
         "uri_template": [f"{prefix}/console/##asset##"], "allow": [f"{prefix}/console"]},
        {"name": "wmq_q", "capacity": 2, "max_idle": 1800,
         "properties": [{"HostName": "^.+$", "QueueName": "^.+$"}], "uri_template": wmq,
         "uri_substitution": subs, "default_properties": port, "allow": [f"{prefix}/queues"]},
        {"name": "wmq_t", "capacity": 2, "max_idle": 1800,
         "properties": [{"HostName": "^.+$", "TopicName": "^.+$"}],
         "uri_template": ["topic:", "##TopicName##"],
         "uri_substitution": [None, "s/\\./_/g"]},
    ]


def example_config(handle: ServerHandle, base: str, workdir: Path) -> dict[str, Any]:
    return {
        "node": node_section(workdir),
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {name: {"server": "srv", "repository": f"{base}/{name}", **FAST}
                      for name in ("events", "flow", "failed")},
        "topics": {"orders_eu": {"server": "srv", "repository": f"{base}/topics/orders_eu", "fanout": False}},
        "routes": {"deliver": {"source": "events", "failure": "endpoint:failed",
                               "nohit": f"{prefix_of(handle, base)}/nohit",
                               "rulesets": deliver_example(handle, base)}},
    }


@contextmanager
def serving(config: Config) -> Iterator[Node]:
    node = Node(config)
    node.start()
    try:
        yield node
    finally:
        assert node.stop(drain_timeout=10)


def files_in(handle: ServerHandle, remote: str) -> dict[str, bytes]:
    """Regular files directly in ``remote`` (reason files included), by name."""
    path = handle.local(remote)
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()} if path.exists() else {}


def all_files(handle: ServerHandle, base: str) -> set[str]:
    root = handle.local(base)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def pending(workdir: Path, node_id: str = "n1") -> dict[str, Any]:
    return Journal.read_pending(workdir / "journals", node_id)


def properties_of(name: str) -> dict[str, Any]:
    env = codec_for("ftpbc").decode(name, direction="in")
    assert env is not None, name
    return dict(env.properties)


# --------------------------------------------------------------------------- the example


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd", "sshd", "local"])
def test_deliver_example_routes_every_message_to_its_place(request: pytest.FixtureRequest, kind: str,
                                                           tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    config = Config.model_validate(example_config(handle, base, tmp_path))
    host = "127.0.0.1"
    prefix = prefix_of(handle, base)
    messages: list[tuple[bytes, dict[str, Any]]] = [
        (b"tcp", {"asset": "a1", "uri": f"{prefix}/tcp/a1"}),
        (b"agent", {"short_name": "Agent", "asset": "web1"}),
        (b"flow", {"short_name": "Flow", "asset": "web2"}),
        (b"console", {"short_name": "Console", "asset": "web3"}),
        (b"wmq_q", {"HostName": host, "QueueName": "Q1"}),
        (b"wmq_t", {"HostName": host, "TopicName": "orders.eu"}),
        (b"nohit", {"short_name": "Other", "asset": "x"}),
        (b"climbs", {"short_name": "Agent", "asset": "../../../etc"}),
        (b"long", {"short_name": "Console", "asset": "y" * 150}),
        (b"stranger", {"asset": "a2", "uri": "ftp://nobody@127.0.0.9:1/x"}),
    ]
    with Client(config.with_node_id("n1.client1")) as client:
        for body, props in messages:
            client.send("events", body, properties=props)
    with serving(config):
        wait_until(lambda: len(files_in(handle, f"{base}/events/inarchive")) == len(messages), timeout=60,
                   what="every message routed")
    assert files_in(handle, f"{base}/events/inbox") == {}
    assert files_in(handle, f"{base}/events/inselect") == {}
    assert sorted(files_in(handle, f"{base}/tcp/a1").values()) == [b"tcp"]
    assert sorted(files_in(handle, f"{base}/agents/web1").values()) == [b"agent"]
    assert sorted(files_in(handle, f"{base}/console/web3").values()) == [b"console"]
    assert sorted(files_in(handle, f"{base}/queues/Q1").values()) == [b"wmq_q"]
    assert sorted(files_in(handle, f"{base}/nohit").values()) == [b"nohit"]
    flow = files_in(handle, f"{base}/flow/inbox")
    assert list(flow.values()) == [b"flow"]
    assert properties_of(next(iter(flow)))["short_name"] == "Flow"  # headers kept
    published = files_in(handle, f"{base}/topics/orders_eu/incoming/inbox")
    assert list(published.values()) == [b"wmq_t"]
    stamped = codec_for("ftpbc").decode(next(iter(published)), direction="in")
    assert stamped is not None and stamped.headers.timestamp is not None  # stamped as a publish is
    failed = files_in(handle, f"{base}/failed/inbox")
    assert sorted(failed.values()) == [b"climbs", b"long", b"stranger"]
    # why, in a property, as much of it as the name has room for (all of it in the node's log)
    reasons = {failed[n]: str(properties_of(n).get(REASON_PROPERTY, "")) for n in failed}
    assert reasons[b"climbs"].startswith("ruleset agent: ##asset##"), reasons
    assert reasons[b"stranger"].startswith("ruleset tcp: destination"), reasons
    # nothing anywhere else: the hostile asset climbed nowhere
    expected_dirs = {"tcp/a1", "agents/web1", "console/web3", "queues/Q1", "nohit", "flow/inbox",
                     "topics/orders_eu/incoming/inbox", "failed/inbox", "events/inarchive"}
    assert {str(Path(f).parent) for f in all_files(handle, base)} == expected_dirs
    assert not (handle.root / "etc").exists()
    assert pending(tmp_path) == {}


# --------------------------------------------------------------------------- idle destinations


def client_connections(port: int) -> int:
    """This process's established TCP connections to ``port`` on loopback."""
    proc = psutil.Process()
    conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
    return sum(1 for c in conns if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def router_of(node: Node) -> Router:
    router = node.providers["route:r"]
    assert isinstance(router, Router)
    return router


def test_an_idle_destination_is_retired_and_its_connections_closed(
        local_server: ServerHandle, pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    src, dst = local_server.fresh_dir(), pyftpdlib_server.fresh_dir()
    port = urlsplit(pyftpdlib_server.url).port
    assert port is not None
    config = Config.model_validate({
        "node": node_section(tmp_path),
        "servers": {"src": local_server.config(name="src"), "dst": pyftpdlib_server.config(name="dst")},
        "endpoints": {"events": {"server": "src", "repository": f"{src}/events", **FAST}},
        "routes": {"r": {"source": "events", "rulesets": [
            {"name": "all", "max_idle": 3.0, "capacity": 2,
             "uri_template": [f"{prefix_of(pyftpdlib_server, dst)}/out"]}]}},
    })
    status_file = status_dir(config) / "r~n1.json"
    with Client(config.with_node_id("n1.client1")) as client, serving(config) as node:
        router = router_of(node)
        client.send("events", b"one")
        wait_until(lambda: len(files_in(pyftpdlib_server, f"{dst}/out")) == 1, timeout=20, what="delivery")
        live = router.destinations.snapshot()
        assert [d["destination"] for d in live] == [f"dst:{dst}/out"]
        assert client_connections(port) >= 1
        wait_until(lambda: status_file.exists() and json.loads(status_file.read_text())["destinations"],
                   what="the destination in the status file")
        shown = cluster_status(config)  # what ftpbc status shows
        live_shown = [(r.name, [d["destination"] for n in r.nodes for d in n.destinations])
                      for r in shown.routes]
        assert live_shown == [("r", [f"dst:{dst}/out"])]
        assert f"    dst:{dst}/out  capacity 2" in render(shown)
        wait_until(lambda: router.destinations.snapshot() == [] and client_connections(port) == 0,
                   timeout=15, what="the idle destination retired and its connections closed")
        assert router.destinations.retired == 1
        wait_until(lambda: json.loads(status_file.read_text())["destinations"] == [], what="status updated")
        client.send("events", b"two")  # a new worker on demand
        wait_until(lambda: len(files_in(pyftpdlib_server, f"{dst}/out")) == 2, timeout=20,
                   what="the second delivery")
        assert len(router.destinations.snapshot()) == 1
    assert not status_file.exists()  # a stopped node publishes nothing


# --------------------------------------------------------------------------- retries, then failure


@pytest.mark.parametrize("problem", ["unreachable", "wrong-password"])
def test_a_failing_destination_is_retried_then_the_message_goes_to_failure_with_its_reason(
        local_server: ServerHandle, pyftpdlib_server: ServerHandle, tmp_path: Path, problem: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    src = local_server.fresh_dir()
    if problem == "unreachable":
        port = free_port()  # nobody listens there
        bad = {"url": f"ftp://app@127.0.0.1:{port}", "password_env": "ROUTE_TEST_PW", "timeout": 5}
    else:
        url = urlsplit(pyftpdlib_server.url)
        port = url.port or 21
        bad = {"url": f"ftp://nobody@127.0.0.1:{port}", "password_env": "ROUTE_TEST_PW", "timeout": 5}
    monkeypatch.setenv("ROUTE_TEST_PW", "wrong")
    user = "app" if problem == "unreachable" else "nobody"
    config = Config.model_validate({
        "node": node_section(tmp_path),
        "servers": {"src": local_server.config(name="src"), "bad": bad},
        "endpoints": {"events": {"server": "src", "repository": f"{src}/events", **FAST}},
        "routes": {"r": {"source": "events", "max_retry": 2, "retry_delay": 0.05,
                         "failure": f"{prefix_of(local_server, src)}/failed",
                         "rulesets": [{"name": "all", "uri_template": [f"ftp://{user}@127.0.0.1:{port}/out"]}]}},
    })
    with Client(config.with_node_id("n1.client1")) as client, serving(config) as node:
        client.send("events", b"doomed", properties={"k": "v"})
        wait_until(lambda: len(files_in(local_server, f"{src}/failed")) == 2, timeout=60,
                   what="the message and its reason in the failure directory")
        wait_until(lambda: router_of(node).route_stats.failed == 1, what="the failure counted")
    failed = files_in(local_server, f"{src}/failed")
    (name, body), (reason_name, reason) = sorted(failed.items())
    assert body == b"doomed" and reason_name == name + ".reason"
    assert properties_of(name) == {"k": "v"}  # its headers kept
    assert b"failed after 2 retries" in reason
    assert (b"ConnectFailed" in reason) if problem == "unreachable" else (b"AuthenticationFailed" in reason)
    assert pending(tmp_path) == {}


# --------------------------------------------------------------------------- bounded destinations


@pytest.mark.parametrize("on_overflow", ["reject", "dead_letter"])
@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_a_full_destination_inbox_is_retried_then_overflows_as_its_endpoint_says(
        request: pytest.FixtureRequest, local_server: ServerHandle, tmp_path: Path, kind: str,
        on_overflow: str) -> None:
    """A destination endpoint bounded to 3 messages, five routed to it at once (five workers,
    capacity 5): 3 in its inbox, never more; the other 2 retried, then where its on_overflow
    says (reject: the failure outlink, reason ``queue full``; dead_letter: its dead letters,
    the reason beside each); all five accounted for, the source committed."""
    dst_server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    src, dst = local_server.fresh_dir(), dst_server.fresh_dir()
    config = Config.model_validate({
        "node": node_section(tmp_path),
        "servers": {"src": local_server.config(name="src"), "dst": dst_server.config(name="dst")},
        "endpoints": {"events": {"server": "src", "repository": f"{src}/events", **FAST},
                      "target": {"server": "dst", "repository": f"{dst}/target", "max_messages": 3,
                                 "on_overflow": on_overflow, **FAST}},
        "routes": {"r": {"source": "events", "max_retry": 2, "retry_delay": 0.05, "capacity": 5,
                         "failure": f"{prefix_of(local_server, src)}/failed",
                         "rulesets": [{"name": "all", "uri_template": ["endpoint:target"]}]}},
    })
    bodies = [f"message {i}".encode() for i in range(5)]
    with Client(config.with_node_id("n1.client1")) as client:
        for body in bodies:
            client.send("events", body)
    with serving(config) as node:
        wait_until(lambda: len(files_in(local_server, f"{src}/events/inarchive")) == len(bodies), timeout=60,
                   what="every message routed or overflowed")
        stats = router_of(node).route_stats
        wait_until(lambda: (stats.routed, stats.failed) == (3, 2), what="3 routed and 2 failures counted")
    inbox = files_in(dst_server, f"{dst}/target/inbox")
    assert len(inbox) == 3
    overflowed = files_in(local_server, f"{src}/failed") if on_overflow == "reject" else files_in(
        dst_server, f"{dst}/target/indead")
    reasons = {n: r.decode() for n, r in overflowed.items() if n.endswith(".reason")}
    messages = {n: b for n, b in overflowed.items() if not n.endswith(".reason")}
    assert sorted([*inbox.values(), *messages.values()]) == bodies  # nothing lost, nothing twice
    assert sorted(reasons) == sorted(n + ".reason" for n in messages)
    for reason in reasons.values():
        assert "queue full: endpoint 'target' holds 3 message(s)" in reason and "max_messages is 3" in reason
        assert "after 2 retries" in reason
    if on_overflow == "reject":
        assert files_in(dst_server, f"{dst}/target/indead") == {}
    else:
        assert all(r.startswith("overflow: ") for r in reasons.values())
        assert files_in(local_server, f"{src}/failed") == {}
    assert files_in(local_server, f"{src}/events/inbox") == {}
    assert files_in(local_server, f"{src}/events/inselect") == {}
    assert pending(tmp_path) == {}


# --------------------------------------------------------------------------- crashes


def write_yaml(tmp_path: Path, src: ServerHandle, dst: ServerHandle, src_base: str, dst_base: str,
               destination: str) -> Path:
    servers: dict[str, Any] = {}
    for name, handle in (("src", src), ("dst", dst)):
        entry: dict[str, Any] = {"url": handle.url}
        entry.update({k: str(v) if isinstance(v, Path) else v for k, v in handle.options.items()})
        if handle.password is not None:
            secret = tmp_path / f"{name}.password"
            secret.write_text(handle.password + "\n", encoding="utf-8")
            secret.chmod(0o600)
            entry["password_file"] = str(secret)
        servers[name] = entry
    uri = "endpoint:target" if destination != "directory" else f"{prefix_of(dst, dst_base)}/out"
    doc = {"node": node_section(tmp_path), "servers": servers,
           "endpoints": {"events": {"server": "src", "repository": f"{src_base}/events", "workers": 1,
                                    **FAST},
                         "target": {"server": "dst", "repository": f"{dst_base}/target",
                                    "protect": destination == "protected", **FAST}},
           "routes": {"r": {"source": "events", "rulesets": [{"name": "all", "uri_template": [uri]}]}}}
    path = tmp_path / "ftpbc.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


#: (destination server, destination kind, crash point): every route point on both servers, an
#: endpoint with protect: true (a second delivery would move the first aside) and recovery's own
#: points on pyftpdlib
CRASH_CASES = ([(k, d, p) for p in ROUTE_POINTS for k in ("pyftpdlib", "sshd")
                for d in ("endpoint", "directory")]
               + [("pyftpdlib", "protected", p) for p in ROUTE_POINTS]
               + [("pyftpdlib", d, p) for p in RECOVERY_POINTS for d in ("endpoint", "directory")])


@pytest.mark.parametrize("kind, destination, point", CRASH_CASES)
def test_a_node_killed_at_every_route_point_delivers_each_message_exactly_once(
        request: pytest.FixtureRequest, local_server: ServerHandle, tmp_path: Path, point: str,
        destination: str, kind: str) -> None:
    dst_server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    src_base, dst_base = local_server.fresh_dir(), dst_server.fresh_dir()
    path = write_yaml(tmp_path, local_server, dst_server, src_base, dst_base, destination)
    config = Config.model_validate(yaml.safe_load(path.read_text()) | {
        "servers": {"src": local_server.config(name="src"), "dst": dst_server.config(name="dst")}})
    bodies = {f"message {i}".encode() for i in range(3)}
    with Client(config.with_node_id("n1.client1")) as client:
        for body in sorted(bodies):
            client.send("events", body)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = "route.after-stage@2" if point in RECOVERY_POINTS else f"{point}@2"
    crashed = subprocess.run([*FTPBC, "serve", "-c", str(path)], cwd=tmp_path, capture_output=True,
                             timeout=60, env={**env, "FTPBC_CRASH_AT": first})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    assert pending(tmp_path), "the crash left no pending operation"
    if point in RECOVERY_POINTS:  # recovery itself killed while deciding the routed message
        crashed = subprocess.run([*FTPBC, "recover", "-c", str(path)], cwd=tmp_path, capture_output=True,
                                 timeout=60, env={**env, "FTPBC_CRASH_AT": point})
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    out = f"{dst_base}/target/inbox" if destination != "directory" else f"{dst_base}/out"
    # A consumer takes what was delivered before the crash: a second delivery of the same message
    # (same name) would show up again instead of replacing the first unnoticed.  (With protect,
    # it is left: a second delivery would move the first aside into inprotect.)
    taken = tmp_path / "taken"
    taken.mkdir()
    for name in files_in(dst_server, out) if destination != "protected" else ():
        dst_server.local(f"{out}/{name}").rename(taken / name)
    log = tmp_path / "node.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*FTPBC, "serve", "-c", str(path)], cwd=tmp_path, stdout=sink, stderr=sink,
                                env=env)
    try:
        wait_until(lambda: len(files_in(local_server, f"{src_base}/events/inarchive")) == 3, timeout=30,
                   what="every message routed after the restart")
        wait_until(lambda: len(files_in(dst_server, out)) + len(list(taken.iterdir())) >= 3,
                   what="every message at its destination")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")[-2000:]
    delivered = [*files_in(dst_server, out).values(), *(p.read_bytes() for p in taken.iterdir())]
    assert sorted(delivered) == sorted(bodies), log.read_text(errors="replace")[-3000:]
    assert files_in(local_server, f"{src_base}/events/inbox") == {}
    assert files_in(local_server, f"{src_base}/events/inselect") == {}
    assert files_in(dst_server, f"{dst_base}/target/inprotect") == {}
    stage = dst_server.local(f"{dst_base}/target/instage/.ftpbc-route" if destination != "directory"
                             else f"{out}/.ftpbc-route")
    assert not stage.exists() or not list(stage.iterdir())
    assert pending(tmp_path) == {}


# --------------------------------------------------------------------------- hostile properties


def test_hostile_properties_go_to_failure_with_their_reason_and_nothing_leaves_the_directory(
        local_server: ServerHandle, tmp_path: Path) -> None:
    base = local_server.fresh_dir()
    prefix = prefix_of(local_server, base)
    config = Config.model_validate({
        "node": node_section(tmp_path),
        "servers": {"srv": local_server.config(name="srv")},
        "endpoints": {"events": {"server": "srv", "repository": f"{base}/events", **FAST}},
        "routes": {"r": {"source": "events", "failure": f"{prefix}/failed", "rulesets": [
            {"name": "own", "properties": [{"uri": "."}], "uri_template": ["##uri##"],
             "allow": [f"{prefix}/assets"]},
            {"name": "asset", "properties": [{"asset": "."}],
             "uri_template": [f"{prefix}/assets/", "##asset##"], "allow": [f"{prefix}/assets"]}]}},
    })
    hostile = {
        b"climb": ({"asset": "../../escape"}, "'..'"),
        b"inner": ({"asset": "a/../../b"}, "'..'"),
        b"encoded": ({"asset": "%2e%2e/%2e%2e/escape"}, "climbs"),
        b"long": ({"asset": "y" * 150}, "over the limit"),
        b"control": ({"asset": "a\tb"}, "control or format character U+0009"),
        b"elsewhere": ({"uri": "file:///etc"}, "outside the allow list"),
        b"password": ({"uri": "ftp://app:pw@127.0.0.1:21/x"}, "carries a password"),
    }
    with Client(config.with_node_id("n1.client1")) as client:
        for body, (props, _) in hostile.items():
            client.send("events", body, properties=props)
    with serving(config):
        wait_until(lambda: len(files_in(local_server, f"{base}/failed")) == 2 * len(hostile), timeout=30,
                   what="every hostile message and its reason in failed/")
    failed = files_in(local_server, f"{base}/failed")
    for name, body in failed.items():
        if name.endswith(".reason"):
            continue
        why = hostile[body][1]
        assert why in failed[name + ".reason"].decode(), (body, failed[name + ".reason"])
    assert {str(Path(f).parent) for f in all_files(local_server, base)} == {"failed", "events/inarchive"}
    assert not (local_server.root / "escape").exists() and not (local_server.root / "b").exists()
    assert pending(tmp_path) == {}


def test_max_destinations_retires_the_least_recently_used_idle_one(local_server: ServerHandle) -> None:
    from ftpbc.node.destinations import Destination, Destinations, DestinationsFull

    server = local_server.config(name="loc")
    pool = Destinations("r", 2)

    def make(key: str) -> Destination:
        return Destination(key, server, 1, 60.0, lambda t: None)

    a = pool.acquire("a", lambda: make("a"))
    b = pool.acquire("b", lambda: make("b"))
    with pytest.raises(DestinationsFull):  # both busy: no room yet
        pool.acquire("c", lambda: make("c"))
    pool.release(a, delivered=True)
    pool.release(b, delivered=True)
    pool.acquire("b", lambda: make("b"))  # b is now the more recently used
    pool.release(b, delivered=True)
    c = pool.acquire("c", lambda: make("c"))
    assert [d["destination"] for d in pool.snapshot()] == ["b", "c"] and pool.retired == 1
    pool.release(c, delivered=False)
    figures = {d["destination"]: (d["delivered"], d["failed"]) for d in pool.snapshot()}
    assert figures == {"b": (2, 0), "c": (0, 1)}
    pool.close()
    assert pool.snapshot() == []


def test_body_patterns_see_the_first_max_body_scan_bytes_only(local_server: ServerHandle,
                                                              tmp_path: Path) -> None:
    base = local_server.fresh_dir()
    config = Config.model_validate({
        "node": node_section(tmp_path),
        "servers": {"srv": local_server.config(name="srv")},
        "endpoints": {name: {"server": "srv", "repository": f"{base}/{name}", **FAST}
                      for name in ("events", "errors", "rest")},
        "routes": {"r": {"source": "events", "max_body_scan": 20, "rulesets": [
            {"name": "errors", "body": [["ERROR", "disk"]], "exclude_body": [["IGNORE"]],
             "uri_template": ["endpoint:errors"]},
            {"name": "rest", "uri_template": ["endpoint:rest"]}]}},
    })
    bodies = {b"ERROR: disk full": "errors", b"ERROR disk IGNORE": "rest", b"ERROR: cpu": "rest",
              b"." * 20 + b"ERROR: disk full": "rest"}
    with Client(config.with_node_id("n1.client1")) as client:
        for body in bodies:
            client.send("events", body)
    with serving(config):
        wait_until(lambda: len(files_in(local_server, f"{base}/events/inarchive")) == len(bodies),
                   what="every message routed")
    for where in ("errors", "rest"):
        got = sorted(files_in(local_server, f"{base}/{where}/inbox").values())
        assert got == sorted(b for b, w in bodies.items() if w == where)
