"""Deprecated path: JMS message selectors (docs/queues.md), now ``ftpbc.model.selector``.

Its names are importable from here still, each the very object of its new home (public ones from
:mod:`ftpbc`), with an :class:`ftpbc.FtpbcDeprecationWarning` naming that home and one line in the
node's log (see :mod:`ftpbc.deprecation`).  This module will be removed in 1.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftpbc.deprecation import moved

if TYPE_CHECKING:  # type checkers see the real names; at run time __getattr__ warns and resolves
    from ftpbc.model.selector import HEADER_FIELDS as HEADER_FIELDS
    from ftpbc.model.selector import MAX_DEPTH as MAX_DEPTH
    from ftpbc.model.selector import MAX_IN_LIST as MAX_IN_LIST
    from ftpbc.model.selector import MAX_SELECTOR_LENGTH as MAX_SELECTOR_LENGTH
    from ftpbc.model.selector import LikeMatcher as LikeMatcher
    from ftpbc.model.selector import Selector as Selector
    from ftpbc.model.selector import SelectorError as SelectorError
    from ftpbc.model.selector import compile_selector as compile_selector

__getattr__ = moved(__name__, {
    "HEADER_FIELDS": "ftpbc.model.selector:HEADER_FIELDS",
    "MAX_DEPTH": "ftpbc.model.selector:MAX_DEPTH",
    "MAX_IN_LIST": "ftpbc.model.selector:MAX_IN_LIST",
    "MAX_SELECTOR_LENGTH": "ftpbc.model.selector:MAX_SELECTOR_LENGTH",
    "LikeMatcher": "ftpbc.model.selector:LikeMatcher",
    "Selector": "ftpbc:Selector",
    "SelectorError": "ftpbc:SelectorError",
    "compile_selector": "ftpbc:compile_selector",
}, remove_in="1.0")
