"""Transports: one interface (``base.Transport``) over FTP/FTPS, SFTP and local directories."""

from __future__ import annotations

from ftpbc.config.servers import ServerConfig
from ftpbc.errors import ConfigError
from ftpbc.transport.base import Entry, Transport, check_name, join, normalize

__all__ = ["Entry", "Transport", "check_name", "join", "normalize", "open_transport"]


def open_transport(server: ServerConfig) -> Transport:
    """A ready-to-use (pooled, where connections exist) transport for ``server``.

    Connections are opened lazily, on first use, so building a transport never blocks.
    """
    if server.scheme == "file":
        from ftpbc.transport.local import LocalTransport

        return LocalTransport(server.base, durable=server.fsync_files)
    if server.scheme in ("ftp", "ftps"):
        from ftpbc.transport.ftp import FTPTransport

        return FTPTransport(server)
    if server.scheme != "sftp":
        # Only a config changed past validation gets here; name it by ``display``, which never
        # holds a password, rather than by its url.
        raise ConfigError(f"unknown URL scheme {server.scheme!r} for {server.display} (expected ftp, ftps, "
                          "sftp or file)", key=f"servers.{server.name}.url")
    from ftpbc.transport.sftp import SFTPTransport

    return SFTPTransport(server)
