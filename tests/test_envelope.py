"""Headers and properties in file names: ftpbc's suffix grammar and DropboxMQ's names.

Pure functions, no servers.  Examples first, then hypothesis properties:

* every name ``encode`` makes decodes back to the same headers and properties (datetimes at
  millisecond precision);
* ``encode`` never writes ``/``, ``\\``, ``~``, NUL, CR/LF or any other control character;
* ``decode`` of any string whatsoever decodes, returns None or raises UnusableName.
"""

from __future__ import annotations

import math
import pickle
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftpbc.errors import FtpbcError
from ftpbc.model.envelope import (
    DEFAULT_PRIORITY,
    ERROR_TYPE,
    NAME_LIMIT,
    DropboxmqCodec,
    Envelope,
    FtpbcCodec,
    Headers,
    Kind,
    NameCodec,
    NameTooLong,
    PropertyValue,
    UnusableName,
    codec_for,
)

UID = "4d4f6177-f085-456b-94d1-1ed22baae814"
ACCEPTANCE = "4.1140429201295000-9262574723.T.1140429211295.corr1283.TestQueue1.XYZType.prop1S=hello"
KINDS: list[Kind] = ["request", "oneway", "response"]
FORBIDDEN = re.compile("[/\\\\~\x00-\x1f\x7f-\x9f]")


def ms(dt: datetime) -> datetime:
    """``dt`` at the millisecond precision names carry (truncated)."""
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


def typed(props: Any) -> list[tuple[str, str, str]]:
    """Properties compared with their types (True == 1 and 0.0 == -0.0 otherwise)."""
    return [(k, type(v).__name__, repr(v)) for k, v in dict(props).items()]


# --------------------------------------------------------------------------- DropboxMQ acceptance


def test_dropboxmq_acceptance_example() -> None:
    env = DropboxmqCodec().decode(ACCEPTANCE, direction="in")
    assert env is not None
    h = env.headers
    assert h.priority == 4
    assert h.id == "1140429201295000-9262574723"
    assert h.message_class == "T"
    assert h.expiration == datetime(2006, 2, 20, 9, 53, 31, 295000, tzinfo=UTC)
    assert h.expiration == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=1140429211295)
    assert h.correlation_id == "corr1283"
    assert h.reply_to == "TestQueue1"
    assert h.type == "XYZType"
    assert dict(env.properties) == {"prop1": "hello"}
    assert h.kind == "request"  # it has a reply-to
    assert h.delivery_count == 0
    # the id's first 13 digits are its creation time in milliseconds
    assert h.timestamp == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=1140429201295)
    assert env.base == ACCEPTANCE


def test_dropboxmq_acceptance_short_form() -> None:
    env = DropboxmqCodec().decode("4.1140429201295000-9262574723.T", direction="in")
    assert env is not None
    h = env.headers
    assert (h.priority, h.id, h.message_class) == (4, "1140429201295000-9262574723", "T")
    assert (h.expiration, h.correlation_id, h.reply_to, h.type) == (None, None, None, None)
    assert h.kind == "oneway" and h.delivery_count == 0 and dict(env.properties) == {}


def test_dropboxmq_reencodes_the_acceptance_name_exactly() -> None:
    codec = DropboxmqCodec()
    env = codec.decode(ACCEPTANCE, direction="in")
    assert env is not None
    assert codec.encode(env.base, env.headers, env.properties) == ACCEPTANCE


# --------------------------------------------------------------------------- ftpbc: defaults


def test_plain_names_are_messages_with_default_headers() -> None:
    codec = FtpbcCodec()
    for name, direction, kind in ((f"req.{UID}", "in", "request"), (f"msg.{UID}", "in", "oneway"),
                                  (f"resp.{UID}", "out", "response")):
        env = codec.decode(name, direction=direction)  # type: ignore[arg-type]
        assert env is not None
        assert env.base == name
        assert env.headers == Headers(UID, kind)  # type: ignore[arg-type]
        assert env.headers.priority == DEFAULT_PRIORITY == 4
        assert env.headers.delivery_count == 0
        assert dict(env.properties) == {}
    resp = codec.decode(f"resp.{UID}", direction="out")
    assert resp is not None and resp.headers.correlation_id == UID  # a response correlates by its id


def test_default_headers_encode_to_the_base_itself() -> None:
    codec = FtpbcCodec()
    assert codec.encode(f"req.{UID}", Headers(UID, "request"), {}) == f"req.{UID}"
    assert codec.encode(f"msg.{UID}", Headers(UID, "oneway"), {}) == f"msg.{UID}"
    assert codec.encode(f"resp.{UID}", Headers(UID, "response", correlation_id=UID), {}) == f"resp.{UID}"
    assert codec.encode(f"resp.{UID}.error", Headers(UID, "response", type=ERROR_TYPE), {}) \
        == f"resp.{UID}.error"


