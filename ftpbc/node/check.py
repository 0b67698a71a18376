"""Is this configuration ready to run here?  The checks behind ``ftpbc check``.

Per server it logs in once.  A server that cannot be reached or logged into is one failure,
named for what went wrong (a wrong password is a wrong password, not "unreachable"), and the
endpoints and transfers on it are marked not checked instead of failing one by one.  A
``file://`` server fails only when its base directory is unusable: one that is missing but can be
created is fine, as ftpbc creates it on first use (:meth:`LocalTransport.mkdir`).

For every endpoint it creates the exchange-area directories that are missing (those ``ftpbc
serve`` would create, :meth:`ExchangeArea.all_dirs`); for every transfer the receive side's
directories (receive, select, error, archive) and the send side's (send, stage, protect) that
ftpbc itself names; then in each of those directories it writes a probe file, renames it and
deletes it, since a server may allow one and refuse another (an upload-only box).  It does the same
in ``state_dir`` and ``journal_dir``, creating them (0700) when missing, as a node would.  It
imports every handler.

On an FTP or FTPS server it also finds out, once, whether the server renames onto an existing
file (ProFTPD's default ``AllowOverwrite off`` refuses): a warning, since ftpbc then deletes the
target first and replacing a file there is not atomic.

Guaranteed: check writes nothing but missing directories and its own probe files, which it
removes again (one it cannot delete is named in the failure); it never moves, reads or deletes
a message, and a running node never takes a probe for one (see :func:`probe_name`).
Not checked: that other nodes see the same ``state_dir``; directories given as patterns
(``post_receive_to``, ``pre_send_to``, ``post_send_to``), which are known only per file.
"""

from __future__ import annotations

import io
import os
import secrets
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ftpbc.config.models import Config, TransferConfig
from ftpbc.config.servers import ServerConfig
from ftpbc.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectFailed,
    ConnectionLost,
    FtpbcError,
    HostKeyRejected,
    NotFound,
    PermissionDenied,
    SessionLimit,
    TLSFailed,
    TransportError,
    TransportTimeout,
)
from ftpbc.exchange.area import ExchangeArea, archive_name
from ftpbc.exchange.layout import PartnerLayout
from ftpbc.model.envelope import NAME_LIMIT
from ftpbc.paths import join, normalize
from ftpbc.private_files import open_private, private_dir
from ftpbc.sequences import SequenceStore
from ftpbc.transport import Transport, open_transport
from ftpbc.transport.ftp import FTPTransport

#: failures that say nothing about one endpoint: every endpoint on the server would fail alike,
#: so they are the server's one failure and the rest of its checks are skipped
SERVER_DOWN = (ConnectFailed, AuthenticationFailed, TLSFailed, TransportTimeout, ConnectionLost)

#: the warning for an FTP server that refuses RNTO onto an existing file
NO_ATOMIC_REPLACE = ("refuses to rename onto an existing file (ProFTPD: AllowOverwrite off), so ftpbc "
                     "deletes the target first: replacing a file is not atomic there and a crash in "
                     "between loses the old file; allow overwriting on the server")

PROBE_PREFIX = ".ftpbc-check-"
#: The length of a probe's name in bytes: archived as ``<name>~<node>~<stamp>`` it would exceed
#: NAME_LIMIT even for a one-character node id, so every layout refuses it as unusable
#: (Layout.check_usable) before anything is done with it.  Not longer: ftpbc's own archive names
#: reach NAME_LIMIT, so a server ftpbc works with takes a name this long.
PROBE_NAME_BYTES = NAME_LIMIT + 1 - len(archive_name("", "x", datetime(2000, 1, 1, tzinfo=UTC)))
PROBE_BODY = b"ftpbc check probe: safe to delete\n"


