"""Storm counts of the memory store (core/store.Counts): count shards, the resolved feed and the
reads a coalescer's cache makes, as the Firestore store keeps them (adapters/firestore_counts.py),
so the port's contract holds for both."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from pitstop.adapters.memory_records import MemoryDocs
from pitstop.core.domain import CountShard, Incident, Resolution
from pitstop.core.store import resolution, with_shards


class MemoryCounts:
    """Count shards by incident, and the resolved feed, in the store's documents."""

    def __init__(self, docs: MemoryDocs) -> None:
        self._d = docs

    def put_shards(self, pages: Mapping[str, Mapping[str, CountShard]]) -> None:
        with self._d.lock:
            for page, shards in pages.items():
                for shard, totals in shards.items():
                    held = self._d.shards.setdefault(totals["incident"], {})
                    held[f"{page}/{shard}"] = copy.deepcopy(totals)
                self._d.tally.wrote(1)  # one document per page

    def as_decided(self, iid: str) -> Incident | None:
        with self._d.lock:
            return copy.deepcopy(self._d.incidents.get(iid))

    def latest(self, nkey: str) -> Incident | None:
        with self._d.lock:
            node = self._d.nodes.get(nkey)
            latest_id = node.get("latest_incident") if node else None
        return self.as_decided(latest_id) if latest_id else None

    def resolved_since(self, since: float) -> list[Resolution]:
        with self._d.lock:
            return [copy.copy(r) for r in self._d.resolved.values() if r["at"] >= since]

    def summed(self, inc: Incident) -> Incident:
        """The incident with its shards' counts added (core/store.with_shards)."""
        with self._d.lock:
            shards = copy.deepcopy(list(self._d.shards.get(inc["id"], {}).values()))
        return with_shards(inc, shards)

    def note_resolved(self, inc: Incident, now: float) -> None:
        """With the decision that writes ``inc``: its resolved feed record, if it is RESOLVED."""
        rec = resolution(inc, now)
        if rec is not None:
            self._d.resolved[inc["id"]] = rec
            self._d.tally.wrote(1)
