"""``Client.trace`` and ``ftpbc trace`` (docs/tracing.md) on real servers: a request served and
collected, a one-way message through a route into a topic and its fan-out, a dead letter and its
replay, an expired message, a journal record, and a trace of one id among thousands of archived
names listed by glob.

The messages are moved by a serving node and a client, as in production; the trace only reads
what they left.  The trace reads through the transport layer, so each test runs on pyftpdlib
(FTP, no globs), vsftpd (FTP listing by glob), OpenSSH (SFTP) and a local directory (file://).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.config.servers import ServerConfig
from ftpbc.exchange.trace import REPLAY_ID, REPLAY_OF, Query, Trace, _property_glob, _window_globs, parse_when
from ftpbc.journal import Journal
from ftpbc.node.serve import Node
from tests.servers.handle import ServerHandle
from tests.support import (
    Seen,
    area_files,
    drop_message,
    free_port,
    ftpbc_env,
    run_ftpbc,
    server_yaml,
    wait_until,
)
from tests.test_bad_input import main_in_process

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20, "redelivery_delay": 0.05}
PAST = "20200101T000000.000Z"
TRACE_SERVERS = ["pyftpdlib", "vsftpd", "sshd", "local"]


@pytest.fixture(params=TRACE_SERVERS)
def trace_server(request: pytest.FixtureRequest) -> ServerHandle:
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle


def node_section(workdir: Path, node_id: str) -> dict[str, Any]:
    return {"id": node_id, "state_dir": str(workdir / f"state-{node_id}"),
            "journal_dir": str(workdir / "journals"), "heartbeat_interval": 0.5, "lease": 5}


def prefix_of(handle: ServerHandle, base: str) -> str:
    if handle.kind == "local":
        return f"file://{handle.root}{base}"
    return handle.url.rstrip("/") + base


def routed_config(handle: ServerHandle, base: str, workdir: Path, node_id: str) -> Config:
    """``quote`` answers requests; ``events`` is routed to topic ``orders`` (kind 'order'),
    whose subscription ``audit`` takes everything and ``billing`` region 'us' only."""
    return Config.model_validate({
        "node": node_section(workdir, node_id),
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {name: {"server": "srv", "repository": f"{base}/{name}", **FAST}
                      for name in ("quote", "events")},
        "topics": {"orders": {"server": "srv", "repository": f"{base}/orders", "poll_interval": 0.02,
                              "subscriptions": {"audit": {}, "billing": {"selector": "region = 'us'"}}}},
        "routes": {"deliver": {"source": "events", "failure": f"{prefix_of(handle, base)}/failed",
                               "rulesets": [{"name": "orders", "properties": [{"kind": "^order$"}],
                                             "uri_template": ["topic:orders"]}]}},
    })


def id_of(path: str) -> str:
    """The message id in a sent file's path (``.../inbox/msg.<uuid>;...``)."""
    return path.rsplit("/", 1)[1].split("~", 1)[0].split(";", 1)[0].split(".", 1)[1]


def events(trace: Trace) -> list[tuple[str, str, str | None]]:
    return [(s.event, s.place, s.node) for s in trace.sightings]


