"""``ftpbc receive``: a pull consumer on the command line."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ftpbc.cli.common import config_option, interrupt_on_signals, json_option, node_id_option, say
from ftpbc.cli.queues import _body_json, _client, _selector, _selector_option

if TYPE_CHECKING:
    from ftpbc.exchange.consumer import Delivery

#: exit status when fewer messages than --count came in time (as ``ftpbc request``'s timeout)
TIMED_OUT = 3


@click.command()
@config_option
@node_id_option
@click.argument("endpoint")
@_selector_option
@click.option("--count", type=click.IntRange(min=0), default=1, show_default=True,
              help="Receive this many messages, then exit (0: all that come until --timeout passes "
                   "without one).")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Wait at most this many seconds for each message (default: the endpoint's timeout).")
@json_option
def receive(config_path: str, node_id: str | None, endpoint: str, selector: str | None, count: int,
            timeout: float | None, as_json: bool) -> None:
    """Receive one-way messages from ENDPOINT, print each, then acknowledge it.

    Each body is printed followed by a line break unless it ends with one; with --json, one JSON
    object per line with the message's headers and properties.  A message is acknowledged
    (archived) once printed: one being printed when the command is killed is delivered again.
    Exits 3 when fewer than --count messages came in time.
    """
    sel = _selector(selector)
    # SIGTERM ends the wait like Ctrl-C does, so the message in hand goes back at once.
    interrupt_on_signals()
    received = 0
    with _client(config_path, node_id) as client:
        wait = client.config.endpoint(endpoint).timeout if timeout is None else timeout
        try:
            with client.consume(endpoint, selector=sel, ack="client", timeout=wait) as deliveries:
                for d in deliveries:
                    _print(d, as_json)
                    if not d.ack():
                        click.echo(f"ftpbc: {d.name}: printed, but its claim had been returned meanwhile "
                                   "(this client looked dead): it will be delivered again", err=True)
                    received += 1
                    if count and received >= count:
                        break
        except KeyboardInterrupt:
            say("interrupted", "the message in hand, if any, went back to the box", "KeyboardInterrupt")
            raise SystemExit(130) from None
    if count and received < count:
        say("timeout", f"{received} of {count} message(s) received from {endpoint} "
            f"(waited {wait:g} s for the next)", "RequestTimeout")
        raise SystemExit(TIMED_OUT)


def _print(d: Delivery, as_json: bool) -> None:
    out = sys.stdout.buffer
    if as_json:
        from ftpbc.exchange.deadletter import envelope_json

        row: dict[str, Any] = {"id": d.uuid, "name": d.name, "endpoint": d.endpoint, "size": d.size,
                               **envelope_json(d.envelope), **_body_json(d.body)}
        out.write(json.dumps(row).encode("utf-8") + b"\n")
    else:
        body = d.body
        out.write(body if body.endswith(b"\n") else body + b"\n")
    # Out of this process before the ack: an ack must never come before the message is delivered.
    out.flush()

