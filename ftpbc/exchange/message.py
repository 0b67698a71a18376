"""Deprecated path: what a handler receives and may return, now ``ftpbc.model.message``.

Its names are importable from here still, each the very object of its new home (public ones from
:mod:`ftpbc`), with an :class:`ftpbc.FtpbcDeprecationWarning` naming that home and one line in the
node's log (see :mod:`ftpbc.deprecation`).  This module will be removed in 1.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftpbc.deprecation import moved

if TYPE_CHECKING:  # type checkers see the real names; at run time __getattr__ warns and resolves
    from ftpbc.model.message import HandlerResult as HandlerResult
    from ftpbc.model.message import Message as Message
    from ftpbc.model.message import result_bytes as result_bytes

__getattr__ = moved(__name__, {
    "HandlerResult": "ftpbc:HandlerResult",
    "Message": "ftpbc:Message",
    "result_bytes": "ftpbc.model.message:result_bytes",
}, remove_in="1.0")
