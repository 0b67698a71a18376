"""Print the fast lane's coverage per module and fail when a module of ftpbc is not reached.

Reads the ``coverage json`` report the fast lane wrote (argument: its path).  A module with no
statement executed was never imported by a fast-lane test: the lane does not cover it.  Code that
runs only in a subprocess (a serving node, a Spark worker) is not counted, so a module must also
be reached in-process by some fast test: a unit test of its own, or one of the CLI tests that run
the command in-process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(report: Path) -> int:
    files = json.loads(report.read_text())["files"]
    unreached = []
    for name in sorted(files):
        summary = files[name]["summary"]
        print(f"{summary['percent_covered']:5.1f} %  {name}")
        if summary["num_statements"] and not summary["covered_lines"]:
            unreached.append(name)
    modules = sorted(str(p) for p in Path("ftpbc").rglob("*.py"))
    unreached += [m for m in modules if m not in files]
    if unreached:
        print(f"the fast lane reaches no line of: {', '.join(unreached)}", file=sys.stderr)
        return 1
    print(f"the fast lane reaches every one of {len(modules)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
