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
#: servers only the tests of a plain login refused for want of TLS use (tests/test_cli_diagnostics.py)
TLS_ONLY_SERVERS = ["vsftpd_tls"]
#: every server kind a test may be parametrised with
SERVER_KINDS = CONFORMANCE_SERVERS + TLS_ONLY_SERVERS


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


#: the one server the fast lane runs server-parametrised tests on (when the test has it)
FAST_SERVER = "pyftpdlib"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast", action="store_true",
        help="the fast lane: no slow tests, and each server-parametrised test on one server "
             f"({FAST_SERVER} where the test has it); see README.md, Tests")


def _server_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    kinds = [v for v in callspec.params.values() if isinstance(v, str) and v in SERVER_KINDS]
    return kinds[0] if kinds else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--fast``: deselect slow tests, and run each server-parametrised test once.

    Why one server is enough there: what a server may do differently is held at the transport
    boundary by the conformance suite (tests/test_transport_conformance.py) and the transport
    suites; the lifecycle, cluster and CLI logic above it is the same code whatever the server.
    Tests marked ``every_server`` (the transport boundary itself) keep every server.  The full
    suite (no ``--fast``) still runs every test on every server."""
    if not config.getoption("--fast"):
        return
    servers: dict[tuple[str, str, str], set[str]] = {}
    for item in items:
        kind = _server_of(item)
        if kind is not None:
            servers.setdefault(_fast_key(item), set()).add(kind)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        kind = _server_of(item)
        slow = item.get_closest_marker("slow") is not None
        elsewhere = (kind is not None and item.get_closest_marker("every_server") is None
                     and kind != _fast_choice(servers[_fast_key(item)]))
        if slow or elsewhere:
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _fast_key(item: pytest.Item) -> tuple[str, str, str]:
    """The test with every parameter but its server."""
    callspec = getattr(item, "callspec", None)
    rest = sorted((k, repr(v)) for k, v in (callspec.params.items() if callspec else ())
                  if not (isinstance(v, str) and v in SERVER_KINDS))
    return (item.nodeid.split("[", 1)[0], getattr(item, "originalname", item.name), repr(rest))


def _fast_choice(kinds: set[str]) -> str:
    return FAST_SERVER if FAST_SERVER in kinds else sorted(kinds)[0]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for nodeid, text in _FIGURES:
        terminalreporter.write_sep("-", f"figures: {nodeid}")
        terminalreporter.write_line(text)
