"""Coalescing storms in memory so that 800 000 identical lines cost a handful of writes.

An event that cannot change anything — its node's latest incident (read from Firestore
less than ``cache_ttl_s`` ago) absorbs it and it does not raise the action — is only
counted in memory. Counts are merged into the incident at most every ``flush_interval_s``
per node, in a transaction that re-checks the incident; if the incident stopped absorbing
meanwhile (it was resolved), the strongest buffered event is replayed through the full
path, so no fault is lost to a stale cache.

Guarantees: incident creation, raises, holds and workflow starts are exactly once (the
transactional path with its dedup record). Event *counts* are a lower bound: an instance
that dies between flushes loses at most one interval of counts, never a decision.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pitstop.adapters.firestore import IncidentStore
from pitstop.core import engine
from pitstop.core.actions import RANK, Action
from pitstop.core.policy import Policy


@dataclass
class _Node:
    latest: dict[str, Any] | None
    fetched_at: float
    last_flush: float
    deltas: dict[str, Any] = field(default_factory=engine.empty_deltas)
    representative: dict[str, Any] | None = None
    buffered: int = 0


class Coalescer:
    def __init__(self, store: IncidentStore, policy: Policy, seen_max: int = 200_000) -> None:
        self.store, self.policy = store, policy
        self.cache_ttl = float(policy.doc["store"]["cache_ttl_s"])
        self.flush_interval = float(policy.doc["store"]["flush_interval_s"])
        self._nodes: dict[str, _Node] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_max = seen_max
        self._lock = threading.RLock()
        self.coalesced = 0
        # Follow-ups (workflow starts, pages) of events replayed at flush time.
        self.on_outcome: Callable[[engine.Outcome], None] | None = None

    def _remember(self, key: str) -> None:
        self._seen[key] = None
        if len(self._seen) > self._seen_max:
            self._seen.popitem(last=False)

    def handle(self, ev: Mapping[str, Any], now: float) -> engine.Outcome:
        key = engine.event_key(ev)
        nkey = engine.node_key(ev["node"])
        ts = float(ev.get("_observed_ts") or now)
        with self._lock:
            if key in self._seen:
                return engine.Outcome("duplicate")
            st = self._nodes.get(nkey)
            fresh = st is not None and now - st.fetched_at < self.cache_ttl
        if not fresh:
            latest = self.store.latest_incident(nkey)  # plain reads: no write to refresh a cache
            with self._lock:
                st = self._nodes.setdefault(nkey, _Node(None, now, now))
                st.latest, st.fetched_at = latest, now
                for k in (latest or {}).get("recent_keys", []):
                    self._remember(k)
                if key in self._seen:
                    return engine.Outcome("duplicate", incident=latest)
        assert st is not None
        job = None
        with self._lock:
            latest = st.latest
            if latest is None and ev["action"] == Action.NONE:
                self._remember(key)
                return engine.Outcome("ignored")
            if (
                latest is not None
                and RANK[ev["action"]] <= RANK[latest["action"]]
                and engine.absorbs(latest, ev, ts)
            ):
                engine.count_into(st.deltas, ev, ts, self.policy)
                if st.representative is None or RANK[ev["action"]] >= RANK[st.representative["action"]]:
                    st.representative = dict(ev)
                st.buffered += 1
                self.coalesced += 1
                self._remember(key)
                if now - st.last_flush >= self.flush_interval:
                    job = self._take(st, now)
                absorbed = True
            else:
                job = self._take(st, now)
                absorbed = False
        if job is not None:
            self._merge(nkey, job, now)
        if absorbed:
            return engine.Outcome("absorbed", incident=latest, coalesced=True)
        out = self.store.apply(ev, self.policy, now)
        with self._lock:
            if out.result != "duplicate":
                if out.incident is not None:
                    st.latest = out.incident
                st.fetched_at = now
            self._remember(key)
        return out

    def _take(self, st: _Node, now: float) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """Detach a node's buffered counts (under the lock) so they can be written outside it."""
        st.last_flush = now
        if not st.buffered or st.latest is None or st.representative is None:
            return None
        job = (st.latest["id"], st.representative, st.deltas)
        st.deltas, st.representative, st.buffered = engine.empty_deltas(), None, 0
        return job

    def _merge(self, nkey: str, job: tuple[str, dict[str, Any], dict[str, Any]], now: float) -> None:
        iid, rep, deltas = job
        out = self.store.merge_counts(iid, rep, deltas, self.policy, now)
        if out is None:
            return
        with self._lock:
            st = self._nodes.get(nkey)
            if st is not None and out.incident is not None:
                st.latest, st.fetched_at = out.incident, now
        if self.on_outcome is not None:
            self.on_outcome(out)

    def flush_all(self, now: float) -> None:
        """Write every buffered count now (end of a benchmark, SIGTERM, the periodic sweep)."""
        with self._lock:
            jobs = [(k, self._take(st, now)) for k, st in self._nodes.items()]
        for nkey, job in jobs:
            if job is not None:
                self._merge(nkey, job, now)

    def forget(self, nkey: str | None = None) -> None:
        with self._lock:
            if nkey is None:
                self._nodes.clear()
            else:
                self._nodes.pop(nkey, None)