def test_foreign_names_are_not_messages_of_the_endpoint() -> None:
    codec = FtpbcCodec()
    for name in ("README", "req", "request.x", ".", "..", "", "resp.x;p=9", f"x.{UID}"):
        assert codec.decode(name, direction="in") is None, name
    for name in (f"req.{UID}", f"msg.{UID}", "x", ""):
        assert codec.decode(name, direction="out") is None, name


def test_direction_decides_which_prefixes_count() -> None:
    codec = FtpbcCodec()
    assert codec.decode(f"resp.{UID}", direction="in") is None
    assert codec.decode(f"req.{UID}", direction="out") is None
    with pytest.raises(ValueError, match="direction"):
        codec.decode(f"req.{UID}", direction="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="direction"):
        DropboxmqCodec().decode("4.x.B", direction="up")  # type: ignore[arg-type]


def test_custom_prefixes_and_uuid_of() -> None:
    pattern = re.compile(r"(?:order|note)-([0-9a-f-]{36})\.xml")

    def uuid_of(base: str) -> str | None:
        m = pattern.search(base)
        return m.group(1) if m else None

    codec = FtpbcCodec(request_prefix="order-", oneway_prefix="note-", response_prefix="ack-",
                       uuid_of=uuid_of)
    base = f"order-{UID}.xml"
    env = codec.decode(base, direction="in")
    assert env is not None and env.headers == Headers(UID, "request") and env.base == base
    assert codec.decode("order-nothing.xml", direction="in") is None  # uuid_of refused it
    assert codec.decode(f"ack-{UID}", direction="out") == Envelope(Headers(UID, "response"), {},
                                                                  f"ack-{UID}")
    name = codec.encode(base, Headers(UID, "request", priority=7), {})
    assert name == f"{base};p=7"
    with pytest.raises(ValueError, match="gives id"):
        codec.encode(base, Headers("other", "request"), {})
    with pytest.raises(ValueError, match="prefixes of one another"):
        FtpbcCodec(request_prefix="x", oneway_prefix="xy")
    with pytest.raises(ValueError, match="request_prefix"):
        FtpbcCodec(request_prefix="a;b")


def test_empty_id_after_the_prefix_is_unusable() -> None:
    with pytest.raises(UnusableName, match="no message id"):
        FtpbcCodec().decode("req.", direction="in")
    with pytest.raises(UnusableName, match="no message id"):
        FtpbcCodec().decode("resp..error", direction="out")


# --------------------------------------------------------------------------- ftpbc: header fields


WHEN = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(("changes", "suffix"), [
    ({"priority": 9}, ";p=9"),
    ({"priority": 0}, ";p=0"),
    ({"delivery_count": 2}, ";n=2"),
    ({"timestamp": WHEN}, ";s=20261125T120000.123Z"),
    ({"expiration": WHEN}, ";e=20261125T120000.123Z"),
    ({"correlation_id": "corr 1/2"}, ";c=corr%201%2F2"),
    ({"reply_to": "queue~b;c=d&e%"}, ";r=queue%7Eb%3Bc%3Dd%26e%25"),
    ({"type": "order.v2"}, ";t=order.v2"),
    ({"message_class": "T"}, ";k=T"),
])
def test_each_header_field_round_trips(changes: dict[str, Any], suffix: str) -> None:
    codec = FtpbcCodec()
    base = f"req.{UID}"
    headers = Headers(UID, "request", **changes)
    name = codec.encode(base, headers, {})
    assert name == base + suffix
    env = codec.decode(name, direction="in")
    assert env is not None and env.base == base
    expected: dict[str, Any] = {k: ms(v) if isinstance(v, datetime) else v for k, v in changes.items()}
    assert env.headers == Headers(UID, "request", **expected)


def test_all_header_fields_at_once_and_in_any_order() -> None:
    codec = FtpbcCodec()
    headers = Headers(UID, "request", priority=1, timestamp=ms(WHEN), expiration=ms(WHEN) + timedelta(1),
                      correlation_id="c", reply_to="r", type="t", message_class="k", delivery_count=3)
    name = codec.encode(f"req.{UID}", headers, {"a": 1})
    assert name == (f"req.{UID};p=1;n=3;s=20261125T120000.123Z;e=20261126T120000.123Z;c=c;r=r;t=t;k=k"
                    ";.aI=1")
    env = codec.decode(name, direction="in")
    assert env is not None and env.headers == headers and dict(env.properties) == {"a": 1}
    shuffled = f"req.{UID};.aI=1;k=k;t=t;r=r;c=c;e=20261126T120000.123Z;s=20261125T120000.123Z;n=3;p=1"
    assert codec.decode(shuffled, direction="in") == env


def test_datetimes_are_utc_at_millisecond_precision() -> None:
    paris = timezone(timedelta(hours=1))
    local = datetime(2026, 1, 2, 3, 4, 5, 678999, tzinfo=paris)
    h = Headers(UID, "request", timestamp=local)
    assert h.timestamp is not None and h.timestamp.tzinfo is UTC and h.timestamp == local
    name = FtpbcCodec().encode(f"req.{UID}", h, {})
    assert name.endswith(";s=20260102T020405.678Z")  # truncated, not rounded
    env = FtpbcCodec().decode(name, direction="in")
    assert env is not None and env.headers.timestamp == datetime(2026, 1, 2, 2, 4, 5, 678000, tzinfo=UTC)
    early = datetime(1, 1, 1, tzinfo=UTC)
    name = FtpbcCodec().encode(f"req.{UID}", Headers(UID, "request", expiration=early), {})
    assert name.endswith(";e=00010101T000000.000Z")
    env = FtpbcCodec().decode(name, direction="in")
    assert env is not None and env.headers.expiration == early


def test_headers_validate() -> None:
    for bad in (-1, 10, 12, True, 4.0, "4"):
        with pytest.raises(ValueError, match="priority"):
            Headers(UID, priority=bad)  # type: ignore[arg-type]
    for bad in (-1, 2**63, False, 1.0):
        with pytest.raises(ValueError, match="delivery_count"):
            Headers(UID, delivery_count=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        Headers(UID, timestamp=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        Headers(UID, expiration=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="kind"):
        Headers(UID, kind="reply")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reply_to"):
        Headers(UID, reply_to=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="id"):
        Headers(None)  # type: ignore[arg-type]
    assert Headers(UID, "response").correlation_id == UID
    assert Headers(UID, "response", correlation_id="x").correlation_id == "x"
    assert Headers(UID, "request").correlation_id is None


# --------------------------------------------------------------------------- properties


def test_properties_of_every_type_round_trip() -> None:
    props: dict[str, PropertyValue] = {
        "yes": True, "no": False, "small": -5, "int32": 2**31 - 1, "long": 2**31, "minlong": -2**63,
        "half": 0.5, "negzero": -0.0, "tiny": 5e-324, "huge": 1.7976931348623157e308,
        "inf": float("inf"), "minf": float("-inf"), "text": "héllo wörld ~;=&%/\\\x00\n",
        "empty": "", "": "nameless", "név ~;=": "odd name",
    }
    for codec, base, headers, direction in (
            (FtpbcCodec(limit=10_000), f"req.{UID}", Headers(UID, "request"), "in"),
            (DropboxmqCodec(limit=10_000), "", Headers(UID, "oneway", message_class="B"), "in")):
        name = codec.encode(base, headers, props)
        env = codec.decode(name, direction=direction)  # type: ignore[arg-type]
        assert env is not None
        assert typed(env.properties) == typed(props)
        assert env.headers == headers
    name = FtpbcCodec().encode(f"req.{UID}", Headers(UID, "request"), {"n": float("nan")})
    assert name.endswith(";.nD=NaN")
    env = FtpbcCodec().decode(name, direction="in")
    assert env is not None and math.isnan(env.properties["n"])  # type: ignore[arg-type]


def test_property_type_letters() -> None:
    codec = FtpbcCodec()
    name = (f"req.{UID};.bB=TRUE;.yY=-128;.hH=32767;.iI=-7;.lL=9223372036854775807;.fF=1.5;.dD=1e%2B300"
            ";.sS=x%20y;.nanD=NaN;.infD=-Infinity")
    env = codec.decode(name, direction="in")
    assert env is not None
    assert typed(env.properties) == typed({
        "b": True, "y": -128, "h": 32767, "i": -7, "l": 2**63 - 1, "f": 1.5, "d": 1e300, "s": "x y",
        "nan": float("nan"), "inf": float("-inf")})
    assert codec.encode(f"req.{UID}", Headers(UID, "request"),
                        {"b": True, "i": 1, "l": -2**31 - 1, "d": 0.1, "s": "a.b"}) == \
        f"req.{UID};.bB=true;.iI=1;.lL=-2147483649;.dD=0.1;.sS=a.b"
    with pytest.raises(ValueError, match="64 bits"):
        codec.encode(f"req.{UID}", Headers(UID, "request"), {"x": 2**63})
    with pytest.raises(TypeError, match="bytes"):
        codec.encode(f"req.{UID}", Headers(UID, "request"), {"x": b"raw"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="property names"):
        codec.encode(f"req.{UID}", Headers(UID, "request"), {1: "x"})  # type: ignore[dict-item]


def test_envelope_properties_are_a_read_only_copy() -> None:
    props: dict[str, PropertyValue] = {"a": 1}
    env = Envelope(Headers(UID, "request"), props, f"req.{UID}")
    props["a"] = 2
    assert env.properties["a"] == 1
    with pytest.raises(TypeError):
        env.properties["a"] = 3  # type: ignore[index]
    assert env == Envelope(Headers(UID, "request"), {"a": 1}, f"req.{UID}")
    assert pickle.loads(pickle.dumps(env)) == env


def test_envelope_replace_changes_headers_only() -> None:
    env = Envelope(Headers(UID, "request", priority=7), {"a": 1}, f"req.{UID}")
    again = env.replace(delivery_count=env.headers.delivery_count + 1)
    assert again.headers == Headers(UID, "request", priority=7, delivery_count=1)
    assert again.properties == env.properties and again.base == env.base
    assert env.headers.delivery_count == 0
    with pytest.raises(ValueError, match="priority"):
        env.replace(priority=10)
    codec = FtpbcCodec()
    assert codec.encode(again.base, again.headers, again.properties) == f"req.{UID};p=7;n=1;.aI=1"


# --------------------------------------------------------------------------- error replies


def test_error_replies() -> None:
    codec = FtpbcCodec()
    base = f"resp.{UID}.error"
    env = codec.decode(base, direction="out")
    assert env is not None
    assert env.headers == Headers(UID, "response", type=ERROR_TYPE, correlation_id=UID)
    assert env.base == base
    name = codec.encode(base, Headers(UID, "response", type=ERROR_TYPE, priority=8), {"why": "boom"})
    assert name == f"{base};p=8;.whyS=boom"
    env = codec.decode(name, direction="out")
    assert env is not None and env.headers.type == ERROR_TYPE and env.headers.priority == 8
    with pytest.raises(ValueError, match="error reply"):
        codec.encode(base, Headers(UID, "response"), {})  # .error base, not an error
    with pytest.raises(ValueError, match="error reply"):
        codec.encode(f"resp.{UID}", Headers(UID, "response", type=ERROR_TYPE), {})  # the reverse
    with pytest.raises(UnusableName, match="type field"):
        codec.decode(f"{base};t=other", direction="out")
    # a request may carry the type: it is only implied by the name for responses
    req = codec.encode(f"req.{UID}", Headers(UID, "request", type=ERROR_TYPE), {})
    assert req == f"req.{UID};t=ftpbc.error"


def test_response_correlation_id() -> None:
    codec = FtpbcCodec()
    name = codec.encode(f"resp.{UID}", Headers(UID, "response", correlation_id="other"), {})
    assert name == f"resp.{UID};c=other"
    env = codec.decode(name, direction="out")
    assert env is not None and env.headers.correlation_id == "other"
    env = codec.decode(f"resp.{UID};p=5", direction="out")
    assert env is not None and env.headers.correlation_id == UID


# --------------------------------------------------------------------------- encode refuses


def test_encode_refuses_bases_that_do_not_match_the_headers() -> None:
    codec = FtpbcCodec()
    with pytest.raises(ValueError, match="must start with"):
        codec.encode(f"msg.{UID}", Headers(UID, "request"), {})  # kind by prefix
    with pytest.raises(ValueError, match="gives id"):
        codec.encode(f"req.{UID}", Headers("other", "request"), {})
    for bad in (f"req.{UID};x", f"req.{UID}~node", f"req.a/{UID}", f"req.{UID}\n", f"req.{UID}\x00"):
        with pytest.raises(ValueError, match="must start with"):
            codec.encode(bad, Headers(bad[4:], "request"), {})


# --------------------------------------------------------------------------- hostile names


@pytest.mark.parametrize("name", [
    f"req.{UID};x=1",            # unknown key
    f"req.{UID};p=12",           # priority out of range
    f"req.{UID};p=a",
    f"req.{UID};p=٣",            # a digit, but not an ASCII one
    f"req.{UID};p=9;p=8",        # duplicate key
    f"req.{UID};p",              # no '='
    f"req.{UID};",               # empty field
    f"req.{UID};;p=9",
    f"req.{UID};c=a=b",          # second '='
    f"req.{UID};c=%zz",          # bad percent-encoding
    f"req.{UID};c=%4",
    f"req.{UID};c=%ff",          # not UTF-8
    f"req.{UID};e=20261325T120000.000Z",  # month 13
    f"req.{UID};e=20261125T120000Z",      # no milliseconds
    f"req.{UID};s=yesterday",
    f"req.{UID};n=-1",
    f"req.{UID};n=99999999999999999999",
    f"req.{UID};.aX=1",          # unknown type letter
    f"req.{UID};.=1",            # no type letter
    f"req.{UID};.aI=x",
    f"req.{UID};.aI=99999999999",  # beyond 32 bits
    f"req.{UID};.aY=128",
    f"req.{UID};.aB=yes",
    f"req.{UID};.aD=1.5.5",
    f"req.{UID};.aI=1;.aS=x",    # duplicate property
])
def test_unparsable_suffixes_are_unusable_names(name: str) -> None:
    with pytest.raises(UnusableName) as info:
        FtpbcCodec().decode(name, direction="in")
    text = str(info.value)
    assert repr(name) in text and "\n" not in text
    assert info.value.name == name and info.value.reason
    assert isinstance(info.value, FtpbcError)


def test_unusable_name_message_is_one_line() -> None:
    name = f"req.{UID};r=a\nb;p=77"
    with pytest.raises(UnusableName) as info:
        FtpbcCodec().decode(name, direction="in")
    assert "\n" not in str(info.value) and "'req." in str(info.value)


# --------------------------------------------------------------------------- too long


def test_too_long_names_say_which_fields() -> None:
    codec = FtpbcCodec()
    headers = Headers(UID, "request", reply_to="q" * 100)
    with pytest.raises(NameTooLong) as info:
        codec.encode(f"req.{UID}", headers, {"blob": "x" * 150})
    err = info.value
    assert err.limit == NAME_LIMIT and err.length > NAME_LIMIT
    assert err.fields == ("properties", "reply_to")
    assert str(err).startswith(f"encoded message name is {err.length} bytes, over the limit of 255")
    assert "properties" in str(err) and "reply_to" in str(err)
    assert isinstance(err, FtpbcError)
    # counted in UTF-8 bytes: 60 characters of 'é' are 120 bytes before percent-encoding, 360 after
    with pytest.raises(NameTooLong, match="correlation_id"):
        codec.encode(f"req.{UID}", Headers(UID, "request", correlation_id="é" * 60), {})
    long_base = "req." + "é" * 130  # 264 bytes, 134 characters
    with pytest.raises(NameTooLong, match=r"264 bytes.*base"):
        codec.encode(long_base, Headers("é" * 130, "request"), {})
    assert FtpbcCodec(limit=300).encode(long_base, Headers("é" * 130, "request"), {}) == long_base
    assert FtpbcCodec(limit=44).encode(f"req.{UID}", Headers(UID, "request", priority=9), {}) \
        == f"req.{UID};p=9"  # exactly 44 bytes
    with pytest.raises(NameTooLong, match="limit of 43"):
        FtpbcCodec(limit=43).encode(f"req.{UID}", Headers(UID, "request", priority=9), {})


def test_too_long_dropboxmq_names() -> None:
    codec = DropboxmqCodec(limit=100)
    with pytest.raises(NameTooLong) as info:
        codec.encode("", Headers(UID, "request", reply_to="r" * 80, type="t" * 40), {})
    assert info.value.fields[0] == "reply_to" and "type" in info.value.fields
    with pytest.raises(NameTooLong, match="delivery_count"):
        DropboxmqCodec(limit=30).encode("", Headers("x", "oneway", delivery_count=10**17), {})


# --------------------------------------------------------------------------- dropboxmq specifics


def test_dropboxmq_defaults_and_trailing_dots() -> None:
    codec = DropboxmqCodec()
    assert codec.encode("ignored", Headers("id1", "oneway"), {}) == "4.id1.B"
    assert codec.encode("", Headers("id1", "request", reply_to="q"), {}) == "4.id1.B...q"
    assert codec.encode("", Headers("id1", "response", correlation_id="c"), {}) == "4.id1.B..c"
    env = codec.decode("4.id1.B...q", direction="in")
    assert env is not None
    assert env.headers == Headers("id1", "request", reply_to="q", message_class="B")
    env = codec.decode("4.id1.", direction="in")  # empty class: the default, BytesMessage
    assert env is not None and env.headers.message_class == "B"
    env = codec.decode("4.id1.M.0", direction="in")  # expiration 0: none
    assert env is not None and env.headers.expiration is None


def test_dropboxmq_direction_gives_the_kind() -> None:
    codec = DropboxmqCodec()
    out = codec.decode(ACCEPTANCE, direction="out")
    assert out is not None and out.headers.kind == "response"
    assert out.headers.correlation_id == "corr1283"  # the request's id
    oneway = codec.decode("4.x.T", direction="in")
    assert oneway is not None and oneway.headers.kind == "oneway"
    resp = codec.decode("4.x.T", direction="out")
    assert resp is not None and resp.headers.kind == "response" and resp.headers.correlation_id == "x"


def test_dropboxmq_priorities_are_clamped() -> None:
    codec = DropboxmqCodec()
    for text, priority in (("-3", 0), ("0", 0), ("9", 9), ("12", 9), ("+7", 7),
                           ("2147483647", 9), ("-99999999999999999999", 0)):
        env = codec.decode(f"{text}.id.B", direction="in")
        assert env is not None and env.headers.priority == priority, text


def test_dropboxmq_unstructured_names_use_the_whole_name_as_id() -> None:
    codec = DropboxmqCodec()
    for name in ("report.txt", "hello", "x.1.T", "4.txt", "4", "a.b.c.d.e.f.g.h.i.j"):
        env = codec.decode(name, direction="in")
        assert env is not None, name
        assert env.headers == Headers(name, "oneway", message_class="B") and env.base == name
    for name in ("", ".", ".."):
        assert codec.decode(name, direction="in") is None
    env = codec.decode("4..T", direction="in")  # no id: the whole name is the id
    assert env is not None and env.headers.id == "4..T" and env.headers.message_class == "T"


def test_dropboxmq_encoding_of_fields() -> None:
    codec = DropboxmqCodec()
    headers = Headers("a.b c+d~e", "request", reply_to="Queue.1", type="x/y")
    name = codec.encode("", headers, {"k.1": "v.2 w"})
    assert name == "4.a%2Eb%20c%2Bd%7Ee.B...Queue%2E1.x%2Fy.k%2E1S=v%2E2%20w"
    env = codec.decode(name, direction="in")
    assert env is not None
    assert env.headers == Headers("a.b c+d~e", "request", reply_to="Queue.1", type="x/y",
                                  message_class="B")
    assert dict(env.properties) == {"k.1": "v.2 w"}
    # Java's URLEncoder writes a space as '+'
    env = codec.decode("4.id.T....Type+One.p+1S=a+b&qI=5", direction="in")
    assert env is not None and env.headers.type == "Type One"
    assert typed(env.properties) == typed({"p 1": "a b", "q": 5})


def test_dropboxmq_delivery_count_and_timestamp_properties() -> None:
    codec = DropboxmqCodec()
    stamped = "1140429201295000-9262574723"
    stamp = datetime(2006, 2, 20, 9, 53, 21, 295000, tzinfo=UTC)
    name = codec.encode("", Headers(stamped, "oneway", delivery_count=3, timestamp=stamp), {"a": "b"})
    assert name == f"4.{stamped}.B.....aS=b&JMSXDeliveryCountI=3"  # the id holds the timestamp
    env = codec.decode(name, direction="in")
    assert env is not None and env.headers.delivery_count == 3 and env.headers.timestamp == stamp
    assert dict(env.properties) == {"a": "b"}
    other = datetime(2026, 1, 1, tzinfo=UTC)
    name = codec.encode("", Headers("plain-id", "oneway", timestamp=other), {})
    assert name == "4.plain-id.B.....JMS_ftpbcTimestampL=1767225600000"
    env = codec.decode(name, direction="in")
    assert env is not None and env.headers.timestamp == other and dict(env.properties) == {}
    with pytest.raises(ValueError, match="reserved"):
        codec.encode("", Headers("x", "oneway"), {"JMSXDeliveryCount": 1})
    with pytest.raises(UnusableName, match="integer"):
        codec.decode("4.x.B.....JMSXDeliveryCountS=two", direction="in")
    with pytest.raises(UnusableName, match="negative"):
        codec.decode("4.x.B.....JMSXDeliveryCountI=-1", direction="in")


def test_dropboxmq_encode_refuses() -> None:
    codec = DropboxmqCodec()
    with pytest.raises(ValueError, match="reply_to"):
        codec.encode("", Headers("x", "request"), {})  # a request is marked by its reply-to
    with pytest.raises(ValueError, match="reply_to"):
        codec.encode("", Headers("x", "oneway", reply_to="q"), {})
    with pytest.raises(ValueError, match="empty"):
        codec.encode("", Headers("x", "oneway", type=""), {})
    with pytest.raises(ValueError, match="non-empty"):
        codec.encode("", Headers("", "oneway"), {})
    with pytest.raises(ValueError, match="message_class"):
        codec.encode("", Headers("x", "oneway", message_class="Q"), {})
    with pytest.raises(ValueError, match="epoch"):
        codec.encode("", Headers("x", "oneway", expiration=datetime(1970, 1, 1, tzinfo=UTC)), {})


@pytest.mark.parametrize("name", [
    "4.x.Q",                     # unknown message class
    "4.x.B.soon",                # expiration not a number
    "4.x.B.99999999999999999",   # expiration out of range
    "4.x.B.1.2.3.4.5.6",         # nine fields
    "4.x.B.....noequals",
    "4.x.B.....aZ=1",
    "4.x.B.....aI=1&aS=2",
    "4.x%zz.B",
    "4.x.B..%C3",
])
def test_dropboxmq_unusable_names(name: str) -> None:
    with pytest.raises(UnusableName) as info:
        DropboxmqCodec().decode(name, direction="in")
    assert repr(name) in str(info.value)


# --------------------------------------------------------------------------- selection, protocol


def test_codec_for() -> None:
    ftp = codec_for("ftpbc", request_prefix="q.", limit=200)
    assert isinstance(ftp, FtpbcCodec) and ftp.name == "ftpbc"
    assert ftp.request_prefix == "q." and ftp.limit == 200
    dbx = codec_for("dropboxmq", request_prefix="q.", uuid_of=None, limit=200)  # ftpbc-only keys ignored
    assert isinstance(dbx, DropboxmqCodec) and dbx.name == "dropboxmq" and dbx.limit == 200
    with pytest.raises(ValueError, match="'jms'"):
        codec_for("jms")
    with pytest.raises(TypeError):
        codec_for("dropboxmq", limt=3)
    codecs: list[NameCodec] = [FtpbcCodec(), DropboxmqCodec()]
    assert [c.name for c in codecs] == ["ftpbc", "dropboxmq"]


def test_decoded_names_are_remembered() -> None:
    codec = FtpbcCodec()
    first = codec.decode(f"req.{UID};p=9", direction="in")
    assert codec.decode(f"req.{UID};p=9", direction="in") is first
    assert codec.decode(f"req.{UID};p=9", direction="out") is None


# --------------------------------------------------------------------------- properties (hypothesis)


PROP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

instants = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31),
                        timezones=st.just(UTC))
offset_instants = st.builds(
    lambda dt, minutes: dt.replace(tzinfo=timezone(timedelta(minutes=minutes))),
    st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)),
    st.integers(-23 * 60, 23 * 60))
