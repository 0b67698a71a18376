"""Options the message commands share: per-message headers and properties, selectors, output."""

from __future__ import annotations

import re
from typing import Any

import click

from ftpbc.cli.common import F
from ftpbc.model.headers import Headers, HeaderSpec

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


class _HeaderValue(click.ParamType[Any]):
    """A header's value on the command line, read as the header table says (its ``cli``)."""

    def __init__(self, spec: HeaderSpec) -> None:
        self.spec = spec
        self.name = spec.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.spec.kind.cli(value, self.spec.name)
        except ValueError as err:
            self.fail(str(err), param, ctx)


def message_options(f: F, headers: type[Headers] = Headers) -> F:
    """``--ttl``, ``--property`` (repeatable), and one option per header the table gives a
    command-line option (``--priority``, ``--correlation-id``, ``--type``); the command gets
    each as the keyword of its header's name (None when not given)."""
    for spec in reversed(headers.table.cli):
        assert spec.cli is not None
        f = click.option(spec.cli, spec.name, type=_HeaderValue(spec), default=None,
                         metavar=spec.kind.metavar, help=spec.help)(f)
    f = click.option("--property", "properties", multiple=True, metavar="NAME=VALUE",
                     help="Add a property (repeatable); true/false is a boolean, an integer an int, a "
                          "number with a point or exponent a float, anything else text.")(f)
    f = click.option("--ttl", type=click.FloatRange(0, min_open=True), default=None,
                     help="Expire the message after this many seconds (default: the endpoint's ttl).")(f)
    return f


def options_dict(ttl: float | None, properties: tuple[str, ...], headers: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of Client.send/request for the options given (none: no key);
    ``headers`` are the header options by header name."""
    out: dict[str, Any] = {}
    if ttl is not None:
        out["ttl"] = ttl
    if properties:
        out["properties"] = parse_properties(properties)
    for name, value in headers.items():
        if value is not None:
            out[name] = value
    return out
