"""Archived names parsed in the JVM: Spark SQL columns computing what ``records.parse_record`` does.

Input: raw listing rows (:data:`ftpbc.analytics.records.RAW_FIELDS`) of one endpoint.  Output:
the parsed rows (:data:`~ftpbc.analytics.records.PARSED_FIELDS`), built only from Spark's own
functions (``rlike``, ``regexp_extract``, ``regexp_replace``, ``split``, ``try_url_decode``,
integer arithmetic, ``to_utc_timestamp``): no Python UDF, no RDD function, so no Python process
runs on the executors and no row crosses to Python.

``records.parse_record`` is the reference, and this module follows it step by step (the
functions below are named after the ones there); ``tests/test_aggregate_names.py`` checks that
both give the same columns for names of every form and for hostile ones.  Where the engines
differ, the reference was written so that both can compute it: stamps are read strictly
(``records.STAMP_RE``), dates by integer arithmetic (``records.days_from_civil``), and a
percent-decoded value holding U+FFFD is refused (Java's decoder writes it for bytes that are
not UTF-8; Python's raises).

Not guaranteed: a request name dated in a time zone whose rules differ between Python's
zoneinfo data and the JVM's (a tzdata update one of them lacks) converts by each one's rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ftpbc.analytics.nameplan import NamePlan, plan
from ftpbc.analytics.nametime import reader_for
from ftpbc.analytics.records import (
    BAD_ESCAPE_RE,
    CLASS_RE,
    CORRELATION_KEY,
    ERROR_TYPE,
    EXPIRATION_RE,
    MESSAGE_KINDS,
    PARSED_FIELDS,
    PRIORITY_RE,
    REPLY_TO_KEY,
    REQUEST_SIDE,
    STAMP_RE,
    UNCOLLECTED,
)
from ftpbc.exchange.area import ERROR_REPLY_SUFFIX, REASON_SUFFIX
from ftpbc.patterns.match import UUID_RE

#: joins the extracted groups in one ``regexp_replace``: never in a group Spark extracts (digits,
#: AM/PM, month and day names, UUIDs), whatever the name holds
_SEP = "\u0001"
_MAX = 1 << 30  # "to the end" for substr
#: days since the epoch of 0001-01-01 and 9999-12-31, the range of Python's datetime
_DAY_ONE = -719162
_DAY_LAST = 2932896

__all__ = ["UNCOLLECTED", "parse_names"]


def _anchored(regex: str) -> str:
    return f"(?s)\\A(?:{regex})\\z"


def _long(c: Column) -> Column:
    # try_cast: with ANSI mode (Spark 4's default) a cast of text that is no number would fail
    # the job instead of giving null.
    return c.try_cast("long")


def _div(a: Column, b: int) -> Column:
    """Floor division (Python's ``//``) of a long column by a positive constant."""
    return _long((a - F.pmod(a, F.lit(b))) / F.lit(b))


def _stage(df: DataFrame, **columns: Column) -> DataFrame:
    """``df`` with these columns added in one projection of their own.

    Why stages: a column used twice in one expression is a copy of its whole expression tree,
    and the copies nest (a date uses its year thrice, a name's parts use the match...), which
    gives a plan so large that Spark takes seconds to optimise it, and that evaluates each
    regular expression many times per row.  A column of an earlier projection is a
    reference; Spark keeps the projections apart (CollapseProject does not merge one whose
    non-trivial expression would then be computed twice).
    """
    return df.select("*", *[c.alias(k) for k, c in columns.items()])


def _civil_days(df: DataFrame, out: str, year: str, month: str, day: str) -> DataFrame:
    """Adds ``out``: ``records.days_from_civil`` of three long columns, by column arithmetic."""
    y, m, d = F.col(year), F.col(month), F.col(day)
    shifted = y - F.when(m <= 2, 1).otherwise(0)
    df = _stage(df, **{f"{out}_y": shifted, f"{out}_era": _div(shifted, 400),
                       f"{out}_doy": _div(F.lit(153) * (m + F.when(m > 2, -3).otherwise(9)) + 2, 5) + d - 1})
    era = F.col(f"{out}_era")
    yoe = F.col(f"{out}_y") - era * 400
    days = era * 146097 + yoe * 365 + _div(yoe, 4) - _div(yoe, 100) + F.col(f"{out}_doy") - 719468
    return _stage(df, **{out: days})


def _valid_date(year: Column, month: Column, day: Column) -> Column:
    """``records.valid_date`` (arguments: column references)."""
    leap = (F.pmod(year, F.lit(4)) == 0) & ((F.pmod(year, F.lit(100)) != 0) | (F.pmod(year, F.lit(400)) == 0))
    dim = (F.when(month == 2, F.when(leap, 29).otherwise(28))
           .when(month.isin(4, 6, 9, 11), 30).otherwise(31))
    return (year >= 1) & (year <= 9999) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= dim)


