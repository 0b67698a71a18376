"""A real vsftpd (``/usr/sbin/vsftpd``, Debian package) on a loopback port, for the conformance suite.

``vsftpd_server`` (session scope) runs vsftpd in the foreground (``listen=YES``,
``background=NO``) with a generated configuration, logging in a dedicated local user
(``ftpbc-ftp-<random>``, created with useradd and given a random password with chpasswd;
removed at teardown) through a PAM service of its own (pam_unix only, written
to /etc/pam.d at start and removed at teardown).  The user is
chrooted into a temporary root outside pytest's root-only temp tree, so remote ``/`` maps to it.

vsftpd has no MLSD, so this server is what exercises the LIST fallback.

``vsftpd_tls_server`` is the same with TLS required of every login (``force_local_logins_ssl``),
its certificate signed by ``tls_material``'s CA; the tests of what a plain ``ftp://`` URL meets
there use it, the conformance suite does not.

Controls: ``drop_connections`` kills the per-session vsftpd processes (the listener stays),
``restart`` stops and starts the listener on the same port.

Locally without vsftpd (or not as root) the fixture skips; under CI=true it fails.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.servers.handle import ServerHandle
from tests.servers.process import ListeningProcess, ServerInstance, accepts, gone, require_root
from tests.servers.pyftpd import TLSMaterial
from tests.support import free_port, require_binary, wait_until

#: user and PAM service names get a per-run suffix: parallel test runs must not reset each
#: other's password or delete each other's user.
USER_PREFIX = "ftpbc-ftp-"
PAM_DIR = Path("/etc/pam.d")
PAM_SERVICE = ("auth required pam_unix.so nodelay\n"
               "account required pam_unix.so\n"
               "session required pam_permit.so\n")
#: passive data ports: below the kernel's ephemeral range (docs/servers.md)
PASV_PORTS = (27000, 27999)


@dataclass
class VsftpdProcess(ListeningProcess):
    binary: str
    config: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: the configured listen_address (tests/hosts.py: the server host's namespace address)
    address: str = "127.0.0.1"
    name: str = field(default="vsftpd", init=False)

    def start(self) -> None:
        self.launch([self.binary, str(self.config)], self.log,
                    f"vsftpd on {self.address}:{self.port} ({self.log})", self._listening,
                    die_with_parent=False)

    def _listening(self) -> bool:
        assert self.proc is not None
        return accepts(self.proc, self.port, "vsftpd", self.log, read_banner=True, host=self.address)

    def kill_session_helpers(self) -> None:
        """Kill the privileged helper of every session (the listener's children) and keep the
        processes that talk to the clients (their children): each open session then answers its
        next command that needs the helper (PASV, EPSV...) with ``500 OOPS: priv_sock_...``, as
        sessions do while vsftpd is being restarted."""
        assert self.proc is not None
        helpers = psutil.Process(self.proc.pid).children()
        for helper in helpers:
            try:
                helper.kill()
            except psutil.NoSuchProcess:
                pass
        wait_until(lambda: all(gone(h) for h in helpers), timeout=5, what="vsftpd session helpers to die")


def _config(root: Path, workdir: Path, port: int, pam_service: str, address: str = "127.0.0.1",
            tls: TLSMaterial | None = None) -> str:
    settings = {
        "listen": "YES",
        "listen_ipv6": "NO",
        "listen_address": address,
        "listen_port": str(port),
        "background": "NO",
        "anonymous_enable": "NO",
        "local_enable": "YES",
        "write_enable": "YES",
        "local_umask": "022",
        "local_root": str(root),
        "chroot_local_user": "YES",
        # The test user writes into its chroot's top directory.
        "allow_writeable_chroot": "YES",
        "secure_chroot_dir": str(workdir / "empty"),
        # The seccomp filter breaks vsftpd in some containers; the tests need no sandbox.
        "seccomp_sandbox": "NO",
        "pam_service_name": pam_service,
        "userlist_enable": "NO",
        "pasv_enable": "YES",
        "pasv_min_port": str(PASV_PORTS[0]),
        "pasv_max_port": str(PASV_PORTS[1]),
        "port_enable": "YES",
        "connect_from_port_20": "NO",
        # Failed-login tests must not wait; many tests connect at once.
        "delay_failed_login": "0",
        "delay_successful_login": "0",
        "max_clients": "0",
        "max_per_ip": "0",
        "max_login_fails": "100",
        "idle_session_timeout": "600",
        "data_connection_timeout": "120",
        # Dot files are ordinary message files for ftpbc; list them.
        "force_dot_files": "YES",
        "use_localtime": "NO",
        "utf8_filesystem": "YES",
        "xferlog_enable": "NO",
        "dual_log_enable": "NO",
        "vsftpd_log_file": str(workdir / "vsftpd.log"),
        "ssl_enable": "NO",
        "ftpd_banner": "ftpbc test vsftpd ready",
    }
    if tls is not None:
        # TLS required of every login, on control and data, as a careful partner runs it; the
        # ciphers named, since vsftpd's own default is one that current OpenSSL no longer offers.
        settings.update({"ssl_enable": "YES", "force_local_logins_ssl": "YES", "force_local_data_ssl": "YES",
                         "rsa_cert_file": str(tls.cert_file), "rsa_private_key_file": str(tls.key_file),
                         "ssl_ciphers": "HIGH"})
    return "".join(f"{k}={v}\n" for k, v in settings.items())


@pytest.fixture(scope="session")
def vsftpd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    binary = require_binary("vsftpd", "/usr/sbin/vsftpd")
    for tool in ("useradd", "userdel", "chpasswd"):
        require_binary(tool, f"/usr/sbin/{tool}")
    require_root("vsftpd", "it creates a login user and chroots")

    with running_vsftpd(binary, tmp_path_factory.mktemp("vsftpd")) as v:
        handle = v.handle("vsftpd")
        assert isinstance(v.server, VsftpdProcess)
        handle.controls["kill_session_helpers"] = v.server.kill_session_helpers
        yield handle


@pytest.fixture(scope="session")
def vsftpd_tls_server(tmp_path_factory: pytest.TempPathFactory,
                      tls_material: TLSMaterial) -> Iterator[ServerHandle]:
    """vsftpd with ``force_local_logins_ssl``: a plain login is refused with 530 (ftps:// only)."""
    binary = require_binary("vsftpd", "/usr/sbin/vsftpd")
    for tool in ("useradd", "userdel", "chpasswd"):
        require_binary(tool, f"/usr/sbin/{tool}")
    require_root("vsftpd", "it creates a login user and chroots")
    with running_vsftpd(binary, tmp_path_factory.mktemp("vsftpd-tls"), label="tls", tls=tls_material) as v:
        yield v.handle("vsftpd_tls", scheme="ftps", options={"ca_file": tls_material.ca_file})


@contextmanager
def running_vsftpd(binary: str, workdir: Path, *, label: str = "test",
                   process_class: Callable[..., VsftpdProcess] = VsftpdProcess,
                   address: str = "127.0.0.1", tls: TLSMaterial | None = None) -> Iterator[ServerInstance]:
    """A real vsftpd on a free port of ``address`` (loopback), with its own login user, PAM service
    and root.

    Used by the fixture, by the benchmarks and by tests/hosts.py (``address`` in a network
    namespace, started there by its ``process_class``); needs root.  Everything it creates (user, PAM
    file, root directory) is removed on exit.
    """
    suffix = f"{label}-{secrets.token_hex(3)}"
    user = f"{USER_PREFIX}{suffix}"
    pam_file = PAM_DIR / f"ftpbc-vsftpd-{suffix}"
    (workdir / "empty").mkdir(parents=True, exist_ok=True, mode=0o755)
    # Outside pytest's root-only temp tree: vsftpd changes into it as the unprivileged user.
    # It is also the user's home, which vsftpd enters before local_root.
    root = Path(tempfile.mkdtemp(prefix=f"ftpbc-{label}-vsftpd-", dir="/tmp"))
    server: VsftpdProcess | None = None
    try:
        # A login shell listed in /etc/shells, as PAM stacks with pam_shells require.
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", str(root),
                        "--shell", "/bin/sh", user], check=True)
        password = secrets.token_urlsafe(12)
        # SHA-512 with few rounds: Debian's default (yescrypt) costs ~100 ms per login, and the
        # tests log in often.  The password is random and lives for one run.
        subprocess.run(["chpasswd", "--crypt-method", "SHA512", "--sha-rounds", "1000"],
                       input=f"{user}:{password}\n".encode(), check=True)
        # Our own PAM service: pam_unix without its 2 s delay after a failure (the wrong-password
        # tests), and without Debian's session stack (pam_systemd), which vsftpd does not need.
        pam_file.write_text(PAM_SERVICE)
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        root.chmod(0o755)

        port = free_port()
        config = workdir / "vsftpd.conf"
        config.write_text(_config(root, workdir, port, pam_file.name, address, tls))
        server = process_class(binary=binary, config=config, port=port, log=workdir / "stderr.log",
                               address=address)
        server.start()
        yield ServerInstance(server, user, password, root)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
        pam_file.unlink(missing_ok=True)
        subprocess.run(["userdel", user], check=False, capture_output=True)
