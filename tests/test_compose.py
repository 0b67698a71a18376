"""docker-compose.yml without a container engine: it parses, what it mounts exists, every
``ftpbc`` command in it is accepted by the CLI, and its nodes run examples/cluster.yaml against
its own FTP service with a shared state volume.  tests/test_image.py runs it under podman."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path, PurePosixPath
from typing import Any

import click
import jsonschema
import pytest
import yaml

from ftpbc.cli import cli
from ftpbc.config.loader import load_config
from tests.support import free_port, ftpbc_env, popen_ftpbc, run_ftpbc, wait_until
from tests.test_metrics import exposed_metric_names

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
CONTAINERFILE = REPO / "Containerfile"
#: services that watch the nodes (their own images, no ftpbc command)
MONITORING = ("prometheus", "grafana")


def image_entrypoint() -> list[str]:
    """The Containerfile's ENTRYPOINT (exec form)."""
    [line] = [ln for ln in CONTAINERFILE.read_text(encoding="utf-8").splitlines()
              if ln.startswith("ENTRYPOINT ")]
    entrypoint = json.loads(line.removeprefix("ENTRYPOINT "))
    assert isinstance(entrypoint, list)
    return entrypoint


def ftpbc_argv(service: dict[str, Any]) -> list[str]:
    """What a service of the ftpbc image runs: the image's entry point, then its command."""
    return [*image_entrypoint(), *service["command"]]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # resolves the <<: *ftpbc merges
    assert isinstance(doc, dict)
    return doc


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]  # type: ignore[no-any-return]


def parse_ftpbc(argv: list[str]) -> click.Context:
    """Parse ``ftpbc ...`` as the CLI would, converting every value, without running it."""
    assert argv[0] == "ftpbc" and len(argv) > 1
    group_ctx = cli.make_context("ftpbc", argv[1:])
    command = cli.get_command(group_ctx, argv[1])
    if command is None:
        raise click.UsageError(f"no such command {argv[1]!r}")
    return command.make_context(argv[1], argv[2:], parent=group_ctx)


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> repository path of the service's bind mounts (``./x:/y[:ro]``)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (REPO / source).resolve()
    return mounts


