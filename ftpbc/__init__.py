"""ftpbc: exchange messages, one-way and request/response, through files on FTP, FTPS and SFTP
servers or a shared directory, with any number of cluster nodes competing for the work.

**The public API is what this module exports** (``__all__``), plus the module
:mod:`ftpbc.errors`.  Import from here:

    from ftpbc import Client, Message, Node, RequestTimeout

* a handler receives a `Message` and returns a `HandlerResult`; `Message.headers` is a
  `Headers`, `Message.properties` maps names to `PropertyValue`;
* a client script uses `Client` (made from a `Config`, or `Client.from_config`), whose sends
  take `MessageOptions` and whose pulls, subscriptions, transactions, browsing, dead-letter
  views and traces give `Delivery`, `Consumer` (acknowledging as an `AckMode` says),
  `Subscription`, `Transaction`, `Waiting`, `DeadLetters`, `DeadLetter`, `Trace` and
  `Sighting`; selectors are text or a `Selector` from `compile_selector`;
* an operator script serving endpoints in-process uses `Node` with `Handler` functions;
* every error ftpbc raises on purpose is an `FtpbcError`; the classes are exported here and in
  :mod:`ftpbc.errors` (`UnknownSubscription` here only).

The type aliases: `HandlerResult` is what a handler may return (bytes, bytearray, str or
None); `Handler` a function from `Message` to that; `PropertyValue` the type of a message
property (bool, int, float or str); `AckMode` a consumer's acknowledgement mode (``"auto"``,
``"client"`` or ``"dups_ok"``, docs/queues.md).

Everything else (``ftpbc.exchange``, ``ftpbc.transport``, ``ftpbc.node``...) is internal: it may
move or change in any release without notice.  A public name that moves keeps working from its
old path for at least one minor release with an `FtpbcDeprecationWarning` (see
:mod:`ftpbc.deprecation` and CHANGELOG.md); removing or renaming a public name is a major
change.  The version is `__version__`, semantic (https://semver.org): before 1.0 a minor
release may deprecate, and removes only what was deprecated before.

Importing ``ftpbc`` is cheap: the names above are loaded on first use, so ``import ftpbc.errors``
or the ``ftpbc`` command does not pull in paramiko and pyftpdlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ftpbc.deprecation import FtpbcDeprecationWarning
from ftpbc.errors import (
    AlreadyExists,
    AuthenticationFailed,
    ConfigError,
    ConnectFailed,
    ConnectionLost,
    FtpbcError,
    HostKeyRejected,
    HostKeyRevoked,
    IncompleteRead,
    JournalError,
    MessageTooLarge,
    MissingDependency,
    NotFound,
    OutcomeUnknown,
    PatternError,
    PermissionDenied,
    ProtocolError,
    QueueFull,
    ReadPastSize,
    RemoteHandlerError,
    RequestExpired,
    RequestTimeout,
    SelectorError,
    SequenceError,
    ServerBusy,
    SessionLimit,
    SourceGone,
    TLSFailed,
    TransportError,
    TransportTimeout,
    UnknownRequest,
    UnsafeEntry,
    UnsafeNameError,
    UnsafeSource,
)

#: the release, semantic versioning; the package metadata (pyproject.toml) reads it from here
__version__ = "0.2.0"

if TYPE_CHECKING:
    from ftpbc.client import Client
    from ftpbc.config.loader import load_config
    from ftpbc.config.models import Config
    from ftpbc.exchange.browse import Waiting
    from ftpbc.exchange.consumer import AckMode, Consumer, Delivery
    from ftpbc.exchange.deadletter import DeadLetter, DeadLetters
    from ftpbc.exchange.topics import Subscription, UnknownSubscription
    from ftpbc.exchange.trace import Sighting, Trace
    from ftpbc.exchange.transaction import Transaction
    from ftpbc.model.headers import Headers, MessageOptions, PropertyValue
    from ftpbc.model.message import HandlerResult, Message
    from ftpbc.model.selector import Selector, compile_selector
    from ftpbc.node.serve import Handler, Node

#: public name -> the module that defines it (internal: a move changes this table only)
_LAZY: dict[str, str] = {
    "Client": "ftpbc.client",
    "Config": "ftpbc.config.models",
    "load_config": "ftpbc.config.loader",
    "Message": "ftpbc.model.message",
    "HandlerResult": "ftpbc.model.message",
    "Headers": "ftpbc.model.headers",
    "PropertyValue": "ftpbc.model.headers",
    "MessageOptions": "ftpbc.model.headers",
    "Delivery": "ftpbc.exchange.consumer",
    "Consumer": "ftpbc.exchange.consumer",
    "AckMode": "ftpbc.exchange.consumer",
    "Waiting": "ftpbc.exchange.browse",
    "DeadLetters": "ftpbc.exchange.deadletter",
    "DeadLetter": "ftpbc.exchange.deadletter",
    "Subscription": "ftpbc.exchange.topics",
    "UnknownSubscription": "ftpbc.exchange.topics",
    "Transaction": "ftpbc.exchange.transaction",
    "Trace": "ftpbc.exchange.trace",
    "Sighting": "ftpbc.exchange.trace",
    "Selector": "ftpbc.model.selector",
    "compile_selector": "ftpbc.model.selector",
    "Node": "ftpbc.node.serve",
    "Handler": "ftpbc.node.serve",
}

__all__ = [
    "AckMode", "AlreadyExists", "AuthenticationFailed", "Client", "Config", "ConfigError",
    "ConnectFailed", "ConnectionLost", "Consumer", "DeadLetter", "DeadLetters", "Delivery",
    "FtpbcDeprecationWarning", "FtpbcError", "Handler", "HandlerResult", "Headers", "HostKeyRejected",
    "HostKeyRevoked", "IncompleteRead", "JournalError", "Message", "MessageOptions", "MessageTooLarge",
    "MissingDependency", "Node", "NotFound", "OutcomeUnknown", "PatternError", "PermissionDenied",
    "PropertyValue", "ProtocolError", "QueueFull", "ReadPastSize", "RemoteHandlerError",
    "RequestExpired", "RequestTimeout", "Selector", "SelectorError", "SequenceError", "ServerBusy",
    "SessionLimit", "Sighting", "SourceGone", "Subscription", "TLSFailed", "Trace", "Transaction",
    "TransportError", "TransportTimeout", "UnknownRequest", "UnknownSubscription", "UnsafeEntry",
    "UnsafeNameError", "UnsafeSource", "Waiting", "__version__", "compile_selector", "load_config",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ftpbc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once; later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
