"""One message per id at a time: files in one inbox that share a message id.

``req.<U>``, ``req.<U>;p=9`` and ``req.<U>;.aS=b`` are three files with one id.  Exactly one is
served and answered; the others go to the error directory unread with ``duplicate message id``
in their reason files, and no error reply is sent for them (the caller of ``<U>`` is waiting for
the one real answer on ``resp.<U>``).  Checked with an in-process node on pyftpdlib and vsftpd,
and with a node SIGKILLed once the first result is recorded: after its restart that result is
delivered and no handler runs again because duplicates are waiting.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.exchange.lifecycle import DUPLICATE_REASON
from ftpbc.journal import Journal
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.chaos import ENDPOINT, Cluster, NodeProcess, load_client_config, make_cluster, read_invocations
from tests.cluster import in_process_config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

#: pyftpdlib, and a real FTP server: duplicates are decided above the transport
SERVERS = ["pyftpdlib", "vsftpd"]
#: the delivery count field of a name (``;n=1``), which a returned claim gains
DELIVERY_COUNT = re.compile(r";n=[0-9]+(?=;|$)")
#: the names the duplicates get beside the ``req.<U>`` the client sent, and their bodies
DUPLICATES = {"req.{u};p=9": b"second", "req.{u};.aS=b": b"third"}


@dataclass
class Area:
    """One test's exchange area on a server, seen from the server's own disk."""

    handle: ServerHandle
    repo: str
    seen: list[str] = field(default_factory=list)

    def files(self, directory: str) -> list[str]:
        path = self.handle.local(f"{self.repo}/{directory}")
        return sorted(p.name for p in path.iterdir()) if path.exists() else []

    def read(self, directory: str, name: str) -> bytes:
        return self.handle.local(f"{self.repo}/{directory}/{name}").read_bytes()


def plant(root: Path, name: str, body: bytes) -> None:
    """Put a complete message into ``root/inbox`` as a producer would (written aside, then
    renamed in), readable and movable by a server that runs as another user."""
    aside = root / f".{name}.part"
    aside.write_bytes(body)
    aside.chmod(0o666)
    os.rename(aside, root / "inbox" / name)


def base_name(filed: str) -> str:
    """``req.<U>;p=9`` of ``req.<U>;p=9~node~stamp`` (an archived or filed message), and of
    ``req.<U>;n=1;p=9~node~stamp``: a file a killed node held claimed comes back to the box
    with its delivery count in its name, and is still the file that was planted."""
    return DELIVERY_COUNT.sub("", filed.split("~", 1)[0])


def plain(filed: str) -> str:
    """``resp.<U>`` of ``resp.<U>;p=9~node~stamp`` (a reply keeps its request's headers)."""
    return base_name(filed).split(";", 1)[0]


def assert_duplicates_filed(files: list[str], read: Any, names: set[str]) -> None:
    """``names`` are in the error directory, each with a reason saying it is a duplicate."""
    filed = {base_name(n): n for n in files if not n.endswith(".reason")}
    assert set(filed) == names, files
    for name in names:
        reason = read(filed[name] + ".reason").decode()
        assert reason.startswith(DUPLICATE_REASON), reason


@pytest.fixture(params=SERVERS)
def area(request: pytest.FixtureRequest) -> Area:
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return Area(handle, f"{handle.fresh_dir()}/echo")


def _rig(area: Area, tmp_path: Path, workers: int, **options: Any) -> tuple[Node, Client]:
    endpoints: dict[str, dict[str, Any]] = {"echo": {"repository": area.repo, "poll_interval": 0.02,
                                                     "workers": workers, "timeout": 20, **options}}

    def handler(message: Message) -> bytes:
        area.seen.append(message.name)
        return b"re:" + message.body

    node = Node(in_process_config(area.handle, tmp_path, "prov", endpoints), handlers={"echo": handler})
    client = Client(in_process_config(area.handle, tmp_path, "cli", endpoints))
    return node, client


@pytest.fixture
def rigs(area: Area, tmp_path: Path) -> Iterator[list[Node | Client]]:
    """What a test started, stopped at the end; then both journals must be empty."""
    started: list[Node | Client] = []
    yield started
    for thing in reversed(started):
        if isinstance(thing, Node):
            assert thing.stop(drain_timeout=10), "node did not drain"
        else:
            thing.close()
    for node_id in ("prov", "cli"):
        journal = Journal(tmp_path / "journals", node_id)
        try:
            assert journal.all_pending() == {}, f"journal of {node_id} not empty"
        finally:
            journal.close()


def test_three_files_with_one_id_are_served_once(area: Area, tmp_path: Path,
                                                 rigs: list[Node | Client]) -> None:
    node, client = _rig(area, tmp_path, workers=2)
    rigs.append(client)
    uid = client.submit("echo", b"first")
    root = area.handle.local(area.repo)
    bodies = {f"req.{uid}": b"first"}
    for pattern, body in DUPLICATES.items():
        plant(root, pattern.format(u=uid), body)
        bodies[pattern.format(u=uid)] = body
    # All three wait in the inbox before the node's first listing.
    rigs.append(node)
    node.start()
    answer = client.collect("echo", uid, timeout=20)

    def settled() -> bool:
        # Each filed duplicate with its reason beside it (a reason is renamed into place whole),
        # and nothing still staged: a count alone could pair one message with another's reason.
        errors = area.files("inerror")
        filed = [n for n in errors if not n.endswith(".reason")]
        return (not any(area.files(d) for d in ("inbox", "inselect", "instage", "outstage", "outbox"))
                and len(filed) == 2 and sorted(errors) == sorted([*filed, *(n + ".reason" for n in filed)]))

    wait_until(settled, timeout=20, what="the duplicates to be filed")
    assert len(area.seen) == 1, f"the handler ran for {area.seen}"
    [served] = area.seen
    assert answer == b"re:" + bodies[served]
    assert [base_name(n) for n in area.files("inarchive")] == [served]
    assert_duplicates_filed(area.files("inerror"), lambda n: area.read("inerror", n), set(bodies) - {served})
    # One reply, and no error reply for the duplicates: none left waiting, none filed.
    assert [plain(n) for n in area.files("outarchive")] == [f"resp.{uid}"]
    assert area.files("outbox") == [] and area.files("outerror") == []


def test_a_duplicate_after_the_first_was_answered_is_filed(area: Area, tmp_path: Path,
                                                           rigs: list[Node | Client]) -> None:
    node, client = _rig(area, tmp_path, workers=1)
    rigs.extend([client, node])
    node.start()
    uid = client.submit("echo", b"first")
    assert client.collect("echo", uid, timeout=20) == b"re:first"
    # The reply is out a moment before the node ends the message's journal operation.
    wait_until(lambda: not node.runtime.journal.all_pending(), timeout=20, what="the first to be settled")
    late = f"req.{uid};p=9"
    plant(area.handle.local(area.repo), late, b"late")
    wait_until(lambda: len(area.files("inerror")) == 2 and not area.files("inselect"), timeout=20,
               what="the late duplicate to be filed")
    assert area.seen == [f"req.{uid}"]
    assert_duplicates_filed(area.files("inerror"), lambda n: area.read("inerror", n), {late})
    reason = next(n for n in area.files("inerror") if n.endswith(".reason"))
    assert "settled" in area.read("inerror", reason).decode()
    assert area.files("outbox") == [] and area.files("outerror") == []
    assert [plain(n) for n in area.files("outarchive")] == [f"resp.{uid}"]


def test_a_dead_letter_replayed_to_the_node_that_filed_it_is_served(area: Area, tmp_path: Path,
                                                                     rigs: list[Node | Client]) -> None:
    """A replay drops the expiration and the delivery count: the same message, not a duplicate
    of the one this node settled."""
    node, client = _rig(area, tmp_path, workers=1, expired="dead_letter")
    rigs.extend([client, node])
    client.runtime.lifecycle("echo")
    uid = str(uuid.uuid4())
    plant(area.handle.local(area.repo), f"msg.{uid};e=20200101T000000.000Z", b"stale")
    node.start()
    wait_until(lambda: len(area.files("indead")) == 2, timeout=20, what="the dead letter")
    letters = client.dead_letters("echo")
    [(_, outcome)] = letters.replay(letters.find([uid]))
    assert outcome.startswith("replayed"), outcome
    wait_until(lambda: area.seen == [f"msg.{uid}"], timeout=20, what="the replayed message to be served")
    wait_until(lambda: not area.files("inselect"), timeout=20, what="its commit")
    assert area.files("inerror") == []


# ---------------------------------------------------------------------- a crash between them


@pytest.fixture
def cluster(area: Area, tmp_path: Path) -> Cluster:
    handle = area.handle
    # One worker: the first message's result is recorded before any other file is claimed, so
    # the kill always comes after it, whatever the duplicates were doing then.
    return make_cluster(tmp_path / "w", url=handle.url, password=handle.password, options=handle.options,
                        repository=area.repo, server_root=handle.root, workers=1)


def test_a_recorded_result_is_not_rerun_because_a_duplicate_waits(area: Area, cluster: Cluster) -> None:
    """The node dies once the first result is recorded, the duplicates claimed or waiting;
    after its restart that result is delivered, the duplicates are filed, and no handler runs
    again."""
    with Client(load_client_config(cluster, "checker")) as checker:
        uid = checker.submit(ENDPOINT, b"first")
        root = area.handle.local(area.repo)
        bodies = {f"req.{uid}": b"first"}
        for pattern, body in DUPLICATES.items():
            plant(root, pattern.format(u=uid), body)
            bodies[pattern.format(u=uid)] = body
        crashing = NodeProcess(cluster, "n1")
        crashing.start(crash_at="serve.after-result")
        try:
            code = crashing.wait(30)
        finally:
            crashing.kill()
        assert code == -9, f"the node should have been SIGKILLed after recording; it exited {code}"
        assert read_invocations(cluster.handler_logs()).returns[uid] == 1
        node = NodeProcess(cluster, "n1")
        node.start()
        try:
            wait_until(node.ready, timeout=30, what="the node to serve")
            answer = checker.collect(ENDPOINT, uid, timeout=30)
            wait_until(lambda: len(cluster.files("inerror")) == 4 and not cluster.files("inbox")
                       and not cluster.files("inselect"), timeout=30, what="the duplicates to be filed")
        finally:
            assert node.stop() == 0
    assert read_invocations(cluster.handler_logs()).returns[uid] == 1, "a handler ran again for that id"
    [served] = [base_name(n) for n in cluster.files("inarchive")]
    assert answer == b"re:" + bodies[served]
    assert_duplicates_filed(cluster.files("inerror"), lambda n: cluster.local("inerror", n).read_bytes(),
                            set(bodies) - {served})
    assert [plain(n) for n in cluster.files("outarchive")] == [f"resp.{uid}"]
    assert cluster.leftovers() == {} and cluster.pending() == {}
