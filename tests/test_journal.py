"""The journal on disk: its format, per-node separation, the registry, compaction, torn lines, and
what ``ftpbc journal`` and ``ftpbc recover`` print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ftpbc.journal import Journal
from ftpbc.journal import store as store_module
from tests.chaos import ENDPOINT, Cluster, make_cluster, run_cli

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\S+) (\S+)( \S+=\S*)*$")


def test_records_are_one_readable_line_each(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node-a")
    ep = j.endpoint("quote")
    ep.record("u1.send", "send", durable=True, kind="request", stage="/q/instage/req.u1~node-a",
              target="/q/inbox/req.u1")
    ep.record("u2.serve", "claim", durable=True, src="/q/inbox/a b\nc", dst="/q/inselect/x=y%")
    lines = ep.path.read_text().splitlines()
    assert len(lines) == 2
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].endswith(" u1.send send kind=request stage=/q/instage/req.u1~node-a "
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
    ep = Journal(tmp_path, "n").endpoint(ENDPOINT)
    for i in range(50):
        ep.record(f"u{i}.send", "send", durable=True, stage="s", target="t")
    assert ep.path.stat().st_size > 0
    for i in range(50):
        ep.end(f"u{i}.send")
    assert ep.path.stat().st_size == 0
    assert ep.pending() == []


def test_compaction_keeps_only_pending_operations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_EVERY", 5)
    j = Journal(tmp_path, "n")
    ep = j.endpoint(ENDPOINT)
    ep.record("keep.serve", "claim", durable=True, src="/q/inbox/req.keep", dst="/q/inselect/req.keep~n")
    ep.record("keep.serve", "served", durable=True, claim="/q/inselect/req.keep~n", body="cmU6eA==")
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
        f"{ENDPOINT}: u2.serve (claim): returned as delivery 1 of 5, held here for 1 s",
        "2 operation(s) recovered for node n1",
    ]
    assert cluster.files("instage") == [] and cluster.files("inselect") == []
    assert cluster.files("inbox") == ["req.u2"]
    # Recovery is idempotent: a second run finds nothing left to do.
    assert run_cli(cluster, "recover", node_id="n1").stdout.splitlines() == [
        "0 operation(s) recovered for node n1"]
    assert cluster.pending() == {} and cluster.nonempty_journal_files() == []