def test_request_route_and_topic_fan_out_are_traced(trace_server: ServerHandle, tmp_path: Path,
                                                    things: list[Any]) -> None:
    handle = trace_server
    base = handle.fresh_dir()
    node = Node(routed_config(handle, base, tmp_path, "prov"), handlers={"quote": Seen().handler})
    things.append(node)
    node.start()
    client = Client(routed_config(handle, base, tmp_path, "cli"))
    things.append(client)

    uid = client.submit("quote", b"q1")
    assert client.collect("quote", uid, timeout=20) == b"q1"
    oid = id_of(client.send("events", b"o42", properties={"kind": "order", "orderId": "42", "region": "eu"}))
    audit = f"{base}/orders/subscriptions/audit"
    wait_until(lambda: area_files(handle, audit, "inbox")
               and area_files(handle, f"{base}/quote", "outarchive")
               and area_files(handle, f"{base}/orders/incoming", "inarchive"), timeout=30,
               what="the request collected and the order fanned out")

    request = client.trace(uid)
    assert events(request) == [("served", "endpoint quote", "prov"), ("collected", "endpoint quote", "cli")]
    served, collected = request.sightings
    assert served.kind == "request" and collected.kind == "response" and collected.correlation_id == uid
    assert served.when is not None and collected.when is not None and served.when <= collected.when
    # a file time without seconds (vsftpd's LIST) gives no wait
    if handle.kind == "vsftpd":
        assert served.waited is None
    else:
        assert served.waited is not None and 0 <= served.waited < 30
    assert request.ids == [uid] and not request.problems and not request.truncated

    order = client.trace(oid)
    # In time order; which of these comes first depends on the threads that moved it (the copy
    # is in the subscription before the topic's claim is committed, the route's destination
    # before its source is): the places are what the test holds.
    assert sorted(events(order)) == [("fanned out", "topic orders", "prov"),
                                     ("routed", "endpoint events", "prov"),
                                     ("waiting", "subscription orders/audit", None)]
    assert all(s.id == oid and s.properties["orderId"] == "42" for s in order.sightings)
    [copy] = [s for s in order.sightings if s.event == "waiting"]
    assert copy.path.startswith(f"{audit}/inbox/msg.{oid}")  # billing's selector refused it

    by_property = client.trace(where="orderId = '42'")
    assert [(s.event, s.id) for s in by_property.sightings] == [(e, oid) for e, _, _ in events(order)]
    assert client.trace(where="orderId = '43'").sightings == []
    since = datetime.now(UTC) - timedelta(hours=1)
    windowed = client.trace(where="region = 'eu' AND orderId = '42'", since=since, until=datetime.now(UTC))
    assert [s.event for s in windowed.sightings] == [e for e, _, _ in events(order)]
    assert client.trace(oid, until=since).sightings == []
    assert [s.event for s in client.trace(correlation_id=uid).sightings] == ["served", "collected"]

    # A request sent to a route's source cannot be routed (no reply could come): the route
    # files it in its failure directory, with the reason beside it.
    rid = client.submit("events", b"r1")
    reason_file = handle.local(f"{base}/failed/req.{rid}.reason")
    wait_until(lambda: reason_file.is_file() and reason_file.read_text().endswith("\n"), timeout=30,
               what="the request in the failure directory with its whole reason")
    failed = client.trace(rid)
    assert sorted(events(failed)) == [("delivered", "route deliver: failure", None),
                                      ("routed", "endpoint events", "prov")]
    [filed] = [s for s in failed.sightings if s.event == "delivered"]
    assert filed.kind == "request" and filed.path == f"{base}/failed/req.{rid}"
    assert filed.reason is not None and "a route carries one-way messages" in filed.reason


def dlq_config(handle: ServerHandle, base: str, workdir: Path, node_id: str) -> Config:
    """``ep`` holds one message at most and files the next as a dead letter."""
    return Config.model_validate({
        "node": node_section(workdir, node_id),
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {"ep": {"server": "srv", "repository": f"{base}/ep", **FAST, "max_messages": 1,
                             "on_overflow": "dead_letter"}},
    })


