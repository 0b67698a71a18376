"""What a partner learns when a handler fails: the ``error_reply`` setting of an endpoint/transfer.

A handler's exception text is written by whoever wrote the handler, for whoever debugs it: a
database URL with its password, a local path, a customer's data.  The error reply and the
``.reason`` file beside a failed message are read by partners on a shared server, so by default
(``error_reply: type``) they carry the exception's class and a reference id only::

    ValueError (ref 7f3a2c19)

and the node's log has the same reference id with the full text and the traceback, which is
where an operator answering the partner's question looks it up.  ``message`` sends the text as
well (one line, at most 2000 characters: the behaviour of releases before this setting), and
``none`` sends an empty error reply and an empty reason.
"""

from __future__ import annotations

import logging
import secrets
from typing import Literal

ErrorReply = Literal["type", "message", "none"]
#: the default: the class and a reference id, the text only in the log
DEFAULT_ERROR_REPLY: ErrorReply = "type"
#: ``message``: the text is cut to one line of this many characters
MESSAGE_LIMIT = 2000


def reference() -> str:
    """A fresh reference id: 8 hex digits, enough to find one failure in a day's logs."""
    return secrets.token_hex(4)


def failure_reason(exc: BaseException, mode: ErrorReply, *, logger: logging.Logger, what: str) -> str:
    """The reason a partner may see for ``exc`` under ``mode``; logs the whole failure.

    ``what`` says where it happened (``"quote: handler failed on req.<uuid>"``); the log line
    holds it, the reference id, the full text and the traceback.
    """
    ref = reference()
    logger.error("%s (ref %s): %s: %s", what, ref, type(exc).__name__, exc, exc_info=exc)
    if mode == "message":
        return f"{type(exc).__name__}: {exc}".replace("\r", " ").replace("\n", " ")[:MESSAGE_LIMIT]
    if mode == "none":
        return ""
    return f"{type(exc).__name__} (ref {ref})"
