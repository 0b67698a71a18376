"""``ftpbc check``: is this configuration ready to run here?

For every server of the configuration it logs in, and for every endpoint on that server it lists
the repository and creates the exchange-area directories that are missing (the same directories
``ftpbc serve`` would create); it also imports each configured handler.  It prints one table row
per endpoint and, for each failure, one line naming the server and the endpoint.

On an FTP or FTPS server it also finds out, once per server, whether the server renames onto an
existing file: it uploads two one-byte probe files (``.ftpbc-check-<random>-a`` and ``-b``) into
the first endpoint's repository directory, renames the first onto the second with a single
RNFR + RNTO, and deletes what is left.  A server that refuses (ProFTPD's default
``AllowOverwrite off``) gets a warning: ftpbc then deletes the target before renaming, so
replacing a file there is not atomic, and a crash in between loses the old file.

Guaranteed: check writes nothing but missing directories and its own probe files, which it
removes again; it never moves, reads or deletes a message.  Exit status: 0 all good (warnings
included), 1 something failed, 2 the configuration itself is invalid.
Not checked: that other nodes see the same ``state_dir`` (it cannot know them).
"""

from __future__ import annotations

import io
import secrets
from contextlib import suppress
from dataclasses import dataclass, field

import click

from ftpbc.cli.common import config_option, load
from ftpbc.config.models import Config, EndpointConfig
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectFailed,
    FtpbcError,
    NotFound,
    TLSFailed,
    TransportTimeout,
)
from ftpbc.exchange.area import ExchangeArea
from ftpbc.paths import normalize
from ftpbc.transport import Transport, open_transport
from ftpbc.transport.ftp import FTPTransport

#: failures that say nothing about the endpoint: every other endpoint on the server would fail alike
SERVER_DOWN = (ConnectFailed, AuthenticationFailed, TLSFailed, TransportTimeout)

#: the warning for an FTP server that refuses RNTO onto an existing file
NO_ATOMIC_REPLACE = ("refuses to rename onto an existing file (ProFTPD: AllowOverwrite off), so ftpbc "
                     "deletes the target first: replacing a file is not atomic there and a crash in "
                     "between loses the old file; allow overwriting on the server")


@dataclass
class Row:
    server: str
    endpoint: str
    repository: str
    status: str
    handler: str
    failures: list[str]
    warnings: list[str] = field(default_factory=list)


def _check_area(transport: Transport, ep: EndpointConfig, timeout: float) -> str:
    """List the repository, create missing exchange directories; a status like ``ok, 12 dirs``."""
    area = ExchangeArea(ep.repository)
    try:
        present = {e.name for e in transport.list(area.repository, timeout=timeout) if e.is_dir}
    except NotFound:
        present = set()
    created = 0
    for d in area.all_dirs():
        if d.rsplit("/", 1)[-1] not in present:
            transport.mkdir(d, timeout=timeout)
            created += 1
    total = len(area.all_dirs())
    return f"ok, {total} dirs" + (f" ({created} created)" if created else "")


def _probe_rename(transport: Transport, directory: str, timeout: float) -> str | None:
    """A warning if the FTP server behind ``transport`` cannot rename onto an existing file.

    None when it can, and for other transports (local renames replace atomically; SFTP without
    the posix-rename extension falls back the same way, but OpenSSH has it).  The probe files
    are removed whatever happens.
    """
    if not isinstance(transport, FTPTransport):
        return None
    prefix = f"{'' if directory == '/' else directory}/.ftpbc-check-{secrets.token_hex(6)}"
    first, second = f"{prefix}-a", f"{prefix}-b"
    try:
        transport.put(first, io.BytesIO(b"a"), timeout=timeout)
        transport.put(second, io.BytesIO(b"b"), timeout=timeout)
        replaces = transport.rename_replaces(first, second, timeout=timeout)
    except FtpbcError as exc:
        return f"cannot tell whether it renames onto an existing file: {exc}"
    finally:
        for leftover in (first, second):
            with suppress(FtpbcError):
                transport.delete(leftover, timeout=timeout)
    return None if replaces else NO_ATOMIC_REPLACE


