"""Shared fixtures.  Real servers live in tests/servers/, one pytest plugin module per server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import Started
from tests.servers.handle import ServerHandle

pytest_plugins = [
    "tests.servers.local",
    "tests.servers.sshd",
    "tests.servers.pyftpd",
    "tests.servers.vsftpd",
    "tests.servers.proftpd",
    "tests.servers.pureftpd",
]

#: every transport/server pair the conformance and lifecycle suites run against
ALL_SERVERS = ["local", "sshd", "pyftpdlib", "pyftpdlib_ftps", "vsftpd"]
#: the servers only the conformance suite adds (tests/test_transport_conformance.py): what holds
#: at the transport boundary there, the lifecycle suites rely on without running again on each
EXTRA_CONFORMANCE_SERVERS = ["proftpd", "proftpd_ftps", "pureftpd", "pureftpd_tls"]
CONFORMANCE_SERVERS = ALL_SERVERS + EXTRA_CONFORMANCE_SERVERS


@pytest.fixture(params=ALL_SERVERS)
def server(request: pytest.FixtureRequest) -> ServerHandle:
    """Each test using this fixture runs once per server kind."""
    handle: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return handle


@pytest.fixture
def things() -> Iterator[list[Any]]:
    """Nodes and clients a test started (append them): stopped or closed in reverse order when the
    test ends, also when it fails."""
    with Started() as started:
        yield started.things


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask (022), which leaves new files world-readable unless a mode is forced."""
    old = os.umask(0o022)
    yield
    os.umask(old)


#: (test id, report) of the tests that report figures (report_figures): printed after the run,
#: passed or failed, so CI's log carries them
_FIGURES: list[tuple[str, str]] = []


@pytest.fixture
def report_figures(request: pytest.FixtureRequest) -> Any:
    """``report_figures(text)``: show ``text`` in the run's terminal summary, whatever the outcome."""
    def report(text: str) -> None:
        _FIGURES.append((request.node.nodeid, text))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for nodeid, text in _FIGURES:
        terminalreporter.write_sep("-", f"figures: {nodeid}")
        terminalreporter.write_line(text)
