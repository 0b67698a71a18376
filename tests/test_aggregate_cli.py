"""``ftpbc aggregate -c ftpbc.yaml`` as a user runs it, against pyftpdlib, and its bad input.

The end-to-end case goes through the command line (``ftpbc.cli.main``, in this process), a YAML
configuration with the password in an environment variable, the FTP listing mirror and every
output file.  Its few hundred messages are below ``--engine auto``'s threshold, so it runs the
plain engine, as a user's run of that size does, and no Spark starts.  The figures it prints and
writes are checked against counts computed from the plan of what was archived
(``test_aggregate.expected``), not against either engine.  Only one server (pyftpdlib): what is
tested sits above the transport, which the mirror reaches through its own tested interface.

The bad-input cases fail before Spark starts: one line on stderr naming what to fix, exit 2.
"""

from __future__ import annotations

import csv
import logging
from datetime import datetime
from pathlib import Path

import pytest

from ftpbc.analytics.job import PLAIN_MAX_FILES
from ftpbc.analytics.sources import sources_from_config
from ftpbc.config.loader import load_config
from ftpbc.exchange.area import parse_archive_name
from ftpbc.transport.local import LocalTransport
from tests import synthetic, test_aggregate
from tests.servers.handle import ServerHandle
from tests.test_bad_input import main_in_process, one_line

MESSAGES = 600
CONFIG = """\
node:
  state_dir: {tmp}/state
  journal_dir: {tmp}/journals
servers:
  partner:
    url: {url}
    password_env: AGG_PARTNER_PASSWORD
endpoints:
  quote:
    server: partner
    repository: {base}/quote
  order:
    server: partner
    repository: {base}/order
    timezone: Europe/Paris
    message_name: "%u.%y%y%y%y%M%M%d%d%H%H%m%m%s%s%S%S%S"
  stock:
    server: partner
    repository: {base}/stock
    request_prefix: "q-"
    response_prefix: "a-"
    message_name: "%u_%y%y%y%y%M%M%d%d%H%H%m%m%s%s"
"""