def probe_name(tag: str) -> str:
    """A probe file's name, which no running node ever takes for a message.

    A name that does not look like a message is not enough: a ``dropboxmq`` endpoint takes any
    name as a message id, and a transfer's ``receive_from`` may be ``*``.  So the name is
    PROBE_NAME_BYTES long, which every layout refuses as too long to archive (it is logged once
    and left alone, never claimed).  It also starts with a dot, as ftpbc's own directories in a
    partner's folders do (``.ftpbc-stage``...), so partners' pollers that skip hidden files skip
    it, and has no ``~``, so no sweeper takes it for a claim or a staged file of a dead node.
    """
    head = f"{PROBE_PREFIX}{secrets.token_hex(6)}-{tag}-"
    return head + "x" * (PROBE_NAME_BYTES - len(head))


# --------------------------------------------------------------------------- results


@dataclass
class DirCheck:
    """One remote directory: created now, and the first of write/rename/delete that failed."""

    path: str
    created: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def status(self) -> str:
        if self.error is not None:
            return "FAILED"
        return "ok (created)" if self.created else "ok"


@dataclass
class HandlerCheck:
    spec: str
    error: str | None = None


@dataclass
class AreaCheck:
    """An endpoint's exchange area or a transfer's directories on their server."""

    kind: Literal["endpoint", "transfer"]
    name: str
    server: str
    #: the repository of an endpoint; ``receive /in, send /out`` for a transfer
    location: str
    handler: HandlerCheck | None = None
    directories: list[DirCheck] = field(default_factory=list)
    #: a failure of the area as a whole (its repository cannot be listed...)
    error: str | None = None
    #: not checked on the server, because the server itself failed
    skipped: bool = False

    @property
    def area_ok(self) -> bool:
        return not self.skipped and self.error is None and all(d.ok for d in self.directories)

    @property
    def ok(self) -> bool:
        return self.area_ok and (self.handler is None or self.handler.error is None)

    def status(self) -> str:
        if self.skipped:
            return f"not checked (server {self.server} failed)"
        n = len(self.directories)
        if not self.area_ok:
            bad = sum(not d.ok for d in self.directories)
            return f"FAILED ({bad} of {n} dirs)" if bad else "FAILED"
        created = sum(d.created for d in self.directories)
        return f"ok, {n} dirs" + (f" ({created} created)" if created else "")

    def problems(self) -> list[str]:
        """What failed on the server, dirs failing alike grouped: ``/r/inbox, /r/outbox: ...``."""
        out = [self.error] if self.error else []
        grouped: dict[str, list[str]] = {}
        for d in self.directories:
            if d.error is not None:
                grouped.setdefault(d.error, []).append(d.path)
        out.extend(f"{', '.join(paths)}: {why}" for why, paths in grouped.items())
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ok=self.ok, status=self.status(), problems=self.problems())
        if self.kind == "endpoint":
            out["repository"] = self.location
        for raw, d in zip(out["directories"], self.directories, strict=True):
            raw["ok"] = d.ok
        if self.handler is not None:
            out["handler"]["ok"] = self.handler.error is None
        return out


@dataclass
class ServerCheck:
    name: str
    url: str
    #: ``wrong user name or password: login refused: 530 ...``: why nothing on it could be checked
    error: str | None = None
    #: a remark that is not a failure (``base directory missing: created on first use``)
    note: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: ``endpoint quote``, ``transfer orders``: what its failure left unchecked
    not_checked: list[str] = field(default_factory=list)
    areas: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} ({self.url})"

    @property
    def ok(self) -> bool:
        return self.error is None

    def status(self) -> str:
        if self.error is not None:
            return f"FAILED: {self.error.split(': ', 1)[0]}"
        text = "ok" if self.areas else "ok (no endpoints)"
        return f"{text}; {self.note}" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["areas"]
        out.update(ok=self.ok, status=self.status())
        return out


@dataclass
class LocalDirCheck(DirCheck):
    """``state_dir`` or ``journal_dir`` (``key``): created now, and what failed in it."""

    key: str = field(kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "status": self.status()}


