"""Topics (docs/topics.md): publish, durable and non-durable subscriptions with selectors, the
fan-out by serving nodes, the subscription registry on the server, and the CLI.

End to end on pyftpdlib, vsftpd, OpenSSH and a local directory; the behaviours that sit above
the transport (created times, offline subscribers, leases, the CLI) on one FTP server and the
local directory.  Crash points and the chaos run: tests/test_topics_chaos.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.config.loader import parse_config
from ftpbc.config.models import Config
from ftpbc.errors import ConfigError, SelectorError
from ftpbc.exchange.lifecycle import op_id_for
from ftpbc.exchange.topics import UnknownSubscription
from ftpbc.journal import Journal
from ftpbc.node.serve import Node
from tests.cluster import REPO_ROOT, SERVER, Started, node_section, write_config
from tests.servers.handle import ServerHandle
from tests.support import ftpbc_env, run_ftpbc, wait_until

TOPIC = "orders"
TOPIC_SERVERS = ["pyftpdlib", "vsftpd", "sshd", "local"]
#: behaviours above the transport: one FTP server and the local directory
CORE_SERVERS = ["pyftpdlib", "local"]
DECLARED = {"all": {}, "eu": {"selector": "region = 'eu'"}, "big": {"selector": "n >= 4"}}


@pytest.fixture(params=TOPIC_SERVERS)
def any_server(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


@pytest.fixture(params=CORE_SERVERS)
def core_server(request: pytest.FixtureRequest) -> ServerHandle:
    h: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return h


@pytest.fixture
def started() -> Iterator[Started]:
    with Started() as s:
        yield s


def topic_section(base: str, subscriptions: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    return {"server": SERVER, "repository": f"{base}/{TOPIC}", "poll_interval": 0.02,
            "subscriptions": subscriptions if subscriptions is not None else {}, **settings}


def config_for(handle: ServerHandle, workdir: Path, node_id: str, base: str, *,
               subscriptions: dict[str, Any] | None = None, node: dict[str, Any] | None = None,
               **settings: Any) -> Config:
    return Config.model_validate({
        "node": {**node_section(workdir, node_id), **(node or {})},
        "servers": {SERVER: handle.config(name=SERVER)},
        "topics": {TOPIC: topic_section(base, subscriptions, **settings)},
    })


def yaml_for(handle: ServerHandle, workdir: Path, base: str, *, subscriptions: dict[str, Any] | None = None,
             node: dict[str, Any] | None = None, **settings: Any) -> Path:
    path = write_config(workdir / "ftpbc.yaml", handle, workdir, {})
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    del document["endpoints"]
    document["node"].update(node or {})
    document["topics"] = {TOPIC: topic_section(base, subscriptions, **settings)}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def files(handle: ServerHandle, base: str, directory: str) -> list[str]:
    d = handle.local(f"{base}/{TOPIC}/{directory}")
    return sorted(p.name for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def inbox(handle: ServerHandle, base: str, sub: str) -> list[bytes]:
    """The bodies waiting in subscription ``sub``, read from the server's disk."""
    return sorted(handle.local(f"{base}/{TOPIC}/subscriptions/{sub}/inbox/{n}").read_bytes()
                  for n in files(handle, base, f"subscriptions/{sub}/inbox"))


def fanned_out(handle: ServerHandle, base: str, count: int) -> bool:
    """``count`` messages archived in the topic's incoming area, nothing waiting or staged."""
    return (len(files(handle, base, "incoming/inarchive")) == count
            and not files(handle, base, "incoming/inbox") and not files(handle, base, "incoming/inselect")
            and not staged_copies(handle, base))


