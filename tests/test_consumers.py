"""Pull consumers with acknowledgement: ``Client.receive`` / ``Client.consume`` and ``ftpbc
receive``.  A received message is archived once acknowledged; ``nack`` puts it back with its
delivery count raised (and ``redelivery_delay`` held back), or files it; the ack modes (auto,
client, dups_ok); leaving a consume block returns what was not acknowledged at once; a consumer
SIGKILLed holding deliveries has them come back after the lease; a consumer killed between claim
and ack is recovered by its next run or ``ftpbc recover``; racing consumers never share one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.errors import SelectorError
from ftpbc.exchange.consumer import AckMode, Delivery
from ftpbc.journal import Journal
from ftpbc.model.envelope import FtpbcCodec
from tests.cluster import Started, in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import area_files, drop_message, ftpbc_env, run_ftpbc, wait_until

FAST = {"poll_interval": 0.02, "timeout": 20}
#: a short lease (heartbeats four times as often) for the tests where a consumer dies
LEASE = 2.0
HEARTBEAT = 0.25


@pytest.fixture
def started() -> Iterator[Started]:
    with Started() as s:
        yield s


def _config(handle: ServerHandle, tmp_path: Path, node_id: str, repo: str, **endpoint: Any) -> Config:
    config = in_process_config(handle, tmp_path, node_id, {"ep": {"repository": repo, **FAST, **endpoint}})
    node = config.node.model_copy(update={"lease": LEASE, "heartbeat_interval": HEARTBEAT})
    return config.model_copy(update={"node": node})


def _yaml(handle: ServerHandle, tmp_path: Path, repo: str, **endpoint: Any) -> Path:
    """The same configuration as :func:`_config`, as a file for subprocesses."""
    path = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path,
                        {"ep": {"repository": repo, **FAST, **endpoint}})
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["node"].update({"lease": LEASE, "heartbeat_interval": HEARTBEAT})
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _count(name: str) -> int:
    """The delivery count a name in the box carries."""
    env = FtpbcCodec().decode(name, direction="in")
    assert env is not None, name
    return env.headers.delivery_count


def _uid(path: str) -> str:
    return path.rsplit("/", 1)[-1].split(";")[0].removeprefix("msg.")


def _pending(tmp_path: Path, node_id: str) -> dict[str, Any]:
    journal = Journal(tmp_path / "journals", node_id)
    try:
        return dict(journal.all_pending())
    finally:
        journal.close()


# --------------------------------------------------------------------------- receive, ack, nack


def test_receive_and_ack_archives_and_leaves_requests_to_handlers(server: ServerHandle, tmp_path: Path,
                                                                 started: Started) -> None:
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(_config(server, tmp_path, "cons", repo)))
    uid = _uid(client.send("ep", b"hello", priority=7, properties={"region": "eu", "n": 3}, type="greeting"))
    request = client.submit("ep", b"a request")
    d = client.receive("ep", timeout=10)
    assert isinstance(d, Delivery) and d.uuid == uid and d.body == b"hello" and d.text() == "hello"
    assert d.headers.priority == 7 and d.headers.type == "greeting" and dict(d.properties) == {"region": "eu",
                                                                                              "n": 3}
    assert d.delivery_count == 1 and not d.redelivered and d.size == 5
    claims = area_files(server, repo, "inselect")
    assert len(claims) == 1 and claims[0].endswith("~cons")  # claimed by this client identity
    assert d.ack() is True and d.state == "acked"
    assert d.ack() is True  # acknowledging again changes nothing
    [archived] = area_files(server, repo, "inarchive")
    assert archived.startswith(f"msg.{uid};") and "~cons~" in archived
    assert not area_files(server, repo, "inselect") and not area_files(server, repo, "outbox")  # no reply
    # A request is for handlers: a pull consumer leaves it in the box.
    assert client.receive("ep", timeout=0.3) is None
    assert area_files(server, repo, "inbox") == [f"req.{request}"]
    with pytest.raises(ValueError, match="acknowledged"):
        d.nack()
    assert client.runtime.journal.all_pending() == {}


def test_nack_requeues_with_the_count_raised_after_the_redelivery_delay(server: ServerHandle, tmp_path: Path,
                                                                        started: Started) -> None:
    """nack(requeue=True) puts the message back with its delivery count raised; the consumer
    that gave it back gets it again only after redelivery_delay, another one at once; at
    max_deliveries it is a dead letter; nack(requeue=False) files it at once."""
    repo = f"{server.fresh_dir()}/ep"
    delay = 0.5
    settings = {"redelivery_delay": delay, "max_deliveries": 3, "dead_letter": True}
    a = started.add(Client(_config(server, tmp_path, "cons-a", repo, **settings)))
    b = started.add(Client(_config(server, tmp_path, "cons-b", repo, **settings)))
    uid = _uid(a.send("ep", b"again"))
    first = a.receive("ep", timeout=10)
    assert first is not None and first.uuid == uid
    nacked = time.monotonic()  # before: the hold-back is counted from inside nack()
    what = first.nack()
    assert what.kind == "returned" and first.state == "requeued"
    [name] = area_files(server, repo, "inbox")
    assert _count(name) == 1
    second = a.receive("ep", timeout=10)
    assert second is not None and second.uuid == uid and time.monotonic() - nacked >= delay
    assert second.delivery_count == 2 and second.redelivered
    second.nack(reason="try elsewhere")  # a holds it back for 2 x delay now; b does not
    third = b.receive("ep", timeout=10)
    assert third is not None and third.uuid == uid and third.delivery_count == 3
    filed = third.nack(reason="cannot handle it")
    assert filed.kind == "dead" and third.state == "filed"  # delivery 3 of 3: a dead letter
    letter, reason = area_files(server, repo, "indead")
    assert letter.startswith(f"msg.{uid}") and reason == letter + ".reason"
    assert "delivery 3 of 3 failed: cannot handle it" in (server.local(f"{repo}/indead") / reason).read_text()
    # Filed at once, whatever its count, with the reason given (error directory without dead_letter).
    plain = started.add(Client(_config(server, tmp_path, "cons-c", repo)))
    other = _uid(plain.send("ep", b"poison"))
    d = plain.receive("ep", timeout=10)
    assert d is not None and d.uuid == other
    assert d.nack(requeue=False, reason="unparseable").kind == "error"
    error, error_reason = area_files(server, repo, "inerror")
    assert error.startswith(f"msg.{other}") and error_reason == error + ".reason"
    assert (server.local(f"{repo}/inerror") / error_reason).read_text() == "unparseable\n"
    assert not area_files(server, repo, "inbox") and not area_files(server, repo, "inselect")


def test_selector_on_receive_and_consume(server: ServerHandle, tmp_path: Path, started: Started) -> None:
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(_config(server, tmp_path, "cons", repo)))
    sent = {region: _uid(client.send("ep", region.encode(), properties={"region": region, "n": i}))
            for i, region in enumerate(["eu", "us", "uk", "eu2"])}
    d = client.receive("ep", timeout=10, selector="region LIKE 'u%' AND n > 1")
    assert d is not None and d.uuid == sent["uk"] and d.ack()
    assert client.receive("ep", timeout=0.2, selector="region = 'fr'") is None
    with client.consume("ep", selector="region IN ('eu', 'us')", timeout=0.5) as deliveries:
        got = sorted(m.body for m in deliveries)
    assert got == [b"eu", b"us"]
    [left] = area_files(server, repo, "inbox")
    assert left.startswith(f"msg.{sent['eu2']}")
    with pytest.raises(SelectorError, match="column"):
        client.receive("ep", timeout=1, selector="region = ")


def test_closing_the_client_returns_what_it_holds(server: ServerHandle, tmp_path: Path,
                                                  started: Started) -> None:
    """Deliveries never settled go back when their client closes (count raised), not after the
    lease: its heartbeat goes with it."""
    repo = f"{server.fresh_dir()}/ep"
    sender = started.add(Client(_config(server, tmp_path, "sender", repo)))
    sent = _fill(sender, 2)
    with Client(_config(server, tmp_path, "cons", repo)) as client:
        held = [client.receive("ep", timeout=10) for _ in range(2)]
        assert {d.uuid for d in held if d is not None} == sent
        assert len(area_files(server, repo, "inselect")) == 2
    assert all(d is not None and d.state == "requeued" for d in held)
    back = area_files(server, repo, "inbox")
    assert len(back) == 2 and all(_count(n) == 1 for n in back)
    assert not area_files(server, repo, "inselect") and _pending(tmp_path, "cons") == {}


# --------------------------------------------------------------------------- ack modes


def _fill(client: Client, count: int) -> set[str]:
    return {_uid(client.send("ep", f"m{i}".encode())) for i in range(count)}


def test_client_mode_acknowledges_all_up_to_the_acked_one(server: ServerHandle, tmp_path: Path,
                                                         started: Started) -> None:
    """m.ack() in client mode acknowledges m and everything received before it; leaving the
    block returns the rest to the box at once (count raised), where another consumer takes it."""
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(_config(server, tmp_path, "cons", repo)))
    sent = _fill(client, 5)
    got: list[Delivery] = []
    with client.consume("ep", ack="client", timeout=10) as deliveries:
        for m in deliveries:
            got.append(m)
            if len(got) == 5:
                break
        assert [m.state for m in got] == ["received"] * 5  # nothing acknowledged yet
        assert len(area_files(server, repo, "inselect")) == 5
        assert got[2].ack() is True
        assert [m.state for m in got] == ["acked"] * 3 + ["received"] * 2
        assert len(area_files(server, repo, "inarchive")) == 3
    # Out of the block: the two not acknowledged are back at once, their delivery count raised.
    assert [m.state for m in got] == ["acked"] * 3 + ["requeued"] * 2
    back = area_files(server, repo, "inbox")
    assert len(back) == 2 and all(_count(n) == 1 for n in back)
    assert not area_files(server, repo, "inselect")
    other = started.add(Client(_config(server, tmp_path, "other", repo)))
    again = [other.receive("ep", timeout=10) for _ in range(2)]
    assert all(d is not None and d.delivery_count == 2 and d.ack() for d in again)
    assert {d.uuid for d in again if d is not None} == {m.uuid for m in got[3:]}
    assert {m.uuid for m in got} == sent and len(area_files(server, repo, "inarchive")) == 5


def test_auto_and_dups_ok_modes(server: ServerHandle, tmp_path: Path, started: Started) -> None:
    """auto: a delivery is acknowledged when the loop moves on; an exception out of the block
    returns the one in hand at once.  dups_ok: all acknowledged by the end of the block."""
    repo = f"{server.fresh_dir()}/ep"
    client = started.add(Client(_config(server, tmp_path, "cons", repo)))
    _fill(client, 3)
    got: list[Delivery] = []
    auto = client.consume("ep", ack="auto", timeout=10)
    with pytest.raises(RuntimeError, match="third"), auto as deliveries:
        for m in deliveries:
            assert all(earlier.state == "acked" for earlier in got)  # acknowledged as the loop moved on
            got.append(m)
            if len(got) == 3:
                raise RuntimeError("the third fails")
    assert [m.state for m in got] == ["acked", "acked", "requeued"]
    [back] = area_files(server, repo, "inbox")
    assert back.startswith(f"msg.{got[2].uuid};") and _count(back) == 1
    assert len(area_files(server, repo, "inarchive")) == 2
    # Left normally (break), the one in hand was handled: acknowledged.
    with client.consume("ep", ack="auto", timeout=10) as deliveries:
        for m in deliveries:
            last = m
            break
    assert last.uuid == got[2].uuid and last.state == "acked"
    more = _fill(client, 6)
    seen: list[Delivery] = []
    with client.consume("ep", ack="dups_ok", timeout=0.5) as deliveries:
        seen.extend(deliveries)
    assert {m.uuid for m in seen} == more and all(m.state == "acked" for m in seen)
    assert len(area_files(server, repo, "inarchive")) == 9
    assert not area_files(server, repo, "inbox") and not area_files(server, repo, "inselect")
    assert client.runtime.journal.all_pending() == {}


# --------------------------------------------------------------------------- racing consumers


def _race(handle: ServerHandle, tmp_path: Path, started: Started, lock: str) -> None:
    """3 consumers (auto, client, dups_ok) race for 300 messages: each is delivered and
    acknowledged exactly once, and all end archived."""
    repo = f"{handle.fresh_dir()}/ep"
    modes: list[AckMode] = ["auto", "client", "dups_ok"]
    clients = [started.add(Client(_config(handle, tmp_path, f"racer-{mode}", repo, lock=lock), connections=2))
               for mode in modes]
    clients[0].runtime.lifecycle("ep")  # the exchange area
    sent = [str(uuid.uuid4()) for _ in range(300)]
    for uid in sent:
        drop_message(handle, repo, f"msg.{uid}", uid.encode())
    delivered: list[list[Delivery]] = [[] for _ in modes]
    errors: list[BaseException] = []

    def consume(client: Client, mode: AckMode, out: list[Delivery]) -> None:
        try:
            with client.consume("ep", ack=mode, timeout=3.0) as deliveries:
                for m in deliveries:
                    assert m.body == m.uuid.encode()
                    out.append(m)
                    if mode == "client" and len(out) % 7 == 0:
                        assert m.ack()  # and the six before it
                if mode == "client" and out:
                    assert out[-1].ack()  # the last few, before the block would return them
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(c, mode, out))
               for c, mode, out in zip(clients, modes, delivered, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    everything = [m for out in delivered for m in out]
    assert all(m.state == "acked" and m.delivery_count == 1 for m in everything)
    times = Counter(m.uuid for m in everything)
    assert sorted(times) == sorted(sent) and set(times.values()) == {1}, "each delivered exactly once"
    assert len(area_files(handle, repo, "inarchive")) == 300
    assert not area_files(handle, repo, "inbox") and not area_files(handle, repo, "inselect")


def test_racing_consumers_deliver_each_message_once(server: ServerHandle, tmp_path: Path,
                                                    started: Started) -> None:
    _race(server, tmp_path, started, "file")


def test_racing_consumers_without_a_poll_lock(local_server: ServerHandle, tmp_path: Path,
                                              started: Started) -> None:
    """lock: none: the claim renames alone decide (exactly one rename of a file wins)."""
    _race(local_server, tmp_path, started, "none")


# --------------------------------------------------------------------------- dead consumers

VICTIM = """
import sys
from ftpbc.client import Client
with Client.from_config(sys.argv[1], node_id="victim") as client:
    with client.consume("ep", ack="client", timeout=30) as deliveries:
        for i, m in enumerate(deliveries, 1):
            print(m.uuid, flush=True)
            if i == int(sys.argv[2]):
                sys.stdin.read()  # holds them, unacknowledged, until it is killed
