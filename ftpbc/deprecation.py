"""Old import paths that keep working after a move, with a warning naming the new one.

A module that moved leaves behind a small module at its old path whose ``__getattr__`` comes from
:func:`moved`::

    # ftpbc/message.py: Message moved; `from ftpbc import Message` is the public path
    from ftpbc.deprecation import moved

    __getattr__ = moved(__name__, {"Message": "ftpbc:Message"}, remove_in="1.0")

Guaranteed, for every name in the table:

* the old path gives the very object the new path gives (``is``-identical), resolved only when
  it is first asked for, so the old module costs nothing to keep and cannot import a cycle;
* every access issues an :class:`FtpbcDeprecationWarning` (a :class:`DeprecationWarning`) whose
  text says what to import instead, pointing at the importing line (the ``warnings`` filters
  decide what is shown: Python hides DeprecationWarning outside ``__main__`` by default);
* the first access from each importing module is also logged once (logger
  ``ftpbc.deprecation``, level WARNING), so a node whose handler uses an old path says so in its
  log, whatever the warning filters are (up to ``LOGGED_MAX`` lines a process: the memory of
  what was logged is bounded).

Not guaranteed: a name not in the table raises AttributeError, as for any module.  Old paths are
kept at least until the release named in ``remove_in`` (CHANGELOG.md lists them).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FtpbcDeprecationWarning", "moved"]

log = logging.getLogger("ftpbc.deprecation")

#: (old module, name, importing module) already logged: as many as a process has importers of
#: old paths, and never more than LOGGED_MAX (past that, the warnings alone speak)
_logged: set[tuple[str, str, str]] = set()
LOGGED_MAX = 1000
_logged_lock = threading.Lock()


class FtpbcDeprecationWarning(DeprecationWarning):
    """An ftpbc name was used through a path that is going away; the text names the new one."""


def moved(old_module: str, names: Mapping[str, str], *,
          remove_in: str = "1.0") -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module`` whose ``names`` now live elsewhere.

    ``names`` maps each old attribute to its new home, ``"package.module:Attribute"``; the
    warning tells users ``from package.module import Attribute``.  ``remove_in`` is the first
    release that may drop the old path.  A malformed target raises ValueError here, when the old
    module is imported, not at the user's first access.
    """
    table: dict[str, tuple[str, str]] = {}
    for old_name, target in names.items():
        module, sep, attr = target.partition(":")
        if not (sep and module and attr.isidentifier()):
            raise ValueError(f"{old_module}.{old_name}: target {target!r} is not 'module:Attribute'")
        table[old_name] = (module, attr)

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        module, attr = table[name]
        alias = "" if attr == name else f" as {name}"
        text = (f"{old_module}.{name} is deprecated: use `from {module} import {attr}{alias}` "
                f"({old_module} will be removed in {remove_in})")
        warnings.warn(text, FtpbcDeprecationWarning, stacklevel=2)
        caller = sys._getframe(1)
        importer = str(caller.f_globals.get("__name__", "?"))
        key = (old_module, name, importer)
        with _logged_lock:
            first = key not in _logged and len(_logged) < LOGGED_MAX
            if first:
                _logged.add(key)
        if first:
            log.warning("%s (imported by %s, %s line %d)", text, importer, caller.f_code.co_filename,
                        caller.f_lineno)
        return getattr(importlib.import_module(module), attr)

    return __getattr__
