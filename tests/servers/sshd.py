"""A real OpenSSH sshd serving SFTP on a loopback port, for the conformance and SFTP tests.

``sshd_server`` (session scope) runs Debian's ``/usr/sbin/sshd -D -e -f <generated config>``
with its own host key, ``internal-sftp``, public-key login for root (the tests run as root) and
a known_hosts file holding the server's key, so host key verification stays ON in every test.
Remote paths are absolute on the server, so the URL's base is the temporary root directory and
remote ``/`` maps to it.

Controls: ``drop_connections`` kills the per-connection sshd processes (the listener stays);
``pause_connections`` / ``resume_connections`` SIGSTOP / SIGCONT them (requests reach the kernel
but get no reply: the "outcome unknown" case); ``restart`` stops and starts the listener on the
same port.

``sshd_password_login`` (session scope, only built when a test asks for it) creates a dedicated
system user with a random password, because password login as root would need root's password
changed.  The user and its directory are removed at teardown.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.servers.handle import ServerHandle
from tests.servers.process import ListeningProcess, accepts, require_root
from tests.support import free_port, require_binary

#: one user per pytest process: a second test run on the same machine (a developer's beside
#: CI's, or two at once) must never delete or re-password the user this run logs in as (one run
#: once failed with "Invalid user" halfway through)
PASSWORD_USER_PREFIX = "ftpbc-sftp-"
PASSWORD_USER = f"{PASSWORD_USER_PREFIX}{os.getpid()}"
PASSWORD_USER_COMMENT = "ftpbc test suite, removed after each run"


def _remove_users_of_dead_runs() -> None:
    """Delete the password users that killed earlier runs left (our comment, a dead pid)."""
    for entry in pwd.getpwall():
        name = entry.pw_name
        if entry.pw_gecos != PASSWORD_USER_COMMENT or not name.startswith(PASSWORD_USER_PREFIX):
            continue
        pid = name.removeprefix(PASSWORD_USER_PREFIX)
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            subprocess.run(["userdel", name], check=False, capture_output=True)

#: client key types generated for the key-authentication tests
CLIENT_KEY_TYPES = ("ed25519", "rsa", "ecdsa")


@dataclass
class SshdProcess(ListeningProcess):
    """The running listener, its files and the means to stop or restart it.

    The listener dies with the process that started it (a pytest killed by a signal skips
    fixture teardown; without that it would hold its port and temp directory)."""

    binary: str
    workdir: Path
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    client_keys: dict[str, Path] = field(default_factory=dict)
    name: str = field(default="sshd", init=False)

    def start(self) -> None:
        self.launch([self.binary, "-D", "-e", "-f", str(self.config)], self.log,
                    f"sshd on 127.0.0.1:{self.port} ({self.log})", self._listening, die_with_parent=True)

    def _listening(self) -> bool:
        assert self.proc is not None
        return accepts(self.proc, self.port, "sshd", self.log)

    def pause_connections(self) -> None:
        """SIGSTOP the per-connection processes: requests are accepted by TCP, never answered."""
        self._signal_children(signal.SIGSTOP)

    def resume_connections(self) -> None:
        self._signal_children(signal.SIGCONT)

    def _signal_children(self, sig: int) -> None:
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                child.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume_connections()
        super().stop()


def _keygen(path: Path, kind: str) -> Path:
    bits = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *bits, "-N", "", "-C", f"ftpbc-test-{kind}",
                    "-f", str(path)], check=True, stdin=subprocess.DEVNULL)
    return path


def _config_text(workdir: Path, port: int, extra: list[str]) -> str:
    lines = [
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {workdir / 'host_ed25519'}",
        f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}",
        "PermitRootLogin yes",
        "PubkeyAuthentication yes",
        "PasswordAuthentication yes",
        "KbdInteractiveAuthentication no",
        # Without PAM sshd checks passwords against /etc/shadow itself: no PAM stack to set up.
        "UsePAM no",
        # The temporary directories are not laid out the way StrictModes wants home dirs.
        "StrictModes no",
        "Subsystem sftp internal-sftp",
        # Test suites open many connections at once; sshd's default throttles at 10.
        "MaxStartups 200",
        "MaxSessions 50",
        "UseDNS no",
        "LogLevel INFO",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def _write_config(binary: str, workdir: Path, port: int) -> Path:
    config = workdir / "sshd_config"
    # OpenSSH >= 9.8 penalises source addresses after failed logins; the wrong-password tests
    # would then lock 127.0.0.1 out.  Older versions reject the keyword, so probe it with -t.
    config.write_text(_config_text(workdir, port, ["PerSourcePenalties no"]))
    probe = subprocess.run([binary, "-t", "-f", str(config)], capture_output=True,
                           stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        config.write_text(_config_text(workdir, port, []))
        probe = subprocess.run([binary, "-t", "-f", str(config)], capture_output=True,
                               stdin=subprocess.DEVNULL)
        if probe.returncode != 0:
            pytest.fail(f"sshd rejects the generated config: {probe.stderr.decode(errors='replace')}")
    return config


@pytest.fixture(scope="session")
def sshd_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdProcess]:
    binary = require_binary("sshd", "/usr/sbin/sshd")
    require_binary("ssh-keygen", "/usr/bin/ssh-keygen")
    require_root("sshd", "sshd's privilege separation needs it")
    # The privilege-separation directory the Debian package normally creates at boot.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    workdir = tmp_path_factory.mktemp("sshd")
    host_key = _keygen(workdir / "host_ed25519", "ed25519")
    client_keys = {kind: _keygen(workdir / f"client_{kind}", kind) for kind in CLIENT_KEY_TYPES}
    (workdir / "authorized_keys").write_text(
        "".join(Path(f"{k}.pub").read_text() for k in client_keys.values()))
    port = free_port()
    host_pub = host_key.with_suffix(".pub").read_text().split()
    (workdir / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")

    server = SshdProcess(binary=binary, workdir=workdir, port=port,
                         config=_write_config(binary, workdir, port), log=workdir / "sshd.log",
                         client_keys=client_keys)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sshd_server(sshd_process: SshdProcess) -> ServerHandle:
    root = sshd_process.workdir / "root"
    root.mkdir()
    return ServerHandle(
        kind="sshd",
        root=root,
        url=f"sftp://root@127.0.0.1:{sshd_process.port}{root}",
        options={"key_file": sshd_process.client_keys["ed25519"],
                 "known_hosts": sshd_process.workdir / "known_hosts"},
        controls={"drop_connections": sshd_process.drop_connections,
                  "pause_connections": sshd_process.pause_connections,
                  "resume_connections": sshd_process.resume_connections,
                  "restart": sshd_process.restart},
    )


@pytest.fixture(scope="session")
def sshd_password_login(sshd_process: SshdProcess) -> Iterator[ServerHandle]:
    """A handle for password login as a dedicated user, rooted in a directory that user owns."""
    for tool in ("useradd", "userdel", "chpasswd"):
        require_binary(tool, f"/usr/sbin/{tool}")
    _remove_users_of_dead_runs()
    try:
        pwd.getpwnam(PASSWORD_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", "--comment", PASSWORD_USER_COMMENT,
                        PASSWORD_USER], check=True)
    if pwd.getpwnam(PASSWORD_USER).pw_gecos != PASSWORD_USER_COMMENT:
        pytest.fail(f"a user {PASSWORD_USER!r} exists that the test suite did not create")
    password = secrets.token_urlsafe(18)
    subprocess.run(["chpasswd"], input=f"{PASSWORD_USER}:{password}\n".encode(), check=True)
    # Outside the root-only pytest temp tree, which the unprivileged user could not traverse.
    root = Path(subprocess.run(["mktemp", "-d", "/tmp/ftpbc-sftp-XXXXXX"], check=True,
                               capture_output=True, text=True).stdout.strip())
    entry = pwd.getpwnam(PASSWORD_USER)
    os.chown(root, entry.pw_uid, entry.pw_gid)
    root.chmod(0o755)
    try:
        yield ServerHandle(
            kind="sshd",
            root=root,
            url=f"sftp://{PASSWORD_USER}@127.0.0.1:{sshd_process.port}{root}",
            password=password,
            options={"known_hosts": sshd_process.workdir / "known_hosts"},
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["userdel", PASSWORD_USER], check=False)