"""


def test_a_killed_consumers_deliveries_come_back_after_the_lease(server: ServerHandle, tmp_path: Path,
                                                                 started: Started) -> None:
    """A real consumer process SIGKILLed holding 4 unacknowledged deliveries: a live consumer's
    sweep returns them once the victim's heartbeat is older than the lease, and receives them
    (delivery count 2) beside the rest: 12 sent, 12 acknowledged once each, none lost."""
    repo = f"{server.fresh_dir()}/ep"
    path = _yaml(server, tmp_path, repo, redelivery_delay=0.05)
    sender = started.add(Client(_config(server, tmp_path, "sender", repo)))
    sent = _fill(sender, 12)
    out = tmp_path / "victim.out"
    with open(out, "wb") as stdout:
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(path), "4"], stdin=subprocess.PIPE,
                                  stdout=stdout, stderr=subprocess.STDOUT, env=ftpbc_env())
    try:
        wait_until(lambda: len(out.read_text().split()) >= 4, timeout=60, what="the victim's 4 deliveries")
        held = set(out.read_text().split())
        claims = area_files(server, repo, "inselect")
        assert len(claims) == 4 and all(c.endswith("~victim") for c in claims), claims
    finally:
        victim.kill()
        victim.wait(timeout=30)
        assert victim.stdin is not None
        victim.stdin.close()
    rescuer = started.add(Client(_config(server, tmp_path, "rescuer", repo)))
    got: dict[str, list[int]] = {}

    def drain() -> bool:
        d = rescuer.receive("ep", timeout=0.5)
        if d is not None:
            got.setdefault(d.uuid, []).append(d.delivery_count)
            assert d.ack()
        return len(got) == len(sent)

    wait_until(drain, timeout=60, interval=0, what="every message, the victim's after the lease")
    assert set(got) == sent
    assert {u: c for u, c in got.items() if u in held} == {u: [2] for u in held}  # redelivered once
    assert all(c == [1] for u, c in got.items() if u not in held)
    assert len(area_files(server, repo, "inarchive")) == 12
    assert not area_files(server, repo, "inbox") and not area_files(server, repo, "inselect")


# --------------------------------------------------------------------------- ftpbc receive


def test_ftpbc_receive_prints_and_acknowledges(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                               started: Started) -> None:
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    path = _yaml(handle, tmp_path, repo)
    client = started.add(Client(_config(handle, tmp_path, "sender", repo)))
    ids = [_uid(client.send("ep", body, properties={"n": i}, priority=p))
           for i, (body, p) in enumerate([(b"one", 9), (b"two\n", 8), (b"three", 1)])]
    env = ftpbc_env()

    def receive(*args: str) -> subprocess.CompletedProcess[str]:
        return run_ftpbc("receive", "-c", str(path), "--node-id", "cli", "ep", *args, env=env)

    shown = receive("--count", "2", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["id"] for r in rows] == ids[:2] and [r["body"] for r in rows] == ["one", "two\n"]
    assert rows[0]["headers"]["priority"] == 9 and rows[0]["properties"] == {"n": 0}
    assert rows[0]["headers"]["delivery_count"] == 0
    assert len(area_files(handle, repo, "inarchive")) == 2  # acknowledged once printed
    text = receive("--selector", "n = 2")
    assert text.returncode == 0 and text.stdout == "three\n", text.stderr
    none = receive("--timeout", "0.3")
    assert none.returncode == 3 and "0 of 1 message(s)" in none.stderr
    drained = receive("--count", "0", "--timeout", "0.3")
    assert drained.returncode == 0 and drained.stdout == ""
    bad = receive("--selector", "n = ")
    assert bad.returncode == 2 and "column" in bad.stderr and bad.stderr.count("\n") == 1
    assert len(area_files(handle, repo, "inarchive")) == 3 and not area_files(handle, repo, "inbox")
    assert _pending(tmp_path, "cli") == {}


@pytest.mark.parametrize("via", ["recover", "next-run"])
@pytest.mark.parametrize("point", ["claim.after-rename", "receive.after-read", "serve.after-result"])
def test_a_consumer_killed_between_claim_and_ack_is_recovered(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                              started: Started, point: str, via: str) -> None:
    """``ftpbc receive`` SIGKILLed after its claim, after its read, or after its ack was recorded;
    then ``ftpbc recover`` or the next ``ftpbc receive`` of the same identity: a message not
    acknowledged goes back (count raised) and is received again; an acknowledged one is
    archived and never delivered again.  Either way: archived exactly once, journal empty."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    path = _yaml(handle, tmp_path, repo, redelivery_delay=0.05)
    client = started.add(Client(_config(handle, tmp_path, "sender", repo)))
    uid = _uid(client.send("ep", b"payload"))

    def receive(*args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        env = ftpbc_env({"FTPBC_CRASH_AT": crash} if crash else None)
        return run_ftpbc("receive", "-c", str(path), "--node-id", "cons", "ep", "--json", *args, env=env)

    killed = receive(crash=point)
    assert killed.returncode == -9, killed.stderr
    acked = point == "serve.after-result"
    assert (killed.stdout != "") == acked  # printed only once read, and acknowledged only once printed
    [claim] = area_files(handle, repo, "inselect")
    assert claim.endswith("~cons")
    if via == "recover":
        recovered = run_ftpbc("recover", "-c", str(path), "--node-id", "cons", env=ftpbc_env())
        assert recovered.returncode == 0, recovered.stderr
        if acked:
            assert len(area_files(handle, repo, "inarchive")) == 1 and not area_files(handle, repo, "inbox")
        else:
            [back] = area_files(handle, repo, "inbox")
            assert back.startswith(f"msg.{uid};") and _count(back) == 1
    again = receive("--timeout", "3" if acked else "20")
    if acked:
        assert again.returncode == 3 and again.stdout == "", again.stderr  # never delivered again
    else:
        assert again.returncode == 0, again.stderr
        [row] = [json.loads(line) for line in again.stdout.splitlines()]
        assert row["id"] == uid and row["body"] == "payload" and row["headers"]["delivery_count"] == 1
    [archived] = area_files(handle, repo, "inarchive")
    assert archived.startswith(f"msg.{uid}")
    assert not area_files(handle, repo, "inbox") and not area_files(handle, repo, "inselect")
    assert _pending(tmp_path, "cons") == {}
