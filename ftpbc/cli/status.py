"""``ftpbc status``: the cluster at a glance (see :mod:`ftpbc.node.status`)."""

from __future__ import annotations

import json

import click

from ftpbc.cli.common import config_option, load


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option("--watch", type=click.FloatRange(min=0.5), default=None, metavar="SECONDS",
              help="Show it again every SECONDS until Ctrl-C.")
def status(config_path: str, as_json: bool, watch: float | None) -> None:
    """Nodes (alive or dead, from their heartbeats), and per endpoint the files in every
    directory of its exchange area, the oldest waiting message and what was served in the last
    minute.  Read-only: safe beside running nodes."""
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
                click.echo(render(current))
            if watch is None:
                return
            time.sleep(watch)
    except KeyboardInterrupt:  # --watch ends with Ctrl-C
        return
