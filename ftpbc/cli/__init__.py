"""The ``ftpbc`` command.

Subcommands are imported only when invoked (``LAZY_COMMANDS``), so ``ftpbc --help`` and quick
commands never pay for importing Spark or paramiko.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import click

from ftpbc import __version__
from ftpbc.cli import logs
from ftpbc.cli.common import add_log_options, log_options, say
from ftpbc.errors import FtpbcError

#: command name -> "module:attribute" of a click command.
LAZY_COMMANDS: dict[str, str] = {
    "aggregate": "ftpbc.cli.aggregate:aggregate",
    "seq": "ftpbc.cli.seq:seq",
    "serve": "ftpbc.cli.serve:serve",
    "recover": "ftpbc.cli.serve:recover",
    "journal": "ftpbc.cli.serve:journal",
    "request": "ftpbc.cli.messaging:request",
    "send": "ftpbc.cli.messaging:send",
    "publish": "ftpbc.cli.topics:publish",
    "topic": "ftpbc.cli.topics:topic",
    "check": "ftpbc.cli.check:check",
    "dlq": "ftpbc.cli.queues:dlq",
    "receive": "ftpbc.cli.receive:receive",
    "browse": "ftpbc.cli.queues:browse",
    "replay": "ftpbc.cli.replay:replay",
    "trace": "ftpbc.cli.trace:trace",
    "status": "ftpbc.cli.status:status",
    "demo": "ftpbc.cli.demo:demo",
    "ftpd": "ftpbc.cli.demo:ftpd",
}


def summary(command: click.Command) -> str:
    """What a command list shows for ``command``: its ``short_help``, else the first paragraph
    of its help, whole (click's default cuts it to the terminal's width, mid-sentence)."""
    if command.short_help:
        return " ".join(command.short_help.split())
    first = inspect.cleandoc(command.help or "").split("\n\n", 1)[0]
    return " ".join(first.split())


class HelpGroup(click.Group):
    """A group whose command list shows every command's summary whole (see :func:`summary`)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class LazyGroup(HelpGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        # Every command, and every subcommand of a group, takes the log options after its name.
        add_log_options(command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="ftpbc")
@log_options
def cli() -> None:
    """Exchange messages through files on FTP, FTPS, SFTP servers or shared directories."""


def asked_format(args: list[str]) -> str | None:
    """The log format ``args`` ask for (the last ``--log-format X`` or ``--log-format=X`` before
    a ``--``), None if none or not one of :data:`ftpbc.cli.logs.FORMATS`.

    For an error click finds while it parses a command's arguments, before the command's
    eager log options are taken (``ftpbc send --bogus --log-format json``): it is reported in
    the format asked for, like every other error.  An option's value that reads
    ``--log-format`` (``--data --log-format``) is taken for the option here: it changes the
    final error's format, nothing else.
    """
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--log-format" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--log-format="):
            found = arg.partition("=")[2]
    return found if found in logs.FORMATS else None


def _format_of_a_parse_error() -> None:
    # Click stops at the first argument it cannot parse, before any eager option's callback
    # has run: the format is then the one the command line asks for, if any.
    if not logs.format_given() and (asked := asked_format(sys.argv[1:])) is not None:
        logs.use_format(asked)


def discard_failed_start() -> None:
    """Remove the journal directories this command made and wrote no record to (see
    :func:`ftpbc.journal.discard_unused_made`): a start that failed leaves no node id behind
    for ``ftpbc journal`` and ``ftpbc recover`` to list.  A directory that was there
    before the command is never touched."""
    from ftpbc.journal import discard_unused_made

    discard_unused_made()


def main() -> None:
    """Entry point: any FtpbcError becomes one line on stderr and exit status 2, and the
    journal directories the command made and wrote nothing to are removed
    (:func:`discard_failed_start`).

    With ``--log-format json`` (or FTPBC_LOG_FORMAT=json) that line, and a usage error's, is a
    JSON record with the error's type and message, like every log line before it."""
    logs.forget_format()
    from ftpbc.journal import forget_made

    forget_made()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        discard_failed_start()
        _format_of_a_parse_error()
        if logs.current_format() == "json":
            say("error", exc.format_message(), type(exc).__name__)
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        discard_failed_start()
        _format_of_a_parse_error()
        if logs.current_format() == "json":
            say("interrupted", "aborted", "Abort")
        else:
            click.echo("Aborted.", err=True)
        sys.exit(130)
    except FtpbcError as exc:
        discard_failed_start()
        say("error", str(exc), type(exc).__name__)
        sys.exit(getattr(exc, "exit_code", 2))
    except OSError as exc:
        # A local file or directory that cannot be made or written (a state_dir below a file,
        # a full disk): the path and the reason are what the user needs, not a traceback.
        discard_failed_start()
        where = f"{exc.filename}: " if exc.filename is not None else ""
        say("error", f"{where}{exc.strerror or exc}", type(exc).__name__)
        sys.exit(2)
