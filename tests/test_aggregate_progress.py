"""The aggregation's one progress display (``ftpbc.analytics.progress``) and its stderr lines.

No Spark and no server here: the display is driven by hand, as ``job.run`` drives it, onto a
stream that says it is a terminal or not.  That a real run reports every phase with its counts
is ``tests/test_aggregate_reply_to.py``'s; that the command writes the lines on stderr is
``tests/test_aggregate_cli.py``'s.
"""

from __future__ import annotations

import io
import json
import threading

from ftpbc.analytics.progress import PHASES, Display, Phase
from ftpbc.cli.aggregate import phase_line
from tests.support import wait_until


class Terminal(io.StringIO):
    """A stream that says it is a terminal; writes from several threads are serialised."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self.lock:
            return super().write(s)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def _drive(display: Display) -> list[Phase]:
    out = []
    for n, name in enumerate(PHASES):
        display.begin(name)
        display.status(f"step {n}")
        out.append(display.end(name, f"{n} things", things=n))
    return out


def test_off_a_terminal_every_phase_is_one_line_with_its_counts() -> None:
    lines: list[str] = []
    with Display(lambda p: lines.append(phase_line(p, "text"))) as display:
        phases = _drive(display)
    assert [p.name for p in phases] == list(PHASES)
    assert [p.counts for p in phases] == [{"things": n} for n in range(len(PHASES))]
    assert len(lines) == len(PHASES)
    for line, phase in zip(lines, phases, strict=True):
        assert line.startswith("aggregate [") and line.endswith(f"] {phase.name}: {phase.text}"), line
        assert "\r" not in line and "\x1b" not in line


def test_under_json_each_phase_is_one_object_with_its_counts() -> None:
    phase = Phase("parsing", 12.3, "40 records: 20 requests", {"records": 40, "requests": 20})
    line = phase_line(phase, "json")
    assert "\n" not in line
    got = json.loads(line)
    assert {k: got[k] for k in ("logger", "level", "event", "phase", "elapsed_s", "counts")} == {
        "logger": "ftpbc.aggregate", "level": "info", "event": "phase", "phase": "parsing", "elapsed_s": 12.3,
        "counts": {"records": 40, "requests": 20}}
    assert got["message"] == "[  12.3 s] parsing: 40 records: 20 requests"


def test_on_a_terminal_a_live_line_is_erased_before_each_phase_line_and_at_the_end() -> None:
    term = Terminal()
    with Display(lambda p: term.write(phase_line(p, "text") + "\n"), live=term, interval=0.01) as display:
        display.begin("listing", status=lambda: "3/7 tasks")
        # The live line is redrawn in place by the display's own thread, status included.
        wait_until(lambda: term.text().count("listing... 3/7 tasks") >= 2, timeout=10, what="two redraws")
        display.end("listing", "9 files listed", files=9)
    text = term.text()
    assert text.endswith("\r\x1b[K")  # nothing of the live line is left behind
    finished = text.rindex("aggregate [")
    # The phase line is written after an erase, on a line of its own.
    assert text[:finished].endswith("\r\x1b[K")
    assert text[finished:].split("\n")[0].endswith("listing: 9 files listed")
    # What a log of the terminal keeps, once each erase is applied, is the phase line alone.
    shown = [seg.rsplit("\r\x1b[K", 1)[-1] for seg in text.split("\n")]
    assert [s for s in shown if s] == [text[finished:].split("\n")[0]]


def test_a_status_that_fails_leaves_the_live_line_without_it() -> None:
    term = Terminal()

    def broken() -> str:
        raise RuntimeError("gone")

    with Display(None, live=term, interval=0.01) as display:
        display.begin("parsing", status=broken)
        display.status("still here")
        wait_until(lambda: term.text().count("parsing... still here") >= 2, timeout=10, what="redraws")
        phase = display.end("parsing", "done", records=1)
    assert phase.counts == {"records": 1}
