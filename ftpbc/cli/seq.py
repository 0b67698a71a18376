"""``ftpbc seq``: show and set persisted sequences.

A sequence is named as a pattern refers to it::

    myseq  or  %{myseq}        global named sequence (shared state directory)
    quote:%{3}                 endpoint "quote"'s cluster-wide counter 3 (shared state directory)
    quote:%3                   endpoint "quote"'s counter 3 on THIS node (node.journal_dir)

``set`` takes the same locks as a running node, so it is safe while nodes run, but a value set
below what was already handed out makes names repeat: set start values before first use.
"""

from __future__ import annotations

import click

from ftpbc.cli.common import config_option, load, node_id_option
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


@click.group()
@config_option
@node_id_option
@click.pass_context
def seq(ctx: click.Context, config_path: str, node_id: str | None) -> None:
    """Show or set persisted sequence numbers (%0-%9, %{0}-%{9}, %{name}).

    Node-local counters (%0-%9) belong to one node id: give --node-id to see a node's own.
    """
    ctx.obj = load(config_path, node_id)


@seq.command()
@click.argument("name", required=False)
@click.pass_obj
def show(config: Config, name: str | None) -> None:
    """List sequences and the value each will hand out next (or only NAME)."""
    store = store_for(config)
    if name is not None:
        kind, endpoint, key = parse_name(config, name)
        click.echo(f"{name}\t{store.get(kind, endpoint, key)}\t{store.path(kind, endpoint, key)}")
        return
    rows = [("KIND", "SEQUENCE", "NEXT", "FILE")]
    for info in store.list():
        label = info.token if info.endpoint is None else f"{info.endpoint}:{info.token}"
        rows.append((info.kind, label, str(info.value), str(info.path)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3])


@seq.command(name="set")
@click.argument("name")
@click.argument("value", type=click.IntRange(min=0))
@click.pass_obj
def set_(config: Config, name: str, value: int) -> None:
    """Make sequence NAME hand out VALUE next (under the same lock as the nodes)."""
    store = store_for(config)
    kind, endpoint, key = parse_name(config, name)
    before = store.get(kind, endpoint, key)
    store.set(kind, endpoint, key, value)
    click.echo(f"{name}: {before} -> {value}  ({store.path(kind, endpoint, key)})")
