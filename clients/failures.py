"""One line for a failure that arrives wrapped: the client commands' errors.

trio reports a failed TCP connect as an OSError caused by an exception group
of the per-address errors; libp2p wraps a refused socket or a failed
handshake in its own errors, a MultiError of the dial attempts, and the
exception groups of its nurseries. The innermost reason is what a user can
act on ("Connection refused", "peer id does not correspond to the received
pubkey").
"""

from __future__ import annotations

import trio


def describe_failure(exc: BaseException) -> str:
    """The innermost reason of ``exc`` on one line."""
    seen: set[int] = set()
    while id(exc) not in seen and not isinstance(exc, trio.TooSlowError):
        seen.add(id(exc))
        inner = _inner(exc)
        if inner is None or isinstance(inner, trio.Cancelled):  # the deadline's own cancellation
            break
        exc = inner
    if isinstance(exc, trio.TooSlowError):
        text = "timed out"
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions of ``group`` and its nested groups, trio.Cancelled left
    out: those are only the tasks a failure cancelled."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(leaves(exc))
        elif not isinstance(exc, trio.Cancelled):
            found.append(exc)
    return found


def _inner(exc: BaseException) -> BaseException | None:
    if isinstance(exc, BaseExceptionGroup):
        live = leaves(exc)
        return live[0] if live else None
    errors = getattr(exc, "errors", None)  # libp2p's MultiError of dial attempts
    if isinstance(errors, (list, tuple)) and errors and isinstance(errors[0], BaseException):
        return errors[0]
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__
