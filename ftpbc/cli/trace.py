"""``ftpbc trace``: where a message is and was (docs/tracing.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click

from ftpbc.cli.common import config_option, json_option, load
from ftpbc.cli.logs import escape


def _when(key: str, text: str | None, now: datetime) -> datetime | None:
    if text is None:
        return None
    from ftpbc.exchange.trace import parse_when

    try:
        return parse_when(text, now=now, key=key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=key) from None


@click.command(short_help="Show where a message is and was: every place, in time order.")
@config_option
@click.argument("message_id", required=False)
@click.option("--correlation", "correlation_id", default=None, metavar="ID",
              help="Trace the messages with this correlation id instead (a request and its reply).")
@click.option("--where", default=None, metavar="EXPR",
              help="Trace the messages this JMS selector selects (docs/queues.md), e.g. \"orderId = '42'\".")
@click.option("--since", default=None, metavar="TIME",
              help="Only sightings at or after TIME: ISO 8601 (UTC unless a zone is given) or an "
                   "age (2h, 7d).")
@click.option("--until", default=None, metavar="TIME", help="Only sightings at or before TIME (as --since).")
@click.option("--journal", "journals", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Also read this node journal directory (a node.journal_dir, or one node's); repeatable.")
@json_option
def trace(config_path: str, message_id: str | None, correlation_id: str | None, where: str | None,
          since: str | None, until: str | None, journals: tuple[str, ...], as_json: bool) -> None:
    """Show every place MESSAGE_ID is or was, in time order, across the endpoints, topics,
    subscriptions and routes of the configuration: staged, waiting, claimed by which node,
    served (when, after how long), answered, collected, failed, expired or dead-lettered (with
    the reason beside it), its replays and what it replays.  Reads only: nothing is moved.

    Exit status: 0 when it was found somewhere, 1 when it was found nowhere, 2 on an error."""
    from ftpbc.exchange.trace import Query, Tracer, text

    config = load(config_path)  # a configuration that cannot be read is the first thing said
    if not (message_id or correlation_id or where):
        raise click.UsageError("give a MESSAGE_ID, --correlation ID or --where EXPR")
    now = datetime.now(UTC)
    try:
        query = Query(message_id, correlation_id, where, _when("--since", since, now),
                      _when("--until", until, now))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    with Tracer(config, journals=[Path(j) for j in journals]) as tracer:
        found = tracer.trace(query)
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=1))
    else:
        # Names, reasons and properties come from the exchange area: a control character there
        # must not repaint the operator's terminal (JSON escapes them itself).
        click.echo(escape(text(found), keep_newlines=True))
    if not found.sightings:
        raise SystemExit(1)
