"""The memory store's documents, and two of its sub-ports over them: the node, budget and job
records, and the outbox (core/store.py Records and Outbox), with Firestore's semantics.

Divided as the Firestore store is (adapters/firestore.py), by responsibility: the documents and
their lock here (:class:`MemoryDocs`, what Firestore's collections hold), storm counts in
adapters/memory_counts.py, decisions and incident reads in adapters/memory_store.py.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

from pitstop.adapters.store_tally import Tally
from pitstop.core import remediation
from pitstop.core.domain import (
    Budget,
    CountShard,
    Incident,
    JobRestarts,
    NodeDoc,
    NodeFields,
    OutboxEntry,
    Resolution,
)
from pitstop.core.steps import MemoryStepStore
from pitstop.core.store import Delivery, due


@dataclass
class MemoryDocs:
    """Every document of the memory store, by collection, and the lock that stands for Firestore's
    transactions (re-entrant: a decision reads through the sub-ports while it holds it)."""

    nodes: dict[str, NodeDoc] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    budgets: dict[str, Budget] = field(default_factory=dict)
    deliveries: dict[str, Delivery] = field(default_factory=dict)
    requeues: dict[str, str] = field(default_factory=dict)  # a job's run -> the incident that requeues it
    job_restarts: dict[str, JobRestarts] = field(default_factory=dict)
    outbox: dict[str, OutboxEntry] = field(default_factory=dict)
    shards: dict[str, dict[str, CountShard]] = field(default_factory=dict)  # incident -> page/shard -> totals
    resolved: dict[str, Resolution] = field(default_factory=dict)
    steps: dict[str, MemoryStepStore] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    tally: Tally = field(default_factory=Tally)  # retries stay 0: a lock never loses to a contender


class MemoryRecords:
    """Node, budget and job documents (core/store.Records), copied in and out as Firestore does."""

    def __init__(self, docs: MemoryDocs) -> None:
        self._d = docs

    def node(self, key: str) -> NodeDoc | None:
        with self._d.lock:
            return copy.deepcopy(self._d.nodes.get(key))

    def put_node(self, key: str, doc: NodeDoc) -> None:
        with self._d.lock:
            self._d.nodes[key] = copy.deepcopy(doc)

    def set_node_fields(self, key: str, fields: NodeFields) -> None:
        with self._d.lock:
            # a merge, as Firestore's set(merge=True): a new document holds only ``fields``
            self._d.nodes.setdefault(key, cast(NodeDoc, {})).update(cast(NodeDoc, copy.deepcopy(fields)))
            self._d.tally.wrote(1)

    def budget(self, doc_id: str) -> Budget | None:
        with self._d.lock:
            return copy.deepcopy(self._d.budgets.get(doc_id))

    def claim_job_restart(self, job_key: str, run_key: str, now: float, cap: int, window_s: float) -> bool:
        with self._d.lock:
            held = self._d.job_restarts.get(job_key)
            ok, doc = remediation.admit_restart(held, run_key, now, cap, window_s)
            self._d.job_restarts[job_key] = doc
            return ok

    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool:
        with self._d.lock:
            return self._d.requeues.setdefault(key, incident) == incident


class MemoryOutbox:
    """Notifications until published (core/store.Outbox)."""

    def __init__(self, docs: MemoryDocs) -> None:
        self._d = docs

    def add(self, nid: str, entry: OutboxEntry) -> OutboxEntry:
        with self._d.lock:
            return copy.deepcopy(self._d.outbox.setdefault(nid, copy.deepcopy(entry)))

    def mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        with self._d.lock:
            # Firestore's merge: an entry not there holds only these fields
            self._d.outbox.setdefault(nid, cast(OutboxEntry, {})).update(
                {"sent": True, "sent_at": now, "message_id": message_id, "expire_at": now + keep_s}
            )

    def note_failure(self, nid: str, now: float) -> None:
        with self._d.lock:
            e = self._d.outbox.setdefault(nid, cast(OutboxEntry, {}))  # as in mark_sent
            e.update({"failed_at": now, "failures": int(e.get("failures") or 0) + 1})

    def unsent(self, created_before: float) -> Iterator[OutboxEntry]:
        with self._d.lock:
            docs = copy.deepcopy(list(self._d.outbox.values()))
        yield from due(docs, created_before)
