"""Deprecated path: import these from :mod:`ftpbc` (``from ftpbc import Message``).

Handlers written for ftpbc 0.1 imported ``from ftpbc.message import Message``.  That still works
and gives the same class, with an :class:`ftpbc.FtpbcDeprecationWarning` naming the public path
and one line in the node's log (see :mod:`ftpbc.deprecation`).  This module will be removed in
1.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftpbc.deprecation import moved

if TYPE_CHECKING:  # type checkers see the real names; at run time __getattr__ warns and resolves
    from ftpbc import HandlerResult as HandlerResult
    from ftpbc import Message as Message
    from ftpbc.model.message import result_bytes as result_bytes

__getattr__ = moved(__name__, {
    "Message": "ftpbc:Message",
    "HandlerResult": "ftpbc:HandlerResult",
    # internal since 0.2: how a node turns a handler's return value into the reply body
    "result_bytes": "ftpbc.model.message:result_bytes",
}, remove_in="1.0")
