"""URL schemes: the one list of what a server's ``url`` and a route's directory destination may
start with, and what each scheme means.

Every part of ftpbc that depends on a scheme asks here, by :func:`lookup` or :func:`names`, never
by a list of its own: the configuration (which URLs parse, the default port, where TLS settings
belong, whether a URL names a host: :mod:`ftpbc.config.servers`), routing (which destination URLs
are directories, which configured server one means: :mod:`ftpbc.routing.templates`,
:mod:`ftpbc.config.routes`), the transports (:func:`ftpbc.transport.open_transport` picks the
transport :attr:`Scheme.transport` names), ``ftpbc check`` and the Spark job (a local base
directory).  This module sits in the lowest layer, so that every one of them may import it.

Adding a scheme: an entry in :data:`SCHEMES`; a transport factory in :mod:`ftpbc.transport` when
no existing one serves it; and its rows in ``tests/test_schemes.py`` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Scheme:
    """One URL scheme."""

    name: str
    #: the port a URL without one means; 0 for a scheme without a host
    default_port: int
    #: whether sessions use TLS: the TLS settings (``tls``, ``ca_file``, ``verify_tls``) are
    #: accepted on these schemes only
    tls: bool
    #: which transport serves it: a key of :data:`ftpbc.transport.FACTORIES`
    transport: str
    #: whether a URL names a host, port and user (``ftp://user@host:port/dir``); without one it
    #: names a directory of this machine (``file:///dir``)
    has_host: bool


#: every scheme ftpbc knows, by name (lower case), in the order messages list them
SCHEMES: Mapping[str, Scheme] = MappingProxyType({s.name: s for s in (
    Scheme("ftp", 21, tls=False, transport="ftp", has_host=True),
    Scheme("ftps", 21, tls=True, transport="ftp", has_host=True),
    Scheme("sftp", 22, tls=False, transport="sftp", has_host=True),
    Scheme("file", 0, tls=False, transport="local", has_host=False),
)})


def lookup(name: str) -> Scheme | None:
    """The scheme called ``name`` (any case); None when ftpbc knows no such scheme."""
    return SCHEMES.get(name.lower())


def names() -> tuple[str, ...]:
    """The known schemes' names, in order."""
    return tuple(SCHEMES)


def expected() -> str:
    """The known schemes for a message: ``ftp, ftps, sftp or file``."""
    known = names()
    return f"{', '.join(known[:-1])} or {known[-1]}" if len(known) > 1 else known[0]