@dataclass
class CheckReport:
    source: str
    servers: list[ServerCheck]
    endpoints: list[AreaCheck]
    transfers: list[AreaCheck]
    state_dir: LocalDirCheck
    journal_dir: LocalDirCheck

    def failures(self) -> list[str]:
        """One line per failure: one per failed server, then per endpoint, transfer, directory."""
        labels = {s.name: s.label for s in self.servers}
        out = []
        for s in self.servers:
            if s.error is not None:
                skipped = f"; not checked: {', '.join(s.not_checked)}" if s.not_checked else ""
                out.append(f"server {s.label}: {s.error}{skipped}")
        for a in (*self.endpoints, *self.transfers):
            where = f"server {labels[a.server]}, {a.kind} {a.name}"
            if not a.skipped and not a.area_ok:
                out.append(f"{where}: {'; '.join(a.problems())}")
            if a.handler is not None and a.handler.error is not None:
                out.append(f"{where}: {a.handler.error}")
        for d in (self.state_dir, self.journal_dir):
            if d.error is not None:
                out.append(f"{d.key} {d.path}: {d.error}")
        return out

    #: warnings about the configuration itself (a lease too tight for its timeouts)
    config_warnings: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        return [*self.config_warnings, *(f"server {s.label}: {w}" for s in self.servers for w in s.warnings)]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.source, "ok": self.ok,
                "servers": [s.to_dict() for s in self.servers],
                "endpoints": [a.to_dict() for a in self.endpoints],
                "transfers": [a.to_dict() for a in self.transfers],
                "state_dir": self.state_dir.to_dict(), "journal_dir": self.journal_dir.to_dict(),
                "warnings": self.warnings(), "failures": self.failures()}

    def summary(self) -> str:
        counts = (f"{self.source}: {len(self.servers)} server(s), {len(self.endpoints)} endpoint(s), "
                  f"{len(self.transfers)} transfer(s)")
        failures, warnings = len(self.failures()), len(self.warnings())
        tail = f", {warnings} warning(s)" if warnings else ""
        return f"{counts}: {failures} failure(s){tail}" if failures else f"{counts}: all ok{tail}"


# --------------------------------------------------------------------------- the checks


def _reason(exc: FtpbcError) -> str:
    """The error without the server's name in front: every line names its server already."""
    if isinstance(exc, TransportError):
        return f"{exc.path}: {exc.reason}" if exc.path else exc.reason
    return str(exc)


def server_problem(exc: FtpbcError, cfg: ServerConfig) -> str:
    """``<what went wrong>: <the error>``, what first, as an operator would put it."""
    if isinstance(exc, HostKeyRejected):
        what = "host key not trusted"
    elif isinstance(exc, AuthenticationFailed):
        what = ("login refused (wrong user name, password or key)" if cfg.key_file is not None
                else "wrong user name or password")
    elif isinstance(exc, TLSFailed):
        what = "TLS failed"
    elif isinstance(exc, SessionLimit):
        what = "refuses another session"
    elif isinstance(exc, ConnectFailed):
        what = "unreachable"
    elif isinstance(exc, TransportTimeout):
        what = "no answer in time"
    elif isinstance(exc, ConnectionLost):
        what = "connection lost"
    else:
        what = type(exc).__name__
    return f"{what}: {_reason(exc)}"


def _local_base_problem(base: Path) -> tuple[str | None, str | None]:
    """(failure, note) for a ``file://`` server's base directory.

    Missing is fine when it can be created: ``LocalTransport.mkdir`` creates it (it is this
    node's own configuration, not a partner's), so it is a note, not a failure.
    """
    if base.is_dir():
        return None, None
    if base.exists() or base.is_symlink():
        return f"base directory {base} is not a directory", None
    ancestor = base.parent
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"base directory {base} is missing and cannot be created: {ancestor} is not a directory", None
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"base directory {base} is missing and cannot be created: {ancestor} is not writable", None
    return None, "base directory missing: created on first use"


def _log_in(cfg: ServerConfig, transport: Transport, timeout: float) -> tuple[str | None, str | None]:
    """(failure, note): can ftpbc use this server at all?"""
    if not cfg.has_host:
        failure, note = _local_base_problem(Path(cfg.base))
        if failure is not None or note is not None:
            return failure, note
    try:
        transport.list("/", timeout=timeout)
    except (NotFound, PermissionDenied):
        # The server answered, so the login worked; whether the directories ftpbc uses are
        # there and writable is what the endpoint checks find out.
        if not cfg.has_host:
            return f"base directory {cfg.base} cannot be listed", None
        return None, None
    except FtpbcError as exc:
        return server_problem(exc, cfg), None
    return None, None


