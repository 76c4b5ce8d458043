"""Documents as this process last read or wrote them, so that a decision need not read them again.

A decision (adapters/firestore.py ``IncidentStore._apply``) commits on condition that the node and
incident documents it writes are as it read them (their update time). That condition, checked
by Firestore, is what makes the decision safe, not the freshness of the read: so a decision may
start from the node and incident as this process last saw them — read by the coalescer a moment
ago to refresh its cache, or written by this process's previous decision on the node — and read
nothing. If another instance wrote them since, the commit is refused and the decision runs
again on fresh reads (a refused commit costs its writes; a read of each document every
decision cost three reads, and a storm's first lines are decided on one node back to back).

Bounded: at most ``MAX_SNAPS`` documents (least recently used dropped), each trusted for the
policy's ``cache_ttl_s`` only, so a document another instance changes is rarely used stale.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from typing import Any

from google.api_core import exceptions as gexc

# A write conditioned on a snapshot's update time was refused: another writer changed the document
# since (Firestore answers FailedPrecondition; the emulator InvalidArgument).
STALE = (gexc.FailedPrecondition, gexc.InvalidArgument)
MAX_SNAPS = 1024  # documents remembered (a node document and its latest incident per busy node)


class Snap:
    """A document as read or written: what ``_Read`` (adapters/firestore.py) needs of a snapshot."""

    __slots__ = ("_data", "reference", "update_time")

    def __init__(self, reference: Any, data: dict[str, Any] | None, update_time: Any) -> None:
        self.reference, self._data, self.update_time = reference, data, update_time

    @property
    def exists(self) -> bool:
        return self._data is not None

    def to_dict(self) -> dict[str, Any] | None:
        return copy.deepcopy(self._data)


def _newer(held: Any, snap: Any) -> bool:
    """Whether ``held`` was written after ``snap`` was read (a read's time, else its update time:
    a :class:`Snap` as written was true as of its commit)."""
    as_of = getattr(snap, "read_time", None) or snap.update_time
    return held.update_time is not None and as_of is not None and as_of < held.update_time


class SnapCache:
    """Snapshots by document path, with when this process took them (monotonic seconds)."""

    def __init__(self, max_snaps: int = MAX_SNAPS, clock: Any = time.monotonic) -> None:
        self._snaps: OrderedDict[str, tuple[Any, float]] = OrderedDict()
        self._max, self._clock = max_snaps, clock
        self._lock = threading.Lock()
        self.hits = 0  # decisions' reads saved (`pitstop bench ingest` reads the store's)

    def put(self, snap: Any) -> None:
        """Remember a snapshot (a DocumentSnapshot as read, or a :class:`Snap` as written), unless
        the one held is newer: a read that began before this process's own commit (a grouped first
        contact holds no node's lock) may end after it, and the next decision would start from the
        older document and be refused."""
        if snap is None or (snap.update_time is None and snap.exists):
            return
        with self._lock:
            held = self._snaps.get(snap.reference.path)
            if held is not None and _newer(held[0], snap):
                return
            self._snaps[snap.reference.path] = (snap, self._clock())
            self._snaps.move_to_end(snap.reference.path)
            while len(self._snaps) > self._max:
                self._snaps.popitem(last=False)

    def written(self, ref: Any, doc: Any, update_time: Any) -> None:
        """A document this process committed (its update time: the commit's)."""
        if update_time is not None:
            self.put(Snap(ref, copy.deepcopy(dict(doc)), update_time))

    def get(self, path: str, ttl_s: float) -> Any | None:
        """The snapshot of ``path`` taken less than ``ttl_s`` ago (None: read it)."""
        with self._lock:
            held = self._snaps.get(path)
            if held is None or self._clock() - held[1] >= ttl_s:
                return None
            self.hits += 1
            return held[0]

    def younger(self, path: str, ttl_s: float) -> bool:
        """Whether ``path`` was taken less than ``ttl_s`` ago (not counted as a saved read)."""
        with self._lock:
            held = self._snaps.get(path)
            return held is not None and self._clock() - held[1] < ttl_s

    def drop(self, *paths: str) -> None:
        with self._lock:
            for p in paths:
                self._snaps.pop(p, None)
