"""Replay from the archive (``ftpbc replay``, ``Client.replay``): archived messages in a time
window, through a selector, sent again as new messages with ids derived from the replay's and
the original's, ``ftpbc_replay_of`` and ``ftpbc_replay_id`` set, bodies unchanged; a dry run
sends nothing; a replay SIGKILLed midway and run again sends each original exactly once; bad
input is one line and a non-zero exit.

The window, the selector and the idempotence are decided above the transport, from names the
archive listing gives; they run on pyftpdlib, vsftpd and OpenSSH's sshd (the listing and the
rename-replaces contract each server keeps). The crash tests run on pyftpdlib and vsftpd.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.errors import ConfigError
from ftpbc.exchange.replay import REPLAY_ID, REPLAY_OF, Progress, copy_id, progress_path, replay_id_for
from ftpbc.model.envelope import DropboxmqCodec, Envelope, FtpbcCodec
from ftpbc.node.serve import Node
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import Seen, area_files, ftpbc_env, run_ftpbc, wait_until
from tests.test_bad_input import main_in_process

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}
SINCE = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
UNTIL = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)


def _archive(handle: ServerHandle, repo: str, name: str, stamp: str, body: bytes) -> None:
    """A served message as a node archives one: ``inarchive/<name>~<node>~<stamp>``."""
    archive = handle.local(f"{repo}/inarchive")
    archive.mkdir(parents=True, exist_ok=True)
    for made in (archive, archive.parent):  # the server's user makes the area's other directories
        made.chmod(0o777)
    (archive / f"{name}~node-x~{stamp}").write_bytes(body)


def _seed(handle: ServerHandle, repo: str) -> dict[str, bytes]:
    """Six archived messages: five in the window [SINCE, UNTIL), one before and one after it;
    the region property and the priority are what the selector tests.  Returns id -> body of
    those the selector ``region = 'eu' OR JMSPriority > 6`` takes in the window."""
    ids = [str(uuid.uuid4()) for _ in range(7)]
    rows = [
        (f"msg.{ids[0]};.regionS=eu", "20260101T000000.999Z", b"before the window"),
        (f"msg.{ids[1]};.regionS=eu", "20260101T000001.000Z", b"one \x00\xff binary"),
        (f"msg.{ids[2]};.regionS=us", "20260101T000002.000Z", b"two, not selected"),
        (f"req.{ids[3]};p=7;n=2", "20260101T000003.000Z", b"three, a request"),
        (f"msg.{ids[4]};e=20260101T000010.000Z;.regionS=eu", "20260101T000004.000Z", b"four"),
        (f"msg.{ids[5]};.regionS=eu", "20260101T000004.999Z", b""),
        (f"msg.{ids[6]};.regionS=eu", "20260101T000005.000Z", b"at the window's end: out"),
    ]
    for name, stamp, body in rows:
        _archive(handle, repo, name, stamp, body)
    return {ids[1]: rows[1][2], ids[3]: rows[3][2], ids[4]: rows[4][2], ids[5]: rows[5][2]}


def _inbox(handle: ServerHandle, repo: str) -> dict[str, tuple[Envelope, bytes]]:
    """The inbox's messages by id: envelope and body."""
    codec = FtpbcCodec()
    found = {}
    for name in area_files(handle, repo, "inbox"):
        env = codec.decode(name, direction="in")
        assert env is not None, name
        found[env.headers.id] = (env, (handle.local(f"{repo}/inbox") / name).read_bytes())
    return found


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd", "sshd"])
def test_a_window_through_a_selector_is_sent_again_as_new_messages(request: pytest.FixtureRequest, kind: str,
                                                                   tmp_path: Path, things: list[Any]) -> None:
    """Only the messages archived in [since, until) that the selector takes are sent, each once,
    as a new message: an id derived from the replay's and the original's, the original's
    headers (delivery count reset, expiration dropped) and properties, the two replay
    properties, the body byte for byte.  A dry run counts them first and sends nothing; the
    same call again sends nothing more; with the progress record lost, the copies still waiting
    are replaced, never doubled."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    repo = f"{handle.fresh_dir()}/ep"
    client = Client(in_process_config(handle, tmp_path, "ops", {"ep": {"repository": repo, **FAST}}))
    things.append(client)
    client.runtime.lifecycle("ep")
    chosen = _seed(handle, repo)
    where = "region = 'eu' OR JMSPriority > 6"

    plan, report = client.replay("ep", SINCE, UNTIL, where=where, dry_run=True)
    assert report is None and not area_files(handle, repo, "inbox")
    assert sorted(m.id for m in plan.messages) == sorted(chosen)
    assert plan.bytes == sum(len(b) for b in chosen.values())
    assert (plan.oldest, plan.newest) == (SINCE, datetime(2026, 1, 1, 0, 0, 4, 999000, tzinfo=UTC))
    assert not progress_path(tmp_path / "state", plan.replay_id).exists()  # a dry run keeps nothing

    plan, report = client.replay("ep", SINCE, UNTIL, where=where)
    assert report is not None and not report.skipped and not report.already
    assert plan.replay_id == replay_id_for("ep", "ep", SINCE, UNTIL, plan.selector)
    inbox = _inbox(handle, repo)
    assert sorted(inbox) == sorted(copy_id(plan.replay_id, i) for i in chosen)
    by_original = {str(env.properties[REPLAY_OF]): (env, body) for env, body in inbox.values()}
    assert sorted(by_original) == sorted(chosen)
    for original, (env, body) in by_original.items():
        assert body == chosen[original]
        assert env.properties[REPLAY_ID] == plan.replay_id
        assert env.headers.delivery_count == 0 and env.headers.expiration is None
    request_copy = by_original[next(i for i, b in chosen.items() if b == b"three, a request")][0]
    assert request_copy.headers.kind == "request" and request_copy.headers.priority == 7
    assert all(env.properties.get("region") == "eu"
               for env, _ in by_original.values() if env is not request_copy)

    again_plan, again = client.replay("ep", SINCE, UNTIL, where=where)
    assert again_plan.replay_id == plan.replay_id
    assert again is not None and not again.sent and sorted(again.already) == sorted(chosen)
    assert sorted(_inbox(handle, repo)) == sorted(inbox)
    # With its record lost, a rerun sends every copy again under its own name: the server's
    # rename replaces the one still waiting, so the inbox holds each copy once.
    names = area_files(handle, repo, "inbox")
    progress_path(tmp_path / "state", plan.replay_id).unlink()
    _, lost = client.replay("ep", SINCE, UNTIL, where=where)
    assert lost is not None and len(lost.sent) == len(chosen)
    assert area_files(handle, repo, "inbox") == names
    bodies = {k: body for k, (_, body) in inbox.items()}
    assert {k: body for k, (_, body) in _inbox(handle, repo).items()} == bodies


def test_the_copies_go_to_another_endpoint_and_a_replay_id_given_names_them(pyftpdlib_server: ServerHandle,
                                                                           tmp_path: Path,
                                                                           things: list[Any]) -> None:
    """``to``: the copies land in that endpoint's inbox, the source's stays empty; another
    replay id is another replay, whose copies have other ids."""
    handle = pyftpdlib_server
    base = handle.fresh_dir()
    endpoints = {"ep": {"repository": f"{base}/ep", **FAST}, "other": {"repository": f"{base}/other", **FAST}}
    client = Client(in_process_config(handle, tmp_path, "ops", endpoints))
    things.append(client)
    client.runtime.lifecycle("ep")
    chosen = _seed(handle, f"{base}/ep")
    _, first = client.replay("ep", SINCE, UNTIL, to="other", replay_id="again-1")
    _, second = client.replay("ep", SINCE, UNTIL, to="other", replay_id="again-2")
    assert first is not None and second is not None and len(first.sent) == len(second.sent) == 5
    assert not area_files(handle, f"{base}/ep", "inbox")
    copies = _inbox(handle, f"{base}/other")
    assert len(copies) == 10
    assert {str(env.properties[REPLAY_ID]) for env, _ in copies.values()} == {"again-1", "again-2"}
    assert set(chosen) < {str(env.properties[REPLAY_OF]) for env, _ in copies.values()}


def test_dropboxmq_names_are_replayed_in_their_own_grammar(pyftpdlib_server: ServerHandle, tmp_path: Path,
                                                           things: list[Any]) -> None:
    """An endpoint with DropboxMQ names: the copy is a DropboxMQ name too, its priority, class
    and properties kept, the replay properties added, its id new."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    client = Client(in_process_config(handle, tmp_path, "ops",
                                      {"ep": {"repository": repo, **FAST, "naming": "dropboxmq"}}))
    things.append(client)
    client.runtime.lifecycle("ep")
    original = "1140429201295000-9262574723"
    _archive(handle, repo, f"7.{original}.T.....regionS=eu", "20260101T000001.000Z", b"dropbox body")
    plan, report = client.replay("ep", SINCE, UNTIL)
    assert report is not None and [i for i, _ in report.sent] == [original], report
    [name] = area_files(handle, repo, "inbox")
    env = DropboxmqCodec().decode(name, direction="in")
    assert env is not None and env.headers.id == copy_id(plan.replay_id, original)
    assert (env.headers.priority, env.headers.message_class) == (7, "T")
    assert dict(env.properties) == {"region": "eu", REPLAY_OF: original, REPLAY_ID: plan.replay_id}
    assert (handle.local(f"{repo}/inbox") / name).read_bytes() == b"dropbox body"


