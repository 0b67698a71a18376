"""Configurations for fixture servers, and clusters of real ``ftpbc serve`` processes.

``endpoint_config`` / ``in_process_config`` build a :class:`~ftpbc.config.models.Config` for an
in-process Node or Client; ``write_config`` writes the same thing as YAML for subprocesses (the
password goes to a 0600 ``password_file`` beside it, never into the YAML).

:class:`ServeCluster` starts ``ftpbc serve`` subprocesses with distinct ``--node-id``, waits for
each to announce its endpoints, and stops them with SIGTERM, checking each exits 0.  Used as a
context manager it kills whatever is still running on the way out, also when a test fails, and
the logs of every node are kept for the failure message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ftpbc.config.models import Config
from tests.servers.handle import ServerHandle
from tests.support import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER = "srv"


def node_section(workdir: Path, node_id: str) -> dict[str, Any]:
    """The ``node:`` section: state (locks, heartbeats) shared by the cluster, journals per node."""
    return {"id": node_id, "state_dir": str(workdir / "state"), "journal_dir": str(workdir / "journals")}


def in_process_config(handle: ServerHandle, workdir: Path, node_id: str,
                      endpoints: dict[str, dict[str, Any]]) -> Config:
    """A Config for an in-process Node or Client on ``handle``'s server (server name ``srv``)."""
    return Config.model_validate({
        "node": node_section(workdir, node_id),
        "servers": {SERVER: handle.config(name=SERVER)},
        "endpoints": {name: {"server": SERVER, **ep} for name, ep in endpoints.items()},
    })


def write_config(path: Path, handle: ServerHandle, workdir: Path,
                 endpoints: dict[str, dict[str, Any]], node_id: str = "unset") -> Path:
    """Write a YAML configuration for subprocesses; ``--node-id`` overrides ``node_id``."""
    server: dict[str, Any] = {"url": handle.url}
    server.update({k: str(v) if isinstance(v, Path) else v for k, v in handle.options.items()})
    if handle.password is not None:
        secret = path.with_name(path.name + ".password")
        secret.write_text(handle.password + "\n", encoding="utf-8")
        secret.chmod(0o600)
        server["password_file"] = str(secret)
    document = {
        "node": node_section(workdir, node_id),
        "servers": {SERVER: server},
        "endpoints": {name: {"server": SERVER, **ep} for name, ep in endpoints.items()},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class ServeProcess:
    node_id: str
    log: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@dataclass
class ServeCluster:
    """``ftpbc serve`` subprocesses sharing one configuration file."""

    config: Path
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[ServeProcess] = field(default_factory=list)

    def start(self, node_ids: list[str], *, ready_timeout: float = 20.0) -> None:
        """Start one node per id; return once each has logged that it is serving."""
        for node_id in node_ids:
            log = self.workdir / f"{node_id}.log"
            env = {**os.environ, **self.env, "FTPBC_NODE_TAG": node_id,
                   # the nodes import examples.handlers from the checkout
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
                                                 if p)}
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from ftpbc.cli import main; main()", "serve",
                     "-c", str(self.config), "--node-id", node_id],
                    cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            self.nodes.append(ServeProcess(node_id, log, proc))
        for node in self.nodes:
            wait_until(lambda n=node: self._ready(n), timeout=ready_timeout,  # type: ignore[misc]
                       interval=0.05, what=f"node {node.node_id} to serve ({node.log})")

    @staticmethod
    def _ready(node: ServeProcess) -> bool:
        if node.proc.poll() is not None:
            raise AssertionError(f"node {node.node_id} exited with {node.proc.returncode}:\n"
                                 f"{node.log_text()[-3000:]}")
        return " serving " in node.log_text()

    def stop(self, timeout: float = 30.0) -> dict[str, int]:
        """SIGTERM every node, wait for each; return node id -> exit status (killed: negative)."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        codes: dict[str, int] = {}
        for node in self.nodes:
            try:
                codes[node.node_id] = node.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=10)
                codes[node.node_id] = -signal.SIGKILL
        return codes

    def logs(self) -> str:
        """Every node's log, headed by its id (for assertion messages)."""
        return "\n".join(f"----- {n.node_id} -----\n{n.log_text()[-4000:]}" for n in self.nodes)

    def __enter__(self) -> ServeCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            print(self.logs())  # pytest shows a failed test's captured output
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=10)


class Started:
    """In-process Nodes and Clients a test started, ended in reverse order when it ends (a Node
    stopped, anything else closed), also when the test fails: ``with Started() as started``."""

    def __init__(self) -> None:
        self.things: list[Any] = []

    def add(self, thing: Any) -> Any:
        self.things.append(thing)
        return thing

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc: object) -> None:
        for thing in reversed(self.things):
            if hasattr(thing, "stop"):
                thing.stop(drain_timeout=5)
            else:
                thing.close()
        self.things.clear()