def named_volumes(service: dict[str, Any]) -> dict[str, str]:
    """container path -> named volume."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", []) if not v.startswith(".")}


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """The repository file behind ``container_path`` in ``service``, if a bind mount provides it."""
    path = PurePosixPath(container_path)
    for target, source in bind_mounts(service).items():
        if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
            return source / path.relative_to(target)
    return None


def test_compose_parses_and_declares_an_ftp_server_and_two_nodes() -> None:
    svc = services()
    assert set(svc) >= {"ftp", "node-a", "node-b", *MONITORING}
    assert set(compose()["volumes"]) >= {"state"}
    for name, service in svc.items():
        if name in MONITORING:
            continue
        assert isinstance(service.get("command"), list), name
        # the image built from the Containerfile, with nothing installed at start
        assert service["image"] == "${FTPBC_IMAGE:-ftpbc:latest}", name
        assert service["build"]["dockerfile"] == "Containerfile", name
        assert "entrypoint" not in service and "/src" not in str(service.get("volumes")), name
    assert image_entrypoint() == ["ftpbc"]
    # the monitoring services' images come from a registry: only with --profile monitoring
    for name in MONITORING:
        assert svc[name]["profiles"] == ["monitoring"], name


def test_compose_file_is_valid_under_the_compose_specification() -> None:
    """``docker compose`` and podman-compose both read the Compose Specification; its JSON
    schema (tests/data/compose-spec.json, from the compose-spec project, Apache-2.0) refuses
    unknown keys and wrong types, so a file ``docker compose`` would reject fails here, with no
    Docker daemon needed.  tests/test_image.py runs the file under podman-compose."""
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft201909Validator(schema)
    problems = [f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message}"
                for e in validator.iter_errors(compose())]
    assert problems == []
    # the check bites: a misspelt key is refused
    misspelt = compose()
    misspelt["services"]["node-a"]["helthcheck"] = {}
    assert any("helthcheck" in e.message for e in validator.iter_errors(misspelt))


def test_every_mounted_repository_path_exists() -> None:
    for name, service in services().items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"
        for volume in named_volumes(service).values():
            assert volume in compose()["volumes"], f"{name}: undeclared volume {volume}"


@pytest.mark.parametrize("service", ["ftp", "node-a", "node-b"])
def test_every_ftpbc_command_is_accepted_by_the_cli(service: str) -> None:
    argv = ftpbc_argv(services()[service])
    ctx = parse_ftpbc(argv)
    assert ctx.command.name == argv[1]


def test_the_command_check_rejects_what_the_cli_rejects() -> None:
    """The parse used above fails on a mistake (so the test above can fail)."""
    with pytest.raises(click.UsageError):
        parse_ftpbc(["ftpbc", "serve", "-c", "/config/cluster.yaml", "--node", "node-a"])
    with pytest.raises(click.UsageError):
        parse_ftpbc(["ftpbc", "ftpd", "--root", "/srv", "--port", "99999"])
    with pytest.raises(click.UsageError):
        parse_ftpbc(["ftpbc", "serv", "-c", "x.yaml"])


def test_nodes_run_the_example_cluster_against_the_ftp_service(monkeypatch: pytest.MonkeyPatch) -> None:
    svc = services()
    ftp = ftpbc_argv(svc["ftp"])
    password_var = option(ftp, "--password-env")
    assert password_var in svc["ftp"]["environment"]
    monkeypatch.setenv(password_var, "compose-test")
    node_ids, journal_volumes = set(), set()
    for name in ("node-a", "node-b"):
        service = svc[name]
        argv = ftpbc_argv(service)
        assert argv[1] == "serve"
        # the image's HEALTHCHECK asks /readyz on FTPBC_METRICS_PORT: the port the node serves
        assert service["environment"]["FTPBC_METRICS_PORT"] == option(argv, "--metrics-port")
        config_file = host_path(service, option(argv, "-c"))
        assert config_file == (REPO / "examples" / "cluster.yaml").resolve()
        config = load_config(config_file, node_id=option(argv, "--node-id"))
        node_ids.add(config.node.id)
        server = next(iter(config.servers.values()))
        # nodes share the ftp service's network namespace, so loopback reaches it
        assert service["network_mode"] == "service:ftp"
        assert (server.host, server.port) == ("127.0.0.1", int(option(ftp, "--port")))
        assert server.password_env == password_var and password_var in service["environment"]
        volumes = named_volumes(service)
        workdir = PurePosixPath(service["working_dir"])
        assert volumes[str(workdir / config.node.state_dir)] == "state"
        journal_volumes.add(volumes[str(workdir / config.node.journal_dir)])
        # the handlers (examples.handlers) import from the working directory, named in handler_path
        assert config.node.handler_path == (Path("."),)
        assert host_path(service, str(workdir / "examples" / "handlers.py")) == \
            (REPO / "examples" / "handlers.py").resolve()
    assert node_ids == {"node-a", "node-b"}
    assert len(journal_volumes) == 2


def test_the_ftp_service_command_serves_ftp(tmp_path: Path) -> None:
    """``ftpbc ftpd`` (the ftp service, on a free loopback port) serves a login and a check."""
    argv = ftpbc_argv(services()["ftp"])
    port = free_port()
    argv[argv.index("--root") + 1] = str(tmp_path / "root")
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    env = ftpbc_env({option(argv, "--password-env"): "ftpd-test-pw"})
    log = tmp_path / "ftpd.log"
    proc = popen_ftpbc(*argv[1:], log=log, env=env)
    try:
        wait_until(lambda: "serving" in log.read_text() or proc.poll() is not None, timeout=20,
                   what="ftpbc ftpd to listen")
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({
            "node": {"state_dir": str(tmp_path / "s"), "journal_dir": str(tmp_path / "j")},
            "servers": {"ftp": {"url": f"ftp://ftpbc@127.0.0.1:{port}/",
                                "password_env": option(argv, "--password-env")}},
            "endpoints": {"e": {"server": "ftp", "repository": "/exchange/e"}}}))
        result = run_ftpbc("check", "-c", str(config), env=env)
        assert result.returncode == 0, result.stdout + result.stderr + log.read_text()
        assert (tmp_path / "root" / "exchange" / "e" / "inbox").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "ftpd-test-pw" not in log.read_text()


def _metric_names_in(text: str) -> set[str]:
    return set(re.findall(r"\bftpbc_[a-z_]+", text))


def test_prometheus_scrapes_every_node_on_its_metrics_port() -> None:
    svc = services()
    prometheus = svc["prometheus"]
    assert prometheus["network_mode"] == "service:ftp"  # loopback is the nodes' loopback
    [flag] = [a for a in prometheus["command"] if a.startswith("--config.file=")]
    config_file = host_path(prometheus, flag.partition("=")[2])
    assert config_file == (REPO / "examples" / "prometheus.yml").resolve()
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {t for static in job["static_configs"] for t in static["targets"]}
    ports = set()
    for name in ("node-a", "node-b"):
        ctx = parse_ftpbc(ftpbc_argv(svc[name]))
        assert ctx.params["metrics_port"] is not None, f"{name} serves no metrics"
        ports.add(ctx.params["metrics_port"])
    assert len(ports) == 2  # one network namespace: a port each
    assert targets == {f"127.0.0.1:{p}" for p in ports}
    published = {p.split(":")[-1] for p in svc["ftp"]["ports"]}
    assert {"9090", "3000"} <= published
    # the rule files it loads are mounted, and every metric they use exists
    for rule_file in config["rule_files"]:
        source = host_path(prometheus, rule_file)
        assert source is not None and source.is_file(), rule_file
        rules = yaml.safe_load(source.read_text(encoding="utf-8"))
        exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
        assert exprs and all(_metric_names_in(e) <= exposed_metric_names() for e in exprs), exprs


def test_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    grafana = services()["grafana"]
    mounts = {str(target): source for target, source in bind_mounts(grafana).items()}
    dashboard_file = mounts["/var/lib/grafana/dashboards/ftpbc.json"]
    assert dashboard_file == (REPO / "examples" / "grafana-dashboard.json").resolve()
    provider = yaml.safe_load(mounts["/etc/grafana/provisioning/dashboards/ftpbc.yml"].read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasource = yaml.safe_load(mounts["/etc/grafana/provisioning/datasources/ftpbc.yml"].read_text())
    assert datasource["datasources"][0]["url"] == "http://127.0.0.1:9090"
    dashboard = json.loads(dashboard_file.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set().union(*(_metric_names_in(e) for e in exprs))
    known = exposed_metric_names()
    assert used <= known, used - known
    # every metric a node exposes is on the dashboard
    assert {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in known} <= \
        {n.removesuffix("_bucket") for n in used}