def _probe(transport: Transport, directory: str, timeout: float) -> str | None:
    """Write, rename and delete a probe file in ``directory``; None, or what failed."""
    first, second = join(directory, probe_name("a")), join(directory, probe_name("b"))
    step = "write a file"
    try:
        transport.put(first, io.BytesIO(PROBE_BODY), timeout=timeout)
        step = "rename a file"
        transport.rename(first, second, timeout=timeout)
        step = "delete a file"
        transport.delete(second, timeout=timeout)
    except SERVER_DOWN:
        raise
    except FtpbcError as exc:
        left = []
        for path in (first, second):
            with suppress(FtpbcError):
                transport.delete(path, timeout=timeout)
            # Asked again rather than judged from the delete's error: an FTP server's 550 says
            # "no such file" and "not allowed" alike.
            with suppress(FtpbcError):
                if transport.exists(path, timeout=timeout):
                    left.append(path.rsplit("/", 1)[-1])
        # Named, so that the operator can remove it: a node never will (see probe_name).
        leftover = f" (probe file {join(directory, left[0])} left behind)" if left else ""
        return f"cannot {step}: {exc.reason if isinstance(exc, TransportError) else exc}{leftover}"
    return None


def _check_dirs(transport: Transport, dirs: list[DirCheck], present: set[str] | None,
                timeout: float) -> None:
    """Create the missing ones (``present``: the paths known to exist; None: ask each), probe each."""
    for d in dirs:
        try:
            there = d.path in present if present is not None else transport.exists(d.path, timeout=timeout)
            if not there:
                transport.mkdir(d.path, timeout=timeout)
                d.created = True
        except SERVER_DOWN:
            raise
        except FtpbcError as exc:
            d.error = f"cannot create it: {_reason(exc)}"
            continue
        d.error = _probe(transport, d.path, timeout)


def _check_endpoint(transport: Transport, check: AreaCheck, timeout: float) -> None:
    area = ExchangeArea(check.location)
    check.directories = [DirCheck(d) for d in area.all_dirs()]
    try:
        listed = transport.list(area.repository, timeout=timeout)
        present = {join(area.repository, e.name) for e in listed if e.is_dir}
    except NotFound:
        present = set()
    except SERVER_DOWN:
        raise
    except FtpbcError as exc:
        check.error = f"cannot list the repository: {_reason(exc)}"
        return
    _check_dirs(transport, check.directories, present, timeout)


def transfer_dirs(name: str, tc: TransferConfig, config: Config) -> list[str]:
    """The directories a node uses for transfer ``name`` whose paths are known before a file
    comes (those given as patterns over whole paths are not)."""
    # The layout is built only for its directory names; its sequence store is never used (and
    # builds nothing on disk until it is).
    state = Path(config.node.state_dir)
    layout = PartnerLayout(name, tc, SequenceStore(state, state))
    dirs: list[str] = []
    if layout.receive_dir is not None:
        dirs += [layout.receive_dir, *([layout.select] if layout.select else []), layout.error,
                 layout.reason_stage]
        if tc.post_receive == "rename" and tc.post_receive_to is None:
            dirs.append(layout.archive_dir)
    if layout.send_dir is not None:
        dirs.append(layout.send_dir)
        if tc.stage:
            dirs.append(layout.stage_dir)
        if tc.pre_send == "rename" and tc.pre_send_to is None:
            dirs.append(layout.protect_dir)
    return list(dict.fromkeys(dirs))


def _transfer_location(tc: TransferConfig) -> str:
    parts = [f"receive {tc.receive_from}" if tc.receive_from else "",
             f"send {tc.send_to}" if tc.send_to else ""]
    return ", ".join(p for p in parts if p) or "-"


