"""Server definitions: where a message exchange area lives and how to log in to it.

A server is declared by a URL plus where its secret comes from::

    partner:
      url: ftp://app@127.0.0.1:2121/base     # ftp, ftps, sftp or file
      password_env: PARTNER_PASSWORD          # or password_file: /run/secrets/partner

Secrets are never written in the URL (a URL with a password is refused, because URLs end up in
logs).  They are read when the configuration loads, kept as :class:`pydantic.SecretStr`, and
never appear in ``repr``, ``str``, error messages or log lines.  A ``password_file`` is read
again at every login (:meth:`ServerConfig.password_value`), as the SFTP ``key_file`` is, so that
a rotated password is used from the next login on without a restart; ``password_env`` is not
(nothing outside a process can change its environment).

A secret read from a file (``password_file``, and the SFTP ``key_file``) is refused when group
or others may read or write it, as ssh refuses such a private key, unless the server sets
``allow_insecure_secret_files: true``.  The check is made on the file as it is read.

TLS is chosen by the scheme alone: ``ftps://`` is FTPS, ``ftp://`` is clear text.  A TLS setting
(``tls``, ``ca_file``, ``verify_tls``) on any other scheme is refused when the configuration
loads, naming the key: on ``ftp://`` it would otherwise be ignored and the password sent in clear.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ftpbc import schemes
from ftpbc.errors import ConfigError

#: settings that only mean something for ftps:// (refused on any other scheme)
TLS_KEYS = ("tls", "ca_file", "verify_tls")
#: mode bits that let group or others read or change a secret file (execute bits give nothing away)
OPEN_SECRET_BITS = 0o066
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


class ServerConfig(BaseModel):
    """One server, immutable once loaded.  Build it from YAML or with :meth:`from_url`."""

    # hide_input_in_errors: a ValidationError's text would otherwise quote the input, url and
    # its password included (the messages themselves show the url redacted)
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    name: str = "server"
    url: str
    password_env: str | None = None
    password_file: Path | None = None
    key_file: Path | None = None
    known_hosts: Path | None = None
    #: Accept and remember an SFTP host key that is not in known_hosts.  Off by default: an
    #: unknown key is refused, because accepting it silently defeats the point of host keys.
    auto_accept_host_keys: bool = False
    #: Accept a ``password_file`` or ``key_file`` that group or others may read or write.  Off by
    #: default: such a file is refused, as ssh refuses such a private key, because anyone in the
    #: group (or on the host) could read the secret or swap it for their own.
    allow_insecure_secret_files: bool = False
    #: FTPS: "explicit" (AUTH TLS on the plain port) or "implicit" (TLS from the first byte).
    tls: Literal["explicit", "implicit"] = "explicit"
    ca_file: Path | None = None
    verify_tls: bool = True
    #: Only true (the default) is accepted: ftpbc opens every FTP data connection with EPSV or
    #: PASV.  Active mode (PORT/EPRT) is not implemented, and ``passive: false`` is refused at
    #: load rather than silently ignored.
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
    #: a name of :data:`ftpbc.schemes.SCHEMES`, lower case
    scheme: str = "ftp"
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
        # Every message below shows ``shown``, never ``url``: a url may carry a password (refused
        # below, but only after the checks that come first), and messages end up in logs.
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
        except ValueError:
            # urlsplit's own text may quote the netloc, password included
            raise ValueError(f"url {shown!r} is not a valid URL") from None
        scheme = parts.scheme.lower()
        spec = schemes.lookup(scheme)
        if spec is None:
            raise ValueError(
                f"unknown URL scheme {parts.scheme!r} in {shown!r} (expected {schemes.expected()})")
        if parts.password is not None:
            raise ValueError(
                f"the url {shown!r} carries a password; use password_env or password_file instead")
        data["scheme"] = scheme
        if not spec.has_host:
            if parts.netloc not in ("", "localhost"):
                raise ValueError(f"{scheme} URL {shown!r} must not name a host (use {scheme}:///absolute/path)")
            data["base"] = unquote(parts.path) or "/"
            data["host"] = "localhost"
            return data
        if not parts.hostname:
            raise ValueError(f"url {shown!r} names no host")
        data["host"] = parts.hostname
        try:
            data["port"] = parts.port or spec.default_port
        except ValueError:
            raise ValueError(f"url {shown!r}: bad port") from None
        data["user"] = unquote(parts.username) if parts.username else "anonymous"
        data["base"] = unquote(parts.path) or "/"
        allow_open = _flag(data.get("allow_insecure_secret_files"))
        data["password"] = _read_secret(data, scheme, allow_open=allow_open)
        return data

    @field_validator("passive")
    @classmethod
    def _no_active_mode(cls, value: bool) -> bool:
        if not value:
            raise ValueError(ACTIVE_MODE_REFUSAL)
        return value

    @field_validator(*TLS_KEYS, mode="before")
    @classmethod
    def _tls_needs_ftps(cls, value: Any, info: ValidationInfo) -> Any:
        url = info.data.get("url")
        scheme = _scheme(url) if isinstance(url, str) else ""
        if scheme and not _uses_tls(scheme):
            raise ValueError(tls_refusal(scheme))
        return value

    def misplaced_tls_keys(self) -> list[str]:
        """TLS settings set on a config whose scheme uses no TLS (possible only past validation,
        e.g. through ``model_copy(update=...)``); transports refuse such a config."""
        if _uses_tls(self.scheme):
            return []
        return [k for k in TLS_KEYS if k in self.model_fields_set]

    @property
    def display(self) -> str:
        """``scheme://user@host:port`` for messages and logs; never holds the password."""
        if not self.has_host:
            return f"{self.scheme}://{self.base}"
        return f"{self.scheme}://{self.user}@{self.host}:{self.port}"

    @property
    def has_host(self) -> bool:
        """Whether the url names a host (ftp, ftps, sftp), or a directory of this machine (file)."""
        spec = schemes.lookup(self.scheme)
        return spec is None or spec.has_host

    def password_value(self) -> str:
        """The password in clear, for handing to a login call and nothing else.

        With ``password_file``, the file is read afresh on each call, with the checks of the
        load (private mode unless allowed, UTF-8, one trailing newline dropped): a node whose
        login is refused at start-up logs in as soon as the file holds the right password.
        ConfigError, naming the server and the file but never what it holds, if it cannot be
        read now.  Otherwise the password loaded (from ``password_env``, or given in code).
        """
        if self.password_file is not None:
            try:
                fresh = _read_secret({"password_file": self.password_file}, self.scheme,
                                     allow_open=self.allow_insecure_secret_files)
            except ValueError as exc:
                raise ConfigError(str(exc), key=f"servers.{self.name}") from None
            return fresh.get_secret_value() if fresh is not None else ""
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


