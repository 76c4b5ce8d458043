"""The adapters' one retry policy, run by google.api_core's own retry loop.

``google.api_core.retry.retry_target`` calls the target, asks a predicate whether an exception is
worth another attempt, calls ``on_error`` with it and draws the next wait from a sleep generator
(googleapis/python-api-core, google/api_core/retry/retry_unary.py). Two things each call site
needs are not in it: a bound on attempts (python-api-core#535 is open for ``max_attempts``) and a
clock a test can move (it sleeps with ``time.sleep`` and measures its timeout on
``time.monotonic``). So a :class:`Policy` says which errors are retried, how many attempts and
which waits (fixed, not jittered: the same waits the adapters always had), and :func:`call` feeds
them to the loop: each wait is taken on the caller's ``sleep`` inside the generator (the loop then
sleeps 0 s), and ``on_error`` ends the loop with the policy's last word once the attempts or the
caller's deadline are spent.

A call site whose retry is decided on an answer rather than an error (a patch refused as stale, a
pod gone since it was listed) raises :class:`StaleReadError` from its attempt; the :func:`conflicts`
policy retries exactly that, at once, as Kubernetes' optimistic concurrency asks ("please apply
your changes to the latest version and try again").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from google.api_core.retry import retry_target

T = TypeVar("T")


class StaleReadError(Exception):
    """An attempt's read went stale before its write (a 409 on a guarded write, a pod replaced):
    read again and decide again."""


@dataclass(frozen=True)
class Backoff:
    """The waits between attempts: ``first``, then each ``factor`` times the last, up to ``cap``."""

    first: float = 0.0
    factor: float = 2.0
    cap: float = math.inf

    def waits(self) -> Iterator[float]:
        wait = self.first
        while True:
            yield wait
            wait = min(wait * self.factor, self.cap)


@dataclass(frozen=True)
class Policy:
    """Which errors are retried (``retryable``), how often (``attempts``; None: until the caller's
    deadline), how long apart (``backoff``), and the error once spent (``give_up``; None: the last
    error itself)."""

    retryable: Callable[[Exception], bool]
    attempts: int | None = None
    backoff: Backoff = field(default_factory=Backoff)
    give_up: Callable[[Exception], Exception] | None = None


def conflicts(attempts: int, give_up: Callable[[Exception], Exception]) -> Policy:
    """A read-decide-write retried at once on :class:`StaleReadError`, ``attempts`` times at most."""
    return Policy(lambda exc: isinstance(exc, StaleReadError), attempts, Backoff(), give_up)


def call(
    target: Callable[[], T],
    policy: Policy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    deadline: float | None = None,
) -> T:
    """``target()`` under ``policy``; ``deadline`` (on ``clock``) also ends it: the last wait is cut
    to fall on it, and an error after it is the last."""
    if policy.attempts is None and deadline is None:
        raise ValueError("a retry needs a bound: attempts or a deadline")
    failed = 0

    def on_error(exc: Exception) -> None:
        nonlocal failed
        failed += 1
        spent = policy.attempts is not None and failed >= policy.attempts
        if spent or (deadline is not None and clock() >= deadline):
            final = exc if policy.give_up is None else policy.give_up(exc)
            if final is exc:
                raise exc
            raise final from exc

    def waits() -> Iterator[float]:
        for wait in policy.backoff.waits():
            if deadline is not None:
                wait = min(wait, deadline - clock())
            if wait > 0:
                sleep(wait)
            yield 0.0  # waited already, on the caller's clock

    result: T = retry_target(target, policy.retryable, waits(), timeout=None, on_error=on_error)
    return result