def _split_archived(df: DataFrame) -> DataFrame:
    """``records.split_archived`` (and the ``.reason`` suffix): adds ``is_reason``, ``_base``,
    ``node`` and ``stamp_us``."""
    n = F.col("name")
    reason_re = _anchored("(.*)" + REASON_SUFFIX.replace(".", "\\."))
    is_reason = n.endswith(REASON_SUFFIX)
    df = _stage(df, is_reason=is_reason,
                _archived=F.when(is_reason, F.regexp_extract(n, reason_re, 1)).otherwise(n))
    a = F.col("_archived")
    has = a.contains("~")
    last_tilde = _anchored("(.*)~([^~]*)")
    df = _stage(df, _rest=F.when(has, F.regexp_extract(a, last_tilde, 1)),
                _last=F.when(has, F.regexp_extract(a, last_tilde, 2)))
    last = F.col("_last")

    def part(pos: int, n: int) -> Column:
        return _long(F.substring(last, pos, n))

    df = _stage(df, _sok=last.rlike(_anchored(STAMP_RE)), _sy=part(1, 4), _smo=part(5, 2), _sd=part(7, 2),
                _sh=part(10, 2), _smi=part(12, 2), _ss=part(14, 2), _sms=part(17, 3))
    df = _civil_days(df, "_sdays", "_sy", "_smo", "_sd")
    c = F.col
    ok = (c("_sok") & _valid_date(c("_sy"), c("_smo"), c("_sd")) & (c("_sh") <= 23) & (c("_smi") <= 59)
          & (c("_ss") <= 59))
    us = ((c("_sdays") * 86_400 + c("_sh") * 3600 + c("_smi") * 60 + c("_ss")) * 1000 + c("_sms")) * 1000
    df = _stage(df, stamp_us=F.when(ok, us))
    rest, stamp = F.col("_rest"), F.col("stamp_us")
    nested = has & stamp.isNotNull() & rest.contains("~")
    df = _stage(df, _nbase=F.when(nested, F.regexp_extract(rest, last_tilde, 1)),
                _nnode=F.when(nested, F.regexp_extract(rest, last_tilde, 2)))
    base = F.when(~has, a).when(stamp.isNull(), rest).when(nested, F.col("_nbase")).otherwise(rest)
    node = F.when(~has, F.lit(None)).when(stamp.isNull(), last).when(nested, F.col("_nnode"))
    return _stage(df, _base=base, node=node)


def _url_decoded(value: Column) -> Column:
    """The first half of ``records.decode_field`` (``plus=False``: ``+`` is itself), of a column
    reference: percent-decoded, null when an escape is broken; :func:`_clean` is the rest."""
    return F.when(~value.rlike(BAD_ESCAPE_RE), F.try_url_decode(F.regexp_replace(value, "\\+", "%2B")))


def _clean(decoded: Column) -> Column:
    """The rest of ``records.decode_field``, of a column reference: null when empty or holding
    U+FFFD (bytes that were not UTF-8)."""
    return F.when(~decoded.contains("\ufffd") & (decoded != ""), decoded)


def _ftpbc_field(base: Column, key: str) -> Column:
    """``records.ftpbc_field``: the first ``;<key>=`` field's value, still encoded (``""`` when
    there is none, which ``_clean`` makes null).  The first ``;<key>=`` in the whole base is the
    first such field: it holds a ``;``, so it cannot come before the first one."""
    return F.regexp_extract(base, f";{key}=([^;]*)", 1)


def _after(c: Column, prefix: str) -> Column:
    return c.substr(F.lit(len(prefix) + 1), F.lit(_MAX))


