"""Reply-to (docs/queues.md, Reply-to): a request's ``reply_to`` names the endpoint whose outbox
gets its response; a client collecting from that endpoint receives it.  A reply_to the client
knows cannot work is refused at send; one the serving node cannot reach (its configuration
differs) gets an error reply, with the reason, in the request's own outbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.errors import RemoteHandlerError
from ftpbc.model.envelope import FtpbcCodec
from ftpbc.model.message import Message
from ftpbc.node.serve import Node
from tests.cluster import SERVER, in_process_config, node_section
from tests.servers.handle import ServerHandle
from tests.support import wait_until

FAST = {"poll_interval": 0.02, "workers": 2, "timeout": 20}


def echo(message: Message) -> bytes:
    return b"re:" + message.body


def config(handle: ServerHandle, workdir: Path, node_id: str, eps: dict[str, dict[str, Any]],
           other_server: set[str] | None = None) -> Config:
    """``eps`` on the handle's server; those in ``other_server`` on a second server entry."""
    return Config.model_validate({
        "node": node_section(workdir, node_id),
        "servers": {SERVER: handle.config(name=SERVER), "other": handle.config(name="other")},
        "endpoints": {name: {"server": "other" if name in (other_server or ()) else SERVER, **ep}
                      for name, ep in eps.items()},
    })


def files(handle: ServerHandle, repo: str, directory: str) -> list[str]:
    d = handle.local(f"{repo}/{directory}")
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_response_goes_to_the_reply_to_endpoint(server: ServerHandle, tmp_path: Path,
                                                things: list[Any]) -> None:
    base = server.fresh_dir()
    eps = {"a": {"repository": f"{base}/a", **FAST}, "b": {"repository": f"{base}/b", **FAST}}
    node = Node(in_process_config(server, tmp_path, "prov", eps), handlers={"a": echo})
    things.append(node)
    node.start()
    client = Client(in_process_config(server, tmp_path, "cli", eps))
    things.append(client)

    # request(): answered through b's outbox
    assert client.request("a", b"one", reply_to="b") == b"re:one"
    archived = files(server, f"{base}/b", "outarchive")
    assert len(archived) == 1 and archived[0].startswith("resp.")
    assert files(server, f"{base}/a", "outarchive") == []

    # submit() + collect() from b, by this client and, once it is there, by another one
    uid = client.submit("a", b"two", reply_to="b")
    assert client.collect("b", uid, timeout=20) == b"re:two"
    uid = client.submit("a", b"three", reply_to="b")
    wait_until(lambda: any(uid in n for n in files(server, f"{base}/b", "outbox")), timeout=20,
               what="the response in b's outbox")
    [name] = files(server, f"{base}/b", "outbox")
    env = FtpbcCodec().decode(name, direction="out")
    assert env is not None and env.headers.correlation_id == uid
    assert env.headers.reply_to == "a"  # the endpoint it answers for (b's sweeper leaves it alone)
    other = Client(in_process_config(server, tmp_path, "cli2", eps))
    things.append(other)
    assert other.collect("b", uid, timeout=20) == b"re:three"
    assert files(server, f"{base}/a", "outbox") == [] and files(server, f"{base}/b", "outbox") == []
    assert files(server, f"{base}/b", "outstage") == []

    # reply_to naming the request's own endpoint is the plain case
    assert client.request("a", b"four", reply_to="a") == b"re:four"


def test_transacted_request_with_reply_to(server: ServerHandle, tmp_path: Path, things: list[Any]) -> None:
    base = server.fresh_dir()
    eps = {"a": {"repository": f"{base}/a", **FAST}, "b": {"repository": f"{base}/b", **FAST}}
    node = Node(in_process_config(server, tmp_path, "prov", eps), handlers={"a": echo})
    things.append(node)
    node.start()
    client = Client(in_process_config(server, tmp_path, "cli", eps))
    things.append(client)
    with client.transaction() as tx:
        uid = tx.submit("a", b"tx", reply_to="b")
    assert client.collect("b", uid, timeout=20) == b"re:tx"


def test_reply_to_the_client_knows_is_wrong_is_refused_at_send(server: ServerHandle, tmp_path: Path,
                                                               things: list[Any]) -> None:
    base = server.fresh_dir()
    eps = {"a": {"repository": f"{base}/a", **FAST}, "far": {"repository": f"{base}/far", **FAST}}
    client = Client(config(server, tmp_path, "cli", eps, other_server={"far"}))
    things.append(client)
    with pytest.raises(ValueError, match="not an endpoint of this configuration"):
        client.request("a", b"x", reply_to="nowhere", timeout=5)
    with pytest.raises(ValueError, match="on server 'other'"):
        client.submit("a", b"x", reply_to="far")
    with pytest.raises(ValueError, match="reply_to is for requests"):
        client.send("a", b"x", reply_to="a")
    assert files(server, f"{base}/a", "inbox") == [] and files(server, f"{base}/a", "instage") == []


@pytest.mark.parametrize("why", ["unknown", "other server"])
def test_reply_to_the_node_cannot_reach_gets_an_error_reply_home(server: ServerHandle, tmp_path: Path,
                                                                 things: list[Any], why: str) -> None:
    """The client's configuration has ``b`` beside ``a``; the node's has no ``b`` (or has it on
    another server): the caller gets an error reply naming the reason, from a's outbox, and the
    request is filed in a's inerror with that reason."""
    base = server.fresh_dir()
    eps = {"a": {"repository": f"{base}/a", **FAST}, "b": {"repository": f"{base}/b", **FAST}}
    node_eps = {"a": eps["a"]} if why == "unknown" else eps
    node = Node(config(server, tmp_path, "prov", node_eps,
                       other_server=set() if why == "unknown" else {"b"}), handlers={"a": echo})
    things.append(node)
    node.start()
    client = Client(in_process_config(server, tmp_path, "cli", eps))
    things.append(client)
    with pytest.raises(RemoteHandlerError, match="reply_to 'b'") as caught:
        client.request("a", b"lost?", reply_to="b", timeout=20)
    assert ("names no endpoint" if why == "unknown" else "on server 'other'") in str(caught.value)
    errors = files(server, f"{base}/a", "inerror")
    assert len(errors) == 2 and any(n.endswith(".reason") for n in errors)
    reason = next(n for n in errors if n.endswith(".reason"))
    assert "reply_to 'b'" in (server.local(f"{base}/a/inerror/{reason}").read_text())
    assert files(server, f"{base}/b", "outbox") == [] and files(server, f"{base}/a", "outbox") == []