any_instant = st.one_of(instants, offset_instants)
property_values: st.SearchStrategy[PropertyValue] = st.one_of(
    st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False), st.text())
properties = st.dictionaries(st.text(), property_values, max_size=5)
id_text = st.text(alphabet=st.characters(blacklist_characters="/\\~;", blacklist_categories=("Cc", "Cs")),
                  min_size=1, max_size=40)
optional_text = st.one_of(st.none(), st.text())
HUGE = 1_000_000


@st.composite
def ftpbc_messages(draw: st.DrawFn) -> tuple[str, Headers, dict[str, PropertyValue]]:
    kind: Kind = draw(st.sampled_from(KINDS))
    uid = draw(id_text.filter(lambda t: not t.endswith(".error")))
    error = kind == "response" and draw(st.booleans())
    prefix = {"request": "req.", "oneway": "msg.", "response": "resp."}[kind]
    base = prefix + uid + (".error" if error else "")
    headers = Headers(
        uid, kind, priority=draw(st.integers(0, 9)),
        timestamp=draw(st.none() | any_instant), expiration=draw(st.none() | any_instant),
        correlation_id=draw(optional_text), reply_to=draw(optional_text),
        type=ERROR_TYPE if error else draw(optional_text.filter(lambda t: t != ERROR_TYPE)),
        message_class=draw(optional_text), delivery_count=draw(st.integers(0, 2**63 - 1)))
    return base, headers, draw(properties)


