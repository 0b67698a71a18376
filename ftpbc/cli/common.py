"""Options and helpers shared by the commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ftpbc.cli import logs
from ftpbc.config.loader import load_config
from ftpbc.config.models import Config

F = TypeVar("F", bound=Callable[..., Any])


def config_option(f: F) -> F:
    return click.option("-c", "--config", "config_path", required=True,
                        type=click.Path(dir_okay=False),
                        help="The YAML configuration file.")(f)


def node_id_option(f: F) -> F:
    return click.option("--node-id", default=None,
                        help="This node's identity (overrides node.id; default: the host name). "
                             "request/send default to a client identity of their own, <node.id>.clientN.")(f)


def load(config_path: str, node_id: str | None = None) -> Config:
    config = load_config(config_path, node_id=node_id)
    logs.set_node(config.node.id)  # json log lines carry it
    return config


def setup_logging(verbose: bool, level: str | None = None, fmt: str | None = None) -> None:
    """Logs on stderr, control characters escaped (:mod:`ftpbc.cli.logs`); ``level`` and ``fmt``
    default to FTPBC_LOG_LEVEL and FTPBC_LOG_FORMAT, else info (debug if verbose) and text."""
    logs.setup(level, fmt, verbose=verbose)


def log_options(f: F) -> F:
    """``--log-level`` and ``--log-format`` (default: FTPBC_LOG_LEVEL, FTPBC_LOG_FORMAT)."""
    f = click.option("--log-format", type=click.Choice(logs.FORMATS), default=None,
                     help="text (default) or json: one object per line.")(f)
    return click.option("--log-level", type=click.Choice(logs.LEVELS), default=None,
                        help="debug, info (default), warning or error.")(f)


def read_body(data: str | None, file: str | None, stdin: bool) -> bytes:
    given = [x for x in (data is not None, file is not None, stdin) if x]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --data TEXT, --file PATH or - (standard input)")
    if data is not None:
        return data.encode("utf-8")
    if file is not None:
        try:
            with open(file, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
    return sys.stdin.buffer.read()
