"""``ftpbc demo`` (the whole request/response path on one machine) and ``ftpbc ftpd`` (the
embedded FTP server on its own, for docker-compose and for trying a configuration by hand)."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import click

from ftpbc.errors import ConfigError


@click.command()
@click.option("--requests", "requests", type=click.IntRange(1, 100_000), default=300, show_default=True,
              help="Send this many requests.")
@click.option("--clients", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Send from this many client threads at once.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the FTP root, journals and state in this directory for inspection.")
@click.option("--no-progress", is_flag=True, help="Do not draw the progress bar.")
def demo(requests: int, clients: int, keep: Path | None, no_progress: bool) -> None:
    """Run an FTP server, two serving nodes and a client here, and print what each node served.

    Needs no network and no setup: everything listens on 127.0.0.1 and lives in a temporary
    directory that is deleted afterwards (unless --keep).  Exits 1 if any request failed.
    """
    from tqdm import tqdm

    from ftpbc.demo import format_report, run_demo

    click.echo(f"ftpbc demo: embedded FTP server, nodes node-a and node-b, {requests} requests "
               f"from {clients} client threads", err=True)
    # A bar only on a terminal: in a log file its carriage-return frames pile up on one line.
    with tqdm(total=requests, unit="req", disable=no_progress or not sys.stderr.isatty(), leave=False) as bar:
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        report = run_demo(requests, clients, keep=keep, progress=advance)
    click.echo(format_report(report))
    for err in report.errors[:10]:
        click.echo(f"ftpbc: demo: {err}", err=True)
    if keep is not None:
        click.echo(f"exchange area, journals and state kept in {keep}")
    raise SystemExit(0 if report.ok else 1)


def _port_range(text: str | None) -> range | None:
    if not text:
        return None
    low, sep, high = text.partition("-")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a port range like 30000-30009",
                                 param_hint="--passive-ports") from None
    if not 0 < first <= last < 65536:
        raise click.BadParameter(f"{text!r} is not a port range like 30000-30009",
                                 param_hint="--passive-ports")
    return range(first, last + 1)


@click.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Serve this directory as '/' (created if missing).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen on this address.")
@click.option("--port", type=click.IntRange(0, 65535), default=2121, show_default=True,
              help="Listen on this port (0: any free one).")
@click.option("--user", default="ftpbc", show_default=True, metavar="NAME[:PASSWORD]",
              help="Accept this one login.  A password given here is visible to local users in `ps`: "
                   "prefer NAME alone with the password in --password-env.")
@click.option("--password-env", default="FTPBC_FTPD_PASSWORD", show_default=True,
              help="Read the password from this environment variable when --user gives none.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Serve FTPS (explicit AUTH TLS) with this PEM certificate (and its key, or see "
                   "--tls-key); "
                   "TLS required: a login or transfer without it is refused.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Read the PEM private key from this file, when not in the --tls-cert file.")
@click.option("--implicit-tls", is_flag=True,
              help="With --tls-cert: speak TLS from the first byte (implicit FTPS).")
@click.option("--passive-ports", default=None,
              help="Open passive data connections in this port range, e.g. 30000-30009.")
@click.option("--masquerade", default=None, help="Announce this address in passive replies (behind NAT).")
def ftpd(root: Path, host: str, port: int, user: str, password_env: str, tls_cert: Path | None,
         tls_key: Path | None, implicit_tls: bool, passive_ports: str | None, masquerade: str | None) -> None:
    """Run the embedded FTP server (pyftpdlib) until SIGTERM or Ctrl-C.

    A single-user server for tests, demos and docker-compose; not hardened for the internet.
    With --tls-cert, TLS is required on the control and data connections; SITE CHMOD is never
    allowed.
    """
    from ftpbc.embedded import EmbeddedFTPServer

    name, sep, password = user.partition(":")
    if not sep:
        password = os.environ.get(password_env, "")
        if not password:
            raise ConfigError(f"no password: give --user NAME:PASSWORD or set ${password_env}",
                              key="--password-env")
    if implicit_tls and tls_cert is None:
        raise click.UsageError("--implicit-tls needs --tls-cert")
    root.mkdir(parents=True, exist_ok=True)
    server = EmbeddedFTPServer(root, password=password, user=name, host=host, port=port,
                               certfile=tls_cert, keyfile=tls_key, implicit_tls=implicit_tls,
                               passive_ports=_port_range(passive_ports), masquerade_address=masquerade)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {_reason(exc)}", key="--port") from None
    click.echo(f"ftpbc ftpd: serving {root} as {server.url}", err=True)
    started = time.monotonic()
    stop.wait()
    server.stop()
    click.echo(f"ftpbc ftpd: stopped after {time.monotonic() - started:.0f} s", err=True)


def _reason(exc: OSError) -> str:
    """Why a bind failed, in words: pyftpdlib wraps the socket's OSError in another whose
    strerror is None (it printed "None"); a port in use says so and what to do."""
    inner = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], OSError) else exc
    if inner.errno == errno.EADDRINUSE:
        return "the port is in use by another program (choose another with --port)"
    if inner.strerror:
        return inner.strerror
    return str(inner) or type(inner).__name__