def _request(df: DataFrame, p: NamePlan, zone: str) -> DataFrame:
    """``NameReader.read`` of ``_rreq`` (a request name's text after its prefix, null for other
    names) with the plan's regex (``ftpbc.analytics.nameplan``): adds ``_ruuid``, ``_rtime`` and
    ``_rprec``."""
    rest = F.col("_rreq")
    c = F.col
    extra: dict[str, Column] = {}
    if p.used:
        # One regex run gives every group Spark needs, joined by _SEP, rather than one run per group.
        joined = F.regexp_replace(rest, p.regex, _SEP.join(f"${{g{g}}}" for g in p.used))
        extra["_rparts"] = F.when(rest.rlike(p.regex), F.split(joined, _SEP, -1))
    df = _stage(df, **extra)

    def g(group: int | None) -> Column:
        return F.get(c("_rparts"), F.lit(p.used.index(group))) if group is not None else F.lit(None)

    matched = c("_rparts").isNotNull() if p.used else rest.rlike(p.regex)
    for a, b in p.same_number:
        matched = matched & (F.regexp_replace(g(a), "^0+", "") == F.regexp_replace(g(b), "^0+", ""))
    fallback = F.nullif(F.lower(F.regexp_extract(rest, "(?i)" + UUID_RE, 0)), F.lit(""))
    df = _stage(df, _rmatched=matched)
    df = _stage(df, _ruuid=F.when(c("_rmatched"), g(p.uuid)).otherwise(F.when(rest.isNotNull(), fallback)))
    none = F.lit(None).cast("long")
    if p.year is None or p.precision_us is None:
        return _stage(df, _rtime=none, _rprec=none)

    def num(group: int | None, default: int = 0) -> Column:
        return _long(g(group)) if group is not None else F.lit(default).cast("long")

    if p.hour is not None:
        hour = num(p.hour)
    elif p.hour_k is not None:
        hour = F.pmod(num(p.hour_k), F.lit(24))
    elif p.hour_12 is not None:
        pm = F.when(g(p.am_pm) == "PM", 12).otherwise(0) if p.am_pm is not None else F.lit(0)
        hour = F.pmod(num(p.hour_12), F.lit(12)) + pm
    else:
        hour = F.lit(0).cast("long")
    by_month = p.month is not None and p.day is not None
    one = F.lit(1).cast("long")
    df = _stage(df, _ry=num(p.year[0]) + p.year[1], _rmo=num(p.month, 1) if by_month else one,
                _rd=num(p.day, 1) if by_month else one,
                _rdoy=F.lit(0).cast("long") if by_month else num(p.day_of_year),
                _rh=hour, _rmi=num(p.minute), _rs=num(p.second), _rms=num(p.milli))
    df = _civil_days(df, "_rdays0", "_ry", "_rmo", "_rd")
    if by_month:
        days, day_ok = c("_rdays0"), _valid_date(c("_ry"), c("_rmo"), c("_rd"))
    else:  # NameReader: fromordinal(date(year, 1, 1).toordinal() + doy - 1), within years 1-9999
        days = c("_rdays0") + c("_rdoy") - 1
        day_ok = ((c("_ry") >= 1) & (c("_ry") <= 9999) & (days >= _DAY_ONE) & (days <= _DAY_LAST))
    ok = c("_rmatched") & day_ok & (c("_rh") <= 23) & (c("_rmi") <= 59) & (c("_rs") <= 59)
    local = (((days * 86_400 + c("_rh") * 3600 + c("_rmi") * 60 + c("_rs")) * 1000 + c("_rms")) * 1000)
    t = F.when(ok, local.cast("long"))
    if zone != "UTC":
        # The local wall time as if UTC, then read in the zone: Spark's to_utc_timestamp takes a
        # time in a DST gap forward and one in an overlap at its earlier offset, which is the
        # instant Python's zoneinfo gives with fold=0 (NameReader).
        t = F.unix_micros(F.to_utc_timestamp(F.timestamp_micros(t), zone))
    return _stage(df, _rtime=t, _rprec=F.when(ok, F.lit(p.precision_us).cast("long")))


def _ftpbc(df: DataFrame, naming: Mapping[str, str]) -> DataFrame:
    """``records._ftpbc_kind``: adds ``_kind``, ``_uuid``, ``_t`` and ``_p``."""
    df = _stage(df, _b0=F.substring_index(F.col("_base"), ";", 1))
    b0 = F.col("_b0")
    req, resp = naming["request_prefix"], naming["response_prefix"]
    # The longer prefix first, as the reference: "r." never shadows "resp.".
    first = "response" if len(resp) > len(req) else "request"
    is_resp = b0.startswith(resp) if first == "response" else b0.startswith(resp) & ~b0.startswith(req)
    is_req = b0.startswith(req) if first == "request" else b0.startswith(req) & ~b0.startswith(resp)
    p = plan(naming["message_name"], reader_for(naming["message_name"], naming["timezone"]).precision_us)
    df = _stage(df, _rreq=F.when(is_req, _after(b0, req)), _rresp=F.when(is_resp, _after(b0, resp)))
    df = _request(df, p, naming["timezone"])
    r = F.col("_rresp")
    is_err = r.endswith(ERROR_REPLY_SUFFIX)
    df = _stage(df, _rid=F.when(is_err, F.regexp_extract(r, _anchored("(.*)\\.error"), 1)).otherwise(r))
    rid = F.col("_rid")
    kind = (F.when(F.col("_rreq").isNotNull(), F.when(F.col("_ruuid").isNull(), "other").otherwise("request"))
            .when(r.isNotNull(), F.when(rid == "", "other").when(is_err, "error_reply").otherwise("response"))
            .otherwise("other"))
    uuid = F.when(F.col("_rreq").isNotNull(), F.col("_ruuid")).when(rid != "", rid)
    df = _stage(df, _fr=_ftpbc_field(F.col("_base"), REPLY_TO_KEY),
                _fc=_ftpbc_field(F.col("_base"), CORRELATION_KEY))
    df = _stage(df, _ur=_url_decoded(F.col("_fr")), _uc=_url_decoded(F.col("_fc")))
    return (df.select("*", kind.alias("_kind"), uuid.alias("_uuid"), F.col("_rtime").alias("_t"),
                      F.col("_rprec").alias("_p"), _clean(F.col("_ur")).alias("_reply"),
                      _clean(F.col("_uc")).alias("_corr")))


