"""Progress of a long verb (replay, simulate, bench) on stderr, so stdout stays the verb's answer.

A line at most every ``every_s`` seconds, plus the ones a caller forces (a start, an end): a
replay of years of logs or a bench of many minutes shows it is working without flooding a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO


class Note(Protocol):
    """Progress.note's shape: what a long loop calls, rate-limited by the callee."""

    def __call__(self, text: str | Callable[[], str], force: bool = False) -> None: ...


class Progress:
    def __init__(
        self,
        verb: str,
        every_s: float = 2.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.verb, self.every_s, self.stream, self.clock = verb, every_s, stream, clock
        self.last: float | None = None

    def note(self, text: str | Callable[[], str], force: bool = False) -> None:
        """Print ``text`` (a string, or a function making it only when it is printed) if it is time."""
        now = self.clock()
        if not force and self.last is not None and now - self.last < self.every_s:
            return
        self.last = now
        line = text() if callable(text) else text
        print(f"pitstop {self.verb}: {line}", file=self.stream or sys.stderr, flush=True)


def silent(text: str | Callable[[], str], force: bool = False) -> None:
    """A progress callback that prints nothing (library callers and tests)."""
