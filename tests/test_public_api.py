"""The public import surface: the names ``ftpbc`` exports stay, old paths keep working with a
warning naming the new one, and ``ftpbc --version`` says which release this is."""

from __future__ import annotations

import inspect
import re
import signal
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import ftpbc
import ftpbc.errors
from ftpbc import deprecation
from ftpbc.client import Client
from ftpbc.deprecation import FtpbcDeprecationWarning, moved
from tests.cluster import in_process_config, write_config
from tests.servers.handle import ServerHandle
from tests.support import popen_ftpbc, run_ftpbc, wait_until

REPO = Path(__file__).resolve().parent.parent

#: What users import from ``ftpbc``.  Adding a name is fine (add it here too); removing or
#: renaming one breaks handlers and scripts: deprecate it first (ftpbc.deprecation).
PUBLIC = {
    "__version__",
    "Message", "HandlerResult", "Headers", "PropertyValue",
    "Client", "MessageOptions", "Delivery", "Consumer", "AckMode", "Subscription", "Transaction",
    "DeadLetters", "DeadLetter", "Waiting", "Selector", "compile_selector", "UnknownSubscription",
    "Trace", "Sighting",
    "Node", "Handler",
    "Config", "load_config",
    "FtpbcDeprecationWarning",
}

#: What users catch, from ``ftpbc`` and from ``ftpbc.errors``.
ERRORS = {
    "FtpbcError", "ConfigError", "PatternError", "SelectorError", "UnsafeNameError", "SequenceError",
    "JournalError", "TransportError", "NotFound", "SourceGone", "AlreadyExists", "PermissionDenied",
    "AuthenticationFailed", "HostKeyRejected", "HostKeyRevoked", "TLSFailed", "ConnectFailed",
    "SessionLimit", "ConnectionLost", "ServerBusy", "TransportTimeout", "OutcomeUnknown",
    "ProtocolError", "IncompleteRead", "ReadPastSize", "MessageTooLarge", "RequestTimeout",
    "RequestExpired", "QueueFull", "RemoteHandlerError", "UnsafeEntry", "UnsafeSource",
    "MissingDependency", "UnknownRequest",
}


def test_the_public_names_stay() -> None:
    missing = (PUBLIC | ERRORS) - set(ftpbc.__all__)
    assert not missing, f"removed from ftpbc.__all__ (deprecate instead): {sorted(missing)}"
    assert len(ftpbc.__all__) == len(set(ftpbc.__all__)), "a name listed twice in ftpbc.__all__"
    for name in ftpbc.__all__:
        assert getattr(ftpbc, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from ftpbc import *", namespace)  # what a user's star import gets
    assert set(ftpbc.__all__) <= set(namespace)


def test_every_error_is_exported_from_both_modules() -> None:
    assert not ERRORS - set(ftpbc.errors.__all__), "removed from ftpbc.errors.__all__"
    defined = {name for name, value in vars(ftpbc.errors).items()
               if isinstance(value, type) and issubclass(value, ftpbc.errors.FtpbcError)}
    assert defined == set(ftpbc.errors.__all__), "an error class ftpbc.errors.__all__ does not list"
    for name in ftpbc.errors.__all__:
        assert getattr(ftpbc, name) is getattr(ftpbc.errors, name), name
        assert issubclass(getattr(ftpbc, name), ftpbc.FtpbcError), name


def test_public_classes_are_the_ones_ftpbc_uses() -> None:
    # A re-export, not a copy: isinstance and except clauses agree whichever path a user took.
    from ftpbc.model.message import Message
    from ftpbc.node.serve import Node

    assert ftpbc.Message is Message and ftpbc.Node is Node and ftpbc.Client is Client


def test_importing_ftpbc_loads_no_transport_library() -> None:
    probe = ("import sys, ftpbc, ftpbc.errors; "
             "print(sorted(m for m in ('paramiko', 'pyftpdlib', 'ftplib', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Mesage'"):
        _ = ftpbc.Mesage  # type: ignore[attr-defined]
    import ftpbc.message as old

    with pytest.raises(AttributeError, match=r"'ftpbc\.message' has no attribute 'Node'"):
        _ = old.Node


# --------------------------------------------------------------------------- moved names


def test_old_message_path_warns_and_gives_the_same_class() -> None:
    with pytest.warns(FtpbcDeprecationWarning, match=r"use `from ftpbc import Message`") as seen:
        from ftpbc.message import Message
    assert Message is ftpbc.Message
    assert len(seen) == 1 and seen[0].filename == __file__, "the warning points at the importing line"
    assert issubclass(FtpbcDeprecationWarning, DeprecationWarning)
    with pytest.warns(FtpbcDeprecationWarning, match=r"from ftpbc import HandlerResult"):
        from ftpbc.message import HandlerResult
    assert HandlerResult is ftpbc.HandlerResult
    with pytest.warns(FtpbcDeprecationWarning, match=r"ftpbc\.message\.result_bytes is deprecated"):
        from ftpbc.message import result_bytes
    assert result_bytes("é") == "é".encode()


def test_a_moved_name_is_logged_once_per_importing_module(caplog: pytest.LogCaptureFixture) -> None:
    getattr_ = moved("ftpbc.old_home_for_test", {"Thing": "ftpbc.errors:FtpbcError",
                                                 "Other": "ftpbc:Message"}, remove_in="9.0")
    with caplog.at_level("WARNING", logger="ftpbc.deprecation"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            assert getattr_("Thing") is ftpbc.errors.FtpbcError
        assert getattr_("Other") is ftpbc.Message
    assert len(seen) == 4, "every access warns (the filters decide what is shown)"
    assert str(seen[0].message) == ("ftpbc.old_home_for_test.Thing is deprecated: use "
                                    "`from ftpbc.errors import FtpbcError as Thing` "
                                    "(ftpbc.old_home_for_test will be removed in 9.0)")
    lines = [r.getMessage() for r in caplog.records if r.name == "ftpbc.deprecation"]
    assert len(lines) == 2, lines
    assert all(f"imported by {__name__}" in line for line in lines), lines


def test_the_memory_of_logged_moves_is_bounded(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deprecation, "_logged", set())
    monkeypatch.setattr(deprecation, "LOGGED_MAX", 2)
    getattr_ = moved("ftpbc.old_home_for_test", {f"N{i}": "ftpbc:Message" for i in range(5)})
    with caplog.at_level("WARNING", logger="ftpbc.deprecation"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(5):
            assert getattr_(f"N{i}") is ftpbc.Message
    assert len(seen) == 5, "past the bound every access still warns"
    assert len([r for r in caplog.records if r.name == "ftpbc.deprecation"]) == 2
    assert len(deprecation._logged) == 2


def test_a_malformed_move_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match=r"ftpbc\.x\.A: target 'ftpbc\.errors' is not 'module:Attribute'"):
        moved("ftpbc.x", {"A": "ftpbc.errors"})


HANDLERS = {
    "old_path": "from ftpbc.message import Message\n",
    "public": "from ftpbc import Message\n",
}


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path,
           pyftpdlib_server: ServerHandle) -> Iterator[tuple[Client, Path]]:
    """A real ``ftpbc serve`` whose endpoint ``greet``'s handler imports Message as HANDLERS says."""
    style: str = request.param
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "greeting.py").write_text(
        HANDLERS[style] + "\n\ndef greet(message: Message) -> str:\n"
        "    return f'hello {message.text()}'\n", encoding="utf-8")
    endpoint = {"repository": pyftpdlib_server.fresh_dir() + "/greet", "poll_interval": 0.05,
                "handler": "greeting:greet", "workers": 2, "timeout": 20}
    config = write_config(tmp_path / "node.yaml", pyftpdlib_server, tmp_path, {"greet": endpoint}, "node-a")
    log = tmp_path / "node.log"
    node = popen_ftpbc("serve", "-c", str(config), "--path", str(handlers), log=log, cwd=tmp_path)
    try:
        wait_until(lambda: " serving " in log.read_text() or node.poll() is not None, timeout=60,
                   what="the node to serve")
        assert node.poll() is None, log.read_text()
        client_config = in_process_config(pyftpdlib_server, tmp_path, "caller",
                                          {"greet": {k: v for k, v in endpoint.items() if k != "handler"}})
        with Client(client_config) as client:
            yield client, log
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


