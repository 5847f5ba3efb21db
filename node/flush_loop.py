"""The task that commits a write path's buffer when its flush policy says so.

It sleeps while nothing is pending, then until the buffer's flush deadline
(the interval since the last commit, or at once when the size threshold is
reached). Puts wake it through :meth:`FlushLoop.notify`; nothing polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

# Pause after a failed commit (the engine is down or restarting): the batch
# stays durable in the log and is retried after this, not in a tight loop.
RETRY_AFTER_FAILURE_S = 1.0


class FlushLoop:
    """``deadline`` returns when the buffer is due (``time.monotonic()``),
    None while it is empty; ``flush`` commits it (async, may raise)."""

    def __init__(
        self, deadline: Callable[[], float | None], flush: Callable[[], Awaitable[object]], what: str = "messages"
    ):
        self._deadline = deadline
        self._flush = flush
        self._what = what
        self._wake = trio.Event()
        self._idle = False
        # Times the loop woke up from a wait (observed by tests: none while idle).
        self.wakeups = 0

    def notify(self) -> None:
        """A put changed the buffer: wake the loop if it waits for a first
        row, or if the buffer is due now (size threshold reached)."""
        if self._wake.is_set():
            return
        if self._idle:
            self._wake.set()
            return
        deadline = self._deadline()
        if deadline is not None and deadline <= time.monotonic():
            self._wake.set()

    async def run(self) -> None:
        while True:
            # Reset before reading the buffer: a put after this read sets it.
            self._wake = trio.Event()
            deadline = self._deadline()
            if deadline is None:
                self._idle = True
                try:
                    await self._wake.wait()
                finally:
                    self._idle = False
                self.wakeups += 1
                continue
            delay = deadline - time.monotonic()
            if delay > 0:
                with trio.move_on_after(delay):
                    await self._wake.wait()
                self.wakeups += 1
                continue  # read the deadline again: due now, or moved by a flush
            try:
                await self._flush()
            except Exception as exc:  # engine down: the batch stays durable in the log
                log.warning("%s flush failed, will retry: %s", self._what, exc)
                await trio.sleep(RETRY_AFTER_FAILURE_S)
