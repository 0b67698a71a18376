"""Where a route may deliver (docs/routing.md, "Where a route may deliver"), on real servers
(pyftpdlib, vsftpd, OpenSSH): destinations built from message values stay inside their
ruleset's allow list; no directory destination lies inside an endpoint's area (so neither does
a stage directory) or the cluster's coordination directory; values holding any control or
format character are refused; a missing value fails unless the template gives a default."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest

from ftpbc.client import Client
from ftpbc.config.models import Config
from ftpbc.routing.templates import REFUSED_CATEGORIES
from tests.servers.handle import ServerHandle
from tests.support import wait_until
from tests.test_routing import FAST, all_files, files_in, node_section, pending, prefix_of, serving

SERVERS = ["pyftpdlib", "vsftpd", "sshd"]


def route_all(handle: ServerHandle, tmp_path: Path, rulesets: list[dict[str, Any]],
              messages: dict[bytes, dict[str, str]], *, base: str | None = None,
              node: dict[str, Any] | None = None) -> tuple[str, dict[bytes, str]]:
    """Serve a route of ``rulesets`` (``{prefix}`` in a value: the base directory's URL) from
    endpoint ``events`` (beside it: endpoint ``other``) until every message is routed or failed;
    return the base directory and the failure reasons by body."""
    base = base or handle.fresh_dir()
    prefix = prefix_of(handle, base)

    def filled(value: Any) -> Any:
        if isinstance(value, str):
            return value.format(prefix=prefix)
        if isinstance(value, list):
            return [filled(v) for v in value]
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return value

    config = Config.model_validate({
        "node": {**node_section(tmp_path), **filled(node or {})},
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {name: {"server": "srv", "repository": f"{base}/{name}", **FAST}
                      for name in ("events", "other")},
        "routes": {"r": {"source": "events", "failure": f"{prefix}/failed", "rulesets": filled(rulesets)}},
    })
    with Client(config.with_node_id("n1.client1")) as client:
        for body, props in messages.items():
            client.send("events", body, properties=filled(props))
    with serving(config):
        wait_until(lambda: len(files_in(handle, f"{base}/events/inarchive")) == len(messages), timeout=60,
                   what="every message routed or failed")
    failed = files_in(handle, f"{base}/failed")
    reasons = {failed[n]: failed[n + ".reason"].decode() for n in failed if not n.endswith(".reason")}
    assert pending(tmp_path) == {}
    return base, reasons


def bodies_in(handle: ServerHandle, remote: str) -> list[bytes]:
    return sorted(b for n, b in files_in(handle, remote).items() if not n.endswith(".reason"))


def directories(handle: ServerHandle, base: str) -> set[str]:
    """The directories below ``base`` that hold a file."""
    return {str(Path(f).parent) for f in all_files(handle, base)}


@pytest.mark.parametrize("kind", SERVERS)
def test_a_destination_built_from_a_message_outside_its_allow_list_goes_to_failure(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    own = [{"name": "own", "properties": [{"uri": "."}], "uri_template": ["##uri##"],
            "allow": ["{prefix}/allowed"]}]
    messages = {b"in": {"uri": "{prefix}/allowed/x"}, b"below": {"uri": "{prefix}/allowed/x/y"},
                b"elsewhere": {"uri": "{prefix}/elsewhere"}, b"beside": {"uri": "{prefix}/allowedX"},
                b"box": {"uri": "{prefix}/other/inbox"}, b"source": {"uri": "{prefix}/events/inerror"}}
    base, reasons = route_all(handle, tmp_path, own, messages)
    assert bodies_in(handle, f"{base}/allowed/x") == [b"in"]
    assert bodies_in(handle, f"{base}/allowed/x/y") == [b"below"]
    assert sorted(reasons) == [b"beside", b"box", b"elsewhere", b"source"]
    for body, reason in reasons.items():
        assert "is outside the allow list of ruleset own" in reason, (body, reason)
    assert directories(handle, base) == {"allowed/x", "allowed/x/y", "failed", "events/inarchive"}


@pytest.mark.parametrize("kind", SERVERS)
def test_no_route_delivers_or_stages_inside_an_endpoints_area(request: pytest.FixtureRequest, kind: str,
                                                               tmp_path: Path) -> None:
    """An allow list wide enough to hold the endpoints' areas: the fence still keeps out, so no
    ``.ftpbc-route`` stage directory appears in a box (where its poller would file it)."""
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    wide = [{"name": "wide", "properties": [{"wide": "."}], "uri_template": ["{prefix}/", "##wide##"],
             "allow": ["{prefix}"]}]
    messages = {b"free": {"wide": "free"}, b"box": {"wide": "other/inbox"}, b"area": {"wide": "other"},
                b"source": {"wide": "events/inerror"}}
    base, reasons = route_all(handle, tmp_path, wide, messages)
    assert bodies_in(handle, f"{base}/free") == [b"free"]
    assert "lies inside the exchange area of endpoint 'other'" in reasons[b"box"]
    assert "lies inside the exchange area of endpoint 'other'" in reasons[b"area"]
    assert "lies inside the exchange area of endpoint 'events'" in reasons[b"source"]
    assert directories(handle, base) == {"free", "failed", "events/inarchive"}
    root = handle.local(base)
    stages = {str(p.parent.relative_to(root)) for p in root.rglob(".ftpbc-route")}
    assert stages <= {"free", "failed"}, stages


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd"])
def test_no_route_delivers_into_the_clusters_coordination_directory(request: pytest.FixtureRequest,
                                                                     kind: str, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    wide = [{"name": "wide", "properties": [{"wide": "."}], "uri_template": ["{prefix}/", "##wide##"],
             "allow": ["{prefix}"]}]
    base = handle.fresh_dir()
    node = {"coordination": "server", "coordination_dir": f"{base}/cluster", "lock_expiry": 5}
    messages = {b"locks": {"wide": "cluster/locks"}, b"free": {"wide": "free"}}
    base, reasons = route_all(handle, tmp_path, wide, messages, base=base, node=node)
    assert bodies_in(handle, f"{base}/free") == [b"free"]
    assert "lies inside the cluster's coordination directory" in reasons[b"locks"], reasons
    assert not list(handle.local(f"{base}/cluster").rglob(".ftpbc-route"))


@pytest.mark.parametrize("kind", SERVERS)
def test_a_value_with_any_control_or_format_character_goes_to_failure_and_names_nothing(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    asset = [{"name": "asset", "properties": [{"asset": "."}],
              "uri_template": ["{prefix}/assets/", "##asset##"], "allow": ["{prefix}/assets"]}]
    hostile = {"\u2028": "Zl", "\u2029": "Zp", "\u0085": "Cc", "\u200b": "Cf", "\u202e": "Cf", "\ufeff": "Cf"}
    messages = {f"U+{ord(c):04X}".encode(): {"asset": f"a{c}b"} for c in hostile}
    messages[b"plain"] = {"asset": "web1"}
    base, reasons = route_all(handle, tmp_path, asset, messages)
    assert bodies_in(handle, f"{base}/assets/web1") == [b"plain"]
    assert sorted(reasons) == sorted(m for m in messages if m != b"plain")
    for body, reason in reasons.items():
        assert f"contains a control or format character {body.decode()}" in reason, reason
    root = handle.local(base)
    named = [p for p in root.rglob("*") if {unicodedata.category(c) for c in p.name} & REFUSED_CATEGORIES]
    assert named == []
    assert directories(handle, base) == {"assets/web1", "failed", "events/inarchive"}


@pytest.mark.parametrize("kind", SERVERS)
def test_a_missing_value_goes_to_failure_unless_the_template_gives_a_default(
        request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    rulesets = [
        {"name": "asset", "properties": [{"short_name": "^Asset$"}],
         "uri_template": ["{prefix}/assets/", "##asset##"], "allow": ["{prefix}/assets"]},
        # a region is optional: without one the message goes to regions/ itself
        {"name": "region", "properties": [{"short_name": "^Region$"}],
         "uri_template": ["{prefix}/regions/", "##region:-##"], "allow": ["{prefix}/regions"]},
    ]
    messages = {b"asset": {"short_name": "Asset", "asset": "web1"}, b"no-asset": {"short_name": "Asset"},
                b"empty-asset": {"short_name": "Asset", "asset": ""},
                b"region": {"short_name": "Region", "region": "eu"}, b"no-region": {"short_name": "Region"}}
    base, reasons = route_all(handle, tmp_path, rulesets, messages)
    assert bodies_in(handle, f"{base}/assets/web1") == [b"asset"]
    assert bodies_in(handle, f"{base}/regions/eu") == [b"region"]
    assert bodies_in(handle, f"{base}/regions") == [b"no-region"]
    assert bodies_in(handle, f"{base}/assets") == []  # never the parent directory
    assert "##asset## is missing" in reasons[b"no-asset"] and "##asset## is empty" in reasons[b"empty-asset"]
    assert sorted(reasons) == [b"empty-asset", b"no-asset"]