@pytest.mark.parametrize("served", ["old_path"], indirect=True)
def test_a_handler_on_the_old_path_is_served_and_warned_about_once(served: tuple[Client, Path]) -> None:
    client, log = served
    for who in ("ada", "bob", "cy"):
        assert client.request("greet", who.encode()) == f"hello {who}".encode()
    text = log.read_text()
    # ftpbc's own lines only: a library's warning on stderr (paramiko's, say) is not the point
    warned = [line for line in text.splitlines() if "ftpbc.deprecation" in line or "FtpbcDeprecation" in line]
    assert len(warned) == 1, text
    assert "ftpbc.message.Message is deprecated: use `from ftpbc import Message`" in warned[0]
    assert "imported by greeting" in warned[0]


@pytest.mark.parametrize("served", ["public"], indirect=True)
def test_a_handler_on_the_public_path_is_served_without_warning(served: tuple[Client, Path]) -> None:
    client, log = served
    assert client.request("greet", b"ada") == b"hello ada"
    text = log.read_text()
    assert "ftpbc.deprecation" not in text and "FtpbcDeprecation" not in text, text


# --------------------------------------------------------------------------- the version


def test_version_is_semantic_and_single_sourced() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", ftpbc.__version__)
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ftpbc.__version__"}
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{ftpbc.__version__}]" in changelog, "CHANGELOG.md has no section for this version"


def test_ftpbc_version_option() -> None:
    got = run_ftpbc("--version")
    assert (got.returncode, got.stdout) == (0, f"ftpbc, version {ftpbc.__version__}\n"), got.stderr


# --------------------------------------------------------------------------- the API reference


def _public_members(cls: type) -> list[str]:
    """The public methods and properties ``cls`` itself defines (dataclass fields are
    documented by the string after them, which only the API reference sees)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            found.append(name)
    return found


def test_every_public_name_and_method_has_a_docstring() -> None:
    undocumented = []
    for name in ftpbc.__all__:
        value = getattr(ftpbc, name)
        if (inspect.isclass(value) or inspect.isfunction(value)) and not (value.__doc__ or "").strip():
            undocumented.append(name)
        if inspect.isclass(value) and value.__module__.startswith("ftpbc."):
            for member in _public_members(value):
                attr = inspect.getattr_static(value, member)
                doc = (attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr).__doc__
                if not (doc or "").strip():
                    undocumented.append(f"{name}.{member}")
    for name in ("Client", "Node"):
        if not (getattr(ftpbc, name).__init__.__doc__ or "").strip():
            undocumented.append(f"{name}.__init__")
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_the_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, str(REPO / "docs" / "build_api.py"), str(tmp_path)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "ftpbc.html").read_text(encoding="utf-8")
    missing = [name for name in ftpbc.__all__ if f'id="{name}"' not in page]
    assert not missing, f"public names not in the reference: {missing}"
    assert (tmp_path / "ftpbc" / "errors.html").is_file()
    pages = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.html"))
    assert pages == ["ftpbc.html", "ftpbc/errors.html", "index.html"], "an internal module is documented"
