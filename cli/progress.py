"""Progress of long commands on stderr: a bar redrawn in place when stderr
is a terminal, plain lines now and then otherwise (logs, pipes, CI).

    with Progress("importing", total=n, unit="messages") as progress:
        for item in items:
            ...
            progress.advance()
        progress.note("a line of its own, kept above the bar")

The bar never goes to stdout, which carries the commands' results
(magnet links, JSON summaries).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

# A terminal redraw at most ten times a second: fast enough to look live,
# rare enough to cost nothing next to the work it reports.
REDRAW_S = 0.1
# Without a terminal, one line every ten seconds tells a log reader the
# command is alive without flooding it.
PLAIN_EVERY_S = 10.0
BAR_WIDTH = 28


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # closed or not a real file
        return False


class Progress:
    """Counts work done out of an optional total and shows it on ``stream``."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "",
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock=time.monotonic,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = is_terminal(self._stream) if terminal is None else terminal
        self._clock = clock
        self._started = clock()
        # A terminal shows the bar at once; a log gets its first line only
        # when the command has run for a while (short commands stay quiet).
        self._shown_at: float | None = None if self._terminal else self._started
        self._drawn = False
        self._closed = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def advance(self, count: int = 1) -> None:
        self.set(self.done + count)

    def set(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = self._clock()
        every = REDRAW_S if self._terminal else PLAIN_EVERY_S
        if self._shown_at is None or now - self._shown_at >= every:
            self._show(now)

    def note(self, text: str) -> None:
        """A line of its own: above the bar on a terminal, as is otherwise."""
        if self._terminal and self._drawn:
            self._stream.write("\r\x1b[K")
        self._stream.write(text + "\n")
        if self._terminal and self._drawn:
            self._stream.write(self.line(self._clock()))
        self._stream.flush()

    def close(self, final: str | None = None) -> None:
        """The last state on its own line (the bar is left complete, not erased)."""
        if self._closed:
            return
        self._closed = True
        text = final if final is not None else self.line(self._clock())
        self._stream.write(("\r\x1b[K" if self._terminal and self._drawn else "") + text + "\n")
        self._stream.flush()

    def abandon(self) -> None:
        """The work failed: the bar is erased so that the error stands alone."""
        if self._closed:
            return
        self._closed = True
        if self._terminal and self._drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            eta = (self.total - self.done) / rate if rate > 0 and self.done < self.total else 0.0
            text = f"{self.label} {self.done:,}/{self.total:,}{unit} {100 * fraction:3.0f}%"
            if self._terminal:
                filled = int(fraction * BAR_WIDTH)
                text = f"{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] " + text[len(self.label) + 1 :]
            return f"{text}, {_rate(rate)}/s, {_duration(elapsed)} elapsed, {_duration(eta)} left"
        return f"{self.label} {self.done:,}{unit}, {_rate(rate)}/s, {_duration(elapsed)} elapsed"

    def _show(self, now: float) -> None:
        self._shown_at = now
        if self._terminal:
            self._stream.write("\r\x1b[K" + self.line(now))
            self._drawn = True
        else:
            self._stream.write(self.line(now) + "\n")
        self._stream.flush()


def _rate(per_s: float) -> str:
    if per_s >= 10_000:
        return f"{per_s / 1000:,.0f}k"
    if per_s >= 100:
        return f"{per_s:,.0f}"
    return f"{per_s:.1f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Stages:
    """Lines and counts of a job in stages (download pieces, then import
    windows): one bar per stage, each line kept above the bar.

    ``line`` and ``count`` fit the ``report`` and ``progress`` callbacks of
    :mod:`wakustore.node.archive`.
    """

    def __init__(self, stream: TextIO | None = None, terminal: bool | None = None, clock=time.monotonic):
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = is_terminal(self._stream) if terminal is None else terminal
        self._clock = clock
        self._bar: Progress | None = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._bar is not None:
            if exc_type is None:
                self._bar.close()
            else:
                self._bar.abandon()

    def line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.note(text)
        else:
            self._stream.write(text + "\n")
            self._stream.flush()

    def count(self, what: str, done: int, total: int) -> None:
        if self._bar is None or self._bar.label != what:
            if self._bar is not None:
                self._bar.close()
            self._bar = Progress(what, total=total, stream=self._stream, terminal=self._terminal, clock=self._clock)
        self._bar.set(done, total)
