"""``ftpbc check``: is this configuration ready to run here?

For every server of the configuration it logs in, and for every endpoint on that server it lists
the repository and creates the exchange-area directories that are missing (the same directories
``ftpbc serve`` would create); it also imports each configured handler.  It prints one table row
per endpoint and, for each failure, one line naming the server and the endpoint.

Guaranteed: check writes nothing but missing directories; it never moves, reads or deletes a
message.  Exit status: 0 all good, 1 something failed, 2 the configuration itself is invalid.
Not checked: that other nodes see the same ``state_dir`` (it cannot know them).
"""

from __future__ import annotations

from dataclasses import dataclass

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

#: failures that say nothing about the endpoint: every other endpoint on the server would fail alike
SERVER_DOWN = (ConnectFailed, AuthenticationFailed, TLSFailed, TransportTimeout)


@dataclass
class Row:
    server: str
    endpoint: str
    repository: str
    status: str
    handler: str
    failures: list[str]


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

    Prints a table (server, endpoint, repository, status, handler) and one line per failure;
    exits 1 if anything failed.
    """
    config = load(config_path)
    rows = [row for name in sorted(config.servers) for row in check_server(config, name, timeout)]
    click.echo(format_rows(rows))
    failures = [f for r in rows for f in r.failures]
    for f in failures:
        click.echo(f"ftpbc: check failed: {f}", err=True)
    if failures:
        raise SystemExit(1)
    click.echo(f"{config.source}: {len(config.servers)} server(s), "
               f"{len(config.endpoints)} endpoint(s): all ok")
