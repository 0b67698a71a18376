"""Hostile servers, hostile partners, careless configurations.

* a shared ``file://`` repository where someone plants symlinks, fifos or files at predictable
  names (the transport must never follow or open them);
* TLS settings on a plain ``ftp://`` URL (refused at load: a password never goes out in clear
  because of a typo in the scheme);
* FTP servers that trickle their replies or data, or send endless replies (every operation is
  bounded in time and memory), and the same for SFTP replies and transfers;
* journals holding message bodies (private to the node's user).

Every server started here is on loopback and is stopped by the test that started it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.journal import Journal
from ftpbc.journal import store as store_module

# --------------------------------------------------------------------------- journal file modes


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask (022), which leaves new files world-readable unless a mode is forced."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_journal_directories_are_0700_and_files_0600(tmp_path: Path, loose_umask: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "COMPACT_EVERY", 2)
    journal_dir = tmp_path / "journals"
    j = Journal(journal_dir, "node-a")
    try:
        ep = j.endpoint("quote")
        ep.record("keep", "send", durable=True, stage="/q/instage/x")  # stays pending
        big = ep.save_result("u1.serve", b"4111 1111 1111 1111 " * 5000)  # a side file
        ep.record("u1.serve", "served", durable=True, **big)
        for i in range(4):  # enough ended operations to compact (rewrite through a temp file)
            ep.record(f"o{i}", "send", stage="/q/instage/y")
            ep.end(f"o{i}")
        node = journal_dir / "node-a"
        assert _mode(journal_dir) == 0o700
        assert _mode(node) == 0o700
        assert _mode(node / "results") == 0o700
        files = [p for p in node.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"registry", ".lock", ep.path.name, big["body_file"]}
        assert {p.name: oct(_mode(p)) for p in files} == {p.name: "0o600" for p in files}
    finally:
        j.close()


def test_an_existing_world_readable_journal_is_tightened_when_opened(tmp_path: Path,
                                                                     loose_umask: None) -> None:
    j = Journal(tmp_path, "node-a")
    ep = j.endpoint("quote")
    ep.record("keep", "send", durable=True, stage="/q/instage/x")
    ep.save_result("big.serve", b"x" * (store_module.INLINE_RESULT_LIMIT + 1))
    j.close()
    node = tmp_path / "node-a"
    # as an older version left them: the umask's modes
    for p in node.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    node.chmod(0o755)

    j = Journal(tmp_path, "node-a")
    try:
        assert _mode(node) == 0o700
        assert _mode(node / "results") == 0o700
        for p in node.rglob("*"):
            if p.is_file():
                assert _mode(p) == 0o600, p
    finally:
        j.close()
