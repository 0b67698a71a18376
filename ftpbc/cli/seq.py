"""``ftpbc seq``: show and set persisted sequences.

A sequence is named as a pattern refers to it::

    myseq  or  %{myseq}        global named sequence (shared state directory)
    quote:%{3}                 endpoint "quote"'s cluster-wide counter 3 (shared state directory)
    quote:%3                   endpoint "quote"'s counter 3 on THIS node (node.journal_dir)

``set`` takes the same locks as a running node, so it is safe while nodes run, but a value set
below what was already handed out makes names repeat: set start values before first use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import click

from ftpbc.cli import HelpGroup
from ftpbc.cli.common import F, json_option, load
from ftpbc.config.models import Config
from ftpbc.errors import PatternError
from ftpbc.patterns import Pattern
from ftpbc.patterns.grammar import Counter
from ftpbc.sequences import SequenceKind, SequenceStore, check_sequence_name


def store_for(config: Config) -> SequenceStore:
    """The store a node running ``config`` uses (see Config.sequence_dirs)."""
    return SequenceStore(*config.sequence_dirs())


def parse_name(config: Config, name: str) -> tuple[SequenceKind, str | None, str]:
    """(kind, endpoint, key) for a NAME argument; click.BadParameter if it names none."""
    endpoint: str | None = None
    token = name
    if ":" in name:
        endpoint, token = name.split(":", 1)
        known = sorted({*config.endpoints, *config.transfers})
        if endpoint not in known:
            raise click.BadParameter(f"unknown endpoint {endpoint!r} (defined: {', '.join(known) or 'none'})",
                                     param_hint="NAME")
    if "%" not in token:
        check_sequence_name(token)
        token = f"%{{{token}}}"
    try:
        tokens = Pattern.parse(token).tokens
    except PatternError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    if len(tokens) != 1 or not isinstance(tokens[0], Counter) or tokens[0].width != 1:
        raise click.BadParameter(f"{name!r}: expected one sequence: NAME, %{{NAME}}, ENDPOINT:%N "
                                 "or ENDPOINT:%{N}", param_hint="NAME")
    counter = tokens[0]
    if counter.kind == "transient":
        raise click.BadParameter("%{#} lives in a running node's memory only", param_hint="NAME")
    if counter.kind == "global":
        return "global", None, counter.key
    if endpoint is None:
        raise click.BadParameter(f"{token} is per endpoint: write ENDPOINT:{token}", param_hint="NAME")
    return counter.kind, endpoint, counter.key


def _location_options(f: F) -> F:
    """``-c`` and ``--node-id``, given to the group and to each subcommand: ``ftpbc seq -c F
    show`` and ``ftpbc seq show -c F`` both work (the subcommand's value wins)."""
    f = click.option("--node-id", default=None,
                     help="Act as this node id (overrides node.id; default: the host name).")(f)
    return click.option("-c", "--config", "config_path", default=None, type=click.Path(dir_okay=False),
                        help="Read the configuration from this YAML file.")(f)


@click.group(cls=HelpGroup)
@_location_options
@click.pass_context
def seq(ctx: click.Context, config_path: str | None, node_id: str | None) -> None:
    """Show or set persisted sequence numbers (%0-%9, %{0}-%{9}, %{name}).

    Node-local counters (%0-%9) belong to one node id: give --node-id to see a node's own.
    """
    ctx.obj = _Given(config_path, node_id)


@dataclass(frozen=True)
class _Given:
    """What the group was given, for its subcommands."""

    config_path: str | None
    node_id: str | None


def _config(config_path: str | None, node_id: str | None) -> Config:
    """The configuration the subcommand or else the group was given (-c is required on one)."""
    group = click.get_current_context().find_object(_Given) or _Given(None, None)
    path = config_path or group.config_path
    if path is None:
        raise click.UsageError("Missing option '-c' / '--config' (before or after the subcommand).")
    return load(path, node_id or group.node_id)


@seq.command()
@click.argument("name", required=False)
@_location_options
@json_option
def show(name: str | None, config_path: str | None, node_id: str | None, as_json: bool) -> None:
    """List sequences and the value each will hand out next (or only NAME)."""
    config = _config(config_path, node_id)
    store = store_for(config)
    if name is not None:
        kind, endpoint, key = parse_name(config, name)
        value, path = store.get(kind, endpoint, key), store.path(kind, endpoint, key)
        if as_json:
            click.echo(json.dumps({"name": name, "kind": kind, "endpoint": endpoint, "next": value,
                                   "file": str(path)}, indent=2))
        else:
            click.echo(f"{name}\t{value}\t{path}")
        return
    found = [{"kind": info.kind,
              "sequence": info.token if info.endpoint is None else f"{info.endpoint}:{info.token}",
              "endpoint": info.endpoint, "next": info.value, "file": str(info.path)} for info in store.list()]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [("KIND", "SEQUENCE", "NEXT", "FILE")]
    rows += [(str(f["kind"]), str(f["sequence"]), str(f["next"]), str(f["file"])) for f in found]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3])


@seq.command(name="set")
@click.argument("name")
@click.argument("value", type=click.IntRange(min=0))
@_location_options
def set_(name: str, value: int, config_path: str | None, node_id: str | None) -> None:
    """Make sequence NAME hand out VALUE next (under the same lock as the nodes)."""
    config = _config(config_path, node_id)
    store = store_for(config)
    kind, endpoint, key = parse_name(config, name)
    before = store.get(kind, endpoint, key)
    store.set(kind, endpoint, key, value)
    click.echo(f"{name}: {before} -> {value}  ({store.path(kind, endpoint, key)})")
