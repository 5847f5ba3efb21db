"""Waiting out a node's rate limit: the one routine every client command uses.

A request the node refuses for its rate (Store and lightpush status 429, a
mailserver's "rate limit exceeded") is sent again after a pause that starts
short and doubles up to a cap. After a bounded number of refusals in a row,
or a bounded time spent waiting in a row, the last refusal is handed back
for the caller to report on one line. The count and the time start again
with every accepted request, so a long run (``query --all``) settles at the
node's pace instead of giving up; the next refusal starts from the pause
that last worked, so the run does not probe with pauses known to be short.

The node does not say its limit in a refusal. nwaku and wakustore limit with
token buckets: one period after a bucket emptied it is full again, so when a
policy knows the period of the limit it waits no longer than that period.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Pauses of ``first_s`` doubling up to ``max_s`` (capped at
    ``period_s``, the period of the node's limit, when known); at most
    ``max_retries`` retries and ``max_wait_s`` seconds of pauses in a row."""

    first_s: float
    max_s: float
    max_retries: int
    max_wait_s: float
    period_s: float | None = None

    def pause(self, retry: int) -> float:
        """The pause before retry number ``retry`` (0 for the first)."""
        cap = self.max_s if self.period_s is None else min(self.max_s, self.period_s)
        return min(self.first_s * 2**retry, cap)


class Backoff:
    """Sends requests through :meth:`call`; counts every retry in :attr:`retries`."""

    def __init__(self, policy: BackoffPolicy, sleep: Callable[[float], Awaitable[None]] = trio.sleep):
        self.policy = policy
        self.retries = 0
        self._sleep = sleep
        self._worked = 0  # the doubling step of the pause that last ended a refusal

    async def call(self, send: Callable[[], Awaitable[T]], limited: Callable[[T], bool]) -> T:
        """``await send()`` until ``limited(answer)`` is false or the policy
        gives up; returns the last answer (still limited when it gave up)."""
        waited = 0.0
        answer = await send()
        for retry in range(self.policy.max_retries):
            if not limited(answer):
                return answer
            step = self._worked + retry
            pause = self.policy.pause(step)
            if waited + pause > self.policy.max_wait_s:
                break
            await self._sleep(pause)
            waited += pause
            self.retries += 1
            answer = await send()
            if not limited(answer):
                self._worked = min(step, self._max_step())
        return answer

    def _max_step(self) -> int:
        step = 0
        while self.policy.pause(step) < self.policy.pause(step + 1):
            step += 1
        return step
