"""docs/security.md names, for every attack it says ftpbc defends against, the test that holds the
defense: each of those tests must exist, or the table promises what nothing checks."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "security.md"
_FILE = re.compile(r"(?:tests/)?(test_\w+\.py)(?:::(test_\w+))?")


def named_tests(text: str) -> list[tuple[str, str | None]]:
    """``(file, test)`` for every test the text names in backquotes: ``file::test``, a bare
    ``file`` (test None), and bare ``test_...`` names after a file on the same line (that file's)."""
    found: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        current = None
        for token in re.findall(r"`([^`]+)`", line):
            m = _FILE.fullmatch(token)
            if m:
                current = m.group(1)
                found.append((current, m.group(2)))
            elif current is not None and re.fullmatch(r"test_\w+", token):
                found.append((current, token))
    return found


def missing(named: list[tuple[str, str | None]]) -> list[str]:
    """The named tests (``file`` or ``file::test``) that do not exist under tests/."""
    gone = []
    for file, test in named:
        path = REPO / "tests" / file
        if not path.is_file():
            gone.append(file)
            continue
        source = path.read_text(encoding="utf-8")
        if test is not None and not re.search(rf"^(?:async )?def {test}\(", source, re.MULTILINE):
            gone.append(f"{file}::{test}")
    return gone


def test_every_test_the_security_page_names_exists() -> None:
    named = named_tests(DOC.read_text(encoding="utf-8"))
    assert len(named) > 50  # the attack table names its tests
    assert not missing(named), f"docs/security.md names tests that do not exist: {missing(named)}"


def test_a_misspelt_test_or_file_is_reported() -> None:
    this = "test_a_misspelt_test_or_file_is_reported"
    row = f"| X | a | b | `test_security_doc.py::test_no_such_test`, `{this}`; `test_nowhere.py` |"
    named = named_tests(row)
    assert named == [("test_security_doc.py", "test_no_such_test"), ("test_security_doc.py", this),
                     ("test_nowhere.py", None)]
    assert missing(named) == ["test_security_doc.py::test_no_such_test", "test_nowhere.py"]
