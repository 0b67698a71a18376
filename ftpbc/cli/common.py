"""Options and helpers shared by the commands."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

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
    return load_config(config_path, node_id=node_id)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("paramiko", "pyftpdlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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
