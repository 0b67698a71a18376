"""What a message is moved below the configuration, to ``ftpbc.model``; the old paths that
were documented (``ftpbc.exchange.envelope`` in docs/naming.md, ``ftpbc.exchange.selector`` in
docs/queues.md) or imported by handlers (``ftpbc.exchange.message``) still work, with a warning
naming the new one."""

from __future__ import annotations

import importlib
import warnings

import pytest

import ftpbc
from ftpbc import FtpbcDeprecationWarning

MOVED = {
    "ftpbc.exchange.envelope": "ftpbc.model.envelope",
    "ftpbc.exchange.selector": "ftpbc.model.selector",
    "ftpbc.exchange.message": "ftpbc.model.message",
}
OLD_NAMES = {
    "ftpbc.exchange.envelope": ["DEFAULT_PRIORITY", "DELIVERY_COUNT_PROPERTY", "ERROR_TYPE", "EXPIRED_TYPE",
                                "NAME_LIMIT", "RESERVED_TYPE_PREFIX", "TIMESTAMP_PROPERTY", "Direction",
                                "DropboxmqCodec", "Envelope", "FtpbcCodec", "Headers", "Kind", "NameCodec",
                                "NameTooLong", "PropertyValue", "UnusableName", "codec_for"],
    "ftpbc.exchange.selector": ["HEADER_FIELDS", "MAX_DEPTH", "MAX_IN_LIST", "MAX_SELECTOR_LENGTH",
                                "LikeMatcher", "Selector", "SelectorError", "compile_selector"],
    "ftpbc.exchange.message": ["HandlerResult", "Message", "result_bytes"],
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_same_objects_and_names_the_new_one(old: str) -> None:
    old_module = importlib.import_module(old)
    new_module = importlib.import_module(MOVED[old])
    for name in OLD_NAMES[old]:
        with pytest.warns(FtpbcDeprecationWarning) as caught:
            got = getattr(old_module, name)
        assert got is getattr(new_module, name), name
        text = str(caught[0].message)
        # public names point at the public path, the others at their module in ftpbc.model
        home = "ftpbc" if name in ftpbc.__all__ else MOVED[old]
        assert f"from {home} import {name}`" in text, text


def test_from_import_of_an_old_path_works() -> None:
    with pytest.warns(FtpbcDeprecationWarning, match="ftpbc.model.envelope import FtpbcCodec"):
        from ftpbc.exchange.envelope import FtpbcCodec
    from ftpbc.model.envelope import FtpbcCodec as moved

    assert FtpbcCodec is moved


def test_the_new_paths_and_the_public_names_are_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for new in MOVED.values():
            importlib.import_module(new)
        from ftpbc import Headers, Message, compile_selector  # noqa: F401
        from ftpbc.model.headers import Headers as table_headers

        assert ftpbc.Headers is table_headers and ftpbc.MessageOptions is not None


def test_the_configuration_no_longer_reaches_above_itself() -> None:
    # an endpoint's selector is compiled by ftpbc.config with ftpbc.model, the floor below it
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    assert not [c["id"] for c in contracts if c.get("ignore_imports")]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    assert layers.index("ftpbc.model") == layers.index("ftpbc.config") + 1
