"""The incident store in memory: the Firestore store's semantics with a lock for a transaction.

For unit tests of remediation, ``pitstop replay`` and the simulator: every decision goes through
the same engine and the same commit rule (core/store.commit_of) as in production, documents are
copied in and out as Firestore copies them, and ids are created once. It imports nothing from
google, so tools may use it without the client libraries.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

from pitstop.adapters.memory_counts import MemoryCounts
from pitstop.core import aggregate, engine, remediation
from pitstop.core.domain import (
    Budget,
    FaultEvent,
    Incident,
    JobRestarts,
    JsonObject,
    NodeDoc,
    NodeFields,
    OutboxEntry,
    StepRecord,
)
from pitstop.core.engine import Outcome
from pitstop.core.policy import Policy
from pitstop.core.states import RunState, State
from pitstop.core.steps import MemoryStepStore, record_state
from pitstop.core.store import Commit, Countable, commit_of, run

T = TypeVar("T")


class MemoryStore(MemoryCounts):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, NodeDoc] = {}
        self.incidents: dict[str, Incident] = {}
        self.budgets: dict[str, Budget] = {}
        self.dedup: dict[str, str | None] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.job_restarts: dict[str, JobRestarts] = {}
        self.outbox: dict[str, OutboxEntry] = {}
        self.step_stores: dict[str, MemoryStepStore] = {}
        self.writes = 0
        self.retries = 0  # a lock stands for the transaction: nothing ever loses and runs again
        self._lock = threading.RLock()

    # -- one decision, one "transaction" -------------------------------------------------------

    def _commit(self, done: Commit) -> None:
        """Keep a decision's documents: the engine made them fresh, and ``get`` hands out copies."""
        for inc in done.incidents:
            self.incidents[inc["id"]] = copy.deepcopy(inc)
            self._note_resolved(inc, time.time())
        if done.node is not None:
            self.nodes[engine.subject_key(done.node)] = copy.deepcopy(done.node)
        self.budgets.update(copy.deepcopy(dict(done.budgets)))
        for entry in done.outbox:
            self.outbox[entry["id"]] = copy.deepcopy(entry)
        self.writes += done.count

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> Outcome:
        """Fold one event in, exactly once per delivery identity."""
        key = engine.event_key(ev)
        with self._lock:
            if key in self.dedup:
                return Outcome("duplicate", duplicate_of=self.dedup[key])
            node = self.get_node(engine.subject_key(ev))  # the engine works on its own copies
            latest_id = node.get("latest_incident") if node else None
            latest = self.incident_as_decided(latest_id) if latest_id else None
            cmd = aggregate.FoldEvent(ev, key, countable)
            out = aggregate.decide(latest, cmd, aggregate.Given(now, policy, node, self.budgets))
            done = commit_of(out, now)
            if done.count:
                self._commit(done)
                self.dedup[key] = out.incident["id"] if out.incident else None
                self.writes += 1
            return out

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> Outcome:
        """Decide a command under the lock that stands for a transaction (core/store.run)."""
        with self._lock:
            return run(_Locked(self), iid, cmd, policy, now)

    def pending_starts(self, now: float) -> list[Incident]:
        with self._lock:
            return [
                copy.deepcopy(i)
                for i in self.incidents.values()
                if (wf := i.get("workflow")) is not None
                and wf.get("state") == RunState.PENDING
                and wf.get("lease_until", 0) <= now
            ]

    # -- records -------------------------------------------------------------------------------

    def get(self, iid: str) -> Incident | None:
        """The incident with its count shards summed (core/store.with_shards)."""
        inc = self.incident_as_decided(iid)
        return self._summed(inc) if inc is not None else None

    def list(self, states: Iterable[State] | None = None) -> list[Incident]:
        wanted = {str(s) for s in states or ()}
        with self._lock:
            docs = [
                self._summed(copy.deepcopy(d))
                for d in self.incidents.values()
                if not wanted or str(d["state"]) in wanted
            ]
        return sorted(docs, key=lambda d: d.get("created_at", 0))

    def latest_incident(self, nkey: str) -> Incident | None:
        node = self.get_node(nkey)
        latest_id = node.get("latest_incident") if node else None
        return self.incident_as_decided(latest_id) if latest_id else None

    def get_node(self, key: str) -> NodeDoc | None:
        with self._lock:
            return copy.deepcopy(self.nodes.get(key))

    def put_node(self, key: str, doc: NodeDoc) -> None:
        with self._lock:
            self.nodes[key] = copy.deepcopy(doc)

    def set_node_fields(self, key: str, fields: NodeFields) -> None:
        with self._lock:
            # a merge, as Firestore's set(merge=True): a new document holds only ``fields``
            self.nodes.setdefault(key, cast(NodeDoc, {})).update(cast(NodeDoc, copy.deepcopy(fields)))
            self.writes += 1

    def budget(self, doc_id: str) -> Budget | None:
        with self._lock:
            return copy.deepcopy(self.budgets.get(doc_id))

    def claim_job_restart(self, job_key: str, run_key: str, now: float, cap: int, window_s: float) -> bool:
        with self._lock:
            ok, doc = remediation.admit_restart(self.job_restarts.get(job_key), run_key, now, cap, window_s)
            self.job_restarts[job_key] = doc
            return ok

    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool:
        with self._lock:
            cur = self.jobs.setdefault(key, {"incident": incident, "at": now})
            return bool(cur["incident"] == incident)

    def steps(self, iid: str) -> MemoryStepStore:
        with self._lock:
            parent = lambda: cast(JsonObject | None, self.incidents.get(iid))  # noqa: E731 - the guard's read
            return self.step_stores.setdefault(iid, MemoryStepStore(parent, self._lock))

    def step_record(self, iid: str, key: str) -> StepRecord | None:
        got = self.steps(iid).read(key)
        return None if got is None else got.record.copy()

    def done_steps(self, iid: str) -> dict[str, StepRecord]:
        """The incident's finished step records by key (what tests look at)."""
        store = self.steps(iid)
        return {k: r.copy() for k, (r, _) in store.records.items() if record_state(r) == "done"}

    # -- the outbox ------------------------------------------------------------------------------

    def outbox_add(self, nid: str, entry: OutboxEntry) -> OutboxEntry:
        with self._lock:
            return copy.deepcopy(self.outbox.setdefault(nid, copy.deepcopy(entry)))

    def outbox_mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        with self._lock:
            # Firestore's merge: an entry not there holds only these fields
            self.outbox.setdefault(nid, cast(OutboxEntry, {})).update(
                {"sent": True, "sent_at": now, "message_id": message_id, "expire_at": now + keep_s}
            )

    def outbox_note_failure(self, nid: str, now: float) -> None:
        with self._lock:
            e = self.outbox.setdefault(nid, cast(OutboxEntry, {}))  # as in outbox_mark_sent
            e.update({"failed_at": now, "failures": int(e.get("failures") or 0) + 1})

    def outbox_unsent(self, created_before: float) -> Iterator[OutboxEntry]:
        with self._lock:
            docs = [copy.deepcopy(d) for d in self.outbox.values() if d.get("sent") is False]
        due = [d for d in docs if d.get("failed_at") is not None or d.get("created_at", 0) <= created_before]
        yield from sorted(due, key=lambda d: float(d.get("created_at", 0)))


class _Locked:
    """The memory store under its lock, as the unit of work core/store.run decides in."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.budgets = store.budgets

    def incident(self, iid: str) -> Incident | None:
        return self._store.incident_as_decided(iid)

    def node(self, key: str) -> NodeDoc | None:
        return self._store.get_node(key)

    def write(self, commit: Commit) -> None:
        self._store._commit(commit)
