"""Build the API reference (HTML) of ftpbc's public surface from its docstrings, with pdoc.

    python3 docs/build_api.py OUTDIR

Documents ``ftpbc`` (the names of ``ftpbc.__all__``) and ``ftpbc.errors``, nothing internal.  Any
warning pdoc gives (an annotation it cannot resolve, a name in ``__all__`` that does not exist)
is an error: the exit status is 1 and the warning is printed.  The output is not kept in the
repository; ``.ci/run`` builds it into a temporary directory.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 docs/build_api.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Deprecations inside third-party libraries are not the reference's problem.
        warnings.filterwarnings("default", category=DeprecationWarning)
        import pdoc

        import ftpbc

        # The public names are loaded on first use (ftpbc.__getattr__); pdoc reads the module's
        # namespace, so load them all first.
        for name in ftpbc.__all__:
            getattr(ftpbc, name)
        try:
            pdoc.pdoc("ftpbc", "ftpbc.errors", output_directory=out)
        except Warning as warning:
            print(f"docs/build_api.py: {type(warning).__name__}: {warning}", file=sys.stderr)
            return 1
    pages = sorted(str(p.relative_to(out)) for p in out.rglob("*.html"))
    print(f"API reference: {len(ftpbc.__all__)} public names in {', '.join(pages)} under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
