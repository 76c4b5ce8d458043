"""Timing a benchmark: one process pinned to one core, wall and CPU seconds (``pitstop bench``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def one_core() -> Iterator[int]:
    """Pin this process to one CPU for the duration (Linux); yields the CPUs it may run on."""
    getaff = getattr(os, "sched_getaffinity", None)
    setaff = getattr(os, "sched_setaffinity", None)
    if getaff is None or setaff is None:
        yield os.cpu_count() or 1
        return
    before = getaff(0)
    setaff(0, {min(before)})
    try:
        yield len(getaff(0))
    finally:
        setaff(0, before)


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall0, time.process_time() - cpu0
