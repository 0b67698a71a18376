"""Simulated hosts: one network namespace per host, all on one bridge, on this machine.

:class:`Network` builds, with ``ip netns`` (root only):

* a bridge in the root namespace, ``fbh<pid>b``, with ``10.231.<N>.254/24``: the root namespace
  (pytest and the clients it runs) reaches every host through it;
* per host, a namespace ``fbh<pid>-<name>`` with its loopback up and one end of a veth pair
  (``eth0``, address ``10.231.<N>.<1+i>/24``), the other end (``fbh<pid>v<i>``) on the bridge.

No namespace has a default route and nothing is forwarded or NATed, so the traffic stays on the
bridge.  Names carry pytest's pid, so parallel runs do not collide; the subnet's third byte is
one no interface of the root namespace uses yet.  :meth:`Network.up` first removes what a killed
run (a pid no longer alive) left behind: the processes in its namespaces, the namespaces and
the bridge.  :meth:`Network.down` kills every process still in a namespace, then deletes the
namespaces (which deletes their veth pairs) and the bridge.

:meth:`Host.command` runs a command in the host's namespace with a host name of its own (a UTS
namespace, ``unshare --uts``): a heartbeat names its host, and a node restarted on the same host
checks whether the pid in its old heartbeat is alive.  ``ip netns exec``, ``unshare`` and
``sh -c 'exec'`` each exec, never fork: the pid Popen returns is the command's own, so a SIGKILL
to it is a crash of that "host's" process.  The filesystem is shared (the tests inspect the
server's files), but each node is given only its own directories.

Locally without ``ip`` or root the fixtures skip; under CI=true that fails.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers.handle import ServerHandle
from tests.servers.vsftpd import VsftpdProcess, running_vsftpd
from tests.support import IN_CI, require_binary

#: prefix of every namespace and link name: short, as link names are limited to 15 characters
PREFIX = "fbh"
#: private /16 the per-run /24 is taken from (10.231.<N>.0/24, N in 1..250)
SUBNET16 = "10.231"
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:-|b$|[vp]\d+$)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs; a zombie (a killed pytest not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def require_netns() -> None:
    """Skip (fail under CI=true) unless ``ip`` and root are here and a namespace can be made."""
    require_binary("ip", "/usr/sbin/ip", "/sbin/ip")
    require_binary("unshare", "/usr/bin/unshare")
    problem = None
    if os.geteuid() != 0:
        problem = "network namespaces need root"
    else:
        probe = f"{PREFIX}{os.getpid()}-probe"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            problem = f"cannot create a network namespace: {made.stderr.strip()}"
        else:
            _ip("netns", "del", probe, check=False)
    if problem:
        if IN_CI:
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)


@dataclass(frozen=True)
class Host:
    """One simulated host: a network namespace and its address on the bridge."""

    name: str
    netns: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run in this host's namespace, under its own host name (the same pid)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts",
                "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *argv]


class Network:
    """Hosts in network namespaces on one bridge (module docstring).  Use as a context manager."""

    def __init__(self, names: list[str]) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{self.tag}b"
        self.names = names
        self.hosts: dict[str, Host] = {}
        self.gateway = ""

    def __enter__(self) -> Network:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        cleanup_leftovers()
        subnet = _free_subnet()
        self.gateway = str(subnet[254])
        # No STP: a port forwards as soon as it is up, so no host waits out a forward delay.
        _ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            host = Host(name, f"{self.tag}-{name}", str(subnet[1 + i]))
            outer, inner = f"{self.tag}v{i}", f"{self.tag}p{i}"
            _ip("netns", "add", host.netns)
            self.hosts[name] = host
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host.netns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            ns = ("-n", host.netns)
            _ip(*ns, "link", "set", "lo", "up")
            _ip(*ns, "link", "set", inner, "name", "eth0")
            _ip(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip(*ns, "link", "set", "eth0", "up")

    def down(self) -> None:
        for host in self.hosts.values():
            _remove_namespace(host.netns)
        self.hosts.clear()
        # A veth pair still in the root namespace (set-up failed before moving it) goes too.
        for i in range(len(self.names)):
            for link in (f"{self.tag}v{i}", f"{self.tag}p{i}"):
                if _ip("link", "show", link, check=False).returncode == 0:
                    _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)


def reaches(host: Host, address: str, port: int) -> bool:
    """True if a TCP connection from ``host``'s namespace to ``address``:``port`` succeeds."""
    probe = ("import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)"
             ".close()")
    argv = ["ip", "netns", "exec", host.netns, sys.executable, "-c", probe, address, str(port)]
    return subprocess.run(argv, capture_output=True, check=False, timeout=30).returncode == 0


def _remove_namespace(netns: str) -> None:
    """Kill and reap-by-init every process left in ``netns``, then delete it (and its veths)."""
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    # A namespace whose processes still exit is deleted anyway: "ip netns del" unmounts its
    # name, and the kernel frees it with its last process.
    _ip("netns", "del", netns, check=False)


def cleanup_leftovers() -> list[str]:
    """Remove the namespaces and links of earlier runs whose pytest is gone; returns their names."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if (m := _NAME.match(name)) and not _pid_alive(int(m.group(1))):
            _remove_namespace(name)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if (m := _NAME.match(name)) and not _pid_alive(int(m.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.231.N.0/24 no address of the root namespace is in (parallel runs take different N)."""
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    start = os.getpid() % 250
    for k in range(250):
        n = 1 + (start + k) % 250
        if f" {SUBNET16}.{n}." not in used:
            return ipaddress.IPv4Network(f"{SUBNET16}.{n}.0/24")
    raise RuntimeError(f"no free /24 left in {SUBNET16}.0.0/16")


# ---------------------------------------------------------------------- the server host


def vsftpd_in(host: Host) -> type[VsftpdProcess]:
    """The rig's vsftpd process, started in ``host``'s namespace (tests/servers/vsftpd.py)."""

    class NamespacedVsftpd(VsftpdProcess):
        def start(self) -> None:
            # Probed from the root namespace, across the bridge, as the clients connect.
            self.launch(host.command([self.binary, str(self.config)]), self.log,
                        f"vsftpd on {self.address}:{self.port} in {host.netns} ({self.log})",
                        self._listening, die_with_parent=False)

    return NamespacedVsftpd


@contextlib.contextmanager
def vsftpd_on(host: Host, workdir: Path) -> Iterator[ServerHandle]:
    """A real vsftpd listening on ``host``'s address only, with the rig's controls."""
    binary = require_binary("vsftpd", "/usr/sbin/vsftpd")
    for tool in ("useradd", "userdel", "chpasswd"):
        require_binary(tool, f"/usr/sbin/{tool}")
    with running_vsftpd(binary, workdir, label="hosts", process_class=vsftpd_in(host),
                        address=host.address) as v:
        yield v.handle("vsftpd", host=host.address)


def host_node_config(base: str) -> dict[str, Any]:
    """``node:`` keys every simulated host shares: the coordination on the server, in ``base``."""
    return {"coordination": "server", "coordination_dir": f"{base}/.ftpbc-cluster"}
