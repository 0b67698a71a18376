"""``ftpbc replay``: archived messages sent again as new messages (docs/replay.md)."""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from ftpbc.cli.common import config_option, json_option, load, node_id_option

if TYPE_CHECKING:
    from ftpbc.exchange.replay import Archived, Plan, Source

#: how the line printed first says where the messages were found
_WHAT = {"archive": "archived by", "error": "filed in inerror of", "expired": "filed in inexpired of",
         "dead": "filed in indead of"}
_AGO_RE = re.compile(r"(\d{1,9})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class WhenType(click.ParamType[datetime]):
    """A point in time: ISO 8601 (a date, or a date and time; UTC unless it names an offset),
    ``now``, or a duration ago (``90s``, ``30m``, ``2h``, ``7d``)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        if text == "now":
            return datetime.now(UTC)
        ago = _AGO_RE.fullmatch(text)
        if ago is not None:
            return datetime.now(UTC) - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            self.fail(f"{text!r} is no time: give ISO 8601 (2026-11-28T04:00:00Z, 2026-11-28), "
                      "now, or a duration ago (30m, 2h, 7d)", param, ctx)
        return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


WHEN = WhenType()


def _replay_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ftpbc.exchange.replay import check_replay_id

    try:
        return check_replay_id(value) if value is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat(timespec="milliseconds") if when is not None else None


def _plan_json(plan: Plan) -> dict[str, Any]:
    return {"replay_id": plan.replay_id, "endpoint": plan.endpoint, "to": plan.target,
            "since": _iso(plan.since), "until": _iso(plan.until),
            "selector": plan.selector.text if plan.selector is not None else None,
            "count": len(plan.messages), "bytes": plan.bytes, "oldest": _iso(plan.oldest),
            "newest": _iso(plan.newest), "unusable": plan.unusable}


@click.command()
@config_option
@node_id_option
@click.argument("endpoint")
@click.option("--since", type=WHEN, default=None,
              help="Replay what was archived at or after this time (required: ISO 8601, UTC unless an "
                   "offset is given; or 30m, 2h, 7d ago).")
@click.option("--until", type=WHEN, default=None,
              help="Replay what was archived before this time (default: when this replay first ran).")
@click.option("--where", "where", default=None, metavar="SELECTOR",
              help="Only the messages this JMS selector selects (docs/queues.md).")
@click.option("--to", "to", default=None, metavar="ENDPOINT",
              help="Send the copies to this endpoint's inbox (default: ENDPOINT's own).")
@click.option("--replay-id", default=None, callback=_replay_id,
              help="The replay's id (default: derived from the endpoint, --to, the window and "
                   "--where, so the same command is the same replay).")
@click.option("--from", "source", type=click.Choice(["archive", "error", "expired", "dead"]),
              default="archive", show_default=True,
              help="Replay copies of the messages served (archive) or filed in inerror, inexpired or indead "
                   "(each stays filed).")
@click.option("--dry-run", is_flag=True, help="Count what would be replayed; send nothing.")
@click.option("--no-progress", is_flag=True, help="Draw no progress bar (none is drawn off a terminal).")
@json_option
def replay(config_path: str, node_id: str | None, endpoint: str, since: datetime | None,
           until: datetime | None, where: str | None, to: str | None, replay_id: str | None, source: Source,
           dry_run: bool, no_progress: bool, as_json: bool) -> None:
    """Send ENDPOINT's archived messages again, as new messages, to its inbox (or --to's).

    Each copy gets a new id, keeps its original's headers (delivery count reset, expiration
    dropped), properties and body, and carries the properties ftpbc_replay_of (the original's
    id) and ftpbc_replay_id.  The replay's id is printed first; run the same command again
    after an interruption and each message is sent once in all (progress is kept in
    state_dir).  --from replays copies of filed messages instead (``ftpbc dlq replay`` moves
    dead letters back).  Exits 1 when a message could not be replayed, 6 when the target's
    queue is full (run the same command again later).
    """
    from tqdm import tqdm

    from ftpbc.client import Client
    from ftpbc.model.selector import compile_selector

    config = load(config_path)  # first: what is wrong with the configuration is said first
    if since is None:
        raise click.UsageError("Missing option '--since': replay what was archived since when?")
    if until is not None and until <= since:
        raise click.BadParameter(f"{_iso(until)} is not after --since {_iso(since)}", param_hint="--until")
    sel = compile_selector(where) if where is not None and where.strip() else None
    show = not (no_progress or dry_run or as_json) and sys.stderr.isatty()
    with Client.with_identity(config, node_id) as client, \
            tqdm(total=0, unit="msg", desc="replaying", disable=not show, leave=False) as bar:
        def on_plan(plan: Plan) -> None:
            # printed before anything is sent: the id a rerun or ftpbc trace is given
            click.echo(f"replay {plan.replay_id}: {len(plan.messages)} message(s), {plan.bytes} bytes "
                       f"{_WHAT[source]} {endpoint} from {_iso(plan.since)} to {_iso(plan.until)}"
                       + (f", sent to {to}" if to else ""), err=True)
            bar.total = len(plan.messages)
            bar.refresh()

        def each(m: Archived, outcome: str) -> None:
            bar.update(1)

        plan, report = client.replay(endpoint, since, until, where=sel, to=to, replay_id=replay_id,
                                     source=source, dry_run=dry_run, on_plan=on_plan, each=each)
    if report is None:
        if as_json:
            click.echo(json.dumps(_plan_json(plan), indent=2))
        else:
            click.echo(f"{len(plan.messages)} message(s), {plan.bytes} bytes, oldest {_iso(plan.oldest)}, "
                       f"newest {_iso(plan.newest)}")
        return
    if as_json:
        click.echo(json.dumps({**_plan_json(plan), "sent": len(report.sent), "already": len(report.already),
                               "skipped": [{"id": i, "why": w} for i, w in report.skipped]}, indent=2))
    else:
        for ident, why in report.skipped:
            click.echo(f"{ident}: not replayed: {why}")
        click.echo(f"{len(report.sent)} sent, {len(report.already)} sent before, {len(report.skipped)} not "
                   "replayed")
    if report.skipped:
        raise SystemExit(1)
