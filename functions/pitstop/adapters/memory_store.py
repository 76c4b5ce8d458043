"""The incident store in memory: the Firestore store's semantics with a lock for a transaction.

For unit tests of remediation, ``pitstop replay`` and the simulator: every decision is read,
decided and written by the same code as in production (core/store.fold and run, over the unit of
work :class:`_Locked` offers), documents are copied in and out as Firestore copies them, and ids
are created once. It imports nothing from google, so tools may use it without the client libraries.

Built as the Firestore store is, from parts each with one responsibility, held (not inherited):
the documents and their lock (:class:`~pitstop.adapters.memory_records.MemoryDocs`), storm counts
(adapters/memory_counts.py), node, budget and job records and the outbox
(adapters/memory_records.py); this class decides and reads incidents.
"""

from __future__ import annotations

import copy
import time
from typing import cast

from pitstop.adapters.memory_counts import MemoryCounts
from pitstop.adapters.memory_records import MemoryDocs, MemoryOutbox, MemoryRecords
from pitstop.adapters.store_tally import Tally
from pitstop.core import aggregate, engine
from pitstop.core.aggregate import Countable
from pitstop.core.domain import FaultEvent, Incident, JsonObject, NodeDoc
from pitstop.core.engine import Outcome
from pitstop.core.policy import Policy
from pitstop.core.steps import MemoryStepStore
from pitstop.core.store import EVERY, Commit, Delivery, InStates, Query, fold, oldest_first, run


class MemoryStore:
    def __init__(self) -> None:
        self.docs = MemoryDocs()  # what tests stage by hand (tests/helpers.py hand_edit)
        self.tally: Tally = self.docs.tally
        self.counts = MemoryCounts(self.docs)
        self.outbox = MemoryOutbox(self.docs)
        self.records = MemoryRecords(self.docs)

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> Outcome:
        """Fold one event in, exactly once per delivery identity (core/store.fold)."""
        with self.docs.lock:
            return fold(_Locked(self), ev, policy, now, countable)

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> Outcome:
        """Decide a command under the lock that stands for a transaction (core/store.run)."""
        with self.docs.lock:
            return run(_Locked(self), iid, cmd, policy, now)

    def get(self, iid: str) -> Incident | None:
        """The incident with its count shards summed (core/store.with_shards)."""
        inc = self.counts.as_decided(iid)
        return self.counts.summed(inc) if inc is not None else None

    def query(self, where: Query = EVERY) -> list[Incident]:
        with self.docs.lock:
            docs = [copy.deepcopy(d) for d in self.docs.incidents.values() if where.matches(d)]
        return oldest_first(map(self.counts.summed, docs)) if isinstance(where, InStates) else docs

    def steps(self, iid: str) -> MemoryStepStore:
        with self.docs.lock:
            parent = lambda: cast(JsonObject | None, self.docs.incidents.get(iid))  # noqa: E731 - the guard's read
            return self.docs.steps.setdefault(iid, MemoryStepStore(parent, self.docs.lock))


class _Locked:
    """The memory store under its lock, as the unit of work core/store.fold and run decide in."""

    def __init__(self, store: MemoryStore) -> None:
        self._store, self._docs = store, store.docs
        self.budgets = store.docs.budgets

    def incident(self, iid: str) -> Incident | None:
        return self._store.counts.as_decided(iid)

    def node(self, key: str) -> NodeDoc | None:
        return self._store.records.node(key)

    def delivered(self, key: str) -> Delivery | None:
        return self._docs.deliveries.get(key)

    def write(self, commit: Commit) -> None:
        """Keep a decision's documents: the engine made them fresh, and reads hand out copies."""
        docs = self._docs
        for inc in commit.incidents:
            docs.incidents[inc["id"]] = copy.deepcopy(inc)
            self._store.counts.note_resolved(inc, time.time())
        if commit.node is not None:
            docs.nodes[engine.subject_key(commit.node)] = copy.deepcopy(commit.node)
        docs.budgets.update(copy.deepcopy(dict(commit.budgets)))
        for entry in commit.outbox:
            docs.outbox[entry["id"]] = copy.deepcopy(entry)
        if commit.delivery is not None:
            docs.deliveries[commit.delivery.key] = commit.delivery
        docs.tally.wrote(commit.count)
