"""The import contracts cover every module of ftpbc, and the maps of the code name what exists.

Fast, no server.  Each rule is checked on the real tree, and each checker is shown to catch what
it is for on a small fake tree (or, for ``click``, on a temporary copy of the package with a
planted import), so a check that passed for the wrong reason would fail here.

Covered by the contracts
    ``lint-imports`` checks only the modules its contracts name.  Every module under ``ftpbc/``
    must be named, itself or through a package it is in, in a layer of a ``layers`` contract
    in ``pyproject.toml`` (a layer ``"a | b"`` or ``"a : b"`` names ``a`` and ``b``).  The one
    exception is the root package's own ``__init__`` (the public API, above every floor): a
    layers contract cannot name the root it is about.

Only ftpbc.cli imports click
    The ``click-only-in-cli`` contract's source modules are exactly the top-level modules and
    packages of ``ftpbc/`` but ``ftpbc.cli``: a new top-level module is refused until it is
    listed there (and in a layer).

The maps
    README.md's Layout block has one entry per top-level module and package of ``ftpbc/`` (a line
    starting ``ftpbc/<name>.py`` or ``ftpbc/<name>/``), and names every subpackage (``<name>/``)
    in its package's entry; docs/architecture.md ("What each floor owns") names every module of
    every package (`` `<module>.py` ``, in the bullet of its top-level package).  Neither names a
    module or package that does not exist.  Not checked: what the prose says about them.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ftpbc"
CLICK_CONTRACT = "click-only-in-cli"


# ---------------------------------------------------------------------- the checkers

def modules(package: Path) -> list[str]:
    """Every module and package under ``package`` (a directory), dotted, the root's own name
    included; ``__pycache__`` and non-Python files left out."""
    root = package.name
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if "__pycache__" in rel.parts:
            continue
        parts = [root, *rel.parts[:-1]]
        if rel.name != "__init__.py":
            parts.append(rel.stem)
        found.append(".".join(parts))
    return sorted(set(found))


def top_level(package: Path) -> list[str]:
    """The modules and packages directly in ``package``, dotted (``ftpbc.cli``, ``ftpbc.demo``)."""
    names = {f"{package.name}.{p.stem}" for p in package.glob("*.py") if p.name != "__init__.py"}
    names |= {f"{package.name}.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    return sorted(names)


def contracts(pyproject: Path) -> list[dict[str, Any]]:
    """The import-linter contracts of a ``pyproject.toml``."""
    with pyproject.open("rb") as f:
        data = tomllib.load(f)
    found: list[dict[str, Any]] = data["tool"]["importlinter"]["contracts"]
    return found


def layered(all_contracts: Iterable[dict[str, Any]]) -> set[str]:
    """Every module a layer of a ``layers`` contract names."""
    named: set[str] = set()
    for contract in all_contracts:
        if contract.get("type") != "layers":
            continue
        containers = contract.get("containers", [])
        for layer in contract["layers"]:
            for name in re.split(r"[|:]", layer):
                name = name.strip().removesuffix("(optional)").strip().strip("()")
                if name:
                    named.add(name)
                    named.update(f"{c}.{name}" for c in containers)
    return named


def uncovered(names: Iterable[str], root: str, named: set[str]) -> list[str]:
    """The modules of ``names`` that no layer names, itself or through a package it is in (the
    root package's own ``__init__`` excepted)."""
    def covered(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:i]) in named for i in range(1, len(parts) + 1))
    return [m for m in names if m != root and not covered(m)]


def click_gaps(all_contracts: Iterable[dict[str, Any]], tops: Iterable[str],
               allowed: str) -> tuple[list[str], list[str]]:
    """(top-level modules the click contract does not forbid it to, names it lists that are no
    top-level module or are ``allowed``)."""
    [contract] = [c for c in all_contracts if c.get("id") == CLICK_CONTRACT]
    sources = set(contract["source_modules"])
    expected = set(tops) - {allowed}
    return sorted(expected - sources), sorted(sources - expected)


def layout_block(readme: str) -> str:
    """The code block of README.md's ``## Layout`` section."""
    m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert m is not None, "README.md has no '## Layout' section"
    block = re.search(r"^```\n(.*?)^```", m[1], re.M | re.S)
    assert block is not None, "README.md's Layout section has no code block"
    return block[1]


_ENTRY_RE = re.compile(r"ftpbc/([A-Za-z_][A-Za-z0-9_]*(?:\.py|/))")
#: a bare module or directory name (not part of a longer path such as docs/cluster.md)
_MODULE_TOKEN_RE = re.compile(r"(?<![\w/.-])([A-Za-z_][A-Za-z0-9_]*\.py)\b")
_DIR_TOKEN_RE = re.compile(r"(?<![\w/.-])([A-Za-z_][A-Za-z0-9_]*)/(?![\w.])")


