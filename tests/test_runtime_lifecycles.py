"""Runtime.lifecycle: each lifecycle is made and prepared once per process, however many
threads ask for it first at the same moment (a fan-out's workers starting together), and a name
no configuration resolves is refused every time, never cached."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpbc.config.models import Config
from ftpbc.errors import ConfigError
from ftpbc.exchange.lifecycle import Lifecycle
from ftpbc.exchange.runtime import Runtime
from tests.cluster import SERVER, node_section
from tests.servers.handle import ServerHandle

THREADS = 8


@pytest.fixture
def runtime(pyftpdlib_server: ServerHandle, tmp_path: Path) -> Iterator[Runtime]:
    base = pyftpdlib_server.fresh_dir()
    config = Config.model_validate({
        "node": node_section(tmp_path, "n1"),
        "servers": {SERVER: pyftpdlib_server.config(name=SERVER)},
        "topics": {"news": {"server": SERVER, "repository": f"{base}/news",
                            "subscriptions": {"all": {}}}},
    })
    rt = Runtime(config)
    try:
        yield rt
    finally:
        rt.close()


def test_threads_asking_at_once_share_one_lifecycle_prepared_once(runtime: Runtime,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    prepared: list[str] = []
    real_prepare = Lifecycle.prepare
    asking: list[int] = []
    all_asking = threading.Event()
    second_prepare = threading.Event()

    def counting_prepare(self: Lifecycle) -> None:
        prepared.append(self.name)
        if len(prepared) > 1:
            second_prepare.set()
        # The first maker goes on only once every thread has asked and a second prepare had a
        # second to begin: a runtime that does not make the others wait for the first maker has
        # several of them prepare a lifecycle of their own meanwhile (seen with the code before).
        all_asking.wait(timeout=10)
        second_prepare.wait(timeout=1.0)
        real_prepare(self)

    monkeypatch.setattr(Lifecycle, "prepare", counting_prepare)
    start = threading.Barrier(THREADS)
    got: list[Lifecycle] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            start.wait(timeout=30)
            asking.append(1)
            if len(asking) == THREADS:
                all_asking.set()
            got.append(runtime.lifecycle("news/all"))
        except BaseException as exc:  # reported by the assertions below
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(got) == THREADS and len({id(lc) for lc in got}) == 1
    assert prepared == ["news/all"]  # one set of directories made, not one per thread
    assert runtime.lifecycle("news/all") is got[0]
    assert prepared == ["news/all"]


def test_an_unknown_endpoint_is_refused_each_time(runtime: Runtime) -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="unknown endpoint 'nope'"):
            runtime.lifecycle("nope")
    with pytest.raises(ConfigError, match="unknown transfer 'nope'"):
        runtime.transfer("nope")
