"""The snapshots a decision may start from (adapters/firestore_snaps.py) never go back in time."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pitstop.adapters.firestore_snaps import Snap, SnapCache

T = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
PATH = "projects/p/databases/(default)/documents/pitstop_nodes/a3-node-001"


class _Ref:
    path = PATH


class _Read:
    """A document as a get returns it: when it was read, and its update time (None if missing)."""

    reference = _Ref()

    def __init__(self, read_s: float, updated_s: float | None) -> None:
        self.read_time = T + dt.timedelta(seconds=read_s)
        self.update_time = None if updated_s is None else T + dt.timedelta(seconds=updated_s)
        self.exists = updated_s is not None


def _written(cache: SnapCache, updated_s: float) -> None:
    cache.written(_Ref(), {"latest_incident": "i1"}, T + dt.timedelta(seconds=updated_s))


def _held(cache: SnapCache) -> Any:
    return cache.get(PATH, 60.0)


def test_a_read_that_began_before_this_process_wrote_does_not_replace_the_write() -> None:
    cache = SnapCache()
    _written(cache, updated_s=5)
    cache.put(_Read(read_s=4, updated_s=1))  # a grouped get, read at 4 s, answered after the commit
    assert isinstance(_held(cache), Snap) and _held(cache).update_time == T + dt.timedelta(seconds=5)
    cache.put(_Read(read_s=3, updated_s=None))  # nor a read from before the node existed
    assert _held(cache).exists


def test_a_read_after_the_write_replaces_it() -> None:
    cache = SnapCache()
    _written(cache, updated_s=5)
    newer = _Read(read_s=6, updated_s=5.5)  # another instance wrote it since
    cache.put(newer)
    assert _held(cache) is newer
    gone = _Read(read_s=7, updated_s=None)  # and deleted it
    cache.put(gone)
    assert _held(cache) is gone


def test_a_write_replaces_what_was_read_and_a_later_write_the_earlier() -> None:
    cache = SnapCache()
    cache.put(_Read(read_s=2, updated_s=1))
    _written(cache, updated_s=3)
    assert _held(cache).update_time == T + dt.timedelta(seconds=3)
    _written(cache, updated_s=4)
    assert _held(cache).update_time == T + dt.timedelta(seconds=4)
