"""Which archive directories an aggregation reads, independent of how the configuration was built."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ftpbc.config.models import Config
from ftpbc.config.servers import ServerConfig
from ftpbc.exchange.area import Direction, ExchangeArea

#: the directories every handled message ends in (the ``.reason`` files beside failed requests too)
ARCHIVE_FOLDERS: tuple[str, ...] = ("inarchive", "outarchive", "inerror", "outerror")

#: where requests end that were never served: expired, dead letters (read for ``--provenance``)
TRAIL_FOLDERS: tuple[str, ...] = ("inexpired", "indead")

_FOLDERS: dict[str, tuple[Direction, str]] = {
    "inarchive": ("in", "archive"), "outarchive": ("out", "archive"),
    "inerror": ("in", "error"), "outerror": ("out", "error"),
    "inexpired": ("in", "expired"), "indead": ("in", "dead"),
}


@dataclass(frozen=True)
class ArchiveSource:
    """One endpoint's exchange area and what is needed to read its names."""

    endpoint: str
    server: ServerConfig
    repository: str
    request_prefix: str = "req."
    response_prefix: str = "resp."
    message_name: str = "%u"
    timezone: str = "UTC"
    #: how names carry headers: ``ftpbc`` or ``dropboxmq`` (docs/naming.md)
    naming_scheme: str = "ftpbc"

    @property
    def area(self) -> ExchangeArea:
        return ExchangeArea(self.repository)

    def folder_path(self, folder: str) -> str:
        """Remote path of ``folder`` (one of :data:`ARCHIVE_FOLDERS` or :data:`TRAIL_FOLDERS`)."""
        direction, kind = _FOLDERS[folder]
        return self.area.dir(direction, kind)

    @property
    def key(self) -> str:
        """Stable identity of this area for local caches: endpoint, server and repository.

        Built from the server's display URL (never a secret), hashed so it is a safe file name.
        """
        text = f"{self.server.scheme}://{self.server.user}@{self.server.host}:{self.server.port}" \
               f"{self.server.base}|{self.repository}"
        return f"{self.endpoint}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def naming(self) -> dict[str, str]:
        """What it takes to parse this endpoint's names (``records.parse_record``,
        ``sqlnames.parse_names``)."""
        return {"naming": self.naming_scheme, "request_prefix": self.request_prefix,
                "response_prefix": self.response_prefix, "message_name": self.message_name,
                "timezone": self.timezone}


def sources_from_config(config: Config, endpoints: Iterable[str] = ()) -> list[ArchiveSource]:
    """Sources for ``endpoints`` (all of the configuration's when empty); ConfigError if unknown."""
    names = list(endpoints) or sorted(config.endpoints)
    out = []
    for name in names:
        ep = config.endpoint(name)
        out.append(ArchiveSource(endpoint=name, server=config.servers[ep.server],
                                 repository=ep.repository, request_prefix=ep.request_prefix,
                                 response_prefix=ep.response_prefix, message_name=ep.message_name,
                                 timezone=ep.timezone, naming_scheme=ep.naming))
    return out