@st.composite
def dropboxmq_messages(draw: st.DrawFn) -> tuple[Headers, dict[str, PropertyValue]]:
    kind: Kind = draw(st.sampled_from(KINDS))
    some_text = st.text(min_size=1)
    reply = (draw(some_text) if kind == "request" else None if kind == "oneway"
             else draw(st.none() | some_text))
    uid = draw(st.one_of(st.text(min_size=1),
                         st.from_regex(r"[0-9]{16}-[0-9]{10}", fullmatch=True)))
    timestamp = draw(st.none() | any_instant)
    head = uid.partition("-")[0]
    if timestamp is None and len(head) == 16 and head.isascii() and head.isdigit():
        # an id of DropboxMQ's form carries its timestamp: keep them consistent
        timestamp = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=int(head[:13]))
    expiration = draw(st.none() | any_instant.filter(lambda d: d != datetime(1970, 1, 1, tzinfo=UTC)))
    headers = Headers(
        uid, kind, priority=draw(st.integers(0, 9)), timestamp=timestamp, expiration=expiration,
        correlation_id=draw(st.none() | some_text), reply_to=reply, type=draw(st.none() | some_text),
        message_class=draw(st.sampled_from("MBSPOT")), delivery_count=draw(st.integers(0, 2**63 - 1)))
    props = draw(st.dictionaries(st.text().filter(lambda k: k not in ("JMSXDeliveryCount",
                                                                        "JMS_ftpbcTimestamp")),
                                 property_values, max_size=5))
    return headers, props


