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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from pitstop.adapters.memory_counts import MemoryCounts
from pitstop.core import engine, remediation
from pitstop.core.domain import (
    Budget,
    FaultEvent,
    Incident,
    JobRestarts,
    NodeDoc,
    NodeFields,
    OutboxEntry,
    StepRecord,
)
from pitstop.core.engine import Budgets, Outcome
from pitstop.core.policy import Policy
from pitstop.core.states import UNCLAIMABLE_STATES, RunState, State
from pitstop.core.steps import MemoryStepStore, record_state
from pitstop.core.store import Commit, Countable, commit_of

T = TypeVar("T")
Decide = Callable[[Incident, NodeDoc, Budgets], Outcome]


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
        self.on_decision: Callable[[Any, Outcome], None] | None = None
        self.writes = 0
        self.retries = 0  # a lock stands for the transaction: nothing ever loses and runs again
        self._lock = threading.RLock()

    # -- one decision, one "transaction" -------------------------------------------------------

    def _commit(self, out: Outcome) -> Commit:
        """Keep the decision's documents: the engine made them fresh, and ``get`` hands out copies."""
        done = commit_of(out)
        for inc in done.incidents:
            self.incidents[inc["id"]] = inc.copy()
            self._note_resolved(inc, time.time())
        if done.node is not None:
            self.nodes[engine.subject_key(done.node)] = done.node
        self.budgets.update(done.budgets)
        self.writes += done.count
        if self.on_decision is not None:
            self.on_decision(None, out)
        return done

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> Outcome:
        """Fold one event in, exactly once per delivery identity."""
        key = engine.event_key(ev)
        with self._lock:
            if key in self.dedup:
                return Outcome("duplicate", duplicate_of=self.dedup[key])
            node = self.nodes.get(engine.subject_key(ev))  # the engine works on its own copies
            latest_id = node.get("latest_incident") if node else None
            latest = self.incidents.get(latest_id) if latest_id else None
            if countable is not None and countable(latest):
                return Outcome("absorbed", incident=copy.deepcopy(latest), coalesced=True)
            out = engine.apply_event(ev, node, latest, self.budgets, policy, now, key)
            if out.result != "ignored":
                self._commit(out)
                self.dedup[key] = out.incident["id"] if out.incident else None
                self.writes += 1
            return out

    def _decide(self, iid: str, decide: Decide) -> Outcome:
        with self._lock:
            inc = self.incident_as_decided(iid)
            if not inc:
                return Outcome("ignored")
            node = self.get_node(inc["node_key"]) or engine.new_node(inc["node"], inc.get("job"))
            out = decide(inc, node, self.budgets)
            if out.result != "ignored":
                self._commit(out)
            return out

    def release(self, iid: str, policy: Policy, now: float, by: str) -> Outcome:
        force = by != "sweep"
        return self._decide(iid, lambda i, n, b: engine.release_held(i, n, b, policy, now, by, force))

    def step_up(self, iid: str, policy: Policy, now: float) -> Outcome:
        return self._decide(iid, lambda i, n, b: engine.step_up(i, n, b, policy, now))

    def close(self, iid: str, by: str, now: float, unfence: bool) -> Outcome:
        return self._decide(iid, lambda i, n, b: engine.close_by_person(i, n, b, by, now, unfence))

    def fail_stuck(self, iid: str, execution: str, why: str, now: float) -> Outcome:
        return self._decide(iid, lambda i, n, b: engine.fail_stuck(i, n, b, execution, why, now))

    def join_block(self, iid: str, block: str, policy: Policy, now: float) -> Outcome:
        return self._decide(iid, lambda i, n, b: engine.join_block(i, n, b, block, policy, now))

    def close_bursts(self, now: float) -> int:
        closed = 0
        with self._lock:
            for listed in self.list((State.OPEN,)):  # summed: the burst goes on while a shard says so
                inc = self.incidents[listed["id"]]
                inc["burst_until"] = max(inc["burst_until"], listed["burst_until"])
                if engine.close_if_burst_over(inc, now):
                    self._note_resolved(inc, now)
                    scopes = {d: self.budgets.get(d) for d in inc.get("budget_scopes", [])}
                    self.budgets.update(engine.release_slots(scopes, inc["id"]))
                    closed += 1
        return closed

    # -- workflow starts ---------------------------------------------------------------------

    def lease_start(self, iid: str, step: int, now: float, lease_s: float = 60.0) -> Incident | None:
        with self._lock:
            inc = self.incident_as_decided(iid)
            wf = inc.get("workflow") if inc is not None else None
            if inc is None or wf is None or wf.get("step") != step or wf.get("state") != RunState.PENDING:
                return None
            if inc["state"] in UNCLAIMABLE_STATES or wf.get("lease_until", 0) > now:
                return None
            wf["lease_until"] = now + lease_s
            wf["attempts"] = wf.get("attempts", 0) + 1
            self.incidents[iid]["workflow"] = copy.deepcopy(wf)
            return inc

    def record_started(self, iid: str, step: int, execution: str, now: float) -> None:
        with self._lock:
            inc = self.incidents.get(iid)
            wf = inc.get("workflow") if inc is not None else None
            if inc is not None and wf is not None and wf.get("step") == step:
                wf.update({"state": RunState.STARTED, "execution": execution, "started_at": now})
                inc["updated_at"] = now

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

    def mutate(self, iid: str, fn: Callable[[Incident], T]) -> T:
        with self._lock:
            inc = self.incident_as_decided(iid)
            if inc is None:
                raise KeyError(iid)
            before = copy.deepcopy(inc)
            out = fn(inc)
            if inc != before:
                self.incidents[iid] = inc
                self.writes += 1
                if inc.get("state") != before.get("state") or inc.get("closure") != before.get("closure"):
                    self._note_resolved(inc, time.time())
            return out

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

    def release_budget(self, inc: Incident) -> None:
        with self._lock:
            docs = {d: self.budgets.get(d) for d in inc.get("budget_scopes", [])}
            self.budgets.update(engine.release_slots(docs, inc["id"]))

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
            return self.step_stores.setdefault(iid, MemoryStepStore())

    def step_record(self, iid: str, key: str) -> StepRecord | None:
        got = self.steps(iid).read(key)
        return None if got is None else got.record.copy()

    def done_steps(self, iid: str) -> dict[str, StepRecord]:
        """The incident's finished step records by key (what tests look at)."""
        store = self.steps(iid)
        return {k: r.copy() for k, (r, _) in store.records.items() if record_state(r) == "done"}

    # -- the outbox ------------------------------------------------------------------------------

    def outbox_put_in(self, t: Any, nid: str, entry: OutboxEntry) -> None:
        self.outbox[nid] = copy.deepcopy(entry)
        self.writes += 1

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
