"""A message's metadata (headers and properties) and the file names that carry it.

Nothing but the name of a file travels with its body, so a message's headers and properties are
written into its name.  Two grammars exist, chosen per endpoint with ``naming:`` (see
``docs/naming.md``):

``ftpbc``
    The name ftpbc has always used (``req.<uuid>``, ``msg.<uuid>``, ``resp.<uuid>``,
    ``resp.<uuid>.error``), followed by ``;key=value`` fields only for what differs from the
    defaults: ``req.<uuid>;p=9;r=audit;.regionS=emea``.  A plain name is a message with default
    headers, so files from producers that know nothing of the suffix are messages too.

``dropboxmq``
    DropboxMQ's default transcoder: ``<priority>.<id>.<class>.<expiration>.<correlation id>.
    <reply-to>.<type>.<properties>``, e.g.
    ``4.1140429201295000-9262574723.T.1140429211295.corr1283.TestQueue1.XYZType.prop1S=hello``.

This module is where the rest of ftpbc gets them: the headers (``headers``, the table), the
envelope and what the codecs share (``names``), the codecs (``ftpbc_names``,
``dropboxmq_names``), and :func:`codec_for`.  Both codecs are pure functions of their input: no
I/O, no clock, no randomness.  Decoding never raises anything but :class:`UnusableName` for a
name, however hostile: callers log it once and skip the file.  ``decode`` returning None means
"not a message of this endpoint" (another prefix, a foreign file): callers skip it quietly.
"""

from __future__ import annotations

from typing import Any

from ftpbc.model.dropboxmq_names import DELIVERY_COUNT_PROPERTY, TIMESTAMP_PROPERTY, DropboxmqCodec
from ftpbc.model.ftpbc_names import FtpbcCodec
from ftpbc.model.headers import (
    DEFAULT_PRIORITY,
    ERROR_TYPE,
    EXPIRED_TYPE,
    RESERVED_TYPE_PREFIX,
    Headers,
    Kind,
    PropertyValue,
)
from ftpbc.model.names import NAME_LIMIT, Direction, Envelope, NameCodec, NameTooLong, UnusableName

__all__ = [
    "DEFAULT_PRIORITY",
    "DELIVERY_COUNT_PROPERTY",
    "ERROR_TYPE",
    "EXPIRED_TYPE",
    "NAME_LIMIT",
    "RESERVED_TYPE_PREFIX",
    "TIMESTAMP_PROPERTY",
    "Direction",
    "DropboxmqCodec",
    "Envelope",
    "FtpbcCodec",
    "Headers",
    "Kind",
    "NameCodec",
    "NameTooLong",
    "PropertyValue",
    "UnusableName",
    "codec_for",
]

_FTPBC_ONLY = ("request_prefix", "response_prefix", "oneway_prefix", "uuid_of")


def codec_for(naming: str, **kw: Any) -> NameCodec:
    """The codec for an endpoint's ``naming:`` (``ftpbc`` or ``dropboxmq``).

    ``kw`` are the codec's keyword arguments; the ftpbc-only ones (prefixes, ``uuid_of``) are
    accepted and ignored for ``dropboxmq``, so callers can pass one set for either.
    """
    if naming == "ftpbc":
        return FtpbcCodec(**kw)
    if naming == "dropboxmq":
        for key in _FTPBC_ONLY:
            kw.pop(key, None)
        return DropboxmqCodec(**kw)
    raise ValueError(f"unknown naming {naming!r}: expected 'ftpbc' or 'dropboxmq'")