def _dropboxmq(df: DataFrame) -> DataFrame:
    """``records._dropboxmq_kind``: adds ``_kind``, ``_uuid``, ``_t`` and ``_p``."""
    b = F.col("_base")
    df = _stage(df, _f=F.split(b, "\\.", -1))
    f = F.col("_f")
    n = F.size(f)

    def field(i: int) -> Column:
        return F.coalesce(F.get(f, F.lit(i)), F.lit(""))

    df = _stage(df, **{f"_u{i}": F.when(~field(i).rlike(BAD_ESCAPE_RE), F.try_url_decode(field(i)))
                       for i in (1, 4, 5, 6)})
    df = _stage(df, **{f"_d{i}": F.when(~F.col(f"_u{i}").contains("\ufffd"), F.col(f"_u{i}"))
                       for i in (1, 4, 5, 6)})
    df = _stage(df, _inbound=F.col("folder").isin(*REQUEST_SIDE),
                _foreign=(n < 3) | ~field(0).rlike(_anchored(PRIORITY_RE)),
                _broken=((n > 8) | ~field(2).rlike(_anchored(CLASS_RE))
                         | ~field(3).rlike(_anchored(EXPIRATION_RE))
                         | F.col("_d1").isNull() | F.col("_d4").isNull() | F.col("_d5").isNull()
                         | F.col("_d6").isNull()))
    inbound, foreign, broken = F.col("_inbound"), F.col("_foreign"), F.col("_broken")
    df = _stage(df, _kind=(F.when(b.isin("", ".", ".."), "other")
                           .when(foreign, F.when(inbound, "other").otherwise("response"))
                           .when(broken, "other")
                           .when(inbound, F.when(field(5) != "", "request").otherwise("other"))
                           .when(F.col("_d6") == ERROR_TYPE, "error_reply").otherwise("response")))
    uid = F.when(F.col("_d1") == "", b).otherwise(F.col("_d1"))
    uuid = (F.when(F.col("_kind") == "other", F.lit(None))
            .when(foreign, b)
            .when(inbound, uid)
            .when(field(4) != "", F.col("_d4")).otherwise(uid))
    none = F.lit(None).cast("long")
    # records._dropboxmq_headers: fields 6 and 5 as decoded above, of a DropboxMQ name only
    return (_stage(df, _uuid=uuid, _t=none, _p=none,
                   _reply=F.when(~foreign, F.nullif(F.col("_d5"), F.lit(""))),
                   _corr=F.when(~foreign, F.nullif(F.col("_d4"), F.lit("")))))


def parse_names(raw: DataFrame, naming: Mapping[str, str]) -> DataFrame:
    """``raw`` (one endpoint's raw rows) with the parsed columns, in ``PARSED_FIELDS`` order."""
    df = _split_archived(raw)
    df = _dropboxmq(df) if naming.get("naming", "ftpbc") == "dropboxmq" else _ftpbc(df, naming)
    reason = F.col("is_reason")
    out = {
        "kind": F.when(reason, "reason").otherwise(F.col("_kind")),
        "uuid": F.when(~reason, F.col("_uuid")),
        "name_time_us": F.when(~reason, F.col("_t")),
        "name_prec_us": F.when(~reason, F.col("_p")),
        "reply_to": F.when(~reason & F.col("_kind").isin(*MESSAGE_KINDS), F.col("_reply")),
        "correlation_id": F.when(~reason & F.col("_kind").isin(*MESSAGE_KINDS), F.col("_corr")),
    }
    return df.select(*[out[n].cast("long" if t == "long" else "string").alias(n) if n in out else F.col(n)
                       for n, t in PARSED_FIELDS])