#: why ``passive: false`` is refused (the caller names the key)
ACTIVE_MODE_REFUSAL = ("active mode is not supported: ftpbc always opens data connections passively "
                       "(EPSV, else PASV); remove 'passive: false'")


def _uses_tls(scheme: str) -> bool:
    spec = schemes.lookup(scheme)
    return spec is not None and spec.tls


def tls_refusal(scheme: str) -> str:
    """The one-line reason a TLS setting is refused on a ``scheme``:// server (the caller names
    the key).  A clear-text scheme whose transport has a TLS twin (ftp: ftps) says to use it."""
    spec = schemes.lookup(scheme)
    with_tls = [s.name for s in schemes.SCHEMES.values() if s.tls]
    twin = next((s for s in with_tls if spec is not None and spec.has_host
                 and schemes.SCHEMES[s].transport == spec.transport), None)
    if twin is not None:
        return (f"a TLS setting on an {scheme}:// url, which logs in and transfers in clear text; "
                f"use {twin}:// (explicit AUTH TLS, or with tls: implicit) or remove the setting")
    return (f"a TLS setting, for {' and '.join(s + '://' for s in with_tls)} only; a {scheme}:// server "
            "does not use it")


def open_secret_file_problem(path: Path, mode: int) -> str | None:
    """Why a secret file of this ``st_mode`` is refused (group or others may read or write it),
    or None when its mode is private enough.  The message names the file and its mode."""
    bits = stat.S_IMODE(mode)
    if not bits & OPEN_SECRET_BITS:
        return None
    return (f"{str(path)!r} is mode {bits:04o}, readable or writable by group or others; "
            f"chmod 600 it, or set allow_insecure_secret_files: true to accept that")


def _flag(value: Any) -> bool:
    # Read before the field itself is validated, with the field's own rules; a value that is
    # not a boolean counts as false here, and pydantic reports it right after.
    if value is None:
        return False
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        return False


def _read_secret(data: dict[str, Any], scheme: str, *, allow_open: bool) -> SecretStr | None:
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
            with open(path, "rb") as fh:
                # The mode of the file actually opened (fstat), not of whatever the name
                # pointed to a moment before.
                mode = os.fstat(fh.fileno()).st_mode
                problem = None if allow_open else open_secret_file_problem(path, mode)
                if problem is not None:
                    raise ValueError(f"password_file: {problem}")
                text = fh.read().decode("utf-8")
        except OSError as exc:
            raise ValueError(f"password_file: cannot read {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"password_file: {str(path)!r} is not UTF-8 text") from None
        # One trailing newline is how editors and `echo` save a secret; it is not part of it.
        return SecretStr(text.rstrip("\r\n"))
    return None


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (``fpt://app:***@host/``).

    Works on the text, not through ``urlsplit``, so that a url ``urlsplit`` rejects or reads
    differently (an unknown scheme, a bad port, an unencoded ``/`` or ``@`` in the password, no
    ``//``) is still redacted.  It errs on the side of hiding: everything between the first
    ``:`` of the authority and its last ``@`` goes, even when a path holds that ``@``.
    """
    start = url.find("//")
    start = 0 if start < 0 else start + 2
    at = url.rfind("@", start)
    if at < 0:
        return url
    colon = url.find(":", start, at)
    if colon < 0:
        return url
    return f"{url[:colon + 1]}***{url[at:]}"


_URL_WITH_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):[^\s'\"]*@")


def redact_urls_in(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced by ``***``
    (for messages that quote a value the configuration gave, whatever the key)."""
    return _URL_WITH_PASSWORD.sub(r"\1:***@", text)


def _scheme(url: str) -> str:
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return ""  # refused by _parse, with a message that does not quote the password