def layout_problems(block: str, package: Path) -> list[str]:
    """What README's Layout block gets wrong about ``package``: a top-level module or package
    with no entry, an entry or name of something that does not exist, a subpackage its
    package's entry does not name."""
    problems: list[str] = []
    entries: dict[str, list[str]] = {}  # entry -> its text (first line and continuation lines)
    current: str | None = None
    for line in block.splitlines():
        m = re.match(r"ftpbc/(\S+)", line)
        if m is not None:
            current = m[1].split()[0]
            entries.setdefault(current, []).append(line)
        elif line.startswith(" ") and current is not None:
            entries[current].append(line)
        else:
            current = None
        for path in _ENTRY_RE.findall(line):
            if not (package / path).exists():
                problems.append(f"README Layout names ftpbc/{path}, which does not exist")
    tops = {p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    for top in sorted(tops - entries.keys()):
        problems.append(f"README Layout has no entry for ftpbc/{top}")
    for entry, lines in entries.items():
        base = package / entry
        if not base.exists():
            continue  # reported above
        text = "\n".join(lines)
        if base.is_dir():
            subs = sorted(d.relative_to(base) for d in base.rglob("*")
                          if (d / "__init__.py").is_file() and "__pycache__" not in d.parts)
            named_dirs = set(_DIR_TOKEN_RE.findall(text))
            problems += [f"README Layout: the ftpbc/{entry} entry does not name its package {s}/"
                         for s in subs if s.name not in named_dirs]
            inside = {p.name for p in base.rglob("*.py")}
            inside |= {d.name for d in base.rglob("*") if d.is_dir()}
        else:
            inside = {p.name for p in package.glob("*.py")}
            inside |= {d.name for d in package.iterdir() if d.is_dir()}
        for token in _MODULE_TOKEN_RE.findall(text):
            if token not in inside:
                problems.append(f"README Layout: the ftpbc/{entry} entry names {token}, which does not exist")
        for token in _DIR_TOKEN_RE.findall(text):
            if token not in inside and token != "ftpbc":
                problems.append(f"README Layout: the ftpbc/{entry} entry names {token}/, "
                                "which does not exist")
    return problems


def floors(architecture: str) -> dict[str, str]:
    """The bullets of docs/architecture.md's "What each floor owns", by top-level package name."""
    m = re.search(r"^## What each floor owns\n(.*?)(?=^## |\Z)", architecture, re.M | re.S)
    assert m is not None, "docs/architecture.md has no 'What each floor owns' section"
    found: dict[str, str] = {}
    for bullet in re.split(r"^\* ", m[1], flags=re.M)[1:]:
        head = re.match(r"\*\*`?(?:ftpbc/)?([A-Za-z_][A-Za-z0-9_]*)/`?\*\*", bullet)
        if head is not None:
            found[head[1]] = bullet
    return found


def architecture_problems(architecture: str, package: Path) -> list[str]:
    """What docs/architecture.md gets wrong about the modules of ``package``'s packages: a
    module its package's bullet does not name, a ``.py`` named there that is in no package."""
    problems: list[str] = []
    bullets = floors(architecture)
    for top in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        mods = sorted(p for p in top.rglob("*.py")
                      if p.name != "__init__.py" and "__pycache__" not in p.parts)
        text = bullets.get(top.name)
        if text is None:
            problems.append(f"docs/architecture.md: no bullet for {top.name}/ in 'What each floor owns'")
            continue
        named = set(re.findall(r"`([A-Za-z0-9_/]+\.py)`", text))
        basenames = {n.rsplit("/", 1)[-1] for n in named}
        problems += [f"docs/architecture.md: the {top.name}/ bullet does not name "
                     f"{p.relative_to(top)}" for p in mods if p.name not in basenames]
        for name in sorted(named):
            where = package / name if "/" in name else None
            if where is not None and where.is_file():
                continue
            if not any(p.name == name.rsplit("/", 1)[-1] for p in mods) and not (top / name).is_file():
                problems.append(f"docs/architecture.md: the {top.name}/ bullet names {name}, "
                                f"which is no module of {top.name}/")
    return problems


# ---------------------------------------------------------------------- the real tree

def test_every_module_is_in_a_layer_of_a_contract() -> None:
    named = layered(contracts(ROOT / "pyproject.toml"))
    missing = uncovered(modules(PACKAGE), "ftpbc", named)
    assert not missing, (f"modules in no layer of a layers contract in pyproject.toml (add each "
                         f"to its floor): {', '.join(missing)}")


def test_click_is_forbidden_to_every_top_level_module_but_the_cli() -> None:
    missing, extra = click_gaps(contracts(ROOT / "pyproject.toml"), top_level(PACKAGE), "ftpbc.cli")
    assert not missing, f"{CLICK_CONTRACT}: add to source_modules in pyproject.toml: {', '.join(missing)}"
    assert not extra, f"{CLICK_CONTRACT}: source_modules that are no top-level module: {', '.join(extra)}"


def test_readme_layout_names_every_package_and_top_level_module() -> None:
    problems = layout_problems(layout_block((ROOT / "README.md").read_text("utf-8")), PACKAGE)
    assert not problems, "\n".join(problems)


def test_architecture_names_every_module_of_every_package() -> None:
    problems = architecture_problems((ROOT / "docs" / "architecture.md").read_text("utf-8"), PACKAGE)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- the checkers catch it

def fake_tree(root: Path, files: Iterable[str]) -> Path:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root / "pkg"


def test_the_layer_check_finds_a_module_in_no_layer(tmp_path: Path) -> None:
    pkg = fake_tree(tmp_path, ["pkg/__init__.py", "pkg/low.py", "pkg/high/__init__.py",
                               "pkg/high/deep/__init__.py", "pkg/high/deep/leaf.py", "pkg/new.py",
                               "pkg/stray/__init__.py", "pkg/stray/inner.py"])
    layers = [{"type": "layers", "layers": ["pkg.high", "pkg.low | pkg.other"]},
              {"type": "forbidden", "source_modules": ["pkg.new"], "forbidden_modules": ["x"]}]
    assert uncovered(modules(pkg), "pkg", layered(layers)) == ["pkg.new", "pkg.stray", "pkg.stray.inner"]


def test_the_click_check_finds_a_top_level_module_left_out(tmp_path: Path) -> None:
    pkg = fake_tree(tmp_path, ["pkg/__init__.py", "pkg/cli/__init__.py", "pkg/a.py", "pkg/b/__init__.py",
                               "pkg/new.py"])
    listed = [{"id": CLICK_CONTRACT, "type": "forbidden", "source_modules": ["pkg.a", "pkg.b", "pkg.gone"],
               "forbidden_modules": ["click"]}]
    assert click_gaps(listed, top_level(pkg), "pkg.cli") == (["pkg.new"], ["pkg.gone"])


def test_the_layout_check_finds_what_is_missing_and_what_is_not_there(tmp_path: Path) -> None:
    pkg = fake_tree(tmp_path, ["pkg/__init__.py", "pkg/a.py", "pkg/b/__init__.py", "pkg/b/x.py",
                               "pkg/b/sub/__init__.py", "pkg/c.py"])
    pkg = pkg.rename(tmp_path / "ftpbc")
    block = ("ftpbc/__init__.py   the root\n"
             "ftpbc/a.py          names gone.py\n"
             "ftpbc/b/            x.py and y.py\n"
             "                    more of b, see docs/b.md\n"
             "ftpbc/old/          moved away\n")
    assert sorted(layout_problems(block, pkg)) == sorted([
        "README Layout names ftpbc/old/, which does not exist",
        "README Layout has no entry for ftpbc/c.py",
        "README Layout: the ftpbc/a.py entry names gone.py, which does not exist",
        "README Layout: the ftpbc/b/ entry does not name its package sub/",
        "README Layout: the ftpbc/b/ entry names y.py, which does not exist",
    ])
    fixed = block.replace("gone.py", "c.py").replace("y.py", "sub/").replace(
        "ftpbc/old/          moved away\n", "ftpbc/c.py\n")
    assert layout_problems(fixed, pkg) == []


def test_the_architecture_check_finds_what_is_missing_and_what_is_not_there(tmp_path: Path) -> None:
    pkg = fake_tree(tmp_path, ["pkg/__init__.py", "pkg/top.py", "pkg/b/__init__.py", "pkg/b/x.py",
                               "pkg/b/sub/__init__.py", "pkg/b/sub/y.py", "pkg/c/__init__.py", "pkg/c/z.py"])
    doc = ("## What each floor owns\n\n"
           "* **b/** - `x.py` and `gone.py`, nothing else\n"
           "  on two lines\n"
           "## Next\n\n* **c/** - `z.py`\n")
    assert architecture_problems(doc, pkg) == [
        "docs/architecture.md: the b/ bullet does not name sub/y.py",
        "docs/architecture.md: the b/ bullet names gone.py, which is no module of b/",
        "docs/architecture.md: no bullet for c/ in 'What each floor owns'",
    ]
    fixed = doc.replace("`gone.py`", "`sub/y.py`").replace("## Next\n\n", "")
    assert architecture_problems(fixed, pkg) == []


def test_lint_imports_refuses_click_planted_outside_the_cli(tmp_path: Path) -> None:
    """A copy of the package with ``import click`` in a module no one listed by hand before
    (ftpbc/demo.py): the contract breaks, naming the import."""
    lint = shutil.which("lint-imports")
    assert lint is not None, "lint-imports is not installed (pip install -e '.[test]')"
    shutil.copytree(PACKAGE, tmp_path / "ftpbc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    demo = tmp_path / "ftpbc" / "demo.py"
    demo.write_text(demo.read_text("utf-8") + "\nimport click  # planted\n", "utf-8")
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([lint, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "Only the CLI imports click BROKEN" in out, out
    assert "ftpbc.demo -> click" in out, out


@pytest.mark.parametrize("module", ["ftpbc.cluster.server", "ftpbc.node.provider", "ftpbc.client"])
def test_the_old_import_paths_of_moved_classes_still_work(module: str) -> None:
    """Classes moved into modules of their own stay importable where they were."""
    names = {"ftpbc.cluster.server": ["ServerCoordination", "ServerLock", "Token", "CLOCK_SLACK",
                                      "MAX_VALUE"],
             "ftpbc.node.provider": ["Poller", "Provider"],
             "ftpbc.client": ["Client"]}[module]
    mod = importlib.import_module(module)
    assert [n for n in names if not hasattr(mod, n)] == []
