"""Load a YAML configuration file into :class:`~ftpbc.config.models.Config`.

Every error is one line naming the file, the line and the key path, e.g.::

    ftpbc.yaml:14: endpoints.quote.poll_interval: expected a number, got 'fast'

The YAML is composed once to keep each key's line, so that a validation error found later by
pydantic can still point at the line a person has to edit.

Aliases are bounded: a document whose aliases would expand it by more than MAX_ALIAS_NODES
nodes (a "billion laughs" file: nine levels of ten aliases each make 10**9 nodes out of 451
bytes), or an alias inside its own anchor, is refused before anything walks the expanded tree,
as the line pass and pydantic both would.  Messages never quote a url's password.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ftpbc.config.models import Config
from ftpbc.config.servers import redact_url, redact_urls_in
from ftpbc.errors import ConfigError

KeyPath = tuple[str | int, ...]

#: nodes aliases may add to a document, all repetitions counted (``<<: *defaults`` in a thousand
#: endpoints adds some 20,000); beyond it the file is refused
MAX_ALIAS_NODES = 250_000


def load_config(path: str | Path, *, node_id: str | None = None) -> Config:
    """Read, validate and return the YAML configuration at ``path``.

    ``node_id`` overrides ``node.id`` (as ``--node-id`` does).  Nothing is contacted: servers,
    handlers and directories are checked by ``ftpbc check`` and at start-up.  Raises
    ConfigError, one line naming the file, the line and the key when they are known
    (``ftpbc.yaml:14: endpoints.quote.poll_interval: expected a number, got 'fast'``), for a
    missing or unreadable file, malformed YAML or any invalid value.
    """
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("configuration file not found", file=source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration: {exc.strerror}", file=source) from None
    return parse_config(text, source=source, node_id=node_id)


def parse_config(text: str, *, source: str = "<config>", node_id: str | None = None) -> Config:
    lines: dict[KeyPath, int] = {}
    loader = yaml.SafeLoader(text)
    try:
        # Composed once, checked, then constructed from the same nodes (safe_load would compose
        # again): the check must come before anything expands the aliases.
        node = loader.get_single_node()
        if node is not None:
            _check_aliases(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(f"malformed YAML: {problem}", file=source, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", file=source) from None
    except RecursionError:
        raise ConfigError("malformed YAML: nested too deeply", file=source) from None
    finally:
        loader.dispose()
    if node is not None:
        _collect_lines(node, (), lines)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping with 'servers' and 'endpoints' at the top", file=source,
                          line=1)
    try:
        config = Config.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise _translate(exc, source, lines) from None
    except ConfigError as exc:  # a PatternError raised inside a validator
        raise ConfigError(exc.reason, file=source, key=exc.key) from None
    try:
        return config.with_node_id(node_id)
    except ValueError as exc:
        raise ConfigError(str(exc), file=source, key="--node-id") from None


def _check_aliases(root: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases expand it by more than MAX_ALIAS_NODES nodes, or that
    holds an alias inside its own anchor (a cycle).

    An alias is the very node object of its anchor, so the expanded size of every distinct node
    is computed once (memoised by identity): the cost is that of the document as written, never
    of its expansion.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    distinct = 0

    def size(node: yaml.Node) -> int:
        nonlocal distinct
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in open_nodes:
            raise ConfigError("an alias refers to a node that contains it (recursive YAML alias)",
                              file=source, line=node.start_mark.line + 1)
        distinct += 1
        total = 1
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            open_nodes.add(key)
            children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                        else node.value)
            for child in children:
                total += size(child)
            open_nodes.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    if expanded - distinct > MAX_ALIAS_NODES:
        raise ConfigError(f"YAML aliases expand this file by {expanded - distinct} nodes, more than "
                          f"{MAX_ALIAS_NODES} (an alias bomb?); write the repeated parts out instead",
                          file=source)


def _collect_lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _collect_lines(value_node, (*path, key), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, (*path, i), out)


_KEY_IN_MESSAGE = re.compile(r"^([A-Za-z0-9_.\-]+): ")


def _translate(exc: ValidationError, source: str, lines: dict[KeyPath, int]) -> ConfigError:
    """The first pydantic error as one ConfigError line (the rest are usually consequences)."""
    err = exc.errors()[0]
    loc: KeyPath = tuple(p for p in err["loc"] if isinstance(p, str | int))
    message = _describe(err)
    if not loc:
        # A model-level check names its key path at the start of its message.
        m = _KEY_IN_MESSAGE.match(message)
        if m:
            loc = tuple(m.group(1).split("."))
            message = message[m.end():]
    line = _line_for(loc, lines)
    key = ".".join(str(p) for p in loc) or None
    # Last line of defence: a value quoted from the file may be a url with its password.
    return ConfigError(redact_urls_in(message), file=source, line=line, key=key)


def _line_for(loc: KeyPath, lines: dict[KeyPath, int]) -> int | None:
    # A key path read from a message (``routes.r.rulesets.0.allow.1``) holds list positions as
    # text; the lines are keyed by int there (a mapping key made of digits stays text).
    indexed = tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in loc)
    while loc:
        for key in (loc, indexed):
            if key in lines:
                return lines[key]
        loc, indexed = loc[:-1], indexed[:-1]
    return None


def _describe(err: Any) -> str:
    kind = err["type"]
    value = err.get("input")
    shown = type(value).__name__ if isinstance(value, dict | list) else repr(
        redact_url(value) if isinstance(value, str) and "@" in value else value)
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {shown}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected a whole number, got {shown}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {shown}"
    if kind in ("string_type",):
        return f"expected text, got {shown}"
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind in ("dict_type", "model_type"):
        return f"expected a mapping, got {shown}"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"expected one of {expected}, got {shown}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"{err['msg'].lower()}, got {shown}"
    message = str(err.get("msg", kind))
    return message.removeprefix("Value error, ")