def at_ms(h: Headers) -> Headers:
    return Headers(h.id, h.kind, h.priority, None if h.timestamp is None else ms(h.timestamp),
                   None if h.expiration is None else ms(h.expiration), h.correlation_id, h.reply_to,
                   h.type, h.message_class, h.delivery_count)


@PROP
@given(ftpbc_messages())
def test_ftpbc_round_trip(message: tuple[str, Headers, dict[str, PropertyValue]]) -> None:
    base, headers, props = message
    codec = FtpbcCodec(limit=HUGE)
    name = codec.encode(base, headers, props)
    assert not FORBIDDEN.search(name), name
    assert name.startswith(base) and name[len(base):].isascii()
    direction = "out" if headers.kind == "response" else "in"
    env = codec.decode(name, direction=direction)  # type: ignore[arg-type]
    assert env is not None
    assert env.base == base
    assert env.headers == at_ms(headers)
    assert typed(env.properties) == typed(props)


@PROP
@given(dropboxmq_messages())
def test_dropboxmq_round_trip(message: tuple[Headers, dict[str, PropertyValue]]) -> None:
    headers, props = message
    codec = DropboxmqCodec(limit=HUGE)
    name = codec.encode("", headers, props)
    assert not FORBIDDEN.search(name), name
    assert name.isascii()
    assert len(name.split(".")) <= 8
    direction = "out" if headers.kind == "response" else "in"
    env = codec.decode(name, direction=direction)  # type: ignore[arg-type]
    assert env is not None
    assert env.base == name
    assert env.headers == at_ms(headers)
    assert typed(env.properties) == typed(props)


