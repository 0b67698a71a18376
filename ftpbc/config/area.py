"""What every message exchange area is configured with: an endpoint's (``endpoints:``) and a
topic's (``topics:``, passed on to its incoming and subscription areas).

Each bound and each check is written here once: :class:`AreaSettings` holds the settings both
kinds have, and the annotated types (:data:`Repository`, :data:`TimeZone`, :data:`Prefix`,
:data:`Workers`) are what other models of the configuration take too.  A value they refuse is
a ValueError naming the value, which pydantic reports at its key (and the loader at its line).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _absolute_repository(v: str) -> str:
    from ftpbc.paths import normalize

    if not v.startswith("/"):
        raise ValueError(f"repository {v!r} must be an absolute path on the server")
    return normalize(v)


def _known_time_zone(v: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {v!r}") from None
    return v


def _bare_prefix(v: str) -> str:
    if "/" in v or "%" in v or ".." in v:
        raise ValueError(f"prefix {v!r} must be plain text without '/', '%' or '..'")
    return v


#: an absolute path on the server, normalized
Repository = Annotated[str, AfterValidator(_absolute_repository)]
#: an IANA time zone name (the time zone of date letters in names)
TimeZone = Annotated[str, AfterValidator(_known_time_zone)]
#: a file name prefix: plain text, no ``/``, ``%`` or ``..``
Prefix = Annotated[str, AfterValidator(_bare_prefix)]
#: worker threads of one poller
Workers = Annotated[int, Field(ge=1, le=256)]
#: the default ``large_box``: messages above which a box is listed a part at a time
LARGE_BOX = 20_000


class AreaSettings(BaseModel):
    """The settings of one exchange area that endpoints and topics share (a topic passes them
    on to each of its areas: :meth:`ftpbc.config.topics.TopicConfig.area_settings`)."""

    # hide_input_in_errors: a ValidationError's text would quote the input, which may hold a
    # server url with its password (the loader builds its own one-line messages, redacted)
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    server: str
    repository: Repository
    #: one-way messages (``ftpbc send``): served, never answered
    oneway_prefix: Prefix = "msg."
    poll_interval: float = Field(default=1.0, gt=0)
    max_per_poll: int = Field(default=32, ge=1)
    #: a box whose listing finds more messages than this is large: listed a part at a time, each
    #: part keeping its best ``large_box`` (docs/queues.md): lower, less memory and shorter
    #: listings; higher, exact order over more messages
    large_box: int = Field(default=LARGE_BOX, ge=1)
    workers: Workers = 5
    lock: Literal["file", "none"] = "file"
    #: how headers and properties are written in file names: ftpbc | dropboxmq (docs/naming.md)
    naming: Literal["ftpbc", "dropboxmq"] = "ftpbc"
    archive: bool = True
    #: a message whose read fails this many times goes to the error directory with its reason
    max_deliveries: int = Field(default=5, ge=1, le=1000)
    #: seconds a node waits before claiming a returned message again (doubling per delivery)
    redelivery_delay: float = Field(default=1.0, ge=0)
    #: the longest that wait grows to, seconds
    max_redelivery_delay: float = Field(default=300.0, ge=0)
    #: how long a request waits for its response, seconds
    timeout: float = Field(default=30.0, gt=0)
    #: priority of messages sent without one, 0 (lowest) to 9 (highest)
    priority: int = Field(default=4, ge=0, le=9)
    #: seconds a message sent without a ttl stays deliverable; none: it never expires
    ttl: float | None = Field(default=None, gt=0)
    #: messages found past their expiration go to inexpired (discard) or indead (dead_letter)
    expired: Literal["discard", "dead_letter"] = "discard"
    #: messages that exhausted max_deliveries go to indead (dead letters) instead of inerror
    dead_letter: bool = False
    #: time zone of date letters in names (IANA name)
    timezone: TimeZone = "UTC"
    #: on shutdown, how long in-flight handlers may take before the node gives up on them
    drain_timeout: float = Field(default=30.0, ge=0)
    #: bodies larger than this are refused at send (when their length is known) and, listed
    #: larger, filed in the error directory unread; a read stops past the listed size
    max_message_bytes: int = Field(default=1 << 30, ge=0)


#: the settings a topic passes on to its areas: all of AreaSettings but where the area is
AREA_KEYS = tuple(k for k in AreaSettings.model_fields if k not in ("server", "repository"))

__all__ = ["AREA_KEYS", "LARGE_BOX", "AreaSettings", "Prefix", "Repository", "TimeZone", "Workers"]
