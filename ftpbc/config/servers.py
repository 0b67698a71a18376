"""Server definitions: where a message exchange area lives and how to log in to it.

A server is declared by a URL plus where its secret comes from::

    partner:
      url: ftp://app@127.0.0.1:2121/base     # ftp, ftps, sftp or file
      password_env: PARTNER_PASSWORD          # or password_file: /run/secrets/partner

Secrets are never written in the URL (a URL with a password is refused, because URLs end up in
logs).  They are read when the configuration loads, kept as :class:`pydantic.SecretStr`, and
never appear in ``repr``, ``str``, error messages or log lines.

TLS is chosen by the scheme alone: ``ftps://`` is FTPS, ``ftp://`` is clear text.  A TLS setting
(``tls``, ``ca_file``, ``verify_tls``) on any other scheme is refused when the configuration
loads, naming the key: on ``ftp://`` it would otherwise be ignored and the password sent in clear.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

Scheme = Literal["ftp", "ftps", "sftp", "file"]

DEFAULT_PORTS: dict[str, int] = {"ftp": 21, "ftps": 21, "sftp": 22, "file": 0}
#: settings that only mean something for ftps:// (refused on any other scheme)
TLS_KEYS = ("tls", "ca_file", "verify_tls")


class ServerConfig(BaseModel):
    """One server, immutable once loaded.  Build it from YAML or with :meth:`from_url`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "server"
    url: str
    password_env: str | None = None
    password_file: Path | None = None
    key_file: Path | None = None
    known_hosts: Path | None = None
    #: Accept and remember an SFTP host key that is not in known_hosts.  Off by default: an
    #: unknown key is refused, because accepting it silently defeats the point of host keys.
    auto_accept_host_keys: bool = False
    #: FTPS: "explicit" (AUTH TLS on the plain port) or "implicit" (TLS from the first byte).
    tls: Literal["explicit", "implicit"] = "explicit"
    ca_file: Path | None = None
    verify_tls: bool = True
    passive: bool = True
    #: file:// only: fsync each file written before it can be renamed into place, so a message
    #: survives a power failure.  Off, a message still survives a killed process (the page
    #: cache outlives it), as with kombu's filesystem transport, at several times the speed.
    fsync_files: bool = True
    #: seconds: bounds connecting plus logging in, and each command until its whole reply is in
    #: (a deadline, not a limit per read: a server trickling its reply cannot stretch it)
    timeout: float = Field(default=30.0, gt=0)
    #: bytes/s: a transfer (get, put, listing) slower than this over a whole ``min_rate_window``
    #: fails with a timeout error, as curl's --speed-limit/--speed-time; 0 turns the check off
    min_transfer_rate: int = Field(default=1024, ge=0)
    #: seconds over which ``min_transfer_rate`` is measured
    min_rate_window: float = Field(default=30.0, gt=0)
    pool_size: int = Field(default=4, ge=1, le=64)
    #: a directory listing stops after this many entries (logged at WARNING): a server listing
    #: without end cannot fill the node's memory
    max_listing_entries: int = Field(default=2_000_000, ge=1)

    # Derived from url and the secret sources by the validator below; not to be set in YAML.
    scheme: Scheme = "ftp"
    host: str = ""
    port: int = 0
    user: str = ""
    base: str = "/"
    password: SecretStr | None = Field(default=None, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for derived in ("scheme", "host", "port", "user", "base", "password"):
            if derived in data:
                raise ValueError(f"'{derived}' is derived from url; set it in the url instead")
        data = dict(data)
        url = data.get("url")
        if not isinstance(url, str):
            return data  # pydantic reports the missing or mistyped url
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(
                f"unknown URL scheme {parts.scheme!r} in {url!r} (expected ftp, ftps, sftp or file)")
        if parts.password is not None:
            raise ValueError(
                f"the url {_redact(url)!r} carries a password; use password_env or password_file instead")
        data["scheme"] = scheme
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise ValueError(f"file URL {url!r} must not name a host (use file:///absolute/path)")
            data["base"] = unquote(parts.path) or "/"
            data["host"] = "localhost"
            return data
        if not parts.hostname:
            raise ValueError(f"url {url!r} names no host")
        data["host"] = parts.hostname
        try:
            data["port"] = parts.port or DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise ValueError(f"url {url!r}: bad port") from exc
        data["user"] = unquote(parts.username) if parts.username else "anonymous"
        data["base"] = unquote(parts.path) or "/"
        data["password"] = _read_secret(data, scheme)
        return data

    @field_validator(*TLS_KEYS, mode="before")
    @classmethod
    def _tls_needs_ftps(cls, value: Any, info: ValidationInfo) -> Any:
        url = info.data.get("url")
        scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
        if scheme and scheme != "ftps":
            raise ValueError(tls_refusal(scheme))
        return value

    def misplaced_tls_keys(self) -> list[str]:
        """TLS settings set on a config whose scheme is not ftps (possible only past validation,
        e.g. through ``model_copy(update=...)``); transports refuse such a config."""
        if self.scheme == "ftps":
            return []
        return [k for k in TLS_KEYS if k in self.model_fields_set]

    @property
    def display(self) -> str:
        """``scheme://user@host:port`` for messages and logs; never holds the password."""
        if self.scheme == "file":
            return f"file://{self.base}"
        return f"{self.scheme}://{self.user}@{self.host}:{self.port}"

    def password_value(self) -> str:
        """The password in clear, for handing to a login call and nothing else."""
        return self.password.get_secret_value() if self.password is not None else ""

    @classmethod
    def from_url(cls, url: str, *, password: str | None = None, **options: Any) -> ServerConfig:
        """Build a config in code (tests, the demo); ``password`` is taken as given."""
        cfg = cls.model_validate({"url": url, **options})
        if password is None:
            return cfg
        return cfg.model_copy(update={"password": SecretStr(password)})

    def __str__(self) -> str:
        return f"{self.name} ({self.display})"


def tls_refusal(scheme: str) -> str:
    """The one-line reason a TLS setting is refused on a ``scheme``:// server (the caller names
    the key)."""
    if scheme == "ftp":
        return ("a TLS setting on an ftp:// url, which logs in and transfers in clear text; "
                "use ftps:// (explicit AUTH TLS, or with tls: implicit) or remove the setting")
    return f"a TLS setting, for ftps:// only; a {scheme}:// server does not use it"


def _read_secret(data: dict[str, Any], scheme: str) -> SecretStr | None:
    env = data.get("password_env")
    file = data.get("password_file")
    if env and file:
        raise ValueError("set password_env or password_file, not both")
    if env:
        value = os.environ.get(str(env))
        if value is None:
            raise ValueError(f"password_env: environment variable {env!r} is not set")
        return SecretStr(value)
    if file:
        path = Path(str(file)).expanduser()
        try:
            # One trailing newline is how editors and `echo` save a secret; it is not part of it.
            return SecretStr(path.read_text(encoding="utf-8").rstrip("\r\n"))
        except OSError as exc:
            raise ValueError(f"password_file: cannot read {str(path)!r}: {exc.strerror}") from None
    return None


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()
