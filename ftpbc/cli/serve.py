"""``ftpbc serve``, ``ftpbc recover`` and ``ftpbc journal``."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from ftpbc.cli.common import config_option, load, node_id_option, setup_logging
from ftpbc.journal import Journal


@click.command()
@config_option
@node_id_option
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
def serve(config_path: str, node_id: str | None, verbose: bool) -> None:
    """Serve every endpoint that has a handler, until SIGTERM or Ctrl-C.

    Replays this node's journal first.  On SIGTERM/SIGINT it stops polling, lets in-flight
    handlers finish within each endpoint's drain_timeout, releases its locks and exits 0
    (1 if a handler was still running when the drain timeout ran out).
    """
    from ftpbc.node.serve import Node

    setup_logging(verbose)
    node = Node(load(config_path, node_id))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node.start()
    for action in node.recovered:
        click.echo(f"recovered {action}", err=True)
    if not node.providers:
        click.echo("ftpbc: warning: no endpoint has a handler; nothing to serve", err=True)
    stop.wait()
    drained = node.stop()
    raise SystemExit(0 if drained else 1)


@click.command()
@config_option
@node_id_option
def recover(config_path: str, node_id: str | None) -> None:
    """Replay this node's journal against the servers, print what was done, and exit."""
    from ftpbc.exchange.runtime import Runtime
    from ftpbc.node.serve import recover as run_recovery

    config = load(config_path, node_id)
    runtime = Runtime(config)
    try:
        actions = run_recovery(runtime)
    finally:
        runtime.close()
    for action in actions:
        click.echo(str(action))
    click.echo(f"{len(actions)} operation(s) recovered for node {config.node.id}")


@click.command()
@config_option
@node_id_option
def journal(config_path: str, node_id: str | None) -> None:
    """List this node's pending journal operations (what recovery would act on)."""
    config = load(config_path, node_id)
    directory = Path(config.node.journal_dir) / config.node.id
    pending = Journal.read_pending(Path(config.node.journal_dir), config.node.id)
    total = 0
    for endpoint, ops in pending.items():
        for op in ops:
            total += 1
            where = op.fields.get("target") or op.fields.get("dst") or op.fields.get("claim", "")
            click.echo(f"{endpoint}\t{op.op_id}\t{' > '.join(op.events)}\t{where}")
    click.echo(f"{total} pending operation(s) in {directory}")
