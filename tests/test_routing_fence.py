"""Where a route may deliver (docs/routing.md, "Where a route may deliver"), on real servers:
destinations built from message values stay inside their ruleset's allow list, no directory
destination lies inside an endpoint's area (so no stage directory either), values holding any
control or format character are refused, and a missing value fails unless the template gives it
a default."""

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


def fenced_config(handle: ServerHandle, base: str, workdir: Path) -> dict[str, Any]:
    prefix = prefix_of(handle, base)
    return {
        "node": node_section(workdir),
        "servers": {"srv": handle.config(name="srv")},
        "endpoints": {name: {"server": "srv", "repository": f"{base}/{name}", **FAST}
                      for name in ("events", "other")},
        "routes": {"r": {"source": "events", "failure": f"{prefix}/failed", "rulesets": [
            # the message names its own destination, inside the allow list
            {"name": "own", "properties": [{"uri": "."}], "uri_template": ["##uri##"],
             "allow": [f"{prefix}/allowed"]},
            # an allow list wide enough to hold the endpoints' areas: the fence still keeps out
            {"name": "wide", "properties": [{"wide": "."}], "uri_template": [f"{prefix}/", "##wide##"],
             "allow": [prefix]},
            {"name": "asset", "properties": [{"short_name": "^Asset$"}],
             "uri_template": [f"{prefix}/assets/", "##asset##"], "allow": [f"{prefix}/assets"]},
            # a region is optional: without one the message goes to regions/ itself
            {"name": "region", "properties": [{"short_name": "^Region$"}],
             "uri_template": [f"{prefix}/regions/", "##region:-##"], "allow": [f"{prefix}/regions"]},
        ]}},
    }


#: body -> (properties, where it goes: a directory below the base, or the failure reason's words)
MESSAGES: dict[bytes, tuple[dict[str, str], str]] = {
    b"own": ({"uri": "{prefix}/allowed/x"}, "allowed/x"),
    b"own-escape": ({"uri": "{prefix}/elsewhere"}, "failure: is outside the allow list of ruleset own"),
    b"own-box": ({"uri": "{prefix}/other/inbox"}, "failure: is outside the allow list of ruleset own"),
    b"wide": ({"wide": "free"}, "free"),
    b"wide-box": ({"wide": "other/inbox"}, "failure: lies inside the exchange area of endpoint 'other'"),
    b"wide-area": ({"wide": "other"}, "failure: lies inside the exchange area of endpoint 'other'"),
    b"wide-source": ({"wide": "events/inerror"},
                    "failure: lies inside the exchange area of endpoint 'events'"),
    b"u2028": ({"short_name": "Asset", "asset": "a\u2028b"}, "failure: control or format character U+2028"),
    b"u0085": ({"short_name": "Asset", "asset": "a\u0085b"}, "failure: control or format character U+0085"),
    b"u2029": ({"short_name": "Asset", "asset": "a\u2029b"}, "failure: control or format character U+2029"),
    b"u200b": ({"short_name": "Asset", "asset": "a\u200bb"}, "failure: control or format character U+200B"),
    b"asset": ({"short_name": "Asset", "asset": "web1"}, "assets/web1"),
    b"no-asset": ({"short_name": "Asset"}, "failure: ##asset## is missing"),
    b"region": ({"short_name": "Region", "region": "eu"}, "regions/eu"),
    b"no-region": ({"short_name": "Region"}, "regions"),
}


@pytest.mark.parametrize("kind", ["pyftpdlib", "vsftpd", "sshd"])
def test_routes_deliver_inside_the_fence_only(request: pytest.FixtureRequest, kind: str,
                                              tmp_path: Path) -> None:
    handle: ServerHandle = request.getfixturevalue(f"{kind}_server")
    base = handle.fresh_dir()
    prefix = prefix_of(handle, base)
    config = Config.model_validate(fenced_config(handle, base, tmp_path))
    with Client(config.with_node_id("n1.client1")) as client:
        for body, (props, _) in MESSAGES.items():
            client.send("events", body, properties={k: v.format(prefix=prefix) for k, v in props.items()})
    with serving(config):
        wait_until(lambda: len(files_in(handle, f"{base}/events/inarchive")) == len(MESSAGES), timeout=60,
                   what="every message routed or failed")
    failed = files_in(handle, f"{base}/failed")
    reasons = {failed[n]: failed[n + ".reason"].decode() for n in failed if not n.endswith(".reason")}
    for body, (_, where) in MESSAGES.items():
        if where.startswith("failure: "):
            assert where.removeprefix("failure: ") in reasons.get(body, ""), (body, reasons.get(body))
        else:
            assert list(files_in(handle, f"{base}/{where}").values()) == [body], where
    assert len(reasons) == sum(w.startswith("failure: ") for _, w in MESSAGES.values())
    # nothing in the other endpoint's boxes, not even a stage directory; nothing in the source's
    # but its archive; no directory named with a refused character anywhere
    assert {str(Path(f).parent) for f in all_files(handle, base)} == {
        "allowed/x", "free", "assets/web1", "regions/eu", "regions", "failed", "events/inarchive"}
    root = handle.local(base)
    stages = {str(p.parent.relative_to(root)) for p in root.rglob(".ftpbc-route")}
    assert stages <= {"allowed/x", "free", "assets/web1", "regions/eu", "regions", "failed"}, stages
    assert not (root / "elsewhere").exists()
    named = [p for p in root.rglob("*") if {unicodedata.category(c) for c in p.name} & REFUSED_CATEGORIES]
    assert named == []
    assert pending(tmp_path) == {}
