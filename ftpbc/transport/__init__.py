"""Transports: one interface (``base.Transport``) over FTP/FTPS, SFTP and local directories.

Which transport serves a server is its scheme's (:data:`ftpbc.schemes.SCHEMES`): each
:attr:`~ftpbc.schemes.Scheme.transport` is a key of :data:`FACTORIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from ftpbc import schemes
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConfigError
from ftpbc.transport.base import Entry, Transport, check_name, join, normalize

__all__ = ["FACTORIES", "Entry", "Transport", "check_name", "join", "normalize", "open_transport"]


def _local(server: ServerConfig) -> Transport:
    from ftpbc.transport.local import LocalTransport

    return LocalTransport(server.base, durable=server.fsync_files)


def _ftp(server: ServerConfig) -> Transport:
    from ftpbc.transport.ftp import FTPTransport

    return FTPTransport(server)


def _sftp(server: ServerConfig) -> Transport:
    from ftpbc.transport.sftp import SFTPTransport

    return SFTPTransport(server)


#: the transport each :attr:`ftpbc.schemes.Scheme.transport` names (imported on first use, so
#: that a node serving only local directories never loads paramiko)
FACTORIES: Mapping[str, Callable[[ServerConfig], Transport]] = MappingProxyType(
    {"local": _local, "ftp": _ftp, "sftp": _sftp})


def open_transport(server: ServerConfig) -> Transport:
    """A ready-to-use (pooled, where connections exist) transport for ``server``.

    Connections are opened lazily, on first use, so building a transport never blocks.
    """
    spec = schemes.lookup(server.scheme)
    factory = FACTORIES.get(spec.transport) if spec is not None else None
    if factory is None:
        # Only a config changed past validation gets here; name it by ``display``, which never
        # holds a password, rather than by its url.
        raise ConfigError(f"unknown URL scheme {server.scheme!r} for {server.display} (expected "
                          f"{schemes.expected()})", key=f"servers.{server.name}.url")
    return factory(server)
