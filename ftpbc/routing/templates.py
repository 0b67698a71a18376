"""Destination URIs from templates: ``##name##`` substitution, then sed-like ``s/.../.../``.

A ruleset's ``uri_template`` and ``uri_substitution`` are lists associated by position (the
QBroker DeliverNode's URITemplate and URISubstitution).  Each template that is not null first
appends the text built so far (when not empty) to the URI, then expands into the new current
text; the substitution at the same position, when not null, edits the current text.  A null
template keeps the current text, so several substitutions can edit the same text in turns.  At
the end the current text is appended.  For example, with ``HostName=h`` and no ``port``::

    ["ftp://app@##HostName##", ":##port##", "/q/##QueueName##"]
    [null,                     "s/^:$//",   null]
    -> "ftp://app@h" + "" + "/q/..."

Values come from an untrusted message.  Every value substituted is checked
(:func:`check_value`): no ``..``, no control or format character (Unicode categories Cc, Cf,
Zl, Zp, and lone surrogates: NUL, line breaks, U+0085, U+2028, U+200B, U+FEFF...), at most
:data:`MAX_VALUE` characters.  A value that is missing or empty is a failure, unless the
placeholder names a default: ``##name:-text##`` puts ``text`` (``##name:-##``: nothing) in its
place; a default is configuration, checked as a value when the template is parsed.  The whole
URI is bounded by :data:`MAX_URI`.  A failure is a :class:`TemplateError` naming the ruleset's
template and why, never a partial URI.

Destination URIs (:func:`parse_destination`): ``endpoint:NAME``, ``topic:NAME``, or a
directory URL of a scheme :mod:`ftpbc.schemes` knows: ``ftp|ftps|sftp://user@host[:port]/dir``
or ``file:///dir``.  Parsing checks the
shape and the path (absolute, normal, no ``..``, no control or format characters, bounded segments); which
configured server a URL means is decided by the caller.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ftpbc import schemes

#: the longest value one ``##name##`` may put into a URI
MAX_VALUE = 128
#: the longest URI a template may build
MAX_URI = 1024
#: the longest path segment of a directory destination (bytes, UTF-8: most servers' limit)
MAX_SEGMENT = 255
#: the deepest directory a destination may name
MAX_DEPTH = 32

#: ``##name##`` or ``##name:-default##`` (the default: up to MAX_VALUE characters, no ``#``)
_PLACEHOLDER = re.compile(r"##([A-Za-z_][A-Za-z0-9_.$-]{0,127})(?::-([^#]{0,128}))?##")
#: Unicode categories no value, path or URI may hold: control (Cc, C0, DEL and C1 such as U+0085),
#: format (Cf: U+200B, U+202E, U+FEFF...), line and paragraph separators (Zl U+2028, Zp U+2029),
#: and surrogates (Cs: no UTF-8 encoding, no file name)
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

Lookup = Callable[[str], "str | None"]


class TemplateError(ValueError):
    """A URI could not be built or parsed; ``str()`` is one line saying why."""


def check_value(name: str, value: str) -> str:
    """``value`` if it may be substituted into a URI; TemplateError naming ``name`` otherwise."""
    if len(value) > MAX_VALUE:
        raise TemplateError(f"##{name}## is {len(value)} characters long, over the limit of {MAX_VALUE}")
    if ".." in value:
        raise TemplateError(f"##{name}## {_shown(value)} contains '..'")
    bad = refused_character(value)
    if bad is not None:
        raise TemplateError(f"##{name}## {_shown(value)} contains {bad}")
    return value


def refused_character(text: str) -> str | None:
    """``a control or format character U+XXXX (Cc)`` for the first character of ``text`` in
    :data:`REFUSED_CATEGORIES`; None when it holds none."""
    for c in text:
        category = unicodedata.category(c)
        if category in REFUSED_CATEGORIES:
            return f"a control or format character U+{ord(c):04X} ({category})"
    return None


def _shown(value: str) -> str:
    """``value`` quoted for a message, cut short (a hostile value may be long)."""
    return repr(value if len(value) <= 80 else value[:77] + "...")


@dataclass(frozen=True)
class Substitution:
    """One sed-like ``s<d>pattern<d>replacement<d>[flags]`` (flags: ``g`` every match, ``i``
    ignore case).  The delimiter is the character after ``s``; ``\\<d>`` stands for it inside the
    pattern or the replacement.  The replacement follows Python's ``re.sub`` (``\\1`` is group 1)."""

    text: str
    pattern: re.Pattern[str]
    replacement: str
    count: int

    @classmethod
    def parse(cls, text: str) -> Substitution:
        if len(text) < 4 or text[0] != "s" or text[1].isalnum() or text[1] in "\\ \n":
            raise TemplateError(f"substitution {text!r} must look like s/pattern/replacement/[gi]")
        delim = text[1]
        parts: list[str] = []
        current: list[str] = []
        i = 2
        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text) and text[i + 1] == delim and len(parts) < 2:
                # in the pattern a delimiter that is a regex metacharacter stays escaped (literal)
                special = not parts and delim in r".^$*+?{}[]|()"
                current.append("\\" + delim if special else delim)
                i += 2
                continue
            if c == delim and len(parts) < 2:
                parts.append("".join(current))
                current = []
            else:
                current.append(c)
            i += 1
        if len(parts) != 2:
            raise TemplateError(f"substitution {text!r} must look like s/pattern/replacement/[gi]")
        flags = "".join(current)
        if set(flags) - set("gi"):
            raise TemplateError(f"substitution {text!r}: unknown flag in {flags!r} (known: g, i)")
        try:
            pattern = re.compile(parts[0], re.IGNORECASE if "i" in flags else 0)
        except re.error as exc:
            raise TemplateError(f"substitution {text!r}: bad pattern: {exc}") from None
        replacement = parts[1]
        try:
            pattern.sub(replacement, "")  # a bad group reference is refused now, not per message
        except (re.error, IndexError) as exc:
            raise TemplateError(f"substitution {text!r}: bad replacement: {exc}") from None
        return cls(text, pattern, replacement, 0 if "g" in flags else 1)

    def apply(self, value: str) -> str:
        try:
            return self.pattern.sub(self.replacement, value, count=self.count)
        except (re.error, IndexError) as exc:  # a group that did not take part, say
            raise TemplateError(f"substitution {self.text!r} failed: {exc}") from None