def _check_handler(config: Config, name: str, ep: EndpointConfig) -> tuple[str, str | None]:
    if ep.handler is None:
        return "- (client only)", None
    from ftpbc.node.serve import load_handler

    try:
        load_handler(ep.handler, key=f"endpoints.{name}.handler", source=config.source)
    except ConfigError as exc:
        return f"{ep.handler}: NOT importable", str(exc)
    return f"{ep.handler}: ok", None


def check_server(config: Config, server_name: str, timeout: float) -> list[Row]:
    """The rows of every endpoint on ``server_name`` (one row for a server with none)."""
    cfg: ServerConfig = config.servers[server_name]
    cfg = cfg.model_copy(update={"timeout": min(cfg.timeout, timeout), "pool_size": 1})
    label = f"{server_name} ({cfg.display})"
    endpoints = {n: ep for n, ep in config.endpoints.items() if ep.server == server_name}
    rows: list[Row] = []
    transport = open_transport(cfg)
    try:
        if not endpoints:
            try:
                transport.list(normalize(cfg.base if cfg.scheme == "file" else "/"), timeout=timeout)
                rows.append(Row(label, "-", "/", "ok (no endpoints)", "-", []))
            except FtpbcError as exc:
                rows.append(Row(label, "-", "/", "FAILED", "-", [f"server {label}: {exc}"]))
            return rows
        server_down: str | None = None
        for name, ep in sorted(endpoints.items()):
            failures: list[str] = []
            if server_down is not None:
                # One unreachable server is one failure, not one timeout per endpoint.
                status = "FAILED (server unreachable)"
                failures.append(f"server {label}, endpoint {name}: {server_down}")
            else:
                try:
                    status = _check_area(transport, ep, timeout)
                except FtpbcError as exc:
                    status = "FAILED"
                    failures.append(f"server {label}, endpoint {name}: {exc}")
                    if isinstance(exc, SERVER_DOWN):
                        server_down = str(exc)
            handler, problem = _check_handler(config, name, ep)
            if problem is not None:
                failures.append(f"server {label}, endpoint {name}: {problem}")
            rows.append(Row(label, name, ep.repository, status, handler, failures))
        # Once per server, in the first repository that is known to be there.
        ready = next((r for r in rows if r.status.startswith("ok")), None)
        if ready is not None:
            warning = _probe_rename(transport, normalize(ready.repository), timeout)
            if warning is not None:
                ready.warnings.append(f"server {label}: {warning}")
    finally:
        transport.close()
    return rows


def format_rows(rows: list[Row]) -> str:
    header = ("server", "endpoint", "repository", "status", "handler")
    cells = [header, *((r.server, r.endpoint, r.repository, r.status, r.handler) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.command()
@config_option
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds allowed per server operation (capped by the server's own timeout).")
def check(config_path: str, timeout: float) -> None:
    """Validate the configuration, log in to every server, prepare every endpoint's directories.

    Prints a table (server, endpoint, repository, status, handler) and one line per warning and
    per failure; exits 1 if anything failed.
    """
    config = load(config_path)
    rows = [row for name in sorted(config.servers) for row in check_server(config, name, timeout)]
    click.echo(format_rows(rows))
    failures = [f for r in rows for f in r.failures]
    warnings = [w for r in rows for w in r.warnings]
    for w in warnings:
        click.echo(f"ftpbc: check warning: {w}", err=True)
    for f in failures:
        click.echo(f"ftpbc: check failed: {f}", err=True)
    if failures:
        raise SystemExit(1)
    click.echo(f"{config.source}: {len(config.servers)} server(s), "
               f"{len(config.endpoints)} endpoint(s): all ok"
               + (f", {len(warnings)} warning(s)" if warnings else ""))
