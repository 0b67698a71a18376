"""Dead letters: messages that exhausted max_deliveries go to indead with ``dead_letter: true``;
``Client.dead_letters`` and ``ftpbc dlq list|show|replay|purge`` (with selectors and JSON); a
replay killed at every point is finished by recovery, never losing or duplicating a message."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.journal import Journal
from ftpbc.model.envelope import FtpbcCodec
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, area_files, ftpbc_env, run_ftpbc, wait_until

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}
PAST = "20200101T000000.000Z"


def _bury(handle: ServerHandle, repo: str, name: str, stamp: str, body: bytes, reason: str | None) -> str:
    """A dead letter as a node files one: ``indead/<name>~<node>~<stamp>`` and its reason."""
    dead = handle.local(f"{repo}/indead")
    dead.mkdir(parents=True, exist_ok=True)
    dead.chmod(0o777)
    file = f"{name}~node-x~{stamp}"
    (dead / file).write_bytes(body)
    if reason is not None:
        (dead / (file + ".reason")).write_text(reason + "\n")
    return file


def _three_letters(handle: ServerHandle, repo: str) -> tuple[str, str, str]:
    u1, u2, u3 = (str(uuid.uuid4()) for _ in range(3))
    _bury(handle, repo, f"msg.{u1};n=5;.regionS=eu", "20260101T000001.000Z", b"one", "delivery 5 of 5 failed")
    _bury(handle, repo, f"req.{u2};p=7;e={PAST};.regionS=us", "20260101T000002.000Z", b"two",
          "expired at 2020-01-01")
    _bury(handle, repo, f"msg.{u3}", "20260101T000003.000Z", b"three", None)
    return u1, u2, u3


def test_exhausted_deliveries_become_dead_letters(vsftpd_server: ServerHandle, tmp_path: Path,
                                                  things: list[Any]) -> None:
    """A 0600 file vsftpd's user cannot read: with dead_letter: true it ends in indead, its name
    and headers kept, with the reason beside it; inerror stays empty."""
    handle = vsftpd_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST, "max_deliveries": 2, "redelivery_delay": 0.05,
                        "dead_letter": True}}
    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    inbox = handle.local(f"{repo}/inbox")
    wait_until(inbox.exists, what="the inbox")
    bad = f"msg.{uuid.uuid4()};p=6;.regionS=eu"
    fd = os.open(inbox / bad, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"secret")
    os.close(fd)
    wait_until(lambda: len(area_files(handle, repo, "indead")) == 2, timeout=20, what="the dead letter")
    letter, reason = area_files(handle, repo, "indead")
    assert letter.startswith(f"msg.{bad[4:40]};p=6;n=1;.regionS=eu~prov~") and reason == letter + ".reason"
    # The reason file is written after the letter is in place: its upload may still be running.
    reason_file = handle.local(f"{repo}/indead") / reason
    wait_until(lambda: reason_file.read_text().endswith("\n"), timeout=20, what="the whole reason")
    assert "delivery 2 of 2 failed" in reason_file.read_text()
    assert not area_files(handle, repo, "inerror") and not area_files(handle, repo, "inbox")
    assert not seen.names
    client = Client(in_process_config(handle, tmp_path, "cli", endpoints))
    things.append(client)
    [d] = client.dead_letters("ep").listing()
    assert d.envelope is not None and d.envelope.headers.priority == 6 and d.node == "prov"
    assert d.reason is not None and "PermissionDenied" in d.reason


def test_dead_letters_list_select_replay_and_purge(server: ServerHandle, tmp_path: Path,
                                                   things: list[Any]) -> None:
    base = server.fresh_dir()
    repo = f"{base}/ep"
    endpoints = {"ep": {"repository": repo, **FAST}}
    client = Client(in_process_config(server, tmp_path, "cli", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")
    u1, u2, u3 = _three_letters(server, repo)
    letters = client.dead_letters("ep")
    listed = letters.listing()
    assert [d.id for d in listed] == [u1, u2, u3]  # oldest filed first
    assert [d.reason for d in listed] == ["delivery 5 of 5 failed", "expired at 2020-01-01", None]
    from ftpbc.model.selector import compile_selector

    assert [d.id for d in letters.listing(compile_selector("region = 'eu' OR JMSPriority > 6"))] == [u1, u2]
    assert [d.id for d in letters.listing(compile_selector("region IS NULL"))] == [u3]
    [two] = letters.find([u2])
    assert letters.body(two) == b"two"
    done = letters.replay(letters.find([u1, u2]))
    assert [o.startswith("replayed") for _, o in done] == [True, True]
    inbox = area_files(server, repo, "inbox")
    # delivery count reset, expiration dropped, everything else kept
    assert sorted(inbox) == sorted([f"msg.{u1};.regionS=eu", f"req.{u2};p=7;.regionS=us"])
    assert [n for n in area_files(server, repo, "indead")] == [f"msg.{u3}~node-x~20260101T000003.000Z"]
    # the replayed request is served and its caller's collect gets the answer
    seen = Seen()
    node = Node(in_process_config(server, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    assert client.collect("ep", u2) == b"two"
    wait_until(lambda: seen.count() == 2, what="both replayed messages served")
    assert letters.purge(letters.listing()) == 1
    assert not area_files(server, repo, "indead")


def test_ftpbc_dlq_commands(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {"ep": {"repository": repo}})
    env = ftpbc_env()
    u1, u2, u3 = _three_letters(handle, repo)

    def dlq(*args: str) -> Any:
        return run_ftpbc("dlq", args[0], "-c", str(cfg), "--node-id", "ops", "ep", *args[1:], env=env)

    listed = dlq("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == [u1, u2, u3]
    assert rows[1]["headers"]["priority"] == 7 and rows[1]["properties"] == {"region": "us"}
    assert rows[0]["headers"]["delivery_count"] == 5 and rows[0]["reason"] == "delivery 5 of 5 failed"
    text = dlq("list", "--selector", "region = 'eu'")
    assert text.returncode == 0, text.stderr
    header, row = text.stdout.splitlines()  # a header row, then the one dead letter selected
    assert header.split("\t") == ["id", "filed", "node", "size", "headers", "reason"]
    assert row.split("\t")[0] == u1 and len(row.split("\t")) == 6
    assert row.split("\t")[-1] == "delivery 5 of 5 failed"
    shown = dlq("show", u2)
    assert shown.returncode == 0 and "expired at 2020-01-01" in shown.stdout and shown.stdout.endswith("two")
    shown_json = json.loads(dlq("show", "--json", u1).stdout)
    assert shown_json["body"] == "one" and shown_json["properties"] == {"region": "eu"}
    refused = dlq("replay")
    assert refused.returncode == 2 and "--selector or --all" in refused.stderr
    unknown = dlq("show", "nope")
    assert unknown.returncode == 2 and "no dead letter 'nope'" in unknown.stderr
    bad = dlq("list", "--selector", "region = ")
    assert bad.returncode == 2 and "column 10" in bad.stderr and bad.stderr.count("\n") == 1
    replayed = dlq("replay", "--selector", "region IS NOT NULL", "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert sorted(r["id"] for r in json.loads(replayed.stdout)) == sorted([u1, u2])
    assert len(area_files(handle, repo, "inbox")) == 2
    purged = dlq("purge", "--all")
    assert purged.returncode == 0 and "1 dead letter(s) purged" in purged.stdout
    assert not area_files(handle, repo, "indead")


@pytest.mark.parametrize("point", ["replay.after-intent", "replay.after-rename", "replay.after-intent@2",
                                   "replay.after-rename@3"])
def test_a_replay_killed_at_any_point_neither_loses_nor_duplicates(pyftpdlib_server: ServerHandle,
                                                                   tmp_path: Path, point: str) -> None:
    """``ftpbc dlq replay --all`` SIGKILLed at a step of one of three replays, then ``ftpbc
    recover`` for its node id: every message is in exactly one place, the ones before the
    crash and the one being replayed in the inbox, the rest still dead letters; no reason file
    outlives its letter and the journal is empty."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    repo = f"{base}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {"ep": {"repository": repo}})
    ids = _three_letters(handle, repo)
    killed = run_ftpbc("dlq", "replay", "-c", str(cfg), "--node-id", "ops", "ep", "--all",
                       env=ftpbc_env({"FTPBC_CRASH_AT": point}))
    assert killed.returncode == -9, killed.stderr
    recovered = run_ftpbc("recover", "-c", str(cfg), "--node-id", "ops", env=ftpbc_env())
    assert recovered.returncode == 0, recovered.stderr
    assert "replay finished" in recovered.stdout
    nth = int(point.partition("@")[2] or 1)
    codec = FtpbcCodec()
    inbox = [codec.decode(n, direction="in") for n in area_files(handle, repo, "inbox")]
    in_box = sorted(e.headers.id for e in inbox if e is not None)
    dead = area_files(handle, repo, "indead")
    letters = [n for n in dead if not n.endswith(".reason")]
    still_dead = sorted(n.split(";")[0].split("~")[0].split(".", 1)[1] for n in letters)
    assert sorted(in_box + still_dead) == sorted(ids)  # each exactly once
    assert in_box == sorted(ids[:nth]) and still_dead == sorted(ids[nth:])
    assert sorted(n for n in dead if n.endswith(".reason")) == sorted(
        n + ".reason" for n in dead if not n.endswith(".reason") and ids[2] not in n)
    journal = Journal(tmp_path / "journals", "ops")
    try:
        assert journal.all_pending() == {}
    finally:
        journal.close()
