"""A real Spark standalone cluster on loopback: one master and two one-core workers.

Started from pyspark's own launcher (``$SPARK_HOME/bin/spark-class``, SPARK_HOME being the
installed pyspark package, which ships the jars), the way a site runs ``start-master.sh`` and
``start-worker.sh``, but in the foreground so that the fixture owns the processes.  Each JVM is
the leader of a process group of its own; the workers' executors and the executors' Python
workers are started inside the worker's group, so ending each group ends everything the cluster
started.

Registration is awaited on the master's JSON status page (``http://127.0.0.1:W/json/``, the web
UI port): both workers ALIVE, with a deadline.

The workers' PATH starts with a directory whose ``python3`` and ``python`` fail loudly: Spark's
Python workers start ``python3`` from the executor's PATH unless ``spark.pyspark.python`` says
otherwise, and a job that ran there would fail instead of passing by luck with a different
interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port

LOOPBACK = "127.0.0.1"
#: a cold JVM start on a shared two-core machine takes 5-15 s; registering, one more second
START_TIMEOUT = 120.0

_DECOY = """#!/bin/sh
echo "decoy $0: Spark started the python3 on PATH, not spark.pyspark.python" >&2
exit 97
"""


@dataclass(frozen=True)
class SparkCluster:
    master_url: str
    web_url: str
    workdir: Path

    def status(self) -> dict[str, object]:
        with urllib.request.urlopen(self.web_url + "/json/", timeout=5) as resp:
            data: dict[str, object] = json.loads(resp.read().decode())
        return data

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except OSError:  # not listening yet
            return 0
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.workdir.glob("*.log")))


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _start(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End the process group ``proc`` leads (the JVM, its executors and their Python workers)."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure no child of its group outlived it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


@contextmanager
def running_spark_cluster(workdir: Path, *, workers: int = 2, memory: str = "1g",
                          decoy: bool = True) -> Iterator[SparkCluster]:
    """A master and ``workers`` one-core workers of ``memory`` each, registered (RuntimeError if
    not within START_TIMEOUT, or if a daemon exits); every process ended on the way out.  With
    ``decoy``, the workers' PATH leads to a ``python3`` that fails (module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", "")
    if decoy:
        bin_dir = workdir / "decoy-bin"
        bin_dir.mkdir(exist_ok=True)
        for name in ("python3", "python"):
            (bin_dir / name).write_text(_DECOY)
            (bin_dir / name).chmod(0o755)
        path = os.pathsep.join((str(bin_dir), path))
    home = spark_home()
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")}
    env = {**base_env, "SPARK_HOME": home, "SPARK_LOCAL_IP": LOOPBACK, "SPARK_LOG_DIR": str(workdir),
           "SPARK_WORKER_DIR": str(workdir / "work"), "SPARK_NO_DAEMONIZE": "1", "PATH": path}
    spark_class = os.path.join(home, "bin", "spark-class")
    port, web = free_port(), free_port()
    cluster = SparkCluster(f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{web}", workdir)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start([spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                             "--port", str(port), "--webui-port", str(web)],
                            workdir / "master.log", env, workdir))
        for i in range(1, workers + 1):
            procs.append(_start([spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                                 "--cores", "1", "--memory", memory, "--host", LOOPBACK,
                                 "--webui-port", str(free_port()), "--work-dir", str(workdir / f"work-{i}")],
                                workdir / f"worker-{i}.log", env, workdir))
        deadline = time.monotonic() + START_TIMEOUT
        while cluster.alive_workers() != workers:
            dead = [p.args for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Spark daemon exited: {dead}\n{cluster.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workers} Spark worker(s) not registered within {START_TIMEOUT:g} s\n"
                                   f"{cluster.logs()}")
            time.sleep(0.5)  # polling the master's status page, within the deadline above
        yield cluster
    finally:
        for p in reversed(procs):
            _end(p)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with running_spark_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
