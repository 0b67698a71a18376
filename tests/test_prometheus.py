"""The shipped Prometheus files under Debian's Prometheus: examples/prometheus.yml scrapes a
real node, and every alert of examples/ftpbc-alerts.yml is unit-tested by ``promtool test rules``
(tests/prometheus/ftpbc-alerts.test.yml).  Locally a missing prometheus skips; under CI=true it
fails."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import free_port, ftpbc_env, popen_ftpbc, require_binary, wait_until

REPO = Path(__file__).resolve().parent.parent
SCRAPE_CONFIG = REPO / "examples" / "prometheus.yml"
RULES = REPO / "examples" / "ftpbc-alerts.yml"
RULES_TEST = REPO / "tests" / "prometheus" / "ftpbc-alerts.test.yml"
PASSWORD = "prometheus-test-pw"


def alert_names() -> set[str]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_promtool_unit_tests_every_shipped_alert() -> None:
    promtool = require_binary("promtool")
    tests = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))
    assert [(RULES_TEST.parent / f).resolve() for f in tests["rule_files"]] == [RULES.resolve()]
    cases = [case for t in tests["tests"] for case in t["alert_rule_test"]]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}
    # each alert is shown both firing and not (yet) firing
    assert firing == alert_names() and silent == alert_names(), (firing, silent, alert_names())
    result = subprocess.run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"promtool: {len(cases)} cases over {len(alert_names())} alerts passed", flush=True)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read(1 << 22))


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=30)


@pytest.fixture()
def node(tmp_path: Path) -> Iterator[int]:
    """An FTP server and one node of examples/cluster.yaml serving metrics on the port the shipped
    scrape config names first; yields that port."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))
    [job] = config["scrape_configs"]
    first = job["static_configs"][0]["targets"][0]
    metrics_port = int(first.rpartition(":")[2])
    ftp_port = free_port()
    env = ftpbc_env({"FTPBC_PASSWORD": PASSWORD})
    ftpd_log = tmp_path / "ftpd.log"
    ftpd = popen_ftpbc("ftpd", "--root", str(tmp_path / "root"), "--host", "127.0.0.1", "--port",
                       str(ftp_port), "--password-env", "FTPBC_PASSWORD", log=ftpd_log, env=env)
    cluster = yaml.safe_load((REPO / "examples" / "cluster.yaml").read_text(encoding="utf-8"))
    cluster["servers"]["exchange"]["url"] = f"ftp://ftpbc@127.0.0.1:{ftp_port}/"
    cluster["node"].update(state_dir=str(tmp_path / "state"), journal_dir=str(tmp_path / "journals"),
                           handler_path=[str(REPO)])
    node_config = tmp_path / "cluster.yaml"
    node_config.write_text(yaml.safe_dump(cluster), encoding="utf-8")
    node_log = tmp_path / "node.log"
    serve = None
    try:
        wait_until(lambda: "serving" in ftpd_log.read_text() or ftpd.poll() is not None, timeout=30,
                   what="ftpbc ftpd to listen")
        serve = popen_ftpbc("serve", "-c", str(node_config), "--node-id", "node-a", "--metrics-port",
                            str(metrics_port), log=node_log, env=env)
        wait_until(lambda: "serving quote" in node_log.read_text() or serve.poll() is not None,
                   timeout=60, what="the node to serve")
        assert serve.poll() is None, node_log.read_text()
        yield metrics_port
    finally:
        if serve is not None:
            assert stop(serve) == 0, node_log.read_text()
        stop(ftpd)


def test_prometheus_scrapes_a_node_with_the_shipped_config(node: int, tmp_path: Path) -> None:
    prometheus = require_binary("prometheus")
    config = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))
    # the rule file is where the compose file mounts it; here it is the repository's
    assert [Path(f).name for f in config["rule_files"]] == [RULES.name]
    config["rule_files"] = [str(RULES)]
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([prometheus, f"--config.file={config_file}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def scraped() -> dict[str, Any] | None:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                targets = get_json(f"{api}/targets")["data"]["activeTargets"]
            except OSError:
                return None
            ours = {t["scrapeUrl"]: t for t in targets}
            target = ours.get(f"http://127.0.0.1:{node}/metrics")
            return target if target and target["health"] == "up" else None
        wait_until(scraped, timeout=90, interval=0.5, what="prometheus to scrape the node")

        def ready_sample() -> list[Any] | None:
            result = get_json(f"{api}/query?query=ftpbc_ready")["data"]["result"]
            return result or None
        samples = wait_until(ready_sample, timeout=30, interval=0.5, what="ftpbc_ready in prometheus")
        assert samples is not None and len(samples) == 1, samples
        [sample] = samples
        assert sample["metric"]["instance"] == f"127.0.0.1:{node}"
        assert sample["value"][1] == "1"
        rules = get_json(f"{api}/rules")["data"]["groups"]
        loaded = {r["name"]: r for g in rules for r in g["rules"]}
        assert set(loaded) == alert_names()
        assert all(r["health"] != "err" for r in loaded.values()), loaded
        print(f"prometheus: scraped 127.0.0.1:{node} (ftpbc_ready 1), {len(loaded)} alert rules loaded",
              flush=True)
    finally:
        stop(proc)