def _probe_rename(transport: Transport, directory: str, timeout: float) -> str | None:
    """A warning if the FTP server behind ``transport`` cannot rename onto an existing file.

    None when it can, and for other transports (local renames replace atomically; SFTP without
    the posix-rename extension falls back the same way, but OpenSSH has it).  The probe files
    are removed whatever happens.
    """
    if not isinstance(transport, FTPTransport):
        return None
    first, second = join(directory, probe_name("a")), join(directory, probe_name("b"))
    try:
        transport.put(first, io.BytesIO(b"a"), timeout=timeout)
        transport.put(second, io.BytesIO(b"b"), timeout=timeout)
        replaces = transport.rename_replaces(first, second, timeout=timeout)
    except FtpbcError as exc:
        return f"cannot tell whether it renames onto an existing file: {_reason(exc)}"
    finally:
        for leftover in (first, second):
            with suppress(FtpbcError):
                transport.delete(leftover, timeout=timeout)
    return None if replaces else NO_ATOMIC_REPLACE


def _check_handler(config: Config, key: str, spec: str | None) -> HandlerCheck | None:
    if spec is None:
        return None
    # Imported here: only a configuration with handlers pays for the serving node's imports.
    from ftpbc.node.serve import load_handler

    try:
        load_handler(spec, key=key, source=config.source, path=config.node.handler_path)
    except ConfigError as exc:
        return HandlerCheck(spec, str(exc))
    return HandlerCheck(spec)


def check_server(config: Config, server_name: str, timeout: float) -> tuple[ServerCheck, list[AreaCheck]]:
    """The server's result and those of the endpoints and transfers on it, in that order."""
    cfg: ServerConfig = config.servers[server_name]
    cfg = cfg.model_copy(update={"timeout": min(cfg.timeout, timeout), "pool_size": 1})
    result = ServerCheck(server_name, cfg.display)
    areas = [AreaCheck("endpoint", n, server_name, ep.repository,
                       _check_handler(config, f"endpoints.{n}.handler", ep.handler))
             for n, ep in sorted(config.endpoints.items()) if ep.server == server_name]
    # a topic's incoming area is checked as the endpoint it is (docs/topics.md)
    areas += [AreaCheck("endpoint", n, server_name, tc.incoming_dir)
              for n, tc in sorted(config.topics.items()) if tc.server == server_name]
    transfers = {n: tc for n, tc in config.transfers.items() if tc.server == server_name}
    areas += [AreaCheck("transfer", n, server_name, _transfer_location(tc),
                        _check_handler(config, f"transfers.{n}.handler", tc.handler))
              for n, tc in sorted(transfers.items())]
    result.areas = len(areas)
    transport = open_transport(cfg)
    try:
        failure, result.note = _log_in(cfg, transport, timeout)
        checked = 0
        try:
            if failure is None:
                for area in areas:
                    if area.kind == "endpoint":
                        _check_endpoint(transport, area, timeout)
                    else:
                        dirs = transfer_dirs(area.name, transfers[area.name], config)
                        area.directories = [DirCheck(d) for d in dirs]
                        _check_dirs(transport, area.directories, None, timeout)
                    checked += 1
        except SERVER_DOWN as exc:
            # Went down midway: still one failure for the server, not one per endpoint.
            failure = server_problem(exc, cfg)
        if failure is not None:
            result.error = failure
            for area in areas[checked:]:
                area.skipped = True
                area.directories = []
                result.not_checked.append(f"{area.kind} {area.name}")
            return result, areas
        if areas and result.note is not None and Path(cfg.base).is_dir():
            result.note = "base directory created"
        # Once per server, in the first directory known to be there and writable.
        ready = next((a for a in areas if a.area_ok and a.directories), None)
        if ready is not None:
            directory = ready.location if ready.kind == "endpoint" else ready.directories[0].path
            warning = _probe_rename(transport, normalize(directory), timeout)
            if warning is not None:
                result.warnings.append(warning)
    finally:
        transport.close()
    return result, areas


