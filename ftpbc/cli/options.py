"""Options the message commands share: per-message headers and properties, selectors, output."""

from __future__ import annotations

import re
from typing import Any

import click

from ftpbc.cli.common import F

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?")


def typed_value(text: str) -> bool | int | float | str:
    """A ``--property`` value typed as DropboxMQ's command line types it: ``true``/``false``
    (any case) a boolean, a decimal integer that fits 64 bits an int, a decimal number with a
    point or an exponent a float, anything else text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(text):
        value = int(text)
        if -(2**63) <= value < 2**63:
            return value
        return text
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def parse_properties(values: tuple[str, ...]) -> dict[str, bool | int | float | str]:
    """``NAME=VALUE`` pairs (the value typed by :func:`typed_value`); BadParameter otherwise."""
    out: dict[str, bool | int | float | str] = {}
    for item in values:
        name, eq, raw = item.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--property")
        if name in out:
            raise click.BadParameter(f"property {name!r} given twice", param_hint="--property")
        out[name] = typed_value(raw)
    return out


def message_options(f: F) -> F:
    """``--priority``, ``--ttl``, ``--property`` (repeatable), ``--correlation-id``, ``--type``."""
    f = click.option("--type", "message_type", default=None, help="Set the message's type (JMSType).")(f)
    f = click.option("--correlation-id", default=None, help="Set the message's correlation id.")(f)
    f = click.option("--property", "properties", multiple=True, metavar="NAME=VALUE",
                     help="Add a property (repeatable); true/false is a boolean, an integer an int, a "
                          "number with a point or exponent a float, anything else text.")(f)
    f = click.option("--ttl", type=click.FloatRange(0, min_open=True), default=None,
                     help="Expire the message after this many seconds (default: the endpoint's ttl).")(f)
    f = click.option("--priority", type=click.IntRange(0, 9), default=None,
                     help="Give the message this priority, 0 (lowest) to 9 (highest) (default: the "
                          "endpoint's, 4).")(f)
    return f


def options_dict(priority: int | None, ttl: float | None, properties: tuple[str, ...],
                 correlation_id: str | None, message_type: str | None) -> dict[str, Any]:
    """The keyword arguments of Client.send/request for the options given (none: no key)."""
    out: dict[str, Any] = {}
    if priority is not None:
        out["priority"] = priority
    if ttl is not None:
        out["ttl"] = ttl
    if properties:
        out["properties"] = parse_properties(properties)
    if correlation_id is not None:
        out["correlation_id"] = correlation_id
    if message_type is not None:
        out["type"] = message_type
    return out
