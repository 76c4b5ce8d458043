"""Storm counts of the memory store: count shards and the resolved feed, as the Firestore store
keeps them (adapters/firestore_counts.py), so the port's contract holds for both."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping

from pitstop.core.domain import CountShard, Incident, Resolution
from pitstop.core.store import resolution, with_shards


class MemoryCounts:
    """Mixed into the memory store, which provides the documents and its lock."""

    incidents: dict[str, Incident]
    writes: int
    _lock: threading.RLock

    def __init__(self) -> None:
        self.count_shards: dict[str, dict[str, CountShard]] = {}  # incident -> page/shard -> totals
        self.resolved: dict[str, Resolution] = {}

    def put_count_shards(self, pages: Mapping[str, Mapping[str, CountShard]]) -> None:
        with self._lock:
            for page, shards in pages.items():
                for shard, totals in shards.items():
                    held = self.count_shards.setdefault(totals["incident"], {})
                    held[f"{page}/{shard}"] = copy.deepcopy(totals)
                self.writes += 1  # one document per page

    def incident_as_decided(self, iid: str) -> Incident | None:
        with self._lock:
            return copy.deepcopy(self.incidents.get(iid))

    def resolved_since(self, since: float) -> list[Resolution]:
        with self._lock:
            return [copy.copy(r) for r in self.resolved.values() if r["at"] >= since]

    def _summed(self, inc: Incident) -> Incident:
        with self._lock:
            shards = copy.deepcopy(list(self.count_shards.get(inc["id"], {}).values()))
        return with_shards(inc, shards)

    def _note_resolved(self, inc: Incident, now: float) -> None:
        rec = resolution(inc, now)
        if rec is not None:
            self.resolved[inc["id"]] = rec
            self.writes += 1
