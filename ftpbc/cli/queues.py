"""``ftpbc dlq``: dead letters (list, show, replay, purge)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ftpbc.cli import HelpGroup
from ftpbc.cli.common import F, config_option, json_option, load, node_id_option

if TYPE_CHECKING:
    from ftpbc.client import Client
    from ftpbc.exchange.deadletter import DeadLetter, DeadLetters
    from ftpbc.model.selector import Selector


#: the header row ``ftpbc dlq list`` prints first in text (tab-separated, as its rows; even
#: with no row under it); --json has no header
DLQ_COLUMNS = ("id", "filed", "node", "size", "headers", "reason")
#: the header row of ``ftpbc browse`` in text (``mtime``: the file's time on the server;
#: ``--bodies`` adds indented body lines below a row, under no column)
BROWSE_COLUMNS = ("id", "mtime", "size", "headers")


def _selector_option(f: F) -> F:
    return click.option("--selector", default=None, metavar="EXPR",
                        help="Act only on the messages this JMS selector selects (docs/queues.md).")(f)


@contextmanager
def _client(config_path: str, node_id: str | None) -> Iterator[Client]:
    from ftpbc.client import Client

    with Client.with_identity(load(config_path), node_id) as client:
        yield client


def _selector(text: str | None) -> Selector | None:
    if text is None or not text.strip():
        # "" is no selector, as in JMS: `dlq purge --selector ""` still needs IDs or --all
        return None
    from ftpbc.model.selector import compile_selector

    return compile_selector(text)


def _body_json(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def _headline(env: Any) -> str:
    if env is None:
        return "(name not decodable)"
    h = env.headers
    parts = [f"priority={h.priority}", f"deliveries={h.delivery_count}"]
    for key in ("type", "correlation_id", "reply_to", "expiration"):
        value = getattr(h, key)
        if value is not None:
            shown = value.isoformat(timespec="milliseconds") if key == "expiration" else value
            parts.append(f"{key}={shown}")
    parts.extend(f"{k}={v!r}" for k, v in env.properties.items())
    return " ".join(parts)


# --------------------------------------------------------------------------- dlq


@click.group(cls=HelpGroup)
def dlq() -> None:
    """Manage dead letters: the messages an endpoint filed in indead instead of delivering them."""


def _dlq_command(f: F) -> F:
    f = json_option(f)
    f = _selector_option(f)
    f = click.argument("endpoint")(f)
    f = node_id_option(f)
    f = config_option(f)
    return f


@dlq.command("list")
@_dlq_command
def dlq_list(config_path: str, node_id: str | None, endpoint: str, selector: str | None,
             as_json: bool) -> None:
    """List ENDPOINT's dead letters, oldest first, with the reason each was filed.

    Text: a header row, then one tab-separated row per dead letter (id, filed, node, size,
    headers, reason); the count goes to stderr.  --json: a list of objects, no header."""
    sel = _selector(selector)
    with _client(config_path, node_id) as client:
        letters = client.dead_letters(endpoint).listing(sel)
    if as_json:
        click.echo(json.dumps([d.as_json() for d in letters], indent=2))
        return
    click.echo("\t".join(DLQ_COLUMNS))
    for d in letters:
        when = d.filed_at.isoformat(timespec="seconds") if d.filed_at else "?"
        reason = d.reason.splitlines()[0] if d.reason else "(no reason file)"
        click.echo(f"{d.id}\t{when}\t{d.node}\t{d.size} B\t{_headline(d.envelope)}\t{reason}")
    click.echo(f"{len(letters)} dead letter(s) in {endpoint}", err=True)


@dlq.command("show")
@_dlq_command
@click.argument("ident", metavar="ID")
def dlq_show(config_path: str, node_id: str | None, endpoint: str, selector: str | None, as_json: bool,
             ident: str) -> None:
    """Show one dead letter (ID: its message id, name or file name): headers, properties, the
    reason it was filed, then its body."""
    sel = _selector(selector)
    with _client(config_path, node_id) as client:
        letters = client.dead_letters(endpoint)
        found = letters.find([ident], sel)
        if len(found) > 1:
            raise click.UsageError(f"{ident!r} names {len(found)} dead letters; give a file name: "
                                   + ", ".join(d.file for d in found))
        letter = found[0]
        body = letters.body(letter)
    if as_json:
        click.echo(json.dumps({**letter.as_json(), **_body_json(body)}, indent=2))
        return
    when = letter.filed_at.isoformat(timespec="milliseconds") if letter.filed_at else "?"
    click.echo(f"file:       {letter.path}\nid:         {letter.id}\nfiled:      {when} by {letter.node}\n"
               f"size:       {letter.size} B\nheaders:    {_headline(letter.envelope)}\n"
               f"reason:     {letter.reason or '(no reason file)'}\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(body)
    sys.stdout.buffer.flush()


def _chosen(letters: DeadLetters, idents: tuple[str, ...], sel: Selector | None,
            every: bool) -> list[DeadLetter]:
    if not idents and sel is None and not every:
        raise click.UsageError("name the dead letters (IDs), or give --selector or --all")
    return letters.find(idents, sel) if idents else letters.listing(sel, reasons=False)


@dlq.command("replay")
@_dlq_command
@click.argument("idents", nargs=-1, metavar="[ID]...")
@click.option("--all", "every", is_flag=True, help="Act on every dead letter (within --selector, if given).")
def dlq_replay(config_path: str, node_id: str | None, endpoint: str, selector: str | None, as_json: bool,
               idents: tuple[str, ...], every: bool) -> None:
    """Put dead letters back into ENDPOINT's inbox, delivery count reset, expiration dropped.

    Each replay is journaled before its rename: one killed at any point is finished by
    ``ftpbc recover`` (or the next dlq command) with the same --node-id, and a message never
    ends up in both places or in neither.
    """
    sel = _selector(selector)
    with _client(config_path, node_id) as client:
        letters = client.dead_letters(endpoint)
        done = letters.replay(_chosen(letters, idents, sel, every))
    if as_json:
        click.echo(json.dumps([{"file": d.file, "id": d.id, "outcome": o} for d, o in done], indent=2))
    else:
        for d, outcome in done:
            click.echo(f"{d.file}: {outcome}")
    replayed = sum(1 for _, o in done if o.startswith("replayed"))
    click.echo(f"{replayed} of {len(done)} dead letter(s) replayed", err=True)
    if replayed < len(done):
        raise SystemExit(1)


@dlq.command("purge")
@_dlq_command
@click.argument("idents", nargs=-1, metavar="[ID]...")
@click.option("--all", "every", is_flag=True, help="Act on every dead letter (within --selector, if given).")
def dlq_purge(config_path: str, node_id: str | None, endpoint: str, selector: str | None, as_json: bool,
              idents: tuple[str, ...], every: bool) -> None:
    """Delete dead letters (and their reason files) for good."""
    sel = _selector(selector)
    with _client(config_path, node_id) as client:
        letters = client.dead_letters(endpoint)
        chosen = _chosen(letters, idents, sel, every)
        count = letters.purge(chosen)
    if as_json:
        click.echo(json.dumps({"purged": count, "files": [d.file for d in chosen]}, indent=2))
    else:
        click.echo(f"{count} dead letter(s) purged")


# --------------------------------------------------------------------------- browse


@click.command()
@config_option
@node_id_option
@click.argument("endpoint")
@_selector_option
@click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N",
              help="Show the first N messages (in delivery order) only.")
@click.option("--bodies", is_flag=True, help="Read and show each message's body (one download each).")
@json_option
def browse(config_path: str, node_id: str | None, endpoint: str, selector: str | None, limit: int | None,
           bodies: bool, as_json: bool) -> None:
    """List the messages waiting in ENDPOINT's inbox in delivery order (higher priority first, then
    the oldest), without claiming, moving or changing any.

    Text: a header row, then one tab-separated row per message (id, mtime, size, headers), each
    followed by its body's lines, indented, with --bodies; the count goes to stderr.  --json: a
    list of objects, no header."""
    from ftpbc.cli.logs import escape

    sel = _selector(selector)
    with _client(config_path, node_id) as client:
        found = client.browse(endpoint, sel, limit=limit, bodies=bodies)
    if as_json:
        out = []
        for w in found:
            entry = w.as_json()
            if bodies:
                entry.update(_body_json(w.body) if w.body is not None else {"body": None})
            out.append(entry)
        click.echo(json.dumps(out, indent=2))
        return
    click.echo("\t".join(BROWSE_COLUMNS))
    for w in found:
        when = w.mtime.isoformat(timespec="seconds") if w.mtime else "?"
        # Names and bodies are a producer's text: escaped, so no control character of theirs
        # reaches the terminal (a \r or an escape sequence could forge or hide a line).
        click.echo("\t".join(escape(f) for f in (w.id, when, f"{w.size} B", _headline(w.envelope))))
        if bodies:
            text = ("(not read: larger than max_message_bytes)" if w.body is None
                    else w.body.decode("utf-8", "backslashreplace"))
            for line in text.splitlines() or [""]:
                click.echo("    " + escape(line))
    click.echo(f"{len(found)} message(s) waiting in {endpoint}"
               + (f" selected by {selector!r}" if selector is not None else ""), err=True)
