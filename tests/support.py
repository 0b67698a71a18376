"""Helpers shared by the tests: waiting on conditions, free ports, binaries that CI must have."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
               what: str = "condition") -> T:
    """Poll ``condition`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def require_binary(name: str, *candidates: str) -> str:
    """Path of a server binary.  Locally a missing binary skips; under CI=true it fails."""
    for cand in (name, *candidates):
        found = shutil.which(cand) or (cand if os.path.isabs(cand) and os.access(cand, os.X_OK) else None)
        if found:
            return found
    message = f"{name} is not installed (apt-get install the Debian package)"
    if IN_CI:
        pytest.fail(f"CI=true but {message}")
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (below the ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