def test_from_replays_copies_of_filed_messages_which_stay_filed(pyftpdlib_server: ServerHandle,
                                                                tmp_path: Path) -> None:
    """``--from dead`` (and ``error``): copies of the messages filed there, in the window of
    their filing stamps; the filed messages and their reason files stay, no reason file is
    taken for a message, and the archive is not read."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {"ep": {"repository": repo}})
    _archive(handle, repo, f"msg.{uuid.uuid4()}", "20260101T000001.000Z", b"served, not filed")
    filed: dict[str, dict[str, bytes]] = {}
    for kind in ("dead", "error"):
        directory = handle.local(f"{repo}/in{kind}")
        directory.mkdir(exist_ok=True)
        ident = str(uuid.uuid4())
        file = f"msg.{ident};n=5~node-x~20260101T000002.000Z"
        (directory / file).write_bytes(f"{kind} body".encode())
        (directory / f"{file}.reason").write_text("delivery 5 of 5 failed\n")
        filed[kind] = {ident: f"{kind} body".encode()}
    for kind in ("dead", "error"):
        before = area_files(handle, repo, f"in{kind}")
        done = main_in_process("replay", "-c", str(cfg), "--node-id", "ops", "ep", "--from", kind,
                               "--since", "2026-01-01", "--until", "2026-01-02", "--json")
        assert done.returncode == 0, done.stderr
        assert (json.loads(done.stdout)["count"], json.loads(done.stdout)["sent"]) == (1, 1)
        assert f"filed in in{kind} of ep" in done.stderr
        assert area_files(handle, repo, f"in{kind}") == before
    copies = {str(env.properties[REPLAY_OF]): (env, body) for env, body in _inbox(handle, repo).values()}
    assert {i: body for i, (_, body) in copies.items()} == {**filed["dead"], **filed["error"]}
    assert all(env.headers.delivery_count == 0 for env, _ in copies.values())


def test_hostile_archive_entries_are_left_out_or_reported_and_the_rest_go_on(
        pyftpdlib_server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    """A name that is no message (left out, counted unusable), a directory, a file larger than
    max_message_bytes (reported, not sent): the others are sent all the same, and a file put
    in the archive without a stamp in its name is timed by its modification time.  While one
    process runs a replay, another run of it is refused, naming its progress record."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    client = Client(in_process_config(handle, tmp_path, "ops",
                                      {"ep": {"repository": repo, **FAST, "max_message_bytes": 100}}))
    things.append(client)
    client.runtime.lifecycle("ep")
    u1, u2, u3, u4 = (str(uuid.uuid4()) for _ in range(4))
    _archive(handle, repo, f"msg.{u1}", "20260101T000001.000Z", b"ok one")
    _archive(handle, repo, f"msg.{u2}", "20260101T000002.000Z", b"x" * 101)
    _archive(handle, repo, "not-a-message", "20260101T000003.000Z", b"?")
    archive = handle.local(f"{repo}/inarchive")
    (archive / "sub~node-x~20260101T000003.000Z").mkdir()
    foreign = archive / f"msg.{u3}"
    foreign.write_bytes(b"put there by hand")
    stamp = datetime(2026, 1, 1, 0, 0, 4, tzinfo=UTC).timestamp()
    os.utime(foreign, (stamp, stamp))
    _archive(handle, repo, f"msg.{u4}", "20260101T000005.000Z", b"ok four")
    since, until = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 1, tzinfo=UTC)

    plan, _ = client.replay("ep", since, until, dry_run=True)
    assert [m.id for m in plan.messages] == [u1, u2, u3, u4] and plan.unusable == 1
    with pytest.raises(ValueError, match="timezone-aware"):
        client.replay("ep", since.replace(tzinfo=None), dry_run=True)
    held = Progress(progress_path(tmp_path / "state", plan.replay_id))
    held.open_locked()
    try:
        with pytest.raises(ConfigError, match="running in another process"):
            client.replay("ep", since, until)
    finally:
        held.close()
    assert not area_files(handle, repo, "inbox")

    _, report = client.replay("ep", since, until)
    assert report is not None
    assert [i for i, _ in report.sent] == [u1, u3, u4]
    [(skipped, why)] = report.skipped
    assert skipped == u2 and "101" in why and "100" in why
    copies = {str(env.properties[REPLAY_OF]): body for env, body in _inbox(handle, repo).values()}
    assert copies == {u1: b"ok one", u3: b"put there by hand", u4: b"ok four"}


