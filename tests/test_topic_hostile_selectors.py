"""Subscription markers with hostile selectors planted in a topic's area (docs/security.md).

Anyone who can write to a topic's area can write a ``*.subscription`` marker, selector
included.  However its selector is built, the topic goes on: a selector that does not compile
(too deep, too long) is logged once and selects nothing, one that compiles costs bounded time,
and every other subscription gets its copies.  On the in-process FTP server, end to end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.client import Client
from ftpbc.node.serve import Node
from tests.cluster import Started
from tests.servers.handle import ServerHandle
from tests.support import wait_until
from tests.test_topics import TOPIC, config_for, fanned_out, files, inbox

#: marker name -> a selector someone planted
PLANTED = {
    # refused when compiled: nested deeper than MAX_DEPTH, longer than MAX_SELECTOR_LENGTH
    "deep": "(" * 3000 + "region = 'eu'" + ")" * 3000,
    "minus": "n = " + "-" * 30_000 + "1",
    # compile, and used to cost minutes (backtracking) or raise RecursionError per message
    "slow": "pad LIKE '%a%a%a%a%a%a%a%a%b'",
    "chain": "n = " + "+".join(["n"] * 5000),
    # no selector (JMS): every message
    "empty": "",
}
REFUSED = ("deep", "minus")


@pytest.fixture
def started() -> Iterator[Started]:
    with Started() as s:
        yield s


def plant(directory: Path, name: str, selector: str) -> None:
    marker = {"version": 1, "topic": TOPIC, "name": name, "durable": True, "selector": selector,
              "owner": "somebody", "created": "2000-01-01T00:00:00+00:00"}
    (directory / f"{name}.subscription").write_text(json.dumps(marker), encoding="utf-8")


def test_planted_hostile_selectors_neither_stop_nor_slow_the_topic(
        pyftpdlib_server: ServerHandle, tmp_path: Path, started: Started,
        caplog: pytest.LogCaptureFixture) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    config = config_for(handle, tmp_path, "hostile-1", base,
                        subscriptions={"eu": {"selector": "region = 'eu'"}})
    node = started.add(Node(config))
    node.start()
    subs = handle.local(f"{base}/{TOPIC}/subscriptions")
    wait_until(lambda: (subs / "eu.subscription").exists(), timeout=20, what="the declared subscription")
    for name, selector in PLANTED.items():
        plant(subs, name, selector)
    client = started.add(Client(config.with_node_id("hostile-1.client0"), connections=2))
    sent = {f"m{n}".encode(): "eu" if n % 2 else "us" for n in range(6)}
    for body, region in sent.items():
        client.publish(TOPIC, body, properties={"region": region, "n": 1, "pad": "a" * 60})
    wait_until(lambda: fanned_out(handle, base, len(sent)), timeout=30, what="every message fanned out")
    assert inbox(handle, base, "eu") == sorted(b for b, r in sent.items() if r == "eu")
    assert inbox(handle, base, "empty") == sorted(sent)
    for name in ("slow", "chain", *REFUSED):
        assert files(handle, base, f"subscriptions/{name}/inbox") == [], name
    warned = Counter(name for r in caplog.records if "does not compile" in r.getMessage()
                     for name in PLANTED if f"{TOPIC}/{name}: " in r.getMessage())
    assert warned == dict.fromkeys(REFUSED, 1), warned
    # one line each, cut short: not the marker's whole selector
    assert all(len(r.getMessage()) < 1000 for r in caplog.records if "does not compile" in r.getMessage())
    node.stop(drain_timeout=5)


def test_the_empty_selector_is_no_selector_for_subscriptions_and_receivers(
        local_server: ServerHandle, tmp_path: Path, started: Started) -> None:
    from ftpbc.cli.queues import _selector

    base = local_server.fresh_dir()
    config = config_for(local_server, tmp_path, "hostile-2", base)
    client = started.add(Client(config.with_node_id("hostile-2.client0"), connections=2))
    sub, made = client.create_subscription(TOPIC, "blank", selector=" ")
    assert made and sub.selector is None
    # the same subscription, resumed: not "exists with another selector"
    assert client.create_subscription(TOPIC, "blank", selector="")[1] is False
    started.add(Node(config)).start()
    client.publish(TOPIC, b"one", properties={"region": "eu"})
    delivery = client.receive(f"{TOPIC}/blank", timeout=20, selector="")
    assert delivery is not None and delivery.body == b"one"
    # `ftpbc dlq purge --selector ""` selects nothing by itself: IDs or --all are still needed
    assert _selector("") is None and _selector("  ") is None