@dataclass(frozen=True)
class UriTemplate:
    """A ruleset's templates and substitutions, parsed once (see the module's docstring)."""

    templates: tuple[str | None, ...]
    substitutions: tuple[Substitution | None, ...]

    @classmethod
    def parse(cls, templates: Sequence[str | None], substitutions: Sequence[str | None] = ()) -> UriTemplate:
        if not templates:
            raise TemplateError("uri_template is empty: a ruleset needs at least one template")
        if len(substitutions) > len(templates):
            raise TemplateError(f"{len(substitutions)} substitutions for {len(templates)} templates: "
                                "each substitution goes with the template at its position")
        for t in templates:
            if t is not None and len(t) > MAX_URI:
                raise TemplateError(f"template {t[:40]!r}... is longer than {MAX_URI} characters")
            for m in _PLACEHOLDER.finditer(t or ""):
                if m.group(2):
                    check_value(m.group(1), m.group(2))
        subs = tuple(None if s is None or s == "" else Substitution.parse(s) for s in substitutions)
        return cls(tuple(templates), subs + (None,) * (len(templates) - len(subs)))

    def placeholders(self) -> list[str]:
        """The names the templates use, in order of first use."""
        seen: dict[str, None] = {}
        for t in self.templates:
            for m in _PLACEHOLDER.finditer(t or ""):
                seen.setdefault(m.group(1), None)
        return list(seen)

    @property
    def templated(self) -> bool:
        """Whether message values build (part of) the URI."""
        return bool(self.placeholders())

    def fixed_kind(self) -> str | None:
        """``endpoint`` or ``topic`` when every URI this template can build starts with that
        kind's ``endpoint:``/``topic:`` whatever the message's values (the first template
        starts with it literally and no substitution edits that text); None otherwise."""
        first = self.templates[0]
        kind = next((k for k in ("endpoint", "topic") if (first or "").startswith(k + ":")), None)
        if kind is None:
            return None
        for i, sub in enumerate(self.substitutions):
            if i > 0 and self.templates[i] is not None:
                break  # the first text is in the URI for good
            if sub is not None:
                return None
        return kind

    def render(self, lookup: Lookup) -> str:
        """The URI for a message whose values ``lookup`` gives (None: missing); TemplateError
        for a value that is missing or empty and has no default, or is refused."""
        def value(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            found = lookup(name)
            if not found:
                if default is None:
                    raise TemplateError(f"##{name}## is {'missing' if found is None else 'empty'}; "
                                        f"write ##{name}:-## in the template to allow that")
                return default
            return check_value(name, found)

        uri: list[str] = []
        current = ""
        for template, sub in zip(self.templates, self.substitutions, strict=True):
            if template is not None:
                if current:
                    uri.append(current)
                current = _PLACEHOLDER.sub(value, template)
            if sub is not None:
                current = sub.apply(current)
            if sum(map(len, uri)) + len(current) > MAX_URI:
                raise TemplateError(f"the URI grows past {MAX_URI} characters")
        uri.append(current)
        result = "".join(uri)
        if not result:
            raise TemplateError("the templates made an empty URI")
        bad = refused_character(result)
        if bad is not None:
            raise TemplateError(f"the URI {_shown(result)} contains {bad}")
        return result


@dataclass(frozen=True)
class Target:
    """A parsed destination URI: ``kind`` endpoint or topic (``name``), or directory (``scheme``,
    ``user``, ``host``, ``port`` None when not given, absolute normal ``path``)."""

    kind: str
    name: str = ""
    scheme: str = ""
    user: str | None = None
    host: str = ""
    port: int | None = None
    path: str = ""

    @property
    def host_named(self) -> bool:
        """Whether this directory is on a host the URL names (not ``file:///dir``)."""
        spec = schemes.lookup(self.scheme)
        return spec is not None and spec.has_host

    @property
    def uri(self) -> str:
        if self.kind in ("endpoint", "topic"):
            return f"{self.kind}:{self.name}"
        if not self.host_named:
            return f"{self.scheme}://{self.path}"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{user}{self.host}{port}{self.path}"


def parse_destination(uri: str) -> Target:
    """The destination ``uri`` names; TemplateError saying why it cannot be one."""
    if len(uri) > MAX_URI:
        raise TemplateError(f"destination is {len(uri)} characters long, over the limit of {MAX_URI}")
    bad = refused_character(uri)
    if bad is not None:
        raise TemplateError(f"destination {_shown(uri)} contains {bad}")
    for kind in ("endpoint", "topic"):
        if uri.startswith(kind + ":"):
            name = uri[len(kind) + 1:]
            if not _NAME.fullmatch(name):
                raise TemplateError(f"destination {_shown(uri)}: a {kind} name is 1-64 characters of "
                                    "A-Z a-z 0-9 . _ -")
            return Target(kind, name=name)
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise TemplateError(f"destination {_shown(_redacted(uri))} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    spec = schemes.lookup(scheme)
    if spec is None:
        raise TemplateError(f"destination {_shown(_redacted(uri))}: expected endpoint:NAME, topic:NAME or "
                            f"an {schemes.expected()} URL")
    if parts.password is not None:
        raise TemplateError(f"destination {_shown(_redacted(uri))} carries a password: passwords come "
                            "only from the configured servers")
    if parts.query or parts.fragment:
        raise TemplateError(f"destination {_shown(uri)}: a directory URL takes no query or fragment")
    path = check_path(unquote(parts.path), uri)
    if not spec.has_host:
        if parts.netloc not in ("", "localhost"):
            raise TemplateError(f"destination {_shown(uri)}: a {scheme} URL names no host ({scheme}:///dir)")
        return Target("directory", scheme=scheme, host="localhost", path=path)
    if not parts.hostname:
        raise TemplateError(f"destination {_shown(uri)} names no host")
    user = unquote(parts.username) if parts.username else None
    return Target("directory", scheme=scheme, user=user, host=parts.hostname.lower(), port=port, path=path)


def check_path(path: str, uri: str) -> str:
    """``path`` (decoded) made normal; TemplateError if it is relative, climbs (``..``), holds a
    control or format character (:data:`REFUSED_CATEGORIES`) or a backslash, or is too deep or
    has a segment too long."""
    if not path.startswith("/"):
        raise TemplateError(f"destination {_shown(uri)}: the directory must be an absolute path")
    bad = refused_character(path)
    if bad is not None:
        raise TemplateError(f"destination {_shown(uri)}: the path holds {bad}")
    if "\\" in path:
        raise TemplateError(f"destination {_shown(uri)}: the path holds a backslash")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise TemplateError(f"destination {_shown(uri)}: the path climbs with '..'")
    if len(parts) > MAX_DEPTH:
        raise TemplateError(f"destination {_shown(uri)}: more than {MAX_DEPTH} directories deep")
    for p in parts:
        if len(p.encode("utf-8", "replace")) > MAX_SEGMENT:
            raise TemplateError(f"destination {_shown(uri)}: a directory name is longer than "
                                f"{MAX_SEGMENT} bytes")
    return "/" + "/".join(parts)


def _redacted(uri: str) -> str:
    """``uri`` without whatever sits between ``//`` and ``@`` (a password must never be shown)."""
    return re.sub(r"//[^/@]*@", "//***@", uri, count=1)