def staged_copies(handle: ServerHandle, base: str) -> list[str]:
    d = handle.local(f"{base}/{TOPIC}/fanout")
    return sorted(str(p) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


def no_pending(workdir: Path, *node_ids: str) -> None:
    for node_id in node_ids:
        journal = Journal(workdir / "journals", node_id)
        try:
            assert journal.all_pending() == {}, node_id
        finally:
            journal.close()


def drain(client: Client, endpoint: str, timeout: float = 1.0) -> list[bytes]:
    with client.consume(endpoint, timeout=timeout) as deliveries:
        return [d.body for d in deliveries]


# ---------------------------------------------------------------------- end to end, every server


def test_publish_fans_out_to_each_matching_subscription_once(any_server: ServerHandle, tmp_path: Path,
                                                              started: Started) -> None:
    handle = any_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-1", base, subscriptions=DECLARED)
    node = started.add(Node(config))
    node.start()
    client = started.add(Client(config.with_node_id("fan-1.client0"), connections=2))
    sent = {f"m{n}".encode(): ("eu" if n % 2 else "us", n) for n in range(6)}
    for body, (region, n) in sent.items():
        client.publish(TOPIC, body, properties={"region": region, "n": n})
    wait_until(lambda: fanned_out(handle, base, 6), timeout=30, what="six messages fanned out")
    expected = {"all": sorted(sent), "eu": sorted(b for b, (r, _) in sent.items() if r == "eu"),
                "big": sorted(b for b, (_, n) in sent.items() if n >= 4)}
    assert {sub: inbox(handle, base, sub) for sub in expected} == expected
    # Consumed through the subscription as a derived endpoint, each message once.
    for sub, bodies in expected.items():
        assert sorted(drain(client, f"{TOPIC}/{sub}")) == bodies
    assert {s.name: s.durable for s in client.subscriptions(TOPIC)} == dict.fromkeys(expected, True)
    node.stop(drain_timeout=5)
    no_pending(tmp_path, "fan-1")


def test_non_durable_subscription_lives_as_long_as_its_client(any_server: ServerHandle, tmp_path: Path,
                                                              started: Started) -> None:
    handle = any_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-2", base)
    started.add(Node(config)).start()
    publisher = started.add(Client(config.with_node_id("fan-2.client0"), connections=2))
    subscriber = Client(config.with_node_id("fan-2.client1"), connections=2)
    try:
        with subscriber.subscribe(TOPIC, durable=False, selector="region = 'eu'", timeout=10) as deliveries:
            (sub,) = publisher.subscriptions(TOPIC)
            assert not sub.durable and sub.owner == "fan-2.client1" and sub.selector == "region = 'eu'"
            publisher.publish(TOPIC, b"us-1", properties={"region": "us"})
            publisher.publish(TOPIC, b"eu-1", properties={"region": "eu"})
            first = next(iter(deliveries))
            assert first.body == b"eu-1"
        wait_until(lambda: fanned_out(handle, base, 2), timeout=20, what="both fanned out")
        assert inbox(handle, base, sub.name) == []
    finally:
        subscriber.close()
    assert publisher.subscriptions(TOPIC) == []  # gone with its subscriber
    assert not handle.local(f"{base}/{TOPIC}/subscriptions/{sub.name}.subscription").exists()


# ---------------------------------------------------------------------- semantics (one FTP server, local)


def test_a_subscription_gets_only_what_was_published_after_it_was_made(
        core_server: ServerHandle, tmp_path: Path, started: Started) -> None:
    """Published before the node runs: the fan-out sees both subscriptions, and decides by the
    messages' sent times, not by when it happens to copy them."""
    handle = core_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-3", base)
    client = started.add(Client(config.with_node_id("fan-3.client0"), connections=2))
    client.create_subscription(TOPIC, "early")
    client.publish(TOPIC, b"one")
    client.create_subscription(TOPIC, "late", selector="TRUE")
    client.publish(TOPIC, b"two")
    started.add(Node(config)).start()
    wait_until(lambda: fanned_out(handle, base, 2), timeout=20, what="both fanned out")
    assert inbox(handle, base, "early") == [b"one", b"two"]
    assert inbox(handle, base, "late") == [b"two"]


def test_an_offline_durable_subscriber_gets_every_message_when_it_returns(core_server: ServerHandle,
                                                                          tmp_path: Path,
                                                                          started: Started) -> None:
    handle = core_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-4", base, workers=4, max_per_poll=64)
    # A thousand on the local directory; fewer through the in-process FTP server, which shares
    # this process (and its two cores) with the node and the publisher.
    count = 1000 if handle.kind == "local" else 250
    with Client(config.with_node_id("fan-4.client1"), connections=2) as subscriber, \
            subscriber.subscribe(TOPIC, name="audit", timeout=0.1) as deliveries:
        assert list(deliveries) == []
    # The subscriber is gone (no heartbeat): its durable subscription stays.
    started.add(Node(config)).start()
    publisher = started.add(Client(config.with_node_id("fan-4.client0"), connections=4))
    for n in range(count):
        publisher.publish(TOPIC, str(n))
    wait_until(lambda: fanned_out(handle, base, count), timeout=120, interval=0.2,
               what=f"{count} messages fanned out")
    assert publisher.backlog(TOPIC, "audit") == count
    with Client(config.with_node_id("fan-4.client1"), connections=2) as subscriber, \
            subscriber.subscribe(TOPIC, name="audit", ack="dups_ok", timeout=1) as deliveries:
        got = Counter(d.body for d in deliveries)
    assert got == Counter(str(n).encode() for n in range(count))
    assert files(handle, base, "subscriptions/audit/inbox") == []


def test_unsubscribe_removes_the_subscription_and_its_messages(core_server: ServerHandle, tmp_path: Path,
                                                               started: Started) -> None:
    handle = core_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-5", base, subscriptions={"keep": {}})
    started.add(Node(config)).start()
    client = started.add(Client(config.with_node_id("fan-5.client0"), connections=2))
    client.create_subscription(TOPIC, "gone")
    for n in range(3):
        client.publish(TOPIC, f"m{n}")
    wait_until(lambda: fanned_out(handle, base, 3), timeout=20, what="three fanned out")
    assert len(inbox(handle, base, "gone")) == 3
    assert client.unsubscribe(TOPIC, "gone") >= 3
    assert [s.name for s in client.subscriptions(TOPIC)] == ["keep"]
    assert inbox(handle, base, "gone") == []
    client.publish(TOPIC, b"after")
    wait_until(lambda: fanned_out(handle, base, 4), timeout=20, what="the fourth fanned out")
    assert inbox(handle, base, "gone") == []
    assert len(inbox(handle, base, "keep")) == 4
    with pytest.raises(UnknownSubscription, match="no subscription 'gone'"):
        client.unsubscribe(TOPIC, "gone")
    # Made again, it starts empty.
    client.create_subscription(TOPIC, "gone")
    assert inbox(handle, base, "gone") == []


def test_resubscribing_keeps_a_durable_subscription_and_refuses_a_different_one(local_server: ServerHandle,
                                                                                 tmp_path: Path,
                                                                                 started: Started) -> None:
    base = local_server.fresh_dir()
    config = config_for(local_server, tmp_path, "fan-6", base)
    client = started.add(Client(config.with_node_id("fan-6.client0"), connections=2))
    sub, made = client.create_subscription(TOPIC, "s", selector="a = 1")
    assert made
    again, made_again = client.create_subscription(TOPIC, "s")  # no selector: resumed as it is
    assert not made_again and again == sub
    with pytest.raises(ValueError, match="exists with selector"):
        client.create_subscription(TOPIC, "s", selector="a = 2")
    with pytest.raises(ValueError, match="exists and is durable"):
        client.create_subscription(TOPIC, "s", durable=False)
    with pytest.raises(ValueError, match="needs a name"):
        client.subscribe(TOPIC)
    with pytest.raises(SelectorError):
        client.create_subscription(TOPIC, "t", selector="a = ")
    with pytest.raises(ConfigError, match="unknown topic"):
        client.publish("nope", b"x")


def test_a_marker_that_is_not_one_is_ignored_and_the_others_still_get_their_copies(
        local_server: ServerHandle, tmp_path: Path, started: Started,
        caplog: pytest.LogCaptureFixture) -> None:
    base = local_server.fresh_dir()
    config = config_for(local_server, tmp_path, "fan-10", base, subscriptions={"good": {}})
    node = started.add(Node(config))
    node.start()
    subs = local_server.local(f"{base}/{TOPIC}/subscriptions")
    (subs / "junk.subscription").write_bytes(b"{not json")
    (subs / "huge.subscription").write_bytes(b" " * (64 * 1024 + 1))
    client = started.add(Client(config.with_node_id("fan-10.client0"), connections=2))
    for n in range(3):
        client.publish(TOPIC, f"m{n}")
    wait_until(lambda: fanned_out(local_server, base, 3), timeout=20, what="three fanned out")
    assert inbox(local_server, base, "good") == [b"m0", b"m1", b"m2"]
    assert [s.name for s in client.subscriptions(TOPIC)] == ["good"]
    warned = Counter(name for r in caplog.records if "cannot be used, ignored" in r.getMessage()
                     for name in ("huge", "junk") if f"/{name}.subscription " in r.getMessage())
    # once per registry that read them (the node's, the client's), not once per listing
    assert warned == {"huge": 2, "junk": 2}, warned


SUBSCRIBER = """
import sys, time
from ftpbc.client import Client
client = Client.from_config(sys.argv[1], node_id="sub-1")
client.create_subscription("orders", "gone-with-me", durable=False)
print("subscribed", flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_a_non_durable_subscription_is_swept_once_its_owner_is_dead(local_server: ServerHandle,
                                                                    tmp_path: Path, started: Started) -> None:
    base = local_server.fresh_dir()
    lease = {"lease": 2.0, "heartbeat_interval": 0.25}
    path = yaml_for(local_server, tmp_path, base, node=lease, subscriptions={"durable": {}})
    config = config_for(local_server, tmp_path, "fan-7", base, node=lease, subscriptions={"durable": {}})
    node = started.add(Node(config))
    node.start()
    proc = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(path)], cwd=REPO_ROOT, env=ftpbc_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "subscribed"
        marker = local_server.local(f"{base}/{TOPIC}/subscriptions/gone-with-me.subscription")
        assert marker.exists()
        os.kill(proc.pid, signal.SIGKILL)  # no close(): only the lease can end it
        proc.wait(timeout=10)
        # the marker goes first, then the area's files, then the sweeper counts it
        wait_until(lambda: not marker.exists() and sum(getattr(s, "removed", 0) for s in node.sweepers) == 1,
                   timeout=20, interval=0.1, what="the sweeper to remove the dead subscriber's subscription")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.close()
    assert [p.name for p in local_server.local(f"{base}/{TOPIC}/subscriptions").glob("*.subscription")] \
        == ["durable.subscription"]


def test_sending_to_a_topic_as_to_an_endpoint_is_a_publish(core_server: ServerHandle, tmp_path: Path,
                                                           started: Started) -> None:
    """What a routing node does with a topic destination: the runtime's lifecycle of the topic's
    name, a name from new_message, a send: fanned out like a publish."""
    handle = core_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "fan-8", base, subscriptions={"all": {}})
    started.add(Node(config)).start()
    client = started.add(Client(config.with_node_id("fan-8.client0"), connections=2))
    runtime = client.runtime
    lc = runtime.lifecycle(TOPIC)
    name, uid = runtime.new_message(TOPIC, "oneway", priority=7, properties={"k": "v"})
    out = lc.layout.outbound(name, runtime.node_id, lc.clock())  # type: ignore[attr-defined]
    lc.send(out, b"routed", op_id=op_id_for(uid, "send"), kind="oneway")
    client.send(TOPIC, b"plain send")
    wait_until(lambda: fanned_out(handle, base, 2), timeout=20, what="both fanned out")
    assert inbox(handle, base, "all") == [b"plain send", b"routed"]
    with client.consume(f"{TOPIC}/all", timeout=1) as deliveries:
        first = next(iter(deliveries))
    assert first.body == b"routed" and first.headers.priority == 7 and first.properties == {"k": "v"}


# ---------------------------------------------------------------------- configuration


BASE = "servers: {s: {url: 'file:///tmp/x'}}\nendpoints: {e: {server: s, repository: /e}}\n"


@pytest.mark.parametrize(("topics", "message"), [
    ("{o: {server: s, repository: /t, subscriptions: {a: {selector: 'x = '}}}}",
     "topics.o.subscriptions.a.selector: selector 'x = '"),
    ("{e: {server: s, repository: /t}}", "topics.e: 'e' is also an endpoint"),
    ("{o: {server: z, repository: /t}}", "topics.o.server: unknown server 'z'"),
    ("{o: {server: s, repository: t}}", "topics.o.repository: repository 't' must be an absolute path"),
    ("{o: {server: s, repository: /t, subscriptions: {.a: {}}}}", "subscription name '.a'"),
    ("{o: {server: s, repository: /t, subscriptions: {a: {durable: false}}}}",
     "topics.o.subscriptions.a.durable: subscriptions in the configuration are durable"),
    ("{o: {server: s, repository: /t, timezone: Mars/Base}}", "topics.o.timezone: unknown time zone"),
    ("{o: {server: s, repository: /t, oneway_prefix: 'a/b'}}",
     "topics.o.oneway_prefix: prefix 'a/b' must be plain text"),
    ("{o: {server: s, repository: /t, workers: 0}}", "topics.o.workers: "),
    ("{o: {server: s, repository: /t, handler: 'a:b'}}", "topics.o.handler: unknown key"),
    ("{'o/x': {server: s, repository: /t}}", "topics: topic name 'o/x' must be"),
])
def test_bad_topic_configuration_is_one_line_naming_the_key(topics: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + "topics: " + topics, source="f.yaml")
    text = str(info.value)
    assert text.startswith("f.yaml:3: ") and message in text and "\n" not in text


def test_a_topic_and_its_subscriptions_resolve_as_endpoints() -> None:
    config = parse_config(BASE + "topics: {o: {server: s, repository: /t, workers: 3}}")
    assert config.endpoint("o").repository == "/t/incoming"
    assert config.endpoint("o/a").repository == "/t/subscriptions/a"
    assert config.endpoint("o/a") is config.endpoint("o/a")  # derived once
    assert config.endpoint("o").workers == 3
    for bad in ("o/", "o/.a", "o/a/b", "x/a"):
        with pytest.raises(ConfigError):
            config.endpoint(bad)


# ---------------------------------------------------------------------- the command line


def test_cli_publish_subscribe_list_receive_unsubscribe(local_server: ServerHandle, tmp_path: Path,
                                                        started: Started) -> None:
    base = local_server.fresh_dir()
    path = yaml_for(local_server, tmp_path, base)
    env = ftpbc_env(cwd_imports=str(REPO_ROOT))

    def ftpbc(*args: str) -> subprocess.CompletedProcess[str]:
        return run_ftpbc(*args, env=env, cwd=tmp_path)

    made = ftpbc("topic", "subscribe", "-c", str(path), TOPIC, "audit", "--selector", "region = 'eu'")
    assert made.returncode == 0 and made.stdout.strip() == "orders/audit: created", made.stderr
    assert ftpbc("topic", "subscribe", "-c", str(path), TOPIC, "audit", "--selector",
                 "region = 'eu'").stdout.strip() == "orders/audit: exists"
    for region in ("eu", "us", "eu"):
        out = ftpbc("publish", "-c", str(path), TOPIC, "--data", f"to {region}", "--property",
                    f"region={region}", "--priority", "6")
        assert out.returncode == 0 and len(out.stdout.strip()) == 36, out.stderr
    config = config_for(local_server, tmp_path, "fan-9", base)
    started.add(Node(config)).start()
    wait_until(lambda: fanned_out(local_server, base, 3), timeout=20, what="three fanned out")
    listed = ftpbc("topic", "list", "-c", str(path), TOPIC)
    assert listed.returncode == 0 and "orders/audit: durable, selector \"region = 'eu'\"" in listed.stdout
    assert "2 waiting" in listed.stdout
    as_json = yaml.safe_load(ftpbc("topic", "list", "-c", str(path), TOPIC, "--json").stdout)
    assert as_json["backlog"] == 2 and as_json["durable"] is True
    got = ftpbc("receive", "-c", str(path), f"{TOPIC}/audit", "--count", "2", "--timeout", "10")
    assert got.returncode == 0 and got.stdout.splitlines() == ["to eu", "to eu"], got.stderr
    status = ftpbc("status", "-c", str(path))
    assert "topic orders" in status.stdout and "subscription audit: durable" in status.stdout
    gone = ftpbc("topic", "unsubscribe", "-c", str(path), TOPIC, "audit")
    assert gone.returncode == 0 and gone.stdout.startswith("orders/audit: removed with "), gone.stderr
    assert ftpbc("topic", "list", "-c", str(path), TOPIC).stdout.strip() == "orders: no subscriptions"


@pytest.mark.parametrize(("args", "error"), [
    (("publish", TOPIC + "x", "--data", "x"), "unknown topic 'orders"),
    (("topic", "list", "nope"), "unknown topic 'nope'"),
    (("topic", "subscribe", TOPIC, ".hidden"), "subscription name '.hidden'"),
    (("topic", "subscribe", TOPIC, "s", "--selector", "a = "), "selector 'a = '"),
    (("topic", "unsubscribe", TOPIC, "never"), "topic 'orders' has no subscription 'never'"),
    (("receive", TOPIC + "/bad/name", "--timeout", "0.1"), "subscription name 'bad/name'"),
])
def test_cli_errors_are_one_line_and_exit_2(local_server: ServerHandle, tmp_path: Path,
                                            args: tuple[str, ...], error: str) -> None:
    path = yaml_for(local_server, tmp_path, local_server.fresh_dir())
    command, *rest = args
    if command == "topic":
        argv = ["topic", rest[0], "-c", str(path), *rest[1:]]
    else:
        argv = [command, "-c", str(path), *rest]
    out = run_ftpbc(*argv, env=ftpbc_env(cwd_imports=str(REPO_ROOT)), cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert error in out.stderr and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len([line for line in lines if error in line]) == 1
