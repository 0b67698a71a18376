"""When to draw a progress bar: asked for, and stderr is a terminal.

tqdm redraws its bar with carriage returns; written to a log file or a pipe, every frame stays
there and the file fills with them, so a bar is drawn on a terminal only.
"""

from __future__ import annotations

import sys


def bar_wanted(progress: bool) -> bool:
    """True when a bar was asked for (``progress``) and stderr, where tqdm draws, is a terminal."""
    return progress and sys.stderr.isatty()
