"""What every server fixture yields: enough to build a ServerConfig and to inspect the files."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftpbc.config.servers import ServerConfig


@dataclass
class ServerHandle:
    #: "local", "pyftpdlib", "pyftpdlib_ftps", "vsftpd", "vsftpd_tls", "sshd", "proftpd",
    #: "proftpd_ftps", "pureftpd" or "pureftpd_tls" (the fixture's name without "_server")
    kind: str
    #: the directory on this machine that remote "/" maps to (the URL's base)
    root: Path
    #: URL without password, e.g. ftp://ftpbc@127.0.0.1:40123/
    url: str
    password: str | None = None
    #: extra ServerConfig options (ca_file, known_hosts, key_file, tls ...)
    options: dict[str, Any] = field(default_factory=dict)
    #: server-specific controls (e.g. "restart", "drop_connections"), where the fixture has them
    controls: dict[str, Callable[[], None]] = field(default_factory=dict)

    def config(self, name: str = "test", **overrides: Any) -> ServerConfig:
        return ServerConfig.from_url(self.url, password=self.password, name=name,
                                     **{**self.options, **overrides})

    def fresh_dir(self) -> str:
        """A new, empty directory under remote "/" for one test; returns its remote path."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        path = self.root / name
        path.mkdir()
        # World-writable despite the umask: servers that log in as an unprivileged user
        # (vsftpd) must be able to write where the root-run tests created the directory.
        path.chmod(0o777)
        return f"/{name}"

    def local(self, remote: str) -> Path:
        """The local file behind a remote path."""
        return self.root / remote.lstrip("/")
