"""Spark's SQL parser of archived names (``ftpbc.analytics.sqlnames``) against the Python reference.

Names of every form the engine writes, made with its own encoders (``ftpbc.model.envelope``
codecs and ``archive_name``): ftpbc and dropboxmq naming, priorities, every header field,
properties of every type, percent-escapes, request names dated in a zone with DST, 12-hour and
day-of-year patterns, counters; and odd or hostile names (broken stamps, control characters,
bad escapes, bytes that are not UTF-8 once decoded, empty ids, too many fields).  Each is parsed
in every archive folder, with each endpoint's naming, by ``records.parse_record`` (Python) and
by ``sqlnames.parse_names`` (the JVM): every column must be the same.  Then whole archives made
of such names: the job's figures, per-node figures and unanswered list must equal the plain
Python pass's (``tests/plain_figures.py``), row for row.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from ftpbc.analytics.job import Options, run
from ftpbc.analytics.records import RAW_FIELDS, ddl, parse_record
from ftpbc.analytics.sources import ArchiveSource
from ftpbc.config.servers import ServerConfig
from ftpbc.exchange.area import REASON_SUFFIX, archive_name, stamp
from ftpbc.model.envelope import DropboxmqCodec, FtpbcCodec, Headers
from ftpbc.patterns import Pattern
from ftpbc.patterns.expand import ExpandContext, expand
from ftpbc.patterns.grammar import parse
from tests import plain_figures, test_aggregate

#: the one session-scoped SparkSession
spark = test_aggregate.spark

U = "4d4f6177-f085-456b-94d1-1ed22baae814"
V = "0b5e8a1c-3f2d-4e6a-9b7c-1d2e3f4a5b6c"
WHEN = datetime(2026, 3, 29, 0, 59, 59, 999_000, tzinfo=UTC)  # the night Paris moves to summer time
FOLDERS = ("inarchive", "inerror", "outarchive", "outerror", "indead")

#: endpoint -> naming facts, one per form the parser knows
NAMINGS: dict[str, dict[str, str]] = {
    "plain": {"naming": "ftpbc", "request_prefix": "req.", "response_prefix": "resp.",
              "message_name": "%u", "timezone": "UTC"},
    "paris": {"naming": "ftpbc", "request_prefix": "q-", "response_prefix": "a-",
              "message_name": "%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S", "timezone": "Europe/Paris"},
    "ampm": {"naming": "ftpbc", "request_prefix": "r.", "response_prefix": "resp.",
             "message_name": "%y%y-%D%D%D-%h%h%m%m%a_%u_%1%1.%1%1%1", "timezone": "America/New_York"},
    "noday": {"naming": "ftpbc", "request_prefix": "req.", "response_prefix": "resp.",
              "message_name": "job-%H%H%m%m-%f-%u", "timezone": "UTC"},
    "dbx": {"naming": "dropboxmq", "request_prefix": "req.", "response_prefix": "resp.",
            "message_name": "%u", "timezone": "UTC"},
}


def _request_base(endpoint: str, uuid: str, when: datetime) -> str:
    n = NAMINGS[endpoint]
    ctx = ExpandContext(endpoint=endpoint, now=when, tz=n["timezone"], uuid=uuid, file="in put.csv")
    text = n["message_name"]
    if "%1" in text:  # a counter without a store: write its value by hand, twice the same number
        text = text.replace("%1%1%1", "007").replace("%1%1", "07")
    return n["request_prefix"] + expand(text, parse(text), ctx).name


def _codec(endpoint: str) -> FtpbcCodec:
    """The endpoint's codec, as the engine builds it: the id of a request is its pattern's UUID."""
    n = NAMINGS[endpoint]
    pattern = Pattern.parse(n["request_prefix"] + n["message_name"])

    def uuid_of(base: str) -> str | None:
        m = pattern.match(base)
        return m.uuid if m is not None else None

    return FtpbcCodec(request_prefix=n["request_prefix"], response_prefix=n["response_prefix"],
                      uuid_of=uuid_of)


def _ftpbc_names(endpoint: str) -> list[str]:
    n = NAMINGS[endpoint]
    codec = _codec(endpoint)
    base = _request_base(endpoint, U, WHEN)
    resp, err = n["response_prefix"] + U, n["response_prefix"] + U + ".error"
    names = [
        base,
        codec.encode(base, Headers(U, "request", priority=9, reply_to="audit queue/1"), {}),
        codec.encode(base, Headers(U, "request", priority=0, delivery_count=3, timestamp=WHEN,
                                   expiration=WHEN + timedelta(days=1), correlation_id="order 42/7",
                                   type="quote.v2", message_class="T"),
                     {"region": "emea", "ok": True, "n": 2, "big": 2**40, "ratio": 0.25,
                      "ü~": "é;=&%"}),
        resp,
        codec.encode(resp, Headers(U, "response", priority=9), {}),
        codec.encode(resp, Headers(U, "response", priority=2, reply_to="quote"), {"elapsedD": 1.5}),
        err,
        codec.encode(err, Headers(U, "response", priority=7, type="ftpbc.error"), {}),
    ]
    return names


def _dropboxmq_names() -> list[str]:
    codec = DropboxmqCodec()
    dbx_id = "1140429201295000-9262574723"
    return [
        codec.encode("", Headers(dbx_id, "request", priority=4, reply_to="TestQueue1", type="XYZType",
                                 message_class="T", expiration=WHEN), {"prop1": "hello"}),
        codec.encode("", Headers("id with. dots/and space", "request", reply_to="q", priority=9), {"a b": 1}),
        codec.encode("", Headers(dbx_id, "response", correlation_id=dbx_id), {}),
        codec.encode("", Headers(dbx_id, "response", correlation_id=dbx_id, type="ftpbc.error"), {}),
        codec.encode("", Headers("id with. dots/and space", "response", priority=9), {}),
        codec.encode("", Headers(dbx_id, "oneway", delivery_count=2), {}),
        "4.1140429201295000-9262574723.T.1140429211295.corr1283.TestQueue1.XYZType.prop1S=hello",
        "4.id+with+plus.B...q", "-12.x.M...q", "99999999999.x.B", "4..B...q", "4.x.B..%E2%82%AC.q",
        "report.txt", "a.b", "4.x.Z...q", "4.x.B.soon..q", "4.x%zz.B...q", "4.x%FF.B...q",
        "4.x%EF%BF%BD.B...q", "4.x.B...q....", "1.2.3.4.5.6.7.8.9", "4.x.B..%C3%28.q", "4.x.B...%4",
    ]


HOSTILE = [
    "", ".", "..", "~", "~~", "~~~", "a~b~c", "req.~n~20260301T000000.000Z", "resp.~n~20260301T000000.000Z",
    "resp..error~n~20260301T000000.000Z", f"REQ.{U}", f"req.{U.upper()}", f"req.x{U}y", f"req.\n{U}",
    f"req.{U}\n", f"req.{U}\x1b[2J", f"req.{U};p=12;zz", f"req.{U};", f"resp.{U};p=9;.bad",
    f"req.{U}~node~20260230T000000.000Z", f"req.{U}~node~20260229T000000.000Z",
    f"req.{U}~node~20280229T235959.999Z", f"req.{U}~node~20260301T240000.000Z",
    f"req.{U}~node~20260301T006000.000Z", f"req.{U}~node~20260301T000060.000Z",
    f"req.{U}~node~00000101T000000.000Z", f"req.{U}~node~20260301T000000.000ZZ",
    f"req.{U}~node~2026030\uff11T000000.000Z", f"req.{U}~node~20260301T000000Z",
    f"req.{U}~node~20260301T000000.0000Z", f"req.{U}~~20260301T000000.000Z",
    f"req.{U}~20260301T000000.000Z", f"req.{U}~node", f"req.{U}~a~b~20260301T000000.000Z",
    f"req.{U}~n~20260301T000000.000Z.reason", "x.reason", ".reason", f"req.{U}.reason~n",
    "q-" + U + ".20260230120000000", "q-" + U + ".20260329023000000", "q-" + U + ".20261025023000000",
    "q-" + U + ".00000101000000000", "q-" + U + ".99991231235959999", "q-" + U + ".2026032912000000",
    "r.26-000-1200AM_" + U + "_07.007", "r.26-366-1259PM_" + U + "_7.0007",
    "r.00-001-1200AM_" + U + "_07.008",
    "r.26-999-0000AM_" + U + "_07.007", "job-2359-a-" + U, "job-2460-a/b-" + U,
    "é" * 60 + U, "req." + "x" * 250, f"req.{U}\u202e", "resp.\ufffd", f"resp.{U}\u2028",
    # header fields read from the name (reply-to, correlation id): empty, broken, doubled, odd
    f"resp.{U};r=", f"resp.{U};r=%zz", f"resp.{U};r=%FF", f"resp.{U};r=%", f"resp.{U};r=a+b",
    f"resp.{U};r=a%2Bb%20c", f"resp.{U};x=1;r=first;r=second", f"resp.{U};.rS=x;r=ok",
    f"resp.{U};c=r=x;rr=y", f"resp.{U};r=a%3Bb", f"req.{U};r=%EF%BF%BD", f"req.{U};r=q=1",
    f"req.{U};r=caf%C3%A9;c=%E2%82%AC", f"req.{U};c=%C3%28", f"resp.{U}.error;r=other;p=3",
    f"resp.{U};r=\u00e9\n", "resp.;r=x", f"resp.{U}r=x", f"resp.{U};R=x",
]


#: property values that land in unanswered request names: comma, quotes, spaces, a tab
ODD_TAILS = ["a,b", 'say "hi"', " both ends ", "tab\tend", "x" * 150 + ",", "'single'"]


def _rows() -> list[dict[str, Any]]:
    names: list[str] = list(HOSTILE) + _dropboxmq_names()
    for endpoint in ("plain", "paris", "ampm", "noday"):
        names += _ftpbc_names(endpoint)
    stamped = [f"{n}~node-a~{stamp(WHEN)}" for n in names if "~" not in n]
    stamped += [s + REASON_SUFFIX for s in stamped[:20]]
    stamped += [n + "~uncollected~20260301T000000.001Z" for n in names[:10]]
    every = sorted(set(names + stamped))
    return [{"endpoint": e, "folder": f, "name": n, "size": len(n), "mtime_us": 1_772_000_000_123_456,
             "mtime_prec_us": 1} for e in NAMINGS for f in FOLDERS for n in every]


# Not slow: the fast lane's one Spark start, so it reaches the modules that build the Spark job.
def test_spark_parses_every_name_as_the_python_reference(spark: Any) -> None:
    rows = _rows()
    want = {(r["endpoint"], r["folder"], r["name"]): parse_record(r, NAMINGS[r["endpoint"]]) for r in rows}
    raw = spark.createDataFrame([tuple(r[k] for k, _ in RAW_FIELDS) for r in rows], ddl(RAW_FIELDS))
    from ftpbc.analytics.sqlnames import parse_names

    got: dict[tuple[str, str, str], dict[str, Any]] = {}
    for endpoint, naming in NAMINGS.items():
        for r in parse_names(raw.filter(raw.endpoint == endpoint), naming).collect():
            got[(r["endpoint"], r["folder"], r["name"])] = r.asDict()
    assert len(got) == len(want) == len(rows)
    differ = [(k, want[k], got[k]) for k in want if want[k] != got[k]]
    assert not differ, f"{len(differ)} names parsed differently, first: {differ[:3]}"

    # And the reference reads what the engine wrote: every form pairs on the request's id.
    def parsed(endpoint: str, folder: str, name: str) -> tuple[str, str | None]:
        r = want[(endpoint, folder, archive_name(name, "node-a", WHEN))]
        return r["kind"], r["uuid"]

    def headers(endpoint: str, folder: str, name: str) -> tuple[str | None, str | None]:
        r = want[(endpoint, folder, name)]
        return r["reply_to"], r["correlation_id"]

    for endpoint in ("plain", "paris", "ampm", "noday"):
        names = _ftpbc_names(endpoint)
        stamped = [archive_name(n, "node-a", WHEN) for n in names]
        assert headers(endpoint, "inarchive", stamped[1]) == ("audit queue/1", None)
        assert headers(endpoint, "inarchive", stamped[2]) == (None, "order 42/7")
        assert headers(endpoint, "outarchive", stamped[5]) == ("quote", None)
        assert {parsed(endpoint, "inarchive", n) for n in names[:3]} == {("request", U)}, endpoint
        assert {parsed(endpoint, "outarchive", n) for n in names[3:6]} == {("response", U)}, endpoint
        assert {parsed(endpoint, "outarchive", n) for n in names[6:]} == {("error_reply", U)}, endpoint
    dbx = _dropboxmq_names()
    assert parsed("dbx", "inarchive", dbx[0]) == ("request", "1140429201295000-9262574723")
    assert parsed("dbx", "inarchive", dbx[1]) == ("request", "id with. dots/and space")
    assert parsed("dbx", "indead", dbx[0]) == ("request", "1140429201295000-9262574723")  # request side
    assert parsed("dbx", "outarchive", dbx[2]) == ("response", "1140429201295000-9262574723")
    assert parsed("dbx", "outarchive", dbx[3]) == ("error_reply", "1140429201295000-9262574723")
    assert parsed("dbx", "outarchive", dbx[4]) == ("response", "id with. dots/and space")
    assert parsed("dbx", "inarchive", dbx[5])[0] == "other"  # one-way: no reply-to
    assert headers("dbx", "inarchive", archive_name(dbx[0], "node-a", WHEN)) == ("TestQueue1", None)
    assert headers("dbx", "inarchive", dbx[6]) == ("TestQueue1", "corr1283")
    assert headers("dbx", "outarchive", "report.txt") == (None, None)  # a foreign reply
    # The first field of its key wins; a field that is empty or not decodable says nothing;
    # '+' is itself in ftpbc names (a space in DropboxMQ's).
    for name, reply_to in ((f"resp.{U};x=1;r=first;r=second", "first"), (f"resp.{U};r=", None),
                           (f"resp.{U};r=%zz", None), (f"resp.{U};r=%FF", None), (f"resp.{U};r=a+b", "a+b"),
                           (f"resp.{U};.rS=x;r=ok", "ok"), (f"resp.{U};c=r=x;rr=y", None),
                           (f"req.{U};r=%EF%BF%BD", None), (f"resp.{U}.error;r=other;p=3", "other")):
        assert headers("plain", "outarchive" if name.startswith("resp.") else "inarchive", name)[0] == \
            reply_to, name
    assert headers("dbx", "inarchive", "4.id+with+plus.B...q") == ("q", None)
    assert headers("plain", "inarchive", f"req.{U};r=caf%C3%A9;c=%E2%82%AC") == ("café", "€")
    # Times in names: the Paris name says 01:59:59.999 local on the night of the change (UTC+1),
    # the 12-hour one 12:00 AM on day 0 of 2026 (31 December 2025) in New York.
    paris = want[("paris", "inarchive", archive_name(_ftpbc_names("paris")[0], "node-a", WHEN))]
    assert (paris["name_time_us"], paris["name_prec_us"]) == (_us(WHEN), 1000)
    ampm = want[("ampm", "inarchive", "r.26-000-1200AM_" + U + "_07.007")]
    assert ampm["name_time_us"] == _us(datetime(2025, 12, 31, tzinfo=ZoneInfo("America/New_York")))
    assert want[("ampm", "inarchive", "r.00-001-1200AM_" + U + "_07.008")]["uuid"] == U  # by the fallback
    assert want[("noday", "inarchive", "job-2359-a-" + U)]["name_time_us"] is None  # no day in it
    # Hostile names are skipped (kind other), identically on both sides (checked above).
    for name in ("", "~", "req.~n~20260301T000000.000Z", "4.x%FF.B...q", "4.x%zz.B...q",
                 "4.x%EF%BF%BD.B...q", "1.2.3.4.5.6.7.8.9"):
        for endpoint in ("plain", "dbx"):
            assert want[(endpoint, "inarchive", name)]["kind"] == "other", (endpoint, name)
    bad_stamp = want[("plain", "inarchive", f"req.{U}~node~20260230T000000.000Z")]
    assert (bad_stamp["kind"], bad_stamp["node"], bad_stamp["stamp_us"]) == \
        ("request", "20260230T000000.000Z", None)


def _us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _write(root: Path, source: ArchiveSource, folder: str, name: str, size: int, mtime: datetime) -> None:
    path = root / source.folder_path(folder).lstrip("/") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    ns = _us(mtime) * 1000
    import os

    os.utime(path, ns=(ns, ns))


@pytest.mark.slow
def test_job_figures_equal_the_plain_pass_on_every_naming_form(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "exchange"
    srv = ServerConfig.from_url(f"file://{root}", name="site")
    sources = [ArchiveSource(e, srv, f"/{e}", request_prefix=n["request_prefix"],
                             response_prefix=n["response_prefix"], message_name=n["message_name"],
                             timezone=n["timezone"], naming_scheme=n["naming"]) for e, n in NAMINGS.items()]
    by_name = {s.endpoint: s for s in sources}
    t0 = datetime(2026, 3, 28, 22, tzinfo=UTC)
    for s in sources:
        for i in range(60):
            uid = f"{i:08x}-f085-456b-94d1-1ed22baae814"
            when = t0 + timedelta(minutes=7 * i, milliseconds=i)
            served = when + timedelta(milliseconds=40 + i)
            collected = when + timedelta(milliseconds=90 + 3 * i)
            if s.naming_scheme == "dropboxmq":
                codec = DropboxmqCodec()
                req = codec.encode("", Headers(uid, "request", priority=i % 10, reply_to="q"), {"iI": i})
                resp = codec.encode("", Headers(uid, "response", correlation_id=uid,
                                                type="ftpbc.error" if i % 7 == 0 else None), {})
            else:
                codec = _codec(s.endpoint)
                base = _request_base(s.endpoint, uid, when)
                req = codec.encode(base, Headers(uid, "request", priority=i % 10), {"iI": i} if i % 2 else {})
                rbase = s.response_prefix + uid + (".error" if i % 7 == 0 else "")
                resp = codec.encode(rbase, Headers(uid, "response", priority=i % 10,
                                                   type="ftpbc.error" if i % 7 == 0 else None), {})
            # Every fifth reply goes through reply_to to another endpoint's outbox (plain's, or
            # dbx's for plain's own requests), named as that endpoint names its replies.
            there = s
            if i % 5 == 2:
                there = by_name["dbx" if s.endpoint == "plain" else "plain"]
                error = i % 7 == 0
                if there.naming_scheme == "dropboxmq":
                    resp = DropboxmqCodec().encode("", Headers(uid, "response", correlation_id=uid,
                                                               reply_to=s.endpoint,
                                                               type="ftpbc.error" if error else None), {})
                else:
                    rbase = there.response_prefix + uid + (".error" if error else "")
                    resp = _codec(there.endpoint).encode(rbase, Headers(
                        uid, "response", reply_to=s.endpoint, type="ftpbc.error" if error else None), {})
            folder = "inerror" if i % 11 == 0 else "inarchive"
            archived = archive_name(req, f"node-{i % 3}", served)
            _write(root, s, folder, archived, 10 + i, when)
            if i % 11 == 0:
                _write(root, s, "inerror", archived + REASON_SUFFIX, 5, when)
            if i % 9 != 0:  # unanswered otherwise
                node = "uncollected" if i % 13 == 0 and there is s else f"client-{i % 2}"
                _write(root, there, "outerror" if i % 17 == 0 else "outarchive",
                       archive_name(resp, node, collected), 20 + i, collected)
        # Hostile names that the reference skips must be skipped by Spark too.  (Not the ones it
        # counts: several requests of one id archived at the same stamp by different nodes do not
        # say which node served it, and the two sides may name different ones.)
        for folder in ("inarchive", "outarchive"):
            for name in HOSTILE + _dropboxmq_names():
                raw = {"endpoint": s.endpoint, "folder": folder, "name": name, "size": 3, "mtime_us": 0,
                       "mtime_prec_us": 1}
                if (name and "/" not in name and name not in (".", "..")
                        and parse_record(raw, s.naming())["kind"] == "other"):
                    _write(root, s, folder, name, 3, t0)
    # Unanswered requests whose names a CSV writer must quote or escape: the engines' lists must
    # still be written alike.
    plain = next(s for s in sources if s.endpoint == "plain")
    for i, tail in enumerate(ODD_TAILS):
        uid = f"{i:08x}-0dd0-456b-94d1-1ed22baae814"
        _write(root, plain, "inarchive", archive_name(f"req.{uid};.noteS={tail}", "node-0", t0),
               7, t0 + timedelta(seconds=i))
    out = tmp_path / "out"
    res = run(Options(sources=sources, out=out, progress=False, print_table=False, engine="spark",
                      provenance=True),
              spark=spark)
    ref = plain_figures.run(sources)

    import pyarrow.parquet as pq

    assert sum(r["requests"] for r in ref.figures) >= 5 * 60
    assert res.figures == ref.figures
    assert res.nodes == ref.nodes
    unanswered = pq.read_table(out / "unanswered").to_pylist()
    for r in unanswered:
        for k in ("bucket", "submitted"):
            r[k] = r[k].astimezone(UTC).replace(tzinfo=None)
    unanswered.sort(key=lambda r: (r["endpoint"], r["submitted"] is not None, r["submitted"], r["name"]))
    assert unanswered == ref.unanswered
    assert {r["t0_source"] for r in ref.figures} >= {"name", "mtime"}
    # Replies through reply_to are paired with their requests: only the i % 9 == 0 are unanswered.
    assert {(r["endpoint"], r["uuid"][:8]) for r in ref.unanswered if "-0dd0-" not in r["uuid"]} == \
        {(s.endpoint, f"{i:08x}") for s in sources for i in range(60) if i % 9 == 0}

    # The plain engine, as ``ftpbc aggregate --engine plain`` runs it: every output the same.
    plain_out = tmp_path / "out-plain"
    alike = run(Options(sources=sources, out=plain_out, progress=False, print_table=False, engine="plain",
                        provenance=True))
    assert (alike.engine, res.engine) == ("plain", "spark")
    assert_same_outputs(out, plain_out)


def assert_same_outputs(spark_out: Path, plain_out: Path) -> None:
    """Every output of the two engines holds the same: figures and nodes (Parquet rows and CSV
    bytes), the unanswered list (Parquet rows and types, CSV text, both in order), the chart,
    and the provenance table when there is one."""
    import pyarrow.parquet as pq

    for stem in ("figures", "nodes"):
        a, b = pq.read_table(spark_out / f"{stem}.parquet"), pq.read_table(plain_out / f"{stem}.parquet")
        assert a.schema == b.schema and a.to_pylist() == b.to_pylist(), stem
        assert (spark_out / f"{stem}.csv").read_bytes() == (plain_out / f"{stem}.csv").read_bytes(), stem
    a, b = pq.read_table(spark_out / "unanswered"), pq.read_table(plain_out / "unanswered")
    assert a.schema.remove_metadata() == b.schema.remove_metadata()
    assert a.num_rows > 0 and a.to_pylist() == b.to_pylist()
    [a_csv] = (spark_out / "unanswered_csv").glob("part-*.csv")
    [b_csv] = (plain_out / "unanswered_csv").glob("part-*.csv")
    assert a_csv.read_text(encoding="utf-8") == b_csv.read_text(encoding="utf-8")
    assert (spark_out / "chart.png").read_bytes() == (plain_out / "chart.png").read_bytes()
    if (spark_out / "provenance").exists():
        # one row per request, in no order: the same rows, the same columns of the same types
        a, b = pq.read_table(spark_out / "provenance"), pq.read_table(plain_out / "provenance")
        assert [(f.name, f.type) for f in a.schema] == [(f.name, f.type) for f in b.schema]

        def rows(table: Any) -> list[dict[str, Any]]:
            return sorted(table.to_pylist(), key=lambda r: (r["endpoint"], r["id"]))

        assert a.num_rows > 0 and rows(a) == rows(b)