@pytest.fixture
def config_file(pyftpdlib_server: ServerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A configuration naming three endpoints on the pyftpdlib server; the password in the env."""
    monkeypatch.setenv("AGG_PARTNER_PASSWORD", pyftpdlib_server.password or "")
    path = tmp_path / "ftpbc.yaml"
    path.write_text(CONFIG.format(tmp=tmp_path, url=pyftpdlib_server.url.rstrip("/"),
                                  base=pyftpdlib_server.fresh_dir()), encoding="utf-8")
    return path


def _table(stdout: str) -> dict[tuple[str, datetime], list[str]]:
    """The printed figures table: (endpoint, bucket) -> the other cells, as printed."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("endpoint"))
    assert lines[head].split()[:4] == ["endpoint", "bucket", "(UTC)", "req"], lines[head]
    assert set(lines[head + 1]) == {"-"}
    rows = {}
    for line in lines[head + 2:]:
        cells = line.split()
        if len(cells) != 14:  # the summary line after the table
            break
        rows[(cells[0], datetime.strptime(f"{cells[1]} {cells[2]}", "%Y-%m-%d %H:%M"))] = cells[3:]
    return rows


def test_aggregate_command_prints_and_writes_the_figures(
        config_file: Path, pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    sources = sources_from_config(load_config(config_file))
    messages = synthetic.plan(sources, MESSAGES // 3, test_aggregate.START, test_aggregate.SPAN, seed=11)
    root = str(pyftpdlib_server.root)
    synthetic.write(LocalTransport(root, durable=False), sources, messages,
                    synthetic.local_mtime_setter(root))
    out = tmp_path / "out"

    result = main_in_process("aggregate", "-c", str(config_file), "--out", str(out), "--no-progress")

    assert result.returncode == 0, result.stderr
    want = test_aggregate.expected(messages)
    printed = _table(result.stdout)
    assert set(printed) == set(want)
    for key, w in want.items():
        cells = printed[key]
        assert cells[:5] == [str(w[k]) for k in ("requests", "responses", "errors", "unanswered",
                                                 "uncollected")], key
        for cell, p in zip(cells[5:9], ("p50", "p95", "p99", "max"), strict=True):
            # printed to the ms: an interpolated x.5 may round either way
            assert cell == "-" if w[f"latency_{p}_ms"] is None else \
                abs(float(cell) - w[f"latency_{p}_ms"]) <= 0.5 + 1e-6, (key, p, cell)
        assert cells[9:] == [w["t0_source"], format(w["t0_precision_ms"], "g")], key
    n_unanswered = sum(m.fate == "unanswered" for m in messages)
    assert result.stdout.splitlines()[-1] == \
        f"{len(want)} rows; {n_unanswered} unanswered; chart: {out / 'chart.png'}"

    import pyarrow.parquet as pq

    figures = pq.read_table(out / "figures.parquet").to_pylist()
    assert {(r["endpoint"], r["bucket"]): r["requests"] for r in figures} == \
        {k: w["requests"] for k, w in want.items()}
    with open(out / "figures.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["requests"]) for r in rows) == len(messages)
    assert sum(int(r["unanswered"]) for r in rows) == n_unanswered
    nodes = pq.read_table(out / "nodes.parquet").to_pylist()
    assert sum(r["served"] + r["failed"] for r in nodes) == len(messages)
    unanswered = pq.read_table(out / "unanswered").to_pylist()
    assert {parse_archive_name(r["name"])[0] for r in unanswered} == \
        {m.request_name for m in messages if m.fate == "unanswered"}
    [csv_part] = (out / "unanswered_csv").glob("part-*.csv")
    with open(csv_part, newline="") as fh:
        assert [r["name"] for r in csv.DictReader(fh)] == [r["name"] for r in unanswered]
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / ".listing").exists()  # this run's staging dataset is gone
    # Every phase is told on stderr, in order, with its counts.
    phases = [line.split("] ", 1)[1] for line in result.stderr.splitlines()
              if line.startswith("aggregate [")]
    assert [p.split(":")[0].split(" ")[0] for p in phases] == \
        ["listing", "engine", "figures", "outputs"], phases
    assert phases[0].endswith("of 3 endpoints")
    # The mirror's files, counted before choosing: about two per message.
    assert phases[1].startswith("engine: plain (") and \
        phases[1].endswith(f"files listed, at most {PLAIN_MAX_FILES})"), phases
    assert phases[2].endswith(f"{len(want)} endpoint-bucket rows, {len(nodes)} node rows, "
                              f"{len(messages)} requests")
    secret = (pyftpdlib_server.password or "").encode()
    assert secret and secret not in result.stdout.encode()
    for f in out.rglob("*"):
        if f.is_file():
            assert secret not in f.read_bytes(), f


def test_unknown_endpoint_is_named_on_one_line(config_file: Path, tmp_path: Path) -> None:
    result = main_in_process("aggregate", "-c", str(config_file), "--endpoint", "quote",
                             "--endpoint", "nosuch", "--out", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 2
    line = one_line(result)
    assert "unknown endpoint 'nosuch'" in line and "order, quote, stock" in line, line
    assert not (tmp_path / "out").exists()


def test_bad_bucket_is_named_on_one_line(config_file: Path, tmp_path: Path) -> None:
    result = main_in_process("aggregate", "-c", str(config_file), "--bucket", "90x",
                             "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "--bucket '90x'" in one_line(result)


def test_endpoint_with_no_archive_yet_is_named_on_one_line(config_file: Path, tmp_path: Path) -> None:
    # A fresh repository: nothing archived, nothing to aggregate (and no Spark started for it).
    result = main_in_process("aggregate", "-c", str(config_file), "--endpoint", "stock",
                             "--out", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 2
    assert "no archive folder found for endpoints stock" in one_line(result)


@pytest.mark.slow
def test_spark_log_stays_quiet_unless_asked_for(
        config_file: Path, pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """A run of its own (a fresh JVM: log4j is configured at launch): no Spark WARN line on stderr."""
    import subprocess
    import sys

    sources = sources_from_config(load_config(config_file))
    messages = synthetic.plan(sources, 20, test_aggregate.START, test_aggregate.SPAN, seed=5)
    root = str(pyftpdlib_server.root)
    synthetic.write(LocalTransport(root, durable=False), sources, messages,
                    synthetic.local_mtime_setter(root))
    proc = subprocess.run(
        [sys.executable, "-c", "from ftpbc.cli import main; main()", "aggregate", "-c", str(config_file),
         "--out", str(tmp_path / "out"), "--no-progress", "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "chart.png").exists()
    spark_lines = [line for line in proc.stderr.splitlines() if " WARN " in line or " INFO " in line]
    assert spark_lines == []


def test_spark_log_level_reaches_the_driver_jvm(tmp_path: Path) -> None:
    from ftpbc.analytics.figures import defaults, session

    conf = tmp_path / "log4j2.properties"
    opts = defaults("local[1]", {}, log_conf=conf)["spark.driver.extraJavaOptions"]
    assert f"-Dlog4j2.configurationFile={conf.as_uri()}" in opts.split()
    assert "-Dlog4j2" not in defaults("local[1]", {})["spark.driver.extraJavaOptions"]
    with pytest.raises(ValueError, match="'loud'"):
        session("local[1]", log_level="loud")  # refused before any JVM starts


@pytest.mark.parametrize(("ftpbc_level", "spark_level"), [
    (logging.WARNING, "error"), (logging.ERROR, "error"), (logging.INFO, "warn"), (logging.DEBUG, "info")])
def test_spark_log_follows_ftpbcs_common_log_options(ftpbc_level: int, spark_level: str) -> None:
    from ftpbc.cli.aggregate import spark_log_level

    root = logging.getLogger()
    before = root.level
    root.setLevel(ftpbc_level)
    try:
        assert spark_log_level() == spark_level
    finally:
        root.setLevel(before)


def test_master_cannot_go_with_the_plain_engine(config_file: Path, tmp_path: Path) -> None:
    result = main_in_process("aggregate", "-c", str(config_file), "--engine", "plain",
                             "--master", "spark://127.0.0.1:7077", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "--master" in one_line(result) and "--engine plain" in one_line(result)
    assert not (tmp_path / "out").exists()


def test_auto_engine_counts_the_listed_files_against_its_threshold(tmp_path: Path) -> None:
    """The choice ``auto`` makes, without running either engine: by the files the inputs hold
    (a folder's entries, a mirror part's lines, a compacted part's rows), stopping past the limit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ftpbc.analytics.job import Options, choose_engine, count_files
    from ftpbc.analytics.listing import Input
    from ftpbc.errors import ConfigError

    folder = tmp_path / "inarchive"
    folder.mkdir()
    for i in range(30):
        (folder / f"req.{i}").write_bytes(b"")
    part = tmp_path / "part-1.jsonl"
    part.write_text("{}\n" * 12)
    compacted = tmp_path / "part-2.parquet"
    pq.write_table(pa.table({"name": ["a", "b", "c"]}), compacted)
    inputs = [Input("dir", str(folder), "q", "inarchive"), Input("mirror", str(part), "q"),
              Input("compacted", str(compacted), "q")]
    assert count_files(inputs, 1000) == 45
    assert 10 < count_files(inputs, 10) <= 30  # stops in the first folder
    opts = Options(sources=[], out=tmp_path / "out")
    assert choose_engine(opts, inputs) == ("plain", f"45 files listed, at most {PLAIN_MAX_FILES}")
    opts.plain_max_files = 44
    assert choose_engine(opts, inputs) == ("spark", "over 44 files listed")
    opts.plain_max_files = 45
    assert choose_engine(opts, inputs)[0] == "plain"
    assert choose_engine(Options(sources=[], out=tmp_path, master="spark://h:7077"), inputs)[0] == "spark"
    # the provenance table is either engine's: it does not decide
    assert choose_engine(Options(sources=[], out=tmp_path, provenance=True), inputs)[0] == "plain"
    assert choose_engine(Options(sources=[], out=tmp_path, engine="spark"), inputs) == ("spark", "as asked")
    assert choose_engine(Options(sources=[], out=tmp_path, engine="plain", plain_max_files=1),
                         inputs) == ("plain", "as asked")
    with pytest.raises(ConfigError, match="--engine 'fast'"):
        choose_engine(Options(sources=[], out=tmp_path, engine="fast"), inputs)



def test_json_phase_lines_and_the_provenance_table_from_the_command_line(
        config_file: Path, pyftpdlib_server: ServerHandle, tmp_path: Path) -> None:
    """``--log-format json --provenance`` on the plain engine (no Spark): each phase one JSON
    object on stderr, in order, each with its counts; the table has a row per request."""
    sources = sources_from_config(load_config(config_file))
    messages = synthetic.plan(sources, 10, test_aggregate.START, test_aggregate.SPAN, seed=3)
    root = str(pyftpdlib_server.root)
    synthetic.write(LocalTransport(root, durable=False), sources, messages,
                    synthetic.local_mtime_setter(root))
    out = tmp_path / "out"

    result = main_in_process("aggregate", "-c", str(config_file), "--out", str(out), "--engine", "plain",
                             "--provenance", "--log-format", "json")

    assert result.returncode == 0, result.stderr
    import json

    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    phases = [x for x in lines if x.get("event") == "phase"]
    assert [p["phase"] for p in phases] == ["listing", "engine", "figures", "outputs", "provenance"]
    assert all(p["logger"] == "ftpbc.aggregate" and p["counts"] for p in phases)
    assert phases[0]["counts"]["endpoints"] == 3
    assert phases[2]["counts"]["requests"] == len(messages)
    assert phases[-1]["counts"] == {"requests": len(messages)}
    assert result.stdout.splitlines()[-1].endswith(f"; provenance: {out / 'provenance'}")
    import pyarrow.parquet as pq

    table = pq.read_table(out / "provenance").to_pylist()
    assert sorted(r["id"] for r in table) == sorted(m.uuid for m in messages)
    # Every fate has its outcome (a reply archived, swept or unreadable, is an answer), those
    # answered through reply_to (the synthetic plan has some) included.
    assert any(m.reply_to is not None for m in messages)
    fates = {"answered": "answered", "uncollected": "answered", "unreadable": "answered",
             "failed": "error", "unanswered": "unanswered"}
    assert {r["id"]: r["outcome"] for r in table} == {m.uuid: fates[m.fate] for m in messages}
