"""``ftpbc check``: is this configuration ready to run here?  (see :mod:`ftpbc.node.check`)

Exit status: 0 all good (warnings included), 1 something failed, 2 the configuration itself is
invalid (raised as a ConfigError by ``load``, printed in one line by ``main``).
"""

from __future__ import annotations

import json

import click

from ftpbc.cli.common import config_option, json_option, load, say
from ftpbc.cli.logs import escape


@click.command()
@config_option
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Seconds allowed per server operation (capped by the server's own timeout).")
@json_option
def check(config_path: str, timeout: float, as_json: bool) -> None:
    """Validate the configuration, log in to every server once, create every endpoint's and
    transfer's missing directories, and prove that ftpbc can write, rename and delete a file in
    each of them and in state_dir and journal_dir; import every handler.

    Prints tables (servers, endpoints, transfers, local directories), then one line per warning
    and per failure on stderr; with --json, one JSON document instead.  Exits 1 if anything failed.
    """
    from ftpbc.node.check import render, run_checks

    config = load(config_path)
    report = run_checks(config, timeout)
    if as_json:
        click.echo(json.dumps(report.to_dict(), sort_keys=True))
    else:
        # Server replies and names in paths are a partner's text: no control character of theirs
        # reaches the terminal (a \r or an escape sequence could forge or hide a line).
        click.echo(escape(render(report), keep_newlines=True))
        for w in report.warnings():
            say("check warning", escape(w), "CheckWarning", level="warning")
        for f in report.failures():
            say("check failed", escape(f), "CheckFailed")
        click.echo(escape(report.summary()))
    if not report.ok:
        raise SystemExit(1)
