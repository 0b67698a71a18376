"""Example handlers, importable as ``examples.handlers:<name>`` from a checkout of ftpbc.

A handler receives a :class:`ftpbc.message.Message` and returns the response body (bytes, text
or None for an empty one).  Raising an exception sends the request to ``inerror`` and the caller
gets a RemoteHandlerError carrying the exception's text.
"""

from __future__ import annotations

import hashlib
import json
import os

from ftpbc.message import Message


def echo(message: Message) -> bytes:
    """The request body, unchanged."""
    return message.body


def upper(message: Message) -> str:
    """The request text in capitals."""
    return message.text().upper()


def fail(message: Message) -> bytes:
    """Always fails: shows how a handler's exception reaches the caller."""
    raise ValueError(f"refusing {message.name}: this handler always fails")


def sha256(message: Message) -> str:
    """The SHA-256 of the body, read as a stream (works for bodies larger than memory)."""
    digest = hashlib.sha256()
    stream = message.stream
    while chunk := stream.read(1024 * 1024):
        digest.update(chunk)
    return digest.hexdigest()


def tagged(message: Message) -> str:
    """JSON naming the serving node and echoing the body, so a caller can tell who served it.

    The node is the ``FTPBC_NODE_TAG`` environment variable (the cluster tests set it to the
    ``--node-id`` of each ``ftpbc serve`` process), else the process id.
    """
    node = os.environ.get("FTPBC_NODE_TAG") or f"pid-{os.getpid()}"
    body = message.body
    return json.dumps({"node": node, "body": body.decode("utf-8"),
                       "sha256": hashlib.sha256(body).hexdigest()})
