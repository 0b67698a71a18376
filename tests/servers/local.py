"""The local-directory "server": a temporary directory behind a file:// URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.handle import ServerHandle


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root: Path = tmp_path_factory.mktemp("local-root")
    yield ServerHandle(kind="local", root=root, url=f"file://{root}")