@PROP
@given(ftpbc_messages(), st.integers(1, 300))
def test_encode_respects_the_limit(message: tuple[str, Headers, dict[str, PropertyValue]],
                                   limit: int) -> None:
    base, headers, props = message
    for codec in (FtpbcCodec(limit=limit), DropboxmqCodec(limit=limit)):
        if isinstance(codec, DropboxmqCodec):
            headers = Headers(headers.id, "response", priority=headers.priority,
                              delivery_count=headers.delivery_count, timestamp=headers.timestamp)
            props = {k: v for k, v in props.items() if k not in ("JMSXDeliveryCount", "JMS_ftpbcTimestamp")}
        try:
            name = codec.encode(base, headers, props)
        except NameTooLong as err:
            assert err.length > limit == err.limit and err.fields
            assert set(err.fields) <= set(err.sizes)
        else:
            assert len(name.encode("utf-8")) <= limit


hostile = st.one_of(
    st.text(),
    st.builds(lambda a, b: a + b,
              st.sampled_from(["req.", "msg.", "resp.", "resp.x.error", "req.x;", "resp.x;", "4.",
                               "4.x.T.", "4.x.B.....", "-1.x.S.1.", "9.1140429201295000-1.O."]),
              st.text(alphabet=";=.%&+-~0123456789abcdefABCDEFpnsectrkBYHILFDSTZ ", max_size=40)),
)


@PROP
@given(hostile, st.sampled_from(["in", "out"]))
def test_decode_never_crashes(name: str, direction: str) -> None:
    for codec in (FtpbcCodec(), DropboxmqCodec()):
        try:
            env = codec.decode(name, direction=direction)  # type: ignore[arg-type]
        except UnusableName as err:
            assert "\n" not in str(err) and err.name == name
        else:
            assert env is None or isinstance(env, Envelope)
