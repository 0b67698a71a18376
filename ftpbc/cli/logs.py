"""Log setup for the commands: level, ``text`` or ``json`` lines, control characters escaped.

A file name or a server's reply text goes into log messages as it came; a ``\\r``, a line break
or an ANSI escape (``\\x1b[31m``) in it could otherwise forge a log line or repaint a terminal.
Both formats escape every control character (C0, DEL, C1, Unicode line and paragraph separators,
bidirectional overrides) in the formatted message, as ``\\r``, ``\\n``, ``\\t`` or ``\\xNN`` /
``\\uNNNN``; a traceback keeps its line breaks (text) or becomes the ``exc`` field (json).

``json``: one object per line with ``time`` (UTC, ISO 8601, milliseconds), ``level``,
``logger``, ``node``, ``message``, and ``endpoint`` / ``message_id`` / ``event`` when the log
call passes them (``extra={"endpoint": ..., "message_id": ..., "event": ...}``); a provider's
threads name their endpoint, so ``endpoint`` is filled in for their lines too.

Environment: ``FTPBC_LOG_LEVEL`` and ``FTPBC_LOG_FORMAT`` set the defaults of every command.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from datetime import UTC, datetime

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LEVEL_ENV = "FTPBC_LOG_LEVEL"
FORMAT_ENV = "FTPBC_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
#: worker and poller threads of a provider: ``ftpbc-<endpoint>_<n>``, ``poller-<endpoint>``
_THREAD_ENDPOINT = re.compile(r"^(?:ftpbc-(?P<worker>.+)_\d+|poller-(?P<poller>.+))$")

_node: str | None = None
_node_lock = threading.Lock()


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character written out (``\\r``, ``\\x1b``, ``\\u2028``...)."""
    def one(m: re.Match[str]) -> str:
        c = m.group()
        if keep_newlines and c == "\n":
            return c
        if c in _NAMED:
            return _NAMED[c]
        return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
    return _CONTROL.sub(one, text)


def set_node(node_id: str | None) -> None:
    """The node id json lines carry (the configuration's, once it is loaded)."""
    global _node
    with _node_lock:
        _node = node_id


def endpoint_of(record: logging.LogRecord) -> str | None:
    """The endpoint a record is about: its ``extra`` if given, else its provider thread's."""
    given = getattr(record, "endpoint", None)
    if given is not None:
        return str(given)
    m = _THREAD_ENDPOINT.match(record.threadName or "")
    return (m.group("worker") or m.group("poller")) if m else None


class TextFormatter(logging.Formatter):
    """The usual text line, its message escaped (a traceback keeps its line breaks)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: object) -> str:
        return escape(super().formatException(ei), keep_newlines=True)  # type: ignore[arg-type]


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module's documentation)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": getattr(record, "node", None) or _node,
            "message": escape(record.getMessage()),
        }
        endpoint = endpoint_of(record)
        if endpoint is not None:
            out["endpoint"] = escape(endpoint)
        message_id = getattr(record, "message_id", None)
        if message_id is not None:
            out["message_id"] = escape(str(message_id))
        event = getattr(record, "event", None)  # a message's outcome (served, failed, ...)
        if event is not None:
            out["event"] = escape(str(event))
        error = getattr(record, "error", None)  # the type of the error a command ends with
        if error is not None:
            out["error"] = escape(str(error))
        if record.exc_info:
            out["exc"] = escape(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def setup(level: str | None = None, fmt: str | None = None, *, verbose: bool = False,
          default: str = "info") -> None:
    """Configure the root logger on stderr.  ``level``/``fmt`` None: the environment's
    (``FTPBC_LOG_LEVEL``, ``FTPBC_LOG_FORMAT``), else ``default`` (debug with ``verbose``) and text."""
    level = (level or os.environ.get(LEVEL_ENV) or ("debug" if verbose else default)).lower()
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    global _format_given
    _format_given = _format_given or fmt is not None
    fmt = (fmt or os.environ.get(FORMAT_ENV) or "text").lower()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    global _format
    _format = fmt
    root = logging.getLogger()
    global _level_before
    if _level_before is None:
        _level_before = root.level
    _remove_handlers(root)
    handler._ftpbc = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    for noisy in ("paramiko", "pyftpdlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


#: the root logger's level before :func:`setup` first changed it (None: not changed)
_level_before: int | None = None
#: the format :func:`setup` last chose, kept by :func:`reset` (a command's final error is
#: written after its context, and with it the log handler, is gone); None: none since
#: :func:`forget_format`
_format: str | None = None
#: whether a :func:`setup` since :func:`forget_format` was given a format (the command line's)
_format_given = False


def forget_format() -> None:
    """Start afresh: :func:`final_line` follows the next :func:`setup` (or the environment)."""
    global _format, _format_given
    _format = None
    _format_given = False


def format_given() -> bool:
    """Whether the command line's format reached :func:`setup` since :func:`forget_format`."""
    return _format_given


def use_format(fmt: str) -> None:
    """Write the final line in ``fmt`` (one of :data:`FORMATS`): the format a command line asked
    for when it failed before its log options were taken."""
    global _format
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    _format = fmt


def current_format() -> str:
    """The format the last :func:`setup` chose, else FTPBC_LOG_FORMAT's if valid, else text."""
    if _format is not None:
        return _format
    env = (os.environ.get(FORMAT_ENV) or "").lower()
    return env if env in FORMATS else "text"


def final_line(word: str, message: str, error: str, *, level: str = "error") -> str:
    """The line a command ends with on stderr: ``ftpbc: <word>: <message>`` in text, else one
    JSON object as :class:`JsonFormatter` writes it (logger ``ftpbc.cli``), with ``error`` the
    error's type (an exception class name).  The text form is not escaped here: callers escape
    what came from others, as they always have."""
    if current_format() != "json":
        return f"ftpbc: {word}: {message}"
    record = logging.LogRecord("ftpbc.cli", getattr(logging, level.upper()), "", 0, "%s", (message,), None)
    record.error = error
    return JsonFormatter().format(record)


def _remove_handlers(root: logging.Logger) -> None:
    for old in list(root.handlers):
        if getattr(old, "_ftpbc", False):
            root.removeHandler(old)


def reset() -> None:
    """Undo :func:`setup`: its handler removed, the root logger's level as it was before."""
    global _level_before
    root = logging.getLogger()
    _remove_handlers(root)
    if _level_before is not None:
        root.setLevel(_level_before)
        _level_before = None
