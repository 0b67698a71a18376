"""``ftpbc publish`` and ``ftpbc topic list|subscribe|unsubscribe`` (docs/topics.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from ftpbc.cli import HelpGroup
from ftpbc.cli.common import config_option, json_option, load, node_id_option, read_body
from ftpbc.cli.messaging import body_options, post_one_way
from ftpbc.cli.options import message_options, options_dict


@click.command()
@config_option
@node_id_option
@click.argument("topic")
@body_options
@message_options
def publish(config_path: str, node_id: str | None, topic: str, data: str | None, file: str | None,
            stdin: str | None, ttl: float | None, properties: tuple[str, ...], **headers: Any) -> None:
    """Publish a message to TOPIC: every subscription that selects it gets a copy; print its UUID.

    The copies are made by the nodes that serve the topic (ftpbc serve), in the subscriptions
    that exist when they do and existed when the message was sent.
    """
    body = read_body(data, file, stdin == "-")
    options = options_dict(ttl, properties, headers)
    post_one_way(config_path, node_id, lambda client: client.publish(topic, body, **options))


@click.group(cls=HelpGroup)
def topic() -> None:
    """A topic's subscriptions: list, subscribe (durable), unsubscribe."""


@topic.command("list")
@config_option
@node_id_option
@click.argument("topic_name", metavar="TOPIC")
@json_option
def list_subscriptions(config_path: str, node_id: str | None, topic_name: str, as_json: bool) -> None:
    """List TOPIC's subscriptions: durability, selector, owner, created, messages waiting (backlog)."""
    from ftpbc.client import Client

    with Client.with_identity(load(config_path), node_id) as client:
        rows = [(s, client.backlog(topic_name, s.name)) for s in client.subscriptions(topic_name)]
    if as_json:
        for s, backlog in rows:
            click.echo(json.dumps({"topic": topic_name, "name": s.name, "durable": s.durable,
                                   "selector": s.selector, "owner": s.owner,
                                   "created": s.created.isoformat(timespec="milliseconds"),
                                   "backlog": backlog}, ensure_ascii=True))
        return
    if not rows:
        click.echo(f"{topic_name}: no subscriptions")
        return
    for s, backlog in rows:
        kind = "durable" if s.durable else f"non-durable (owner {s.owner})"
        selector = f", selector {s.selector!r}" if s.selector else ""
        click.echo(f"{topic_name}/{s.name}: {kind}{selector}, created "
                   f"{s.created.isoformat(timespec='seconds')}, {backlog} waiting")


@topic.command()
@config_option
@node_id_option
@click.argument("topic_name", metavar="TOPIC")
@click.argument("name")
@click.option("--selector", default=None, help="Copy only the messages this JMS selector selects.")
def subscribe(config_path: str, node_id: str | None, topic_name: str, name: str,
              selector: str | None) -> None:
    """Create the durable subscription NAME of TOPIC (kept as it is if it exists with that
    selector); its messages are then received as TOPIC/NAME (ftpbc receive -c FILE TOPIC/NAME)."""
    from ftpbc.client import Client

    with Client.with_identity(load(config_path), node_id) as client:
        try:
            sub, made = client.create_subscription(topic_name, name, durable=True, selector=selector)
        except ValueError as exc:  # a bad name, or it exists otherwise
            raise click.UsageError(str(exc)) from None
    click.echo(f"{topic_name}/{sub.name}: {'created' if made else 'exists'}")


@topic.command()
@config_option
@node_id_option
@click.argument("topic_name", metavar="TOPIC")
@click.argument("name")
def unsubscribe(config_path: str, node_id: str | None, topic_name: str, name: str) -> None:
    """Remove subscription NAME of TOPIC and every message waiting in it."""
    from ftpbc.client import Client

    with Client.with_identity(load(config_path), node_id) as client:
        try:
            removed = client.unsubscribe(topic_name, name)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    click.echo(f"{topic_name}/{name}: removed with {removed} file(s)")
