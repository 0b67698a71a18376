"""Shared fixtures.  Real servers live in tests/servers/, one pytest plugin module per server."""

from __future__ import annotations

import pytest

from tests.servers.handle import ServerHandle

pytest_plugins = [
    "tests.servers.local",
    "tests.servers.sshd",
    "tests.servers.pyftpd",
    "tests.servers.vsftpd",
]

#: every transport/server pair the conformance and lifecycle suites run against
ALL_SERVERS = ["local", "sshd", "pyftpdlib", "pyftpdlib_ftps", "vsftpd"]


@pytest.fixture(params=ALL_SERVERS)
def server(request: pytest.FixtureRequest) -> ServerHandle:
    """Each test using this fixture runs once per server kind."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle
