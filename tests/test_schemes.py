"""URL schemes live in one registry (ftpbc.schemes): what each means, and that the configuration,
routing and the transports all take it from there, so that a scheme added to the registry is
known everywhere at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ftpbc import schemes
from ftpbc.config.routes import match_server
from ftpbc.config.servers import ServerConfig, tls_refusal
from ftpbc.routing.templates import TemplateError, parse_destination
from ftpbc.transport import FACTORIES, open_transport
from ftpbc.transport.ftp import FTPTransport
from ftpbc.transport.local import LocalTransport
from ftpbc.transport.sftp import SFTPTransport

PACKAGE = Path(__file__).resolve().parent.parent / "ftpbc"


def test_the_registry_says_what_each_scheme_means() -> None:
    table = {s.name: (s.default_port, s.tls, s.transport, s.has_host) for s in schemes.SCHEMES.values()}
    assert table == {"ftp": (21, False, "ftp", True), "ftps": (21, True, "ftp", True),
                     "sftp": (22, False, "sftp", True), "file": (0, False, "local", False)}
    assert schemes.expected() == "ftp, ftps, sftp or file"
    assert schemes.lookup("SFTP") is schemes.SCHEMES["sftp"] and schemes.lookup("http") is None


def test_every_transport_the_registry_names_has_a_factory() -> None:
    assert {s.transport for s in schemes.SCHEMES.values()} <= set(FACTORIES)


@pytest.mark.parametrize("url, kind", [("ftp://app@127.0.0.1/x", FTPTransport),
                                       ("ftps://app@127.0.0.1/x", FTPTransport),
                                       ("sftp://app@127.0.0.1/x", SFTPTransport),
                                       ("file:///tmp/ftpbc-schemes", LocalTransport)])
def test_each_scheme_parses_and_opens_its_transport(url: str, kind: type) -> None:
    server = ServerConfig.from_url(url, password="pw", name="s")
    spec = schemes.SCHEMES[server.scheme]
    assert server.port == spec.default_port and server.has_host == spec.has_host
    target = parse_destination(url)
    assert target.kind == "directory" and match_server({"s": server}, target) == ("s", "/")
    transport = open_transport(server)  # connections open on first use: nothing is contacted
    try:
        assert isinstance(transport, kind)
        if isinstance(transport, FTPTransport):
            assert transport._tls == spec.tls
    finally:
        transport.close()


def test_an_unknown_scheme_is_refused_naming_the_known_ones() -> None:
    expected = r"unknown URL scheme 'http' .* \(expected ftp, ftps, sftp or file\)"
    with pytest.raises(ValueError, match=expected):
        ServerConfig.from_url("http://h/x")
    with pytest.raises(TemplateError, match="an ftp, ftps, sftp or file URL"):
        parse_destination("gopher://h/x")


def test_tls_settings_are_refused_by_what_the_registry_says() -> None:
    assert "use ftps://" in tls_refusal("ftp")  # a clear-text scheme whose transport has a TLS twin
    assert tls_refusal("sftp") == "a TLS setting, for ftps:// only; a sftp:// server does not use it"
    ServerConfig.from_url("ftps://app@h/", password="pw", verify_tls=False)
    with pytest.raises(ValueError, match="clear text"):
        ServerConfig.from_url("ftp://app@h/", password="pw", verify_tls=False)


def test_a_scheme_added_to_the_registry_is_known_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """What adding a scheme takes: its entry, nothing else (here implicit FTPS on its own port,
    served by the FTP transport)."""
    added = schemes.Scheme("ftpsi", 990, tls=True, transport="ftp", has_host=True)
    monkeypatch.setattr(schemes, "SCHEMES", {**schemes.SCHEMES, "ftpsi": added})
    server = ServerConfig.from_url("ftpsi://app@127.0.0.1/base", password="pw", name="s", tls="implicit")
    assert (server.scheme, server.port) == ("ftpsi", 990)
    target = parse_destination("ftpsi://app@127.0.0.1/base/in")
    assert match_server({"s": server}, target) == ("s", "/in")  # the default port, from the registry
    transport = open_transport(server)
    try:
        assert isinstance(transport, FTPTransport) and transport._tls
    finally:
        transport.close()
    assert schemes.expected().endswith("file or ftpsi")
    with pytest.raises(ValueError, match="expected ftp, ftps, sftp, file or ftpsi"):
        ServerConfig.from_url("http://h/x")


def _scheme_lists(path: Path) -> list[int]:
    """Lines of ``path`` where a tuple, list, set or dict literal holds two or more scheme names
    (not only names that are transports' too: FACTORIES lists transports)."""
    known = set(schemes.names())
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items: list[ast.expr | None] = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        names = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if len(names & known) >= 2 and not names <= set(FACTORIES):
            found.append(node.lineno)
    return found


def test_no_module_but_the_registry_lists_schemes() -> None:
    offenders = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
                 if p.name != "schemes.py" and (lines := _scheme_lists(p))}
    assert offenders == {}
