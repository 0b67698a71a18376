"""Listings are bounded: max_listing_entries stops an FTP or SFTP listing, with a warning."""

from __future__ import annotations

import logging

import pytest

from ftpbc.transport import open_transport
from tests.servers.handle import ServerHandle


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd", "sshd"])
def test_a_listing_stops_at_max_listing_entries(kind: str, request: pytest.FixtureRequest,
                                                caplog: pytest.LogCaptureFixture) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    for i in range(300):
        (handle.local(base) / f"f{i:04d}").write_bytes(b"x")
    with open_transport(handle.config()) as t:
        assert len(t.list(base)) == 300  # the default bound is far away
    with open_transport(handle.config(max_listing_entries=100)) as t, \
            caplog.at_level(logging.WARNING, logger="ftpbc"):
        found = t.list(base)
        assert 95 <= len(found) <= 100, len(found)
        assert all(e.name.startswith("f") for e in found)
        # The session is still usable after a listing cut short.
        assert t.stat(f"{base}/f0000").size == 1
    assert any("listing stopped at 100 entries (max_listing_entries)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
