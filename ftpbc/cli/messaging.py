"""``ftpbc request`` and ``ftpbc send``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ftpbc.cli.common import F, config_option, interrupt_on_signals, load, node_id_option, read_body, say
from ftpbc.cli.options import message_options, options_dict
from ftpbc.errors import FtpbcError, QueueFull, RemoteHandlerError, RequestExpired, RequestTimeout

if TYPE_CHECKING:
    from ftpbc.client import Client

#: how a message command ends when its message fails: the word its one line on stderr starts
#: with, and the exit code (their --help lists the codes)
_FAILURES: tuple[tuple[type[FtpbcError], str, int], ...] = (
    (RequestTimeout, "timeout", 3),
    (RemoteHandlerError, "error reply", 4),
    (RequestExpired, "expired", RequestExpired.exit_code),
    (QueueFull, "queue full", QueueFull.exit_code),
)


def body_options(f: F) -> F:
    """The body of a message: ``--data TEXT``, ``--file PATH`` or ``-`` (standard input)."""
    f = click.argument("stdin", required=False, type=click.Choice(["-"]))(f)
    f = click.option("--file", "file", type=click.Path(dir_okay=False),
                     help="Read the body from this file.")(f)
    f = click.option("--data", help="Send this text as the body (as typed: bytes that are not UTF-8 too).")(f)
    return f


@contextmanager
def failures_exit() -> Iterator[None]:
    """End the command on a failed message: one line on stderr and the exit code of
    :data:`_FAILURES`; a ValueError (an option the destination cannot carry) is a usage error."""
    try:
        yield
    except tuple(kind for kind, _, _ in _FAILURES) as exc:
        word, code = next((word, code) for kind, word, code in _FAILURES if isinstance(exc, kind))
        say(word, str(exc), type(exc).__name__)
        raise SystemExit(code) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def post_one_way(config_path: str, node_id: str | None, post: Callable[[Client], str]) -> None:
    """``ftpbc send`` and ``ftpbc publish``: ``post`` with a client of the configuration's
    identity, print what it returns (failures: :func:`failures_exit`)."""
    from ftpbc.client import Client

    with Client.with_identity(load(config_path), node_id) as client, failures_exit():
        click.echo(post(client))


@click.command()
@config_option
@node_id_option
@click.argument("endpoint")
@body_options
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wait this many seconds for the response (default: the endpoint's timeout).")
@message_options
def request(config_path: str, node_id: str | None, endpoint: str, data: str | None, file: str | None,
            stdin: str | None, timeout: float | None, ttl: float | None, properties: tuple[str, ...],
            **headers: Any) -> None:
    """Send a request to ENDPOINT and print the response body.

    Exits 3 when no response comes in time, 4 when the provider's handler failed, 5 when the
    request expired (its ttl ran out) before a provider served it, 6 when the endpoint's queue
    was full (max_messages, max_bytes): not sent, or filed as a dead letter (on_overflow).
    """
    from ftpbc.client import Client

    body = read_body(data, file, stdin == "-")
    options = options_dict(ttl, properties, headers)
    # SIGTERM ends the wait like Ctrl-C does, so the request is withdrawn before exiting.
    interrupt_on_signals()
    with Client.with_identity(load(config_path), node_id) as client, failures_exit():
        try:
            answer = client.request(endpoint, body, timeout=timeout, **options)
        except KeyboardInterrupt:
            say("interrupted", "the request was withdrawn unless a provider had taken it",
                "KeyboardInterrupt")
            raise SystemExit(130) from None
    sys.stdout.buffer.write(answer)
    if sys.stdout.isatty() and not answer.endswith(b"\n"):
        # On a terminal the shell prompt would follow the body on its line; piped or redirected,
        # the bytes stay exactly the response's.
        sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()


@click.command()
@config_option
@node_id_option
@click.argument("endpoint")
@body_options
@message_options
def send(config_path: str, node_id: str | None, endpoint: str, data: str | None, file: str | None,
         stdin: str | None, ttl: float | None, properties: tuple[str, ...], **headers: Any) -> None:
    """Send a one-way message to ENDPOINT (or a file to a transfer's send_to); print its remote path.

    Exits 6 when the endpoint's queue is full (max_messages, max_bytes) and on_overflow is
    reject: nothing was sent.  With on_overflow: dead_letter the message is filed in the
    dead letters instead, and the path printed is there.
    """
    body = read_body(data, file, stdin == "-")
    options = options_dict(ttl, properties, headers)
    post_one_way(config_path, node_id, lambda client: client.send(endpoint, body, **options))

