"""Options and helpers shared by the commands."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ftpbc.cli import logs

if TYPE_CHECKING:
    from ftpbc.config.models import Config

F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def config_option(f: F) -> F:
    return click.option("-c", "--config", "config_path", required=True,
                        type=click.Path(dir_okay=False),
                        help="Read the configuration from this YAML file.")(f)


def node_id_option(f: F) -> F:
    return click.option("--node-id", default=None,
                        help="Act as this node id (overrides node.id; default: the host name; request and "
                             "send take a client identity of their own, <node.id>.clientN).")(f)


def load(config_path: str, node_id: str | None = None) -> Config:
    # Imported here: ``ftpbc --help`` loads this module and need not pay for pydantic.
    from ftpbc.config.loader import load_config

    config = load_config(config_path, node_id=node_id)
    logs.set_node(config.node.id)  # json log lines carry it
    return config


#: where the log options given so far are kept: on the root context, so that one given before
#: the subcommand (``ftpbc --log-format json send``) and one after it (``ftpbc send ...
#: --log-format json``) end up in the same place, the later one winning
_LOG_META = "ftpbc.logging"


def setup_logging(default: str = "warning") -> None:
    """Logs on stderr, control characters escaped (:mod:`ftpbc.cli.logs`), at the level and in
    the format the command line gave (``--log-level``, else ``-v`` for debug; ``--log-format``;
    before or after the subcommand), else FTPBC_LOG_LEVEL and FTPBC_LOG_FORMAT, else ``default``
    and text.  The default is warning: a one-shot command's stderr carries its own messages,
    not a line per step; ``serve`` logs at info."""
    ctx = click.get_current_context(silent=True)
    given: dict[str, Any] = ctx.find_root().meta.get(_LOG_META, {}) if ctx is not None else {}
    level = given.get("log_level") or ("debug" if given.get("verbose") else None)
    logs.setup(level, given.get("log_format"), default=default)


def _log_option(ctx: click.Context, param: click.Parameter, value: str | bool | None) -> None:
    root = ctx.find_root()
    if root.meta.get(_LOG_META) is None:
        root.meta[_LOG_META] = {}
        # main() also runs in-process (tests, embedding programs): hand the root logger back
        # as it was when the command is done, not bound to a stream that may be gone by then.
        root.call_on_close(logs.reset)
    if value is not None and value is not False and param.name is not None:
        root.meta[_LOG_META][param.name] = value
    # ``serve`` sets up again once it runs, with its own default level (info)
    setup_logging()


def log_options(f: F) -> F:
    """``--log-level``, ``-v`` / ``--verbose`` and ``--log-format`` (default: FTPBC_LOG_LEVEL,
    FTPBC_LOG_FORMAT, else warning, info for ``serve``, and text).  They configure logging as
    they are parsed and pass no argument to the command; every command has them, after its
    name as well as before it (see ``ftpbc.cli.LazyGroup``).  A given ``--log-level`` wins
    over ``-v``; either wins over the environment."""
    # Eager: set up before any other option is checked, so that a usage error is reported in
    # the format asked for.
    f = click.option("--log-format", type=click.Choice(logs.FORMATS), default=None, expose_value=False,
                     is_eager=True, callback=_log_option,
                     help="Write log lines, and the final error, as text (default) or as JSON, one "
                          "object per line.")(f)
    f = click.option("-v", "--verbose", is_flag=True, default=None, expose_value=False,
                     is_eager=True, callback=_log_option, help="Log debug detail (as --log-level debug).")(f)
    return click.option("--log-level", type=click.Choice(logs.LEVELS), default=None, expose_value=False,
                        is_eager=True, callback=_log_option,
                        help="Log at this level and above on stderr (default: info for serve, warning "
                             "otherwise).")(f)


def say(word: str, message: str, error: str, *, level: str = "error") -> None:
    """One line on stderr: ``ftpbc: <word>: <message>``, or with ``--log-format json`` (or
    FTPBC_LOG_FORMAT=json) a JSON record whose ``error`` is ``error`` (an exception's type
    name) and ``level`` is ``level`` (see :func:`ftpbc.cli.logs.final_line`)."""
    click.echo(logs.final_line(word, message, error, level=level), err=True)


def add_log_options(command: click.Command) -> None:
    """Give ``command`` (and a group's subcommands) ``--log-level`` and ``--log-format`` unless
    it has them already: every command takes them, after its name as well as before it."""
    if not any(p.name == "log_level" for p in command.params):
        log_options(command)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_log_options(sub)


def read_body(data: str | None, file: str | None, stdin: bool) -> bytes:
    given = [x for x in (data is not None, file is not None, stdin) if x]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --data TEXT, --file PATH or - (standard input)")
    if data is not None:
        # An argument that is not valid in the locale's encoding reaches Python as lone
        # surrogates (surrogateescape): os.fsencode gives back the bytes that were typed.
        return os.fsencode(data)
    if file is not None:
        try:
            with open(file, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
    return sys.stdin.buffer.read()


def interrupt_on_signals() -> None:
    """From here on SIGTERM and SIGINT both raise KeyboardInterrupt, so the command ends as on
    Ctrl-C (a request withdrawn, a message in hand given back).  SIGINT is set too, not left to
    Python: a command started by a parent that ignores SIGINT (a background job of a script, some
    supervisors) inherits it ignored, and Python then never raises KeyboardInterrupt on it: the
    command would wait on, its request in the inbox.  ``ftpbc serve`` handles both the same way."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
