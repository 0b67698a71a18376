"""Deprecated path: headers and properties <-> file names (docs/naming.md), now ``ftpbc.model.envelope``.

Its names are importable from here still, each the very object of its new home (public ones from
:mod:`ftpbc`), with an :class:`ftpbc.FtpbcDeprecationWarning` naming that home and one line in the
node's log (see :mod:`ftpbc.deprecation`).  This module will be removed in 1.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftpbc.deprecation import moved

if TYPE_CHECKING:  # type checkers see the real names; at run time __getattr__ warns and resolves
    from ftpbc.model.envelope import DEFAULT_PRIORITY as DEFAULT_PRIORITY
    from ftpbc.model.envelope import DELIVERY_COUNT_PROPERTY as DELIVERY_COUNT_PROPERTY
    from ftpbc.model.envelope import ERROR_TYPE as ERROR_TYPE
    from ftpbc.model.envelope import EXPIRED_TYPE as EXPIRED_TYPE
    from ftpbc.model.envelope import NAME_LIMIT as NAME_LIMIT
    from ftpbc.model.envelope import RESERVED_TYPE_PREFIX as RESERVED_TYPE_PREFIX
    from ftpbc.model.envelope import TIMESTAMP_PROPERTY as TIMESTAMP_PROPERTY
    from ftpbc.model.envelope import Direction as Direction
    from ftpbc.model.envelope import DropboxmqCodec as DropboxmqCodec
    from ftpbc.model.envelope import Envelope as Envelope
    from ftpbc.model.envelope import FtpbcCodec as FtpbcCodec
    from ftpbc.model.envelope import Headers as Headers
    from ftpbc.model.envelope import Kind as Kind
    from ftpbc.model.envelope import NameCodec as NameCodec
    from ftpbc.model.envelope import NameTooLong as NameTooLong
    from ftpbc.model.envelope import PropertyValue as PropertyValue
    from ftpbc.model.envelope import UnusableName as UnusableName
    from ftpbc.model.envelope import codec_for as codec_for

__getattr__ = moved(__name__, {
    "DEFAULT_PRIORITY": "ftpbc.model.envelope:DEFAULT_PRIORITY",
    "DELIVERY_COUNT_PROPERTY": "ftpbc.model.envelope:DELIVERY_COUNT_PROPERTY",
    "ERROR_TYPE": "ftpbc.model.envelope:ERROR_TYPE",
    "EXPIRED_TYPE": "ftpbc.model.envelope:EXPIRED_TYPE",
    "NAME_LIMIT": "ftpbc.model.envelope:NAME_LIMIT",
    "RESERVED_TYPE_PREFIX": "ftpbc.model.envelope:RESERVED_TYPE_PREFIX",
    "TIMESTAMP_PROPERTY": "ftpbc.model.envelope:TIMESTAMP_PROPERTY",
    "Direction": "ftpbc.model.envelope:Direction",
    "DropboxmqCodec": "ftpbc.model.envelope:DropboxmqCodec",
    "Envelope": "ftpbc.model.envelope:Envelope",
    "FtpbcCodec": "ftpbc.model.envelope:FtpbcCodec",
    "Headers": "ftpbc:Headers",
    "Kind": "ftpbc.model.envelope:Kind",
    "NameCodec": "ftpbc.model.envelope:NameCodec",
    "NameTooLong": "ftpbc.model.envelope:NameTooLong",
    "PropertyValue": "ftpbc:PropertyValue",
    "UnusableName": "ftpbc.model.envelope:UnusableName",
    "codec_for": "ftpbc.model.envelope:codec_for",
}, remove_in="1.0")
