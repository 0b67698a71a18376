"""The header table: a header declared there, and nowhere else, is a header everywhere.

``GroupHeaders`` adds one header the way docs/architecture.md ("Adding a header") says to: one
``header(...)`` line.  Nothing else in ftpbc names it, yet both codecs write and read it, a
selector selects by it, the command line offers it and dead letters print it.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ftpbc.cli.options import message_options, options_dict
from ftpbc.exchange.deadletter import envelope_json
from ftpbc.model.envelope import DropboxmqCodec, Envelope, FtpbcCodec, UnusableName
from ftpbc.model.headers import COUNT, TEXT, TIME, Headers, MessageOptions, header, header_table
from ftpbc.model.selector import HEADER_FIELDS, compile_selector

UID = "4d4f6177-f085-456b-94d1-1ed22baae814"


@header_table
class GroupHeaders(Headers):
    group_id: str | None = header(TEXT, default=None, ftpbc="g", dropboxmq="JMSXGroupID", jms="JMSXGroupID",
                                  send=True, cli="--group-id", lookup=True, help="Set the message group.")


def grouped(group: str | None = "orders/eu 1", **changes: typing.Any) -> GroupHeaders:
    return GroupHeaders(UID, "request", priority=7, reply_to="audit", group_id=group, **changes)


def test_ftpbc_names_carry_a_header_declared_only_in_the_table() -> None:
    codec = FtpbcCodec(headers=GroupHeaders)
    name = codec.encode("req." + UID, grouped(), {"region": "emea"})
    # after the existing fields, percent-encoded like every text value
    assert name == f"req.{UID};p=7;r=audit;g=orders%2Feu%201;.regionS=emea"
    env = codec.decode(name, direction="in")
    assert env is not None
    assert env.headers == grouped()
    assert type(env.headers) is GroupHeaders
    assert dict(env.properties) == {"region": "emea"}


def test_a_header_at_its_default_costs_nothing_in_either_name() -> None:
    plain = GroupHeaders(UID, "oneway")
    assert FtpbcCodec(headers=GroupHeaders).encode("msg." + UID, plain, {}) == "msg." + UID
    assert DropboxmqCodec(headers=GroupHeaders).encode("", plain, {}) == f"4.{UID}.B"


def test_dropboxmq_names_carry_it_as_its_reserved_property() -> None:
    codec = DropboxmqCodec(headers=GroupHeaders)
    name = codec.encode("", grouped(delivery_count=2), {"region": "emea"})
    assert name == f"7.{UID}.B...audit..regionS=emea&JMSXDeliveryCountI=2&JMSXGroupIDS=orders%2Feu%201"
    env = codec.decode(name, direction="in")
    assert env is not None
    assert env.headers == grouped(delivery_count=2, message_class="B")  # dropboxmq: B when none given
    assert dict(env.properties) == {"region": "emea"}  # the reserved one is a header again
    with pytest.raises(ValueError, match=r"JMSXGroupID.*reserved"):
        codec.encode("", grouped(), {"JMSXGroupID": "x"})


def test_a_garbled_value_of_it_is_an_unusable_name_naming_it() -> None:
    with pytest.raises(UnusableName, match=r"JMSXGroupID.*a string"):
        DropboxmqCodec(headers=GroupHeaders).decode(f"4.{UID}.B...audit..JMSXGroupIDI=3", direction="in")
    with pytest.raises(UnusableName, match="field 'g' given twice"):
        FtpbcCodec(headers=GroupHeaders).decode(f"req.{UID};g=a;g=b", direction="in")
    # a codec reading the plain table does not know the key
    with pytest.raises(UnusableName, match="unknown field 'g'"):
        FtpbcCodec().decode(f"req.{UID};g=a", direction="in")


def test_its_value_is_checked_when_the_headers_are_made() -> None:
    with pytest.raises(TypeError, match="group_id must be a str"):
        GroupHeaders(UID, group_id=3)  # type: ignore[arg-type]


def test_a_selector_selects_by_its_jms_name() -> None:
    selector = compile_selector("JMSXGroupID LIKE 'orders/%' AND JMSPriority > 5", headers=GroupHeaders)
    assert selector.matches(grouped(), {})
    assert not selector.matches(grouped("billing"), {})
    assert selector.evaluate(grouped(None), {}) is None  # a header the message lacks is NULL
    # without the table row the name is a property the message does not have
    assert compile_selector("JMSXGroupID IS NULL").matches(grouped(), {})


def test_the_command_line_offers_it_and_dead_letters_print_it() -> None:
    got: dict[str, typing.Any] = {}

    @click.command()
    def send(ttl: float | None, properties: tuple[str, ...], **headers: typing.Any) -> None:
        got.update(options_dict(ttl, properties, headers))

    command = message_options(send, GroupHeaders)
    result = CliRunner().invoke(command, ["--group-id", "g1", "--priority", "9"])
    assert result.exit_code == 0, result.output
    assert got == {"group_id": "g1", "priority": 9}
    assert "--group-id TEXT" in CliRunner().invoke(command, ["--help"]).output
    bad = CliRunner().invoke(command, ["--priority", "12"])
    assert bad.exit_code == 2 and "'--priority'" in bad.output

    printed = envelope_json(Envelope(grouped(), {}, "req." + UID))["headers"]
    assert printed["group_id"] == "orders/eu 1" and printed["priority"] == 7


def test_other_kinds_of_value_round_trip_too() -> None:
    @header_table
    class MoreHeaders(Headers):
        hops: int = header(COUNT, default=0, ftpbc="h", dropboxmq="JMS_ftpbcHops", jms="JMS_ftpbcHops")
        sent_at: datetime | None = header(TIME, default=None, ftpbc="a", dropboxmq="JMS_ftpbcSentAt",
                                          jms="JMS_ftpbcSentAt")

    at = datetime(2026, 11, 25, 12, 0, 0, 123000, tzinfo=UTC)
    headers = MoreHeaders(UID, "oneway", hops=3, sent_at=at, message_class="B")
    for codec in (FtpbcCodec(headers=MoreHeaders), DropboxmqCodec(headers=MoreHeaders)):
        env = codec.decode(codec.encode("msg." + UID, headers, {}), direction="in")
        assert env is not None and env.headers == headers, codec
    assert compile_selector("JMS_ftpbcHops = 3 AND JMS_ftpbcSentAt > 0", headers=MoreHeaders).matches(
        headers, {})


def test_a_table_whose_rows_clash_is_refused() -> None:
    with pytest.raises(ValueError, match="ftpbc key 'p' is also 'priority'"):
        @header_table
        class Clash(Headers):
            pressure: int = header(COUNT, default=0, ftpbc="p")


def test_a_codec_refuses_a_table_with_a_header_it_could_not_carry() -> None:
    @header_table
    class NoKey(Headers):
        group_id: str | None = header(TEXT, default=None, dropboxmq="JMSXGroupID")

    @header_table
    class NoPlace(Headers):
        group_id: str | None = header(TEXT, default=None, ftpbc="g", dropboxmq=8)

    with pytest.raises(ValueError, match="'group_id' has no ftpbc key"):
        FtpbcCodec(headers=NoKey)
    with pytest.raises(ValueError, match="'group_id': dropboxmq=8"):
        DropboxmqCodec(headers=NoPlace)
    FtpbcCodec(headers=NoPlace)
    DropboxmqCodec(headers=NoKey)


def test_what_a_sender_may_set_is_what_message_options_types() -> None:
    # MessageOptions is the typed face of the table's send column (Client.send's keywords)
    sendable = {spec.name for spec in Headers.table.sendable}
    assert set(typing.get_type_hints(MessageOptions)) == sendable | {"ttl", "properties"}


def test_the_table_lists_every_field_of_headers() -> None:
    assert {f.name for f in dataclasses.fields(Headers)} == set(Headers.table.by_name)


DOCS = Path(__file__).resolve().parent.parent / "docs"


def _rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the rows of the markdown table whose header row starts ``heading``."""
    rows = []
    for line in text[text.index(heading):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_docs_list_the_tables_headers_keys_and_selector_names() -> None:
    naming = (DOCS / "naming.md").read_text(encoding="utf-8")
    assert [row[0] for row in _rows(naming, "| header | default |")] == [
        f.name for f in dataclasses.fields(Headers)]
    keys = {row[0]: row[1] for row in _rows(naming, "| key | header | value |")}
    assert keys == {spec.ftpbc: spec.name for spec in Headers.table.ftpbc}
    queues = (DOCS / "queues.md").read_text(encoding="utf-8")
    names = [row[0] for row in _rows(queues, "| name | value |")]
    assert sorted(names) == sorted(HEADER_FIELDS)
    assert all(re.fullmatch(r"JMS\w+", name) for name in names)
