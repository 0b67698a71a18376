"""Example handlers for ``endpoints.<name>.handler: examples.handlers:<function>``.

A handler receives a :class:`ftpbc.Message` and returns the response body (bytes or
str; None for an empty one).  Whatever it raises becomes an error reply: the caller's
``ftpbc request`` exits 4 with the reason, and the request lands in ``inerror`` with a
``.reason`` file beside it.  ``ftpbc serve`` imports these from the working directory, so run it
from the repository root (or put this directory on PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import json
import os

from ftpbc import Message

#: made-up mid prices for quote(); a real handler would ask a pricing service
PRICES: dict[str, str] = {
    "EURUSD": "1.0842",
    "GBPUSD": "1.2671",
    "USDJPY": "151.37",
    "USDCHF": "0.9013",
}


def echo(message: Message) -> bytes:
    """The request body, unchanged."""
    return message.body


def upper(message: Message) -> str:
    """The request body (UTF-8 text) in upper case."""
    return message.text().upper()


def quote(message: Message) -> str:
    """``EURUSD`` -> ``EURUSD 1.0842``; an unknown symbol is an error reply naming it."""
    symbol = message.text().strip().upper()
    if symbol not in PRICES:
        raise KeyError(f"no price for {symbol!r} (known: {', '.join(sorted(PRICES))})")
    return f"{symbol} {PRICES[symbol]}"


def fail(message: Message) -> bytes:
    """Always raises: shows what a caller sees when a handler fails."""
    raise RuntimeError(f"fail handler refuses {message.name} ({message.size} bytes) on purpose")


def tagged(message: Message) -> str:
    """JSON naming the serving node and echoing the body, so a caller can tell who served what.

    The node is the ``FTPBC_NODE_TAG`` environment variable (the cluster tests set it to each
    ``ftpbc serve`` process's ``--node-id``), else the process id.
    """
    node = os.environ.get("FTPBC_NODE_TAG") or f"pid-{os.getpid()}"
    body = message.body
    return json.dumps({"node": node, "body": body.decode("utf-8"),
                       "sha256": hashlib.sha256(body).hexdigest()})


def orders(message: Message) -> str:
    """A transfer's handler: acknowledge a partner's order file (``ORD_<id>.xml``) by name.

    ``message.values["%*0"]`` is what the wildcard of ``receive_from: .../ORD_%*.xml`` matched.
    """
    order_id = message.values.get("%*0", message.name)
    return f"<ack order='{order_id}' bytes='{message.size}'/>\n"