def _served_by_original(seen: Seen) -> dict[str, int]:
    counts: dict[str, int] = {}
    with seen.lock:
        for m in seen.messages:
            original = str(m.properties.get(REPLAY_OF))
            counts[original] = counts.get(original, 0) + 1
    return counts


@pytest.mark.parametrize(("kind", "point", "signal"), [
    ("pyftpdlib", "archive-replay.after-send@2", "KILL"),
    pytest.param("pyftpdlib", "archive-replay.after-begin@3", "KILL", marks=pytest.mark.slow),
    pytest.param("pyftpdlib", "send.after-put@2", "KILL", marks=pytest.mark.slow),
    pytest.param("vsftpd", "archive-replay.after-send@3", "KILL", marks=pytest.mark.slow),
    pytest.param("pyftpdlib", "archive-replay.after-send@2", "INT", marks=pytest.mark.slow),
])
def test_a_replay_killed_midway_and_run_again_sends_each_message_once(request: pytest.FixtureRequest,
                                                                      tmp_path: Path, things: list[Any],
                                                                      kind: str, point: str,
                                                                      signal: str) -> None:
    """``ftpbc replay`` SIGKILLed (or interrupted: Ctrl-C, exit 130) at a step of one of its
    sends; a node serves what reached the inbox (so a copy sent twice would be served twice,
    not replaced in the inbox); the same command again: every archived message in the window
    is served exactly once, counted by ``ftpbc_replay_of``, and the copies the node archived
    meanwhile are not replayed again."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    repo = f"{handle.fresh_dir()}/ep"
    endpoints = {"ep": {"repository": repo, **FAST}}
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, endpoints)
    ids = [str(uuid.uuid4()) for _ in range(5)]
    for i, ident in enumerate(ids):
        _archive(handle, repo, f"msg.{ident}", f"20260101T00000{i}.000Z", f"body {i}".encode())
    command = ("replay", "-c", str(cfg), "--node-id", "ops", "ep", "--since", "2026-01-01")
    killed = run_ftpbc(*command, env=ftpbc_env({"FTPBC_CRASH_AT": point, "FTPBC_CRASH_SIGNAL": signal}))
    assert killed.returncode == (-9 if signal == "KILL" else 130), killed.stderr
    replay_id = killed.stderr.split("replay ", 1)[1].split(":", 1)[0]

    seen = Seen()
    node = Node(in_process_config(handle, tmp_path, "prov", endpoints), handlers={"ep": seen.handler})
    things.append(node)
    node.start()
    nth = int(point.rpartition("@")[2])
    # The copies before the one killed are out; the one killed after its send too.
    reached = nth if point.startswith("archive-replay.after-send") else nth - 1
    wait_until(lambda: seen.count() == reached and not area_files(handle, repo, "inbox"), timeout=20,
               what="the copies sent before the kill served")

    rerun = run_ftpbc(*command, env=ftpbc_env())
    assert rerun.returncode == 0, rerun.stderr
    assert f"replay {replay_id}:" in rerun.stderr
    assert rerun.stdout.strip().endswith(f"{5 - reached} sent, {reached} sent before, 0 not replayed")
    # Nothing waiting nor in a handler's hands: a copy sent twice would have been counted.
    wait_until(lambda: seen.count() >= 5 and not area_files(handle, repo, "inbox")
               and not area_files(handle, repo, "inselect"), timeout=20, what="every copy served")
    assert _served_by_original(seen) == dict.fromkeys(ids, 1)
    with seen.lock:
        assert sorted(seen.bodies) == sorted(f"body {i}".encode() for i in range(5))
    # A third run finds everything done, the copies the node archived since included.
    third = run_ftpbc(*command, "--json", env=ftpbc_env())
    assert third.returncode == 0, third.stderr
    done = json.loads(third.stdout)
    assert (done["count"], done["sent"], done["already"]) == (5, 0, 5)
    progress = Progress(progress_path(tmp_path / "state", replay_id))
    assert progress.done == set(ids) and not progress.in_doubt


def test_dry_run_and_bad_input_on_the_command_line(pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """(In this process: the command's own code is what the fast lane must reach.)
    ``--dry-run`` prints the count, bytes, oldest and newest and sends nothing; an unknown
    endpoint, a time that is none, an empty window, a bad selector or replay id: one line on
    stderr and a non-zero exit, nothing sent."""
    handle = pyftpdlib_server
    repo = f"{handle.fresh_dir()}/ep"
    cfg = write_config(tmp_path / "ftpbc.yaml", handle, tmp_path, {"ep": {"repository": repo}})
    chosen = _seed(handle, repo)

    def replay(*args: str) -> Any:
        return main_in_process("replay", "-c", str(cfg), "--node-id", "ops", *args)

    dry = replay("ep", "--since", "2026-01-01T00:00:01Z", "--until", "2026-01-01T00:00:05Z",
                 "--where", "region = 'eu' OR JMSPriority > 6", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert counted["count"] == 4 and counted["bytes"] == sum(len(b) for b in chosen.values())
    assert counted["oldest"] == "2026-01-01T00:00:01.000+00:00"
    assert counted["newest"] == "2026-01-01T00:00:04.999+00:00"
    text = replay("ep", "--since", "2026-01-01T00:00:01", "--until", "2026-01-01T00:00:05", "--dry-run")
    assert text.returncode == 0 and text.stdout.startswith("5 message(s), ")
    assert not area_files(handle, repo, "inbox")

    for args, says in [
        (("nowhere", "--since", "2026-01-01"), "'nowhere'"),
        (("ep", "--since", "2026-01-01", "--where", "region = "), "column 10"),
        (("ep", "--since", "2026-01-01", "--to", "elsewhere"), "'elsewhere'"),
    ]:
        bad = replay(*args)
        assert bad.returncode == 2 and says in bad.stderr, (args, bad.stderr)
        assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("ftpbc: error: "), bad.stderr
    for args, says in [
        (("ep", "--since", "yesterday-ish"), "'yesterday-ish' is no time"),
        (("ep",), "Missing option '--since'"),
        (("ep", "--since", "2026-01-02", "--until", "2026-01-01"), "is not after --since"),
        (("ep", "--since", "2026-01-01", "--replay-id", "../x"), "replay id '../x'"),
    ]:
        bad = replay(*args)  # usage errors: the usage, then the one error line
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, (args, bad.stderr)
        [line] = [x for x in bad.stderr.splitlines() if x.startswith("Error: ")]
        assert says in line, (args, bad.stderr)
    assert not area_files(handle, repo, "inbox")
