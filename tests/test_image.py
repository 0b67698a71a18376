"""The container image and docker-compose.yml, run for real under podman.

A Debian bookworm base image is made from Debian's packages (debootstrap, podman import; kept
and reused when present), the Containerfile builds ftpbc on it, and podman-compose runs the
stack: a request from the host is answered, a stop drains (every container exits 0, no claim
left behind), the stack comes up again on its volumes (the journals replay) and goes down with
them.  Locally a missing podman skips; under CI=true it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import IN_CI, ftpbc_env, require_binary, run_ftpbc, wait_until

REPO = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/ftpbc-debian:bookworm"
IMAGE = "localhost/ftpbc:test"
PROJECT = "ftpbc-image-test"
PASSWORD = "image-test-password"
#: host ports docker-compose.yml publishes (FTP control, the first passive port, Prometheus, Grafana)
HOST_PORTS = (2121, 30000, 9090, 3000)
#: the image's build runs pip; behind a TLS-intercepting proxy pip needs the host's CA bundle
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def report(line: str) -> None:
    """What the test checked, in the log (pytest -s, or CI's output on failure)."""
    print(f"test_image: {line}", flush=True)


def run(argv: list[str], env: dict[str, str], timeout: float = 300,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(argv[:4])} ... exited {result.returncode}:\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def podman_env(tmp_path: Path) -> dict[str, str]:
    """podman here runs with runc (crun cannot set RLIMIT_NOFILE in this kind of sandbox) and
    without default ulimits, set in a containers.conf of the test's own, not the system's."""
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n', encoding="utf-8")
    return {**os.environ, "CONTAINERS_CONF": str(conf), "FTPBC_PASSWORD": PASSWORD,
            "FTPBC_IMAGE": IMAGE, "FTPBC_BASE": BASE_IMAGE}


def make_base_image(env: dict[str, str], tmp_path: Path) -> None:
    """A Debian bookworm minbase from the Debian mirror, imported once and reused after."""
    if run(["podman", "image", "exists", BASE_IMAGE], env, check=False).returncode == 0:
        report(f"base image {BASE_IMAGE} present, reused")
        return
    debootstrap = require_binary("debootstrap", "/usr/sbin/debootstrap")
    rootfs = tmp_path / "rootfs"
    started = time.monotonic()
    run([debootstrap, "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"], env,
        timeout=600)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        imported = subprocess.run(["podman", "import", "-q", "-", BASE_IMAGE], stdin=tar.stdout, env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(timeout=60)
    assert imported.returncode == 0, imported.stderr
    shutil.rmtree(rootfs, ignore_errors=True)
    report(f"base image {BASE_IMAGE} made by debootstrap in {time.monotonic() - started:.0f} s")


def build_image(env: dict[str, str]) -> None:
    argv = ["podman", "build", "--format", "docker", "-f", "Containerfile", "-t", IMAGE,
            "--build-arg", f"BASE={BASE_IMAGE}"]
    if CA_BUNDLE.is_file():
        argv += ["--secret", f"id=ca-certificates,src={CA_BUNDLE}"]
    started = time.monotonic()
    run([*argv, "."], env, timeout=900)
    report(f"image {IMAGE} built in {time.monotonic() - started:.0f} s")


def inspect(what: str, name: str, env: dict[str, str]) -> Any:
    [doc] = json.loads(run(["podman", what, "inspect", name], env).stdout)
    return doc


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # as a server binds: a connection of a finished run in TIME_WAIT does not hold the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture()
def stack(tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """podman-compose bound to the test's project, taken down with its volumes at the end."""
    require_binary("podman")
    require_binary("runc", "/usr/sbin/runc")
    compose = require_binary("podman-compose")
    env = podman_env(tmp_path)
    version = run([compose, "--version"], env).stdout
    # profiles and network_mode service:NAME are read from podman-compose 1.1 on
    found = re.search(r"podman-composer? version:?\s+(\d+)\.(\d+)\S*", version)
    if found is None or (int(found[1]), int(found[2])) < (1, 1):
        seen = found[0] if found else "of no version it names"
        message = f"podman-compose 1.1 or later is needed; {compose} is {seen} (pip install podman-compose)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    busy = [p for p in HOST_PORTS if not port_free(p)]
    assert not busy, f"host ports {busy} that docker-compose.yml publishes are in use"
    base = [compose, "-p", PROJECT, "-f", "docker-compose.yml"]
    try:
        yield base, env
    finally:
        run([*base, "down", "-v", "-t", "40"], env, check=False, timeout=180)
        left = run(["podman", "ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}"],
                   env, check=False)
        assert not left.stdout.strip(), f"containers left behind: {left.stdout}"


def request_quote(host_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_ftpbc("request", "-c", "examples/cluster.yaml", "quote", "--data", "EURUSD",
                     env=host_env, cwd=REPO, timeout=60)


def wait_answered(host_env: dict[str, str], what: str) -> str:
    def answered() -> str | None:
        result = request_quote(host_env)
        return result.stdout if result.returncode == 0 else None
    answer = wait_until(answered, timeout=180, interval=1, what=what)
    assert answer is not None
    return answer


def test_image_builds_and_the_compose_stack_serves_drains_and_replays(
        stack: tuple[list[str], dict[str, str]], tmp_path: Path) -> None:
    base, env = stack
    make_base_image(env, tmp_path)
    build_image(env)

    image = inspect("image", IMAGE, env)
    config = image["Config"]
    assert config["Entrypoint"] == ["ftpbc"]
    assert config["User"] == "ftpbc"
    healthcheck = image.get("Healthcheck") or config.get("Healthcheck")  # podman's place, docker's
    assert healthcheck and "/readyz" in " ".join(healthcheck["Test"]), image
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "ftpbc"
    assert labels["org.opencontainers.image.base.name"] == BASE_IMAGE
    report("image: entry point ftpbc, user ftpbc, HEALTHCHECK on /readyz, OCI labels")
    version = run(["podman", "run", "--rm", IMAGE, "--version"], env).stdout
    assert "ftpbc" in version, version
    ids = run(["podman", "run", "--rm", "--entrypoint", "id", IMAGE], env).stdout
    assert ids.startswith("uid=10001(ftpbc) gid=10001(ftpbc)"), ids

    host_env = ftpbc_env({"FTPBC_PASSWORD": PASSWORD})
    # The host's client keeps its journal under the working directory's journals/ (gitignored).
    run([*base, "up", "-d"], env, timeout=300)
    services = {c["Labels"]["com.docker.compose.service"]: c["Names"][0] for c in json.loads(
        run(["podman", "ps", "-a", "--format", "json", "--filter",
             f"label=io.podman.compose.project={PROJECT}"], env).stdout)}
    # the monitoring profile is not started by a plain `up`
    assert set(services) == {"ftp", "node-a", "node-b"}, services
    answer = wait_answered(host_env, "the stack to answer a request from the host")
    assert answer.strip() == "EURUSD 1.0842", answer
    report("stack up: ftp, node-a, node-b; request from the host answered; monitoring profile not started")
    for name in ("node-a", "node-b"):
        # no install at start: the image's ftpbc runs, nothing was pip-installed into the container
        diff = run(["podman", "diff", services[name]], env).stdout
        assert "/opt/ftpbc" not in diff, diff
        # the image's HEALTHCHECK, run on demand (podman schedules it through systemd, absent here)
        container = services[name]

        def healthy(container: str = container) -> bool:
            return run(["podman", "healthcheck", "run", container], env, check=False).returncode == 0
        wait_until(healthy, timeout=60, interval=1, what=f"{name} healthy (/readyz)")
    report("nodes healthy by the image's HEALTHCHECK (/readyz); nothing installed at start")
    # a mark in node-a's journal volume, to see the same volume after the restart
    run(["podman", "exec", services["node-a"], "touch", "/data/journals/volume-mark"], env)

    # drain: nodes first (the FTP server stays up to take the claims back), then the server
    run([*base, "stop", "-t", "40", "node-a", "node-b"], env, timeout=180)
    for name in ("node-a", "node-b"):
        state = inspect("container", services[name], env)["State"]
        assert (state["Status"], state["ExitCode"]) == ("exited", 0), (name, state)
    status = run_ftpbc("status", "-c", "examples/cluster.yaml", "--json", env=host_env, cwd=REPO)
    assert status.returncode == 0, status.stderr
    depths = {e["name"]: e["depth"] for e in json.loads(status.stdout)["endpoints"]}
    assert depths and all(d["inselect"] == 0 for d in depths.values()), depths
    run([*base, "stop", "-t", "40"], env, timeout=180)
    assert inspect("container", services["ftp"], env)["State"]["ExitCode"] == 0
    report("stop: every container exited 0, no claim left in any inselect")

    # up again on the same volumes: the nodes replay their journals and serve
    run([*base, "down", "-t", "40"], env, timeout=180)
    run([*base, "up", "-d"], env, timeout=300)
    services = {c["Labels"]["com.docker.compose.service"]: c["Names"][0] for c in json.loads(
        run(["podman", "ps", "--format", "json", "--filter",
             f"label=io.podman.compose.project={PROJECT}"], env).stdout)}
    answer = wait_answered(host_env, "the restarted stack to answer")
    assert answer.strip() == "EURUSD 1.0842", answer
    run(["podman", "exec", services["node-a"], "test", "-f", "/data/journals/volume-mark"], env)
    journal = run(["podman", "exec", services["node-a"], "ftpbc", "journal", "-c", "/config/cluster.yaml",
                   "--node-id", "node-a"], env)
    assert "0 pending operation(s) in journals/node-a" in journal.stdout, journal.stdout + journal.stderr
    report("down and up again: journal volume kept and replayed (0 pending), request answered")

    run([*base, "down", "-v", "-t", "40"], env, timeout=180)
    volumes = run(["podman", "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}"],
                  env).stdout
    assert not volumes.strip(), volumes
    report("down -v: containers and volumes removed")
