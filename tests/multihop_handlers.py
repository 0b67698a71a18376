"""Handlers of the multi-hop test (tests/test_multihop.py), imported by ``ftpbc serve`` through
``node.handler_path`` as ``multihop_handlers``.

``front`` answers a request by requesting ``back`` (served by other nodes) and wrapping its
reply: a handler that is itself a client.  Its :class:`ftpbc.Client` is made once per process,
from the configuration named by ``FTPBC_MULTIHOP_CONFIG``, with the identity
``<node id>-hop``: stable across restarts, so a node killed mid-request restarts with a client
that replays the journal the killed one left (its half-sent request rolled back, its claimed
response returned to back's outbox).
"""

from __future__ import annotations

import atexit
import os
import threading

from ftpbc.client import Client
from ftpbc.model.message import Message

CONFIG_ENV = "FTPBC_MULTIHOP_CONFIG"
#: how long front waits for back: longer than a back node's kill and restart, so a chaos run's
#: kills delay an answer but never turn it into an error reply
BACK_TIMEOUT = 90.0

_client: Client | None = None
_lock = threading.Lock()


def _hop_client() -> Client:
    global _client
    with _lock:
        if _client is None:
            node = os.environ.get("FTPBC_TEST_NODE", "node")
            _client = Client.from_config(os.environ[CONFIG_ENV], node_id=f"{node}-hop")
            atexit.register(_client.close)
        return _client


def back(message: Message) -> bytes:
    return b"back:" + message.body


def front(message: Message) -> bytes:
    return b"front:" + _hop_client().request("back", message.body, timeout=BACK_TIMEOUT)
