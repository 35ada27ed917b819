"""Progress of a long pass over the inputs, on stderr: a line redrawn in place on a terminal, else (a log
file, a pipe, a batch job) a plain line every ``INTERVAL_S`` seconds, so logs stay readable."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

REDRAW_S = 0.2
INTERVAL_S = 10.0


class Progress:
    """Bytes of input done out of ``total``, with the rate; ``done()`` prints the final state."""

    def __init__(self, label: str, total: int, stream: Optional[TextIO] = None):
        self.label, self.total, self.stream = label, max(1, total), stream or sys.stderr
        self.tty = self.stream.isatty()
        self.count = 0
        self.start = self.shown = time.monotonic()

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if now - self.shown >= (REDRAW_S if self.tty else INTERVAL_S):
            self.shown = now
            self._show()

    def done(self) -> None:
        self.count = max(self.count, self.total)
        self._show()
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def _show(self) -> None:
        seconds = max(1e-6, time.monotonic() - self.start)
        text = (f"{self.label}: {min(100.0, 100 * self.count / self.total):5.1f}% "
                f"({self.count / 1e6:,.1f} of {self.total / 1e6:,.1f} MB, {self.count / 1e6 / seconds:,.1f} MB/s)")
        self.stream.write(f"\r{text}\033[K" if self.tty else text + "\n")
        self.stream.flush()