def check_local_dir(key: str, path: Path) -> LocalDirCheck:
    """Create ``path`` (0700) if missing, as a node would; create, rename and delete a file in it."""
    result = LocalDirCheck(str(path), key=key)
    step = "create the directory"
    try:
        if not path.is_dir():
            if path.exists():
                result.error = "not a directory"
                return result
            private_dir(path)
            result.created = True
        # A short dot name: nothing lists these directories for messages, and everything that
        # reads them skips dot files or takes directories only (heartbeats, journals).
        first = path / f"{PROBE_PREFIX}{secrets.token_hex(6)}-a"
        second = first.with_name(first.name[:-1] + "b")
        step = "create a file in it"
        fd = open_private(first, os.O_WRONLY | os.O_EXCL | os.O_NOFOLLOW)
        try:
            os.write(fd, PROBE_BODY)
        finally:
            os.close(fd)
        try:
            step = "rename a file in it"
            os.rename(first, second)
            step = "delete a file in it"
            os.unlink(second)
        finally:
            for leftover in (first, second):
                with suppress(OSError):
                    os.unlink(leftover)
    except OSError as exc:
        result.error = f"cannot {step}: {exc.strerror or exc}"
    return result


def run_checks(config: Config, timeout: float) -> CheckReport:
    """Every check of ``ftpbc check``, servers in name order."""
    servers: list[ServerCheck] = []
    endpoints: list[AreaCheck] = []
    transfers: list[AreaCheck] = []
    for name in sorted(config.servers):
        server, areas = check_server(config, name, timeout)
        servers.append(server)
        endpoints += [a for a in areas if a.kind == "endpoint"]
        transfers += [a for a in areas if a.kind == "transfer"]
    endpoints.sort(key=lambda a: a.name)
    transfers.sort(key=lambda a: a.name)
    warning = lease_warning(config)
    return CheckReport(config.source, servers, endpoints, transfers,
                       check_local_dir("state_dir", Path(config.node.state_dir)),
                       check_local_dir("journal_dir", Path(config.node.journal_dir)),
                       config_warnings=[warning] if warning is not None else [])


#: heartbeat intervals a lease must cover besides one server timeout (a late beat, a missed one,
#: and the wait for the next)
LEASE_BEATS = 3


def lease_warning(config: Config) -> str | None:
    """One line if ``node.lease`` cannot cover ``LEASE_BEATS`` heartbeat intervals plus the
    longest server ``timeout``, else None.

    Over a slow link a command may take up to its server's timeout; a lease shorter than that
    plus a few beats lets a live node's lease run out while it waits (it then fences itself and
    other nodes take its work over), which looks like a crash and costs a redelivery.
    """
    node = config.node
    if not config.servers:
        return None
    name, server = max(config.servers.items(), key=lambda item: item[1].timeout)
    needed = LEASE_BEATS * node.heartbeat_interval + server.timeout
    if node.lease >= needed:
        return None
    return (f"node.lease {node.lease:g} s is shorter than {LEASE_BEATS} x node.heartbeat_interval "
            f"({node.heartbeat_interval:g} s) + servers.{name}.timeout ({server.timeout:g} s) = "
            f"{needed:g} s: "
            f"a live node on a slow link may lose its lease and its work; set node.lease to at least "
            f"{needed:g}, or lower servers.{name}.timeout (docs/cluster.md, sizing the lease)")


# --------------------------------------------------------------------------- text


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns two spaces apart, a rule of dashes under the header (as ``ftpbc`` prints tables)."""
    cells = [header, *rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _handler_text(h: HandlerCheck | None) -> str:
    if h is None:
        return "- (client only)"
    return f"{h.spec}: ok" if h.error is None else f"{h.spec}: NOT importable"


def render(report: CheckReport) -> str:
    """The tables ``ftpbc check`` prints: servers, endpoints, transfers, local directories."""
    parts = [table(("server", "url", "status"),
                   [(s.name, s.url, s.status()) for s in report.servers])]
    if report.endpoints:
        parts.append(table(("endpoint", "server", "repository", "status", "handler"),
                           [(a.name, a.server, a.location, a.status(), _handler_text(a.handler))
                            for a in report.endpoints]))
    if report.transfers:
        parts.append(table(("transfer", "server", "directories", "status", "handler"),
                           [(a.name, a.server, a.location, a.status(),
                             _handler_text(a.handler) if a.handler else "-")
                            for a in report.transfers]))
    parts.append(table(("local", "path", "status"),
                       [(d.key, d.path, d.status()) for d in (report.state_dir, report.journal_dir)]))
    return "\n\n".join(parts)
