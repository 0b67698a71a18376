"""``ftpbc status``: the cluster at a glance (see :mod:`ftpbc.node.status`)."""

from __future__ import annotations

import json

import click

from ftpbc.cli.common import config_option, load
from ftpbc.cli.logs import escape


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option("--watch", type=click.FloatRange(min=0.5), default=None, metavar="SECONDS",
              help="Show it again every SECONDS until Ctrl-C.")
def status(config_path: str, as_json: bool, watch: float | None) -> None:
    """Show the cluster at a glance: nodes, boxes, backlogs and throughput.

    Nodes are alive or dead from their heartbeats (in state_dir or on the coordination server),
    with what each serves and served in the last minute; per endpoint, the files in every
    directory of its exchange area, the oldest waiting message and what was served in the last
    minute; each route with its live destinations per node.  Takes no lock and moves nothing:
    safe beside running nodes."""
    import time

    from ftpbc.node.status import cluster_status, render

    config = load(config_path)
    try:
        while True:
            current = cluster_status(config)
            if as_json:
                click.echo(json.dumps(current.to_dict(), sort_keys=True))
            else:
                if watch is not None:
                    click.clear()
                # File names, host names and what heartbeats say come from others: a control
                # character in one must not repaint the terminal (JSON escapes them itself).
                click.echo(escape(render(current), keep_newlines=True))
            if watch is None:
                return
            time.sleep(watch)
    except KeyboardInterrupt:  # --watch ends with Ctrl-C
        return
