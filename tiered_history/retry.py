"""Retry policies, one place: which failures are retried, how often, how long apart (tenacity).

Only transient failures are retried: a dropped PostgreSQL connection, a serialization failure,
a summariser that timed out or answered 5xx. Anything else fails at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from .errors import TransientStoreError

T = TypeVar("T")

#: Database calls: 5 attempts, 50 ms doubling to at most 1 s between them.
STORE_ATTEMPTS = 5


def _transient_store(exc: BaseException) -> bool:
    return isinstance(exc, TransientStoreError)


#: Seconds before the second attempt; each next wait doubles, up to STORE_MAX_WAIT.
STORE_FIRST_WAIT = 0.05
STORE_MAX_WAIT = 1.0


def store_retry(fn: Callable[[], T]) -> T:
    """Run ``fn``; retry it on :class:`TransientStoreError` (each attempt is a whole transaction).

    The first attempt runs bare: nearly every transaction succeeds at once, and tenacity's
    bookkeeping costs a PostgreSQL write ~13 us. Only after a transient failure does it take
    over, for the remaining attempts, with the same waits (it counts from 1 again, hence the
    doubled multiplier: 0.05 s before the second attempt, 0.1 s before the third...).
    """
    try:
        return fn()
    except TransientStoreError:
        if STORE_ATTEMPTS < 2:
            raise
    time.sleep(STORE_FIRST_WAIT)
    retrying = Retrying(
        retry=retry_if_exception(_transient_store),
        stop=stop_after_attempt(STORE_ATTEMPTS - 1),
        wait=wait_exponential(multiplier=STORE_FIRST_WAIT * 2, max=STORE_MAX_WAIT),
        reraise=True,
    )
    return retrying(fn)


def summarizer_retrying(
    attempts: int, is_transient: Callable[[BaseException], bool], max_wait: float = 4.0
) -> AsyncRetrying:
    """Model calls: ``attempts`` in all, exponential backoff from 0.25 s, transient errors only."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(max(attempts, 1)),
        wait=wait_exponential(multiplier=0.25, max=max_wait),
        reraise=True,
    )


def attempts_made(state: RetryCallState) -> int:
    return state.attempt_number
