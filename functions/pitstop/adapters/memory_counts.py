"""Storm counts of the memory store: count shards and the resolved feed, as the Firestore store
keeps them (adapters/firestore_counts.py), so the port's contract holds for both."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from pitstop.core.store import resolution, with_shards


class MemoryCounts:
    """Mixed into the memory store, which provides the documents and its lock."""

    incidents: dict[str, dict[str, Any]]
    writes: int
    _lock: threading.RLock

    def __init__(self) -> None:
        self.count_shards: dict[str, dict[str, dict[str, Any]]] = {}  # incident -> shard -> totals
        self.resolved: dict[str, dict[str, Any]] = {}

    def put_count_shard(self, iid: str, shard: str, totals: Mapping[str, Any]) -> None:
        with self._lock:
            self.count_shards.setdefault(iid, {})[shard] = copy.deepcopy(dict(totals))
            self.writes += 1

    def incident_as_decided(self, iid: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.incidents.get(iid))

    def resolved_since(self, since: float) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self.resolved.values() if r["at"] >= since]

    def _summed(self, inc: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            shards = copy.deepcopy(list(self.count_shards.get(inc["id"], {}).values()))
        return with_shards(inc, shards)

    def _note_resolved(self, inc: Mapping[str, Any], now: float) -> None:
        rec = resolution(inc, now)
        if rec is not None:
            self.resolved[inc["id"]] = rec
            self.writes += 1