def test_dead_letter_its_replay_and_an_expired_message_are_traced(trace_server: ServerHandle, tmp_path: Path,
                                                                  things: list[Any]) -> None:
    handle = trace_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    client = Client(dlq_config(handle, base, tmp_path, "cli"))
    things.append(client)
    client.runtime.lifecycle("ep")
    first = id_of(client.send("ep", b"first"))
    dead = id_of(client.send("ep", b"second"))  # the inbox is full: filed in indead
    assert len(area_files(handle, repo, "indead")) == 2  # the letter and its reason
    expired = str(uuid.uuid4())
    drop_message(handle, repo, f"msg.{expired};e={PAST}", b"late")
    seen = Seen()
    node = Node(dlq_config(handle, base, tmp_path, "prov"), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    wait_until(lambda: seen.count() == 1 and len(area_files(handle, repo, "inexpired")) == 2, timeout=30,
               what="the first message served, the expired one filed")
    # The dead letter sent again as a new message (ftpbc replay --from dead): it stays filed.
    replay_id = str(uuid.uuid4())
    plan, report = client.replay("ep", datetime.now(UTC) - timedelta(hours=1), source="dead",
                                 replay_id=replay_id)
    assert len(plan.messages) == 1 and report is not None
    wait_until(lambda: seen.count() == 2 and len(area_files(handle, repo, "inarchive")) == 2, timeout=30,
               what="the replay served")
    replay = next(m.uuid for m in seen.messages if m.properties.get(REPLAY_OF) == dead)
    assert seen.bodies[-1] == b"second"

    trace = client.trace(dead)
    assert [(s.event, s.id) for s in trace.sightings] == [("dead-lettered", dead), ("consumed", replay)]
    letter, replayed = trace.sightings
    assert letter.node == "cli" and letter.reason is not None and "overflow" in letter.reason
    assert replayed.node == "prov" and replayed.replay_of == dead
    assert replayed.properties[REPLAY_ID] == replay_id
    assert trace.replays == {dead: [replay]} and trace.ids == [dead, replay]

    back = client.trace(replay)  # from the replay to what it replays
    assert back.ids == [replay, dead]
    assert [(s.event, s.id) for s in back.sightings] == [("dead-lettered", dead), ("consumed", replay)]

    late = client.trace(expired)
    assert [(s.event, s.node) for s in late.sightings] == [("expired", "prov")]
    assert late.sightings[0].reason is not None and "expire" in late.sightings[0].reason
    assert [s.event for s in client.trace(first).sightings] == ["consumed"]
    assert client.trace(str(uuid.uuid4())).sightings == []


def test_journal_records_join_the_trace(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                        things: list[Any]) -> None:
    """A send a node journaled and never finished (killed between its record and its upload)
    is in no directory: only the journal says it was on its way."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    client = Client(dlq_config(handle, base, tmp_path, "cli"))
    things.append(client)
    uid = str(uuid.uuid4())
    journal = Journal(tmp_path / "other-journals", "n9")
    try:
        journal.endpoint("ep").record(f"{uid}.send", "send", kind="oneway",
                                      stage=f"{base}/ep/instage/msg.{uid}~n9",
                                      target=f"{base}/ep/inbox/msg.{uid}")
    finally:
        journal.close()
    assert client.trace(uid).sightings == []
    [record] = client.trace(uid, journals=[tmp_path / "other-journals"]).sightings
    assert record.event == "journal send" and record.node == "n9" and record.kind == "journal"
    assert f"{base}/ep/inbox/msg.{uid}" in record.detail and record.when is not None


def test_ftpbc_trace_command(pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    client = Client(dlq_config(handle, base, tmp_path, "cli"))
    things.append(client)
    client.runtime.lifecycle("ep")
    uid = id_of(client.send("ep", b"x", properties={"orderId": "7"}))
    config = tmp_path / "ftpbc.yaml"
    document = {"node": node_section(tmp_path, "op"),
                "endpoints": {"ep": {"server": "srv", "repository": f"{base}/ep"}},
                "servers": {"srv": {"url": handle.url, "password_env": "TRACE_PW"}}}
    config.write_text(json.dumps(document), encoding="utf-8")
    env = ftpbc_env({"TRACE_PW": handle.password or ""})

    done = run_ftpbc("trace", uid, "-c", str(config), "--json", env=env)  # as installed
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    found = [(s["event"], s["id"], s["properties"]) for s in answer["sightings"]]
    assert found == [("waiting", uid, {"orderId": "7"})]
    assert answer["ids"] == [uid] and answer["cost"]["listings"] >= 16 and answer["problems"] == []

    shown = main_in_process("trace", "-c", str(config), "--where", "orderId = '7'", "--since", "1h", env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("trace of where orderId = '7' between ") and "1 sighting(s)" in lines[0]
    assert "waiting" in lines[1] and f"id={uid}" in lines[1] and lines[-1].startswith("cost: ")

    missing = main_in_process("trace", str(uuid.uuid4()), "-c", str(config), env=env)
    assert missing.returncode == 1 and "0 sighting(s)" in missing.stdout
    bad = main_in_process("trace", uid, "-c", str(config), "--since", "yesterday", env=env)
    assert bad.returncode == 2 and "--since" in bad.stderr and "'yesterday'" in bad.stderr
    nothing = main_in_process("trace", "-c", str(config), env=env)
    assert nothing.returncode == 2 and "MESSAGE_ID" in nothing.stderr


def test_one_id_among_thousands_is_listed_by_glob(vsftpd_server: ServerHandle, tmp_path: Path,
                                                  things: list[Any]) -> None:
    """vsftpd lists by glob: of 3,000 archived names the server hands back the traced one and
    its reply only, so a trace costs a directory read, not the archive's size in lines."""
    handle = vsftpd_server
    base = handle.fresh_dir()
    client = Client(dlq_config(handle, base, tmp_path, "cli"))
    things.append(client)
    client.runtime.lifecycle("ep")
    archive = handle.local(f"{base}/ep/inarchive")
    for _ in range(3000):
        (archive / f"req.{uuid.uuid4()}~prov~20261128T040000.000Z").write_bytes(b"")
    uid = str(uuid.uuid4())
    (archive / f"req.{uuid.uuid4()};c={uid}~prov~20261128T040001.000Z").write_bytes(b"")  # related
    (archive / f"req.{uid}~prov~20261128T040002.000Z").write_bytes(b"x")
    (handle.local(f"{base}/ep/outarchive") / f"resp.{uid}~cli~20261128T040003.000Z").write_bytes(b"y")
    trace = client.trace(uid)
    assert [s.event for s in trace.sightings] == ["served", "served", "collected"]
    assert trace.names == 3 and not trace.truncated


# ---------------------------------------------------------------------- the query's pieces


def test_globs_a_query_lists_with() -> None:
    assert _property_glob("orderId = '42'") == "*;.orderIdS=42*"
    assert _property_glob("orderId=42") == "*;.orderId?=42*"
    assert _property_glob("note = 'a b'") == "*;.noteS=a%20b*"
    assert _property_glob("orderId = '42' OR x = 1") is None
    assert _property_glob("JMSPriority = 4") is None
    t = datetime(2026, 11, 28, 4, 30, tzinfo=UTC)
    assert _window_globs(t, t + timedelta(hours=2)) == ["20261128T04", "20261128T05", "20261128T06"]
    assert _window_globs(t, t + timedelta(days=3)) == ["20261128T", "20261129T", "20261130T", "20261201T"]
    assert _window_globs(t, t + timedelta(days=100)) == ["202611", "202612", "202701", "202702", "202703"]
    assert _window_globs(t, t + timedelta(days=3650)) is None
    assert _window_globs(None, t) is None


def test_times_and_queries_are_checked() -> None:
    now = datetime(2026, 11, 28, 4, 0, tzinfo=UTC)
    assert parse_when("2h", now=now) == now - timedelta(hours=2)
    assert parse_when("2026-11-28T03:00", now=now) == datetime(2026, 11, 28, 3, 0, tzinfo=UTC)
    assert parse_when("2026-11-28T03:00Z") == datetime(2026, 11, 28, 3, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"--since: 'soon' is neither"):
        parse_when("soon", key="--since")
    with pytest.raises(ValueError, match="needs a message id"):
        Query()
    with pytest.raises(ValueError, match="is after until"):
        Query("x", since=now, until=now - timedelta(seconds=1))


@pytest.mark.parametrize("kind", ["local", "pyftpdlib"])
def test_hostile_names_and_reasons_and_a_server_down(kind: str, request: pytest.FixtureRequest,
                                                     tmp_path: Path, things: list[Any]) -> None:
    """What the exchange area holds is anyone's: a reason with terminal escapes is shown
    escaped, a huge one named and not read, names that are not usable and a directory named
    like the message are passed over, and a server that cannot be reached is named while the
    other places are still read."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    document: dict[str, Any] = {
        "node": node_section(tmp_path, "cli"),
        "servers": {"srv": handle.config(name="srv"),
                    "down": ServerConfig.from_url(f"ftp://nobody@127.0.0.1:{free_port()}/", password="x",
                                                  name="down", timeout=5)},
        "endpoints": {"ep": {"server": "srv", "repository": f"{base}/ep", **FAST},
                      "gone": {"server": "down", "repository": "/gone"}},
    }
    client = Client(Config.model_validate(document))
    things.append(client)
    client.runtime.lifecycle("ep")
    uid = str(uuid.uuid4())
    stamp = "20261128T040000.000Z"
    error = handle.local(f"{base}/ep/inerror")
    (error / f"req.{uid}~node-x~{stamp}").write_bytes(b"a")
    (error / f"req.{uid}~node-x~{stamp}.reason").write_text("boom \x1b[31mred\x1b[0m\n")
    dead = handle.local(f"{base}/ep/indead")
    later = "20261128T040001.000Z"
    (dead / f"req.{uid};n=3~node-x~{later}").write_bytes(b"b")
    (dead / f"req.{uid};n=3~node-x~{later}.reason").write_bytes(b"x" * 10_000)
    (handle.local(f"{base}/ep/inarchive") / f"req.{uid};p=12~node-x~{stamp}").write_bytes(b"c")  # p=12
    (handle.local(f"{base}/ep/inbox") / f"req.{uid}").mkdir()

    trace = client.trace(uid)
    assert [(s.event, s.delivery_count) for s in trace.sightings] == [("failed", 0), ("dead-lettered", 3)]
    failed, letter = trace.sightings
    assert failed.reason == "boom \x1b[31mred\x1b[0m"
    assert letter.reason is not None and "longer than 4096 bytes" in letter.reason
    assert len(trace.problems) == 16 and all(p.startswith("endpoint gone: /gone/") for p in trace.problems)

    config = tmp_path / "ftpbc.yaml"
    del document["endpoints"]["gone"]
    config.write_text(json.dumps({**document, "servers": {"srv": server_yaml(handle, "TRACE_PW")}}),
                      encoding="utf-8")
    shown = main_in_process("trace", uid, "-c", str(config), env={"TRACE_PW": handle.password or ""})
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "boom \\x1b[31mred\\x1b[0m" in shown.stdout
