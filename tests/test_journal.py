"""The journal on disk: its format, per-node separation, the registry, compaction, torn lines, and
what ``ftpbc journal`` and ``ftpbc recover`` print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ftpbc.journal import Journal
from ftpbc.journal import store as store_module
from tests.chaos import ENDPOINT, Cluster, make_cluster, run_cli

#: <time> <op id> <event> key=value... #<crc32 of what comes before " #">
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\S+) (\S+)( \S+=\S*)* #[0-9a-f]{8}$")


def test_records_are_one_readable_line_each(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node-a")
    ep = j.endpoint("quote")
    ep.record("u1.send", "send", durable=True, kind="request", stage="/q/instage/req.u1~node-a",
              target="/q/inbox/req.u1")
    ep.record("u2.serve", "claim", durable=True, src="/q/inbox/a b\nc", dst="/q/inselect/x=y%")
    lines = ep.path.read_text().splitlines()
    assert len(lines) == 2
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].rsplit(" #", 1)[0].endswith(" u1.send send kind=request stage=/q/instage/req.u1~node-a "
                                                "target=/q/inbox/req.u1")
    # a space, a newline, '=' or '%' in a value never breaks the one-record-per-line format
    assert "a%20b%0Ac" in lines[1] and "x%3Dy%25" in lines[1]
    j.close()
    again = Journal(tmp_path, "node-a").endpoint("quote").pending()
    assert [(o.op_id, o.events, o.fields) for o in again] == [
        ("u1.send", ["send"], {"kind": "request", "stage": "/q/instage/req.u1~node-a",
                               "target": "/q/inbox/req.u1"}),
        ("u2.serve", ["claim"], {"src": "/q/inbox/a b\nc", "dst": "/q/inselect/x=y%"}),
    ]


def test_a_name_with_undecodable_bytes_is_journaled_and_read_back(tmp_path: Path) -> None:
    # A listed name is decoded with surrogateescape: bytes that are not UTF-8 become lone
    # surrogates.  The claim of such a file must be journaled (and replayed) like any other.
    name = b"/q/inbox/req.\xe9\xff".decode("utf-8", "surrogateescape")
    j = Journal(tmp_path, "node-a")
    j.endpoint("quote").record("u1.serve", "claim", durable=True, src=name, dst="/q/inselect/x")
    j.close()
    again = Journal(tmp_path, "node-a").endpoint("quote").pending()
    assert [o.fields for o in again] == [{"src": name, "dst": "/q/inselect/x"}]


def test_nodes_on_one_host_never_share_a_journal(tmp_path: Path) -> None:
    a, b = Journal(tmp_path, "a"), Journal(tmp_path, "b")
    a.endpoint(ENDPOINT).record("u1.send", "send", durable=True, stage="s", target="t")
    assert a.dir != b.dir and a.dir.parent == b.dir.parent == tmp_path
    assert b.all_pending() == {}
    assert [o.op_id for o in a.all_pending()[ENDPOINT]] == ["u1.send"]
    a.close()
    b.close()


def test_registry_maps_endpoints_to_stable_files(tmp_path: Path) -> None:
    j = Journal(tmp_path, "n")
    quote, audit = j.endpoint("quote"), j.endpoint("audit")
    audit.record("u.send", "send", durable=True, stage="s", target="t")
    j.close()
    lines = (tmp_path / "n" / "registry").read_text().splitlines()
    assert lines == [f"audit\t{audit.path.name}", f"quote\t{quote.path.name}"]
    assert quote.path.name.endswith(".journal") and quote.path.name != audit.path.name
    # A new process finds the same file for the same endpoint, and lists endpoints it never opened.
    j2 = Journal(tmp_path, "n")
    assert j2.registry() == {"audit": audit.path.name, "quote": quote.path.name}
    assert list(j2.all_pending()) == ["audit"]
    assert j2.endpoint("quote").path == quote.path
    j2.close()


def test_journal_is_emptied_when_nothing_is_pending(tmp_path: Path) -> None:
    """A journal of ended operations only is emptied at once while nothing fsynced it since it
    was last emptied (a sender's); once fsynced, only when it reaches TRUNCATE_AT bytes (a
    truncation costs the next fsync a metadata commit) or is closed.  A reopened one finds
    nothing pending either way."""
    journal = Journal(tmp_path, "n")
    ep = journal.endpoint(ENDPOINT)
    for i in range(50):
        ep.record(f"u{i}.send", "send", durable=True, stage="s", target="t")
    assert ep.path.stat().st_size > 0
    for i in range(50):
        ep.end(f"u{i}.send")
    assert ep.pending() == []
    assert 0 < ep.path.stat().st_size < store_module.TRUNCATE_AT  # kept: small, nothing pending
    assert Journal.read_pending(tmp_path, "n") == {}
    sizes = []
    i = 50
    while len(sizes) < 2 or sizes[-1] != 0:  # one message at a time until the file is emptied
        ep.record(f"u{i}.send", "send", durable=False, stage="s" * 200, target="t")
        ep.end(f"u{i}.send")
        sizes.append(ep.path.stat().st_size)
        i += 1
        assert i < 10_000, "never truncated"
    assert max(sizes) < store_module.TRUNCATE_AT + 1024  # truncated at the threshold, not later
    ep.record("unsynced.send", "send", durable=False, stage="s", target="t")
    ep.end("unsynced.send")
    assert ep.path.stat().st_size == 0  # no fsync since it was emptied: emptied at once
    ep.record("last.send", "send", durable=True, stage="s", target="t")
    ep.end("last.send")
    assert ep.path.stat().st_size > 0
    journal.close()
    assert ep.path.stat().st_size == 0  # a clean close leaves it empty


def test_compaction_keeps_only_pending_operations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_EVERY", 5)
    j = Journal(tmp_path, "n")
    ep = j.endpoint(ENDPOINT)
    ep.record("keep.serve", "claim", durable=True, src="/q/inbox/req.keep", dst="/q/inselect/req.keep~n")
    ep.record("keep.serve", "served", durable=True, claim="/q/inselect/req.keep~n",
              commit="/q/inarchive/req.keep", body="cmU6eA==")
    for i in range(5):  # the fifth end triggers the compaction
        ep.record(f"u{i}.send", "send", durable=True, stage="s", target="t")
        ep.end(f"u{i}.send")
    text = ep.path.read_text()
    assert "u0.send" not in text and "u4.send" not in text, text
    assert text.count("keep.serve") == 2
    j.close()
    [op] = Journal(tmp_path, "n").endpoint(ENDPOINT).pending()
    assert op.events == ["claim", "served"]
    assert op.fields["body"] == "cmU6eA==" and op.fields["src"] == "/q/inbox/req.keep"


@pytest.mark.parametrize("torn", ["2026-11-22T01:02:03.123Z u2.se",
                                  "2026-11-22T01:02:03.123Z u2.send send stage=/q/instage/req.u"])
def test_torn_last_line_is_ignored_and_cut_off(tmp_path: Path, torn: str) -> None:
    j = Journal(tmp_path, "n")
    ep = j.endpoint(ENDPOINT)
    ep.record("u1.send", "send", durable=True, stage="/q/instage/req.u1~n", target="/q/inbox/req.u1")
    j.close()
    with open(ep.path, "a") as fh:
        fh.write(torn)  # a process killed in the middle of its write
    ep2 = Journal(tmp_path, "n").endpoint(ENDPOINT)
    assert [o.op_id for o in ep2.pending()] == ["u1.send"]
    ep2.end("u1.send")
    ep2.record("u3.send", "send", durable=True, stage="s3", target="t3")
    ep2.close()
    # The next record starts on a line of its own, not glued to the torn one.
    [op] = Journal(tmp_path, "n").endpoint(ENDPOINT).pending()
    assert op.op_id == "u3.send" and op.fields == {"stage": "s3", "target": "t3"}


def test_large_result_is_kept_beside_the_journal_until_the_end(tmp_path: Path) -> None:
    ep = Journal(tmp_path, "n").endpoint(ENDPOINT)
    body = b"x" * (store_module.INLINE_RESULT_LIMIT + 1)
    fields = ep.save_result("big.serve", body)
    ep.record("big.serve", "served", durable=True, **fields)
    assert ep.load_result(ep.pending()[0].fields) == body
    ep.end("big.serve")
    assert not (ep.results_dir / "big.serve").exists()
    assert ep.load_result(ep.save_result("small.serve", b"tiny")) == b"tiny"


# ---------------------------------------------------------------------- the commands

@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    root = tmp_path / "srv"
    (root / "q").mkdir(parents=True)
    return make_cluster(tmp_path / "w", url=f"file://{root}", password=None, options={}, repository="/q",
                        server_root=root)


def test_journal_command_lists_pending_and_recover_decides_them(cluster: Cluster) -> None:
    j = Journal(cluster.journal_dir, "n1")
    ep = j.endpoint(ENDPOINT)
    for d in ("instage", "inbox", "inselect"):
        cluster.local(d).mkdir(parents=True, exist_ok=True)
    cluster.local("instage", "req.u1~n1").write_bytes(b"staged, never exposed")
    ep.record("u1.send", "send", durable=True, kind="request", stage="/q/instage/req.u1~n1",
              target="/q/inbox/req.u1")
    cluster.local("inselect", "req.u2~n1").write_bytes(b"claimed, never served")
    ep.record("u2.serve", "claim", durable=True, src="/q/inbox/req.u2", dst="/q/inselect/req.u2~n1")
    j.close()

    listing = run_cli(cluster, "journal", node_id="n1")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == f"{ENDPOINT}\tu1.send\tsend\t/q/inbox/req.u1"
    assert lines[1] == f"{ENDPOINT}\tu2.serve\tclaim\t/q/inselect/req.u2~n1"
    assert lines[2].startswith("2 pending operation(s) in ") and lines[2].endswith("/n1")
    # Another node id on the same host sees nothing.
    assert run_cli(cluster, "journal", node_id="n2").stdout.startswith("0 pending operation(s)")

    out = run_cli(cluster, "recover", node_id="n1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{ENDPOINT}: u1.send (send): rolled back: staged file removed, never exposed",
        f"{ENDPOINT}: u2.serve (claim): returned as delivery 1 of 5, held for 1 s by every node",
        "2 operation(s) recovered for node n1",
    ]
    assert cluster.files("instage") == [] and cluster.files("inselect") == []
    assert cluster.files("inbox") == ["req.u2"]
    # Recovery is idempotent: a second run finds nothing left to do.
    assert run_cli(cluster, "recover", node_id="n1").stdout.splitlines() == [
        "0 operation(s) recovered for node n1"]
    assert cluster.pending() == {} and cluster.nonempty_journal_files() == []


# ---------------------------------------------------------------------- the journal trusts no byte


def _journal_with_two_sends(tmp_path: Path) -> Path:
    j = Journal(tmp_path, "n")
    ep = j.endpoint(ENDPOINT)
    ep.record("u1.send", "send", durable=True, kind="request", stage="/q/instage/req.u1~n",
              target="/q/inbox/req.u1")
    ep.record("u2.send", "send", durable=True, kind="request", stage="/q/instage/req.u2~n",
              target="/q/inbox/req.u2")
    j.close()
    return ep.path


def _reopen(tmp_path: Path) -> list[store_module.Operation]:
    j = Journal(tmp_path, "n")
    try:
        return j.endpoint(ENDPOINT).pending()
    finally:
        j.close()


def _rewrite_line(path: Path, number: int, edit: object) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[number - 1] = edit(lines[number - 1])  # type: ignore[operator]
    path.write_bytes(b"\n".join(lines))


def _with_crc(text: bytes) -> bytes:
    import zlib
    return b"%s #%08x" % (text, zlib.crc32(text))


def _side_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".damaged-*"))


def test_a_damaged_record_is_set_aside_naming_file_and_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _journal_with_two_sends(tmp_path)
    _rewrite_line(path, 1, lambda line: line.replace(b"req.u1", b"req.u9"))  # a flipped byte
    damaged = path.read_bytes().split(b"\n")[0]
    assert [o.op_id for o in _reopen(tmp_path)] == ["u2.send"]  # every other record is used
    [side] = _side_files(path)
    assert side.read_bytes() == damaged + b"\n"
    [line] = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert f"{path}: 1 damaged record(s) (line 1 at offset 0" in line and "checksum" in line, line
    assert str(side) in line and "\n" not in line
    # The journal was rewritten without it: the next opening finds nothing more to set aside.
    assert [o.op_id for o in _reopen(tmp_path)] == ["u2.send"]
    assert _side_files(path) == [side]


def test_a_record_cut_inside_its_body_is_never_replayed(tmp_path: Path) -> None:
    j = Journal(tmp_path, "n")
    ep = j.endpoint(ENDPOINT)
    fields = ep.save_result("u1.serve", b"the whole response")
    ep.record("u1.serve", "served", durable=True, claim="/q/inselect/req.u1~n", commit="/q/inarchive/req.u1",
              target="/q/outbox/resp.u1", stage="/q/outstage/resp.u1~n", **fields)
    ep.record("u2.send", "send", durable=True, stage="/q/instage/req.u2~n", target="/q/inbox/req.u2")
    j.close()
    # Cut the first record inside its body (as a lost tail of a write would), the next one intact.
    _rewrite_line(ep.path, 1, lambda line: line[: line.index(b"body=") + 8])
    assert [o.op_id for o in _reopen(tmp_path)] == ["u2.send"]
    assert len(_side_files(ep.path)) == 1


def test_a_record_whose_checksum_holds_but_is_not_utf8_is_set_aside(tmp_path: Path) -> None:
    path = _journal_with_two_sends(tmp_path)
    _rewrite_line(path, 2, lambda line: _with_crc(line.rsplit(b" #", 1)[0].replace(b"req.u2", b"req.\xff2")))
    reading = store_module.read_journal(path)
    assert [(d.line, d.reason) for d in reading.damaged] == [(2, "journal record is not UTF-8")]
    assert reading.torn is None  # its checksum holds: written whole, so not a torn write
    assert [o.op_id for o in _reopen(tmp_path)] == ["u1.send"]
    assert len(_side_files(path)) == 1


@pytest.mark.parametrize(("record", "expected"), [
    (b"u3.x frobnicate src=a", "unknown journal event 'frobnicate'"),
    (b"u3.serve claim src=/q/inbox/req.u3", "journal record 'claim' lacks dst"),
    (b"u3.serve served claim=/q/inselect/req.u3~n target=/q/outbox/resp.u3 commit=/q/inarchive/req.u3",
     "journal record 'served' lacks body"),
    (b"u3.serve served claim=/q/inselect/req.u3~n body=eA==", "journal record 'served' lacks commit"),
])
def test_records_missing_what_their_event_needs_are_set_aside(tmp_path: Path, record: bytes,
                                                              expected: str) -> None:
    path = _journal_with_two_sends(tmp_path)
    with open(path, "ab") as fh:
        fh.write(_with_crc(b"2026-11-22T01:02:03.123Z " + record) + b"\n")
    assert [(d.line, d.reason) for d in store_module.read_journal(path).damaged] == [(3, expected)]
    assert [o.op_id for o in _reopen(tmp_path)] == ["u1.send", "u2.send"]
    [side] = _side_files(path)
    assert record in side.read_bytes()


def test_a_journal_of_the_previous_release_is_read_and_rewritten_with_checksums(tmp_path: Path) -> None:
    j = Journal(tmp_path, "n")
    path = j.endpoint(ENDPOINT).path
    j.close()
    old = b"2026-11-22T01:02:03.123Z u0.send send stage=/q/instage/req.u0~n target=/q/inbox/req.u0\n"
    path.write_bytes(old)
    assert [o.op_id for o in _reopen(tmp_path)] == ["u0.send"]
    # Opened for writing, the file was rewritten with checksums at once.
    assert all(LINE.match(line) for line in path.read_text().splitlines()), path.read_text()
    j = Journal(tmp_path, "n")
    j.endpoint(ENDPOINT).record("u1.send", "send", durable=True, stage="/q/instage/req.u1~n",
                                target="/q/inbox/req.u1")
    j.close()
    assert [o.op_id for o in _reopen(tmp_path)] == ["u0.send", "u1.send"]
    with open(path, "ab") as fh:  # an unchecksummed record after checksummed ones: damage, not age
        fh.write(old.replace(b"u0", b"u2"))
        fh.write(_with_crc(b"2026-11-22T01:02:03.123Z u3.send send stage=s target=t") + b"\n")
    reading = store_module.read_journal(path)
    assert [(d.line, d.reason) for d in reading.damaged] == [
        (3, "journal record without its checksum (damaged or cut)")]
    assert [o.op_id for o in _reopen(tmp_path)] == ["u0.send", "u1.send", "u3.send"]


def test_a_damaged_side_file_result_is_never_delivered(tmp_path: Path) -> None:
    ep = Journal(tmp_path, "n").endpoint(ENDPOINT)
    body = b"y" * (store_module.INLINE_RESULT_LIMIT + 10)
    fields = ep.save_result("big.serve", body)
    (ep.results_dir / fields["body_file"]).write_bytes(body[:-3] + b"zzz")
    with pytest.raises(store_module.JournalError, match="fails its checksum"):
        ep.load_result(fields)


def test_ftpbc_journal_names_the_damaged_line_and_recover_sets_it_aside(cluster: Cluster) -> None:
    j = Journal(cluster.journal_dir, "n1")
    ep = j.endpoint(ENDPOINT)
    ep.record("u1.send", "send", durable=True, kind="request", stage="/q/instage/req.u1~n1",
              target="/q/inbox/req.u1")
    ep.record("u2.send", "send", durable=True, kind="request", stage="/q/instage/req.u2~n1",
              target="/q/inbox/req.u2")
    j.close()
    _rewrite_line(ep.path, 1, lambda line: line.replace(b"request", b"requesT"))
    r = run_cli(cluster, "journal", node_id="n1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "u2.send" in r.stdout and "u1.send" not in r.stdout, r.stdout
    [problem] = [line for line in r.stdout.splitlines() if line.startswith("journal ")]
    assert problem.startswith(f"journal {ep.path}: 1 damaged record(s) (line 1 at offset 0") \
        and "checksum" in problem and "set aside when the node next opens" in problem, problem
    r = run_cli(cluster, "recover", node_id="n1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    [side] = _side_files(ep.path)
    r = run_cli(cluster, "journal", node_id="n1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    set_aside = f"journal {ep.path}: 1 damaged record(s) set aside in {side}"
    assert r.stdout.splitlines()[-1] == set_aside, r.stdout
    r = run_cli(cluster, "journal", "--json", node_id="n1")
    assert json.loads(r.stdout)["problems"] == [set_aside], r.stdout
    side.unlink()  # inspected and dealt with: nothing left to say
    r = run_cli(cluster, "journal", node_id="n1")
    assert not [line for line in r.stdout.splitlines() if line.startswith("journal ")], r.stdout
