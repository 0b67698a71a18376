"""``ftpbc serve``, ``ftpbc recover`` and ``ftpbc journal``."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from ftpbc.cli import discard_failed_start
from ftpbc.cli.common import config_option, json_option, load, log_options, node_id_option, setup_logging
from ftpbc.config.models import CLIENT_ID_RE, Config
from ftpbc.errors import JournalError
from ftpbc.journal import Journal

if TYPE_CHECKING:
    from ftpbc.node.serve import Node
    from ftpbc.node.systemd import Notifier


@click.command()
@config_option
@node_id_option
@log_options
@click.option("--path", "handler_path", multiple=True, type=click.Path(file_okay=False),
              help="Import handler modules from this directory too (repeatable; after node.handler_path).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve /metrics, /healthz, /readyz and the status page (/) on this port "
                   "(default: node.metrics).")
def serve(config_path: str, node_id: str | None, handler_path: tuple[str, ...],
          metrics_port: int | None) -> None:
    """Serve every endpoint that has a handler, and every route, until SIGTERM or Ctrl-C.

    Replays this node's journal first.  A start-up that fails (a server down, a login refused,
    a directory it cannot make) is tried again with backoff until it succeeds, password_file
    read afresh each time; meanwhile ftpbc status and /readyz say "not serving: <why>".  On
    SIGTERM/SIGINT it stops claiming, lets in-flight handlers finish within each endpoint's
    drain_timeout, returns what is left unfinished to the inbox for other nodes, delivers
    recorded results, and exits 0 (1 if a claim could not be returned).  A second signal exits
    at once and leaves the rest to recovery at the next start.

    Handler modules are imported from node.handler_path, --path and the installed packages
    (PYTHONPATH included), never from the working directory unless one of them names it.

    Under systemd (NOTIFY_SOCKET set, Type=notify) it sends READY=1 once it serves, WATCHDOG=1
    after each heartbeat written, STOPPING=1 when it drains, and STATUS= lines saying what it
    does ("not serving: <why>"); deploy/systemd/ftpbc@.service.
    """
    from ftpbc.node.check import lease_warning
    from ftpbc.node.serve import Node

    setup_logging(default="info")
    config = load(config_path, node_id)
    tight = lease_warning(config)
    if tight is not None:
        # Logged, not printed: with --log-format json every line on stderr is a JSON record.
        logging.getLogger("ftpbc.node").warning("%s", tight)
    node = Node(config, handler_path=handler_path)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            click.echo("ftpbc: second signal: exiting now; recovery finishes the rest at the next start",
                       err=True)
            os._exit(130)
        stop.set()
        node.interrupt()  # a start-up still waiting for a server gives up

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from ftpbc.node.health import serve_configured_metrics

    metrics = serve_configured_metrics(node, metrics_port)  # /healthz answers during start-up
    notifier = _notify_systemd(node)
    try:
        node.start()
    except BaseException:
        # Refused at once (the node id is live elsewhere): the journal is let go, so that the
        # directory this start made can be removed on the way out (ftpbc.cli.main).  Not
        # node.stop(): that would remove the heartbeat file, which is the other node's.
        node.runtime.journal.close()
        raise
    if metrics is not None:
        metrics.attach()  # the providers start() built report their events from now on
    if not stop.is_set():
        notifier.ready(f"serving {', '.join(sorted(node.providers)) or 'nothing'} as node {node.node_id}")
    for action in node.recovered:
        click.echo(f"recovered {action}", err=True)
    if not node.providers and not stop.is_set():
        click.echo("ftpbc: warning: no endpoint has a handler; nothing to serve", err=True)
    stop.wait()
    notifier.stopping()
    clean = node.stop()
    if not node.served:
        # Stopped before it ever served (a server down, a login refused, all along): the
        # journal directory this start made, if it holds no record, goes with it.
        discard_failed_start()
    # Handlers abandoned at the drain timeout may still run in worker threads, which the
    # interpreter would wait for at exit; their claims are back in the box, so leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if clean else 1)


def _notify_systemd(node: Node) -> Notifier:
    """A :class:`Notifier` told of what ``node`` does (a no-op without ``$NOTIFY_SOCKET``)."""
    from ftpbc.node.systemd import Notifier, watchdog_warning

    notifier = Notifier()
    if not notifier.enabled:
        return notifier
    log = logging.getLogger("ftpbc.node")
    tight = watchdog_warning(notifier.watchdog, node.config.node.heartbeat_interval)
    if tight is not None:
        log.warning("%s", tight)
    notifier.status(f"not serving: {node.not_serving}" if node.not_serving else "starting")
    node.serving_observers.append(lambda why: notifier.status(f"not serving: {why}") if why else None)

    def on_heartbeat(held: str | None) -> None:
        # The watchdog is pet by beats actually written: a node whose loops are stuck (or whose
        # state_dir refuses the write) stops petting it, as it stops its heartbeat.
        if held is None:
            notifier.watchdog_ping()
            if node.not_serving is None:
                notifier.status(f"serving {', '.join(sorted(node.providers)) or 'nothing'} "
                                f"as node {node.node_id}")
        else:
            notifier.status(f"heartbeat stopped: {held}")

    node.runtime.heartbeat.observers.append(on_heartbeat)
    return notifier


@click.command()
@config_option
@node_id_option
def recover(config_path: str, node_id: str | None) -> None:
    """Replay this node's journal against the servers, print what was done, and exit.

    Without --node-id, the journals of this node's client identities (<node.id>.clientN, left
    by ftpbc request/send and Client) are replayed too, except those a running client holds."""
    from ftpbc.exchange.runtime import Runtime
    from ftpbc.node.serve import recover as run_recovery

    config = load(config_path, node_id)
    clients = [] if node_id else _client_ids(config)
    if not _has_journal(config, quiet=bool(clients)):
        click.echo(f"0 operation(s) recovered for node {config.node.id}")
    else:
        runtime = Runtime(config)
        try:
            actions = run_recovery(runtime)
        finally:
            runtime.close()
        for action in actions:
            click.echo(str(action))
        click.echo(f"{len(actions)} operation(s) recovered for node {config.node.id}")
    for client_id in clients:
        try:
            runtime = Runtime(config.with_node_id(client_id))
        except JournalError as exc:
            if "in use" not in str(exc):
                raise
            click.echo(f"client {client_id}: in use by a running client, which replays its own journal")
            continue
        try:
            actions = run_recovery(runtime, orphans=False)
        finally:
            runtime.close()
        for action in actions:
            click.echo(str(action))
        click.echo(f"{len(actions)} operation(s) recovered for client {client_id}")


def _client_ids(config: Config) -> list[str]:
    """The client identities of this node that have a journal directory (see Client.with_identity)."""
    journal_dir = Path(config.node.journal_dir)
    base = CLIENT_ID_RE.sub("", config.node.id)[:54]
    pattern = re.compile(re.escape(base) + r"\.client\d+")
    found = [p.name for p in journal_dir.iterdir() if p.is_dir() and pattern.fullmatch(p.name)] \
        if journal_dir.is_dir() else []
    return sorted(found, key=lambda name: int(name.rsplit("client", 1)[1]))


@click.command()
@config_option
@node_id_option
@json_option
def journal(config_path: str, node_id: str | None, as_json: bool) -> None:
    """List this node's pending journal operations (what recovery would act on), then any
    damaged records, set aside or still to be (one line each: what recovery went without)."""
    config = load(config_path, node_id)
    directory = Path(config.node.journal_dir) / config.node.id
    # With --json, stdout is the document alone; the hint about other node ids stays on stderr.
    found = _has_journal(config)
    pending = Journal.read_pending(Path(config.node.journal_dir), config.node.id) if found else {}
    problems = Journal.read_problems(Path(config.node.journal_dir), config.node.id) if found else []
    rows = [{"endpoint": endpoint, "op_id": op.op_id, "events": list(op.events),
             "where": op.fields.get("target") or op.fields.get("dst") or op.fields.get("claim", "")}
            for endpoint, ops in pending.items() for op in ops]
    if as_json:
        click.echo(json.dumps({"node": config.node.id, "directory": str(directory), "pending": rows,
                               "problems": problems}, indent=2))
        return
    for row in rows:
        click.echo(f"{row['endpoint']}\t{row['op_id']}\t{' > '.join(row['events'])}\t{row['where']}")
    click.echo(f"{len(rows)} pending operation(s) in {directory}")
    for problem in problems:
        click.echo(problem)


def _has_journal(config: Config, *, quiet: bool = False) -> bool:
    """False, having said on stderr (unless ``quiet``) which node ids do have journals in
    journal_dir, when this node has none (a typo, or another host's default id)."""
    journal_dir = Path(config.node.journal_dir)
    if (journal_dir / config.node.id).is_dir():
        return True
    if quiet:
        return False
    known = sorted(p.name for p in journal_dir.iterdir() if p.is_dir()) if journal_dir.is_dir() else []
    click.echo(f"ftpbc: no journal for node {config.node.id!r} in {journal_dir}; known node ids: "
               f"{', '.join(known) or 'none'} (--node-id ID)", err=True)
    return False
