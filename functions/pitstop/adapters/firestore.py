"""The incident store on Firestore: every state change is one transaction.

Collections (``<prefix>_...``): ``nodes`` (one per node: latest incident, remediation
history, cooldown clocks), ``incidents``, ``budgets`` (blast-radius slots per scope) and
``dedup`` (one record per state-changing delivery, with an ``expire_at`` field for the
Firestore TTL policy that infra/ deploys) and ``outbox`` (notifications to publish, each
recorded with the decision that causes it; see services/outbox.py).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore_jobs import JobRecords
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.core import engine
from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.policy import Policy
from pitstop.core.states import UNCLAIMABLE_STATES, RunState, State
from pitstop.core.store import commit_of

T = TypeVar("T")

# Contended documents (one node during a storm) abort transactions. A retry at once meets the
# same contenders again (a livelock: five instances absorbing into one incident kept failing for
# tens of seconds), so a transaction is tried once and then again after an exponentially growing,
# fully jittered pause (up to RETRIES tries, pauses capped at BACKOFF_CAP_S).
MAX_ATTEMPTS = 1
RETRIES = 10
BACKOFF_S = 0.1
BACKOFF_CAP_S = 4.0
# In-process turn-taking per node: a fixed set of locks, keys hashed onto them, so a long-lived
# instance that sees many nodes and incidents holds no per-key state.
LOCK_STRIPES = 512


class _LazyBudgets(Mapping[str, dict[str, Any] | None]):
    """Budget documents read inside the transaction only if the engine asks for them.

    Most events are absorbed and never touch a budget; reading every scope on every event
    would serialise a whole zone's events on one document.
    """

    def __init__(self, coll: Any, txn: Any) -> None:
        self._coll, self._txn, self._cache = coll, txn, dict[str, dict[str, Any] | None]()

    def __getitem__(self, key: str) -> dict[str, Any] | None:
        if key not in self._cache:
            snap = self._coll.document(key).get(transaction=self._txn)
            self._cache[key] = snap.to_dict() if snap.exists else None
        return self._cache[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class IncidentStore(JobRecords):
    def __init__(self, client: firestore.Client, prefix: str = "pitstop") -> None:
        self.db, self.prefix = client, prefix
        self.nodes = client.collection(f"{prefix}_nodes")
        self.incidents = client.collection(f"{prefix}_incidents")
        self.budgets = client.collection(f"{prefix}_budgets")
        self.dedup = client.collection(f"{prefix}_dedup")
        self.outbox = client.collection(f"{prefix}_outbox")
        # Called inside each decision's transaction (services/outbox.py records its page there).
        self.on_decision: Callable[[Any, engine.Outcome], None] | None = None
        self._lock = threading.Lock()
        self._node_locks = [threading.RLock() for _ in range(LOCK_STRIPES)]
        # Only node actions claim blast-radius slots; their transactions all touch the same
        # budget documents, so inside one instance they take turns instead of aborting each other.
        self._claim_lock = threading.Lock()
        self.writes = 0  # documents written by this process, for `pitstop bench ingest`

    def _count_writes(self, n: int) -> None:
        with self._lock:
            self.writes += n

    def _txn(self) -> Any:
        return self.db.transaction(max_attempts=MAX_ATTEMPTS)

    def _node_lock(self, nkey: str) -> threading.RLock:
        return self._node_locks[hash(nkey) % LOCK_STRIPES]

    # -- events ------------------------------------------------------------------------

    def _serialised(self, nkey: str, claims: bool, fn: Callable[[], T]) -> T:
        """Run one transaction for a node: in turn with this process's others on that node.

        A storm on one node lands on few instances, so taking turns in-process removes most
        aborts; across instances Firestore's transactions decide, and one that loses is retried
        after a fully jittered exponential pause. ``claims``: it may claim blast-radius slots, whose
        documents every node shares, so such transactions also take turns across nodes.
        """
        for attempt in range(RETRIES):
            try:
                with self._node_lock(nkey), self._claim_lock if claims else contextlib.nullcontext():
                    return fn()
            except (ValueError, gexc.Aborted):  # the commit lost, or a read hit a lock timeout
                if attempt == RETRIES - 1:
                    raise
                pause = min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt)
                time.sleep(random.uniform(0, pause))  # noqa: S311 - jitter, not a secret
        raise AssertionError("unreachable")

    def apply(self, ev: Mapping[str, Any], policy: Policy, now: float) -> engine.Outcome:
        """Fold one event in, exactly once per delivery identity."""
        nkey = engine.node_key(ev["node"])
        return self._serialised(
            nkey, ev["action"] in NODE_ACTIONS, lambda: self._apply(ev, policy, now, nkey)
        )

    def _apply(self, ev: Mapping[str, Any], policy: Policy, now: float, nkey: str) -> engine.Outcome:
        key = engine.event_key(ev)
        node_ref = self.nodes.document(nkey)
        dedup_ref = self.dedup.document(key)
        ttl = dt.datetime.fromtimestamp(now + policy.window("dedup_ttl_h") * 3600, tz=dt.UTC)

        @firestore.transactional
        def txn(t: Any) -> engine.Outcome:
            seen = dedup_ref.get(transaction=t)
            if seen.exists:
                return engine.Outcome("duplicate", duplicate_of=(seen.to_dict() or {}).get("incident"))
            node_snap = node_ref.get(transaction=t)
            node_doc = node_snap.to_dict() if node_snap.exists else None
            latest = None
            if node_doc and node_doc.get("latest_incident"):
                snap = self.incidents.document(node_doc["latest_incident"]).get(transaction=t)
                latest = snap.to_dict() if snap.exists else None
            budgets = _LazyBudgets(self.budgets, t)
            out = engine.apply_event(ev, node_doc, latest, budgets, policy, now, key)
            if out.result == "ignored":
                return out
            self._write(t, out)
            inc_id = out.incident["id"] if out.incident else None
            t.set(dedup_ref, {"expire_at": ttl, "incident": inc_id, "node": nkey})
            self._count_writes(1)
            return out

        result: engine.Outcome = txn(self._txn())
        return result

    def latest_incident(self, nkey: str) -> dict[str, Any] | None:
        """The node's latest incident, read without a transaction (to refresh a cache)."""
        node = self.nodes.document(nkey).get().to_dict()
        if not node or not node.get("latest_incident"):
            return None
        snap = self.incidents.document(node["latest_incident"]).get()
        return snap.to_dict() if snap.exists else None

    def merge_counts(
        self,
        iid: str,
        representative: Mapping[str, Any],
        deltas: Mapping[str, Any],
        policy: Policy,
        now: float,
    ) -> engine.Outcome:
        """Write coalesced storm counts into an incident; if it stopped absorbing, replay instead.

        Returns ``absorbed`` (``coalesced``) with the incident as merged, which refreshes the
        caller's cache for free, or the Outcome of replaying the representative event.
        """
        ref = self.incidents.document(iid)

        @firestore.transactional
        def txn(t: Any) -> dict[str, Any] | None:
            snap = ref.get(transaction=t)
            inc = snap.to_dict() if snap.exists else None
            ts = float(representative.get("_observed_ts") or now)
            if inc is None or not engine.absorbs(inc, representative, ts):
                return None
            engine.merge_deltas(inc, deltas, policy)
            inc["updated_at"] = now
            t.set(ref, inc)
            self._count_writes(1)
            return inc

        nkey = engine.node_key(representative["node"])
        merged = self._serialised(nkey, False, lambda: txn(self._txn()))
        if merged is not None:
            return engine.Outcome("absorbed", incident=merged, coalesced=True)
        return self.apply(representative, policy, now)

    # -- workflow starts ---------------------------------------------------------------

    def lease_start(self, iid: str, step: int, now: float, lease_s: float = 60.0) -> dict[str, Any] | None:
        """Claim the right to start the execution of one incident step (one starter at a time)."""
        ref = self.incidents.document(iid)

        @firestore.transactional
        def txn(t: Any) -> dict[str, Any] | None:
            snap = ref.get(transaction=t)
            inc = snap.to_dict() if snap.exists else None
            wf = (inc or {}).get("workflow") or {}
            if inc is None or wf.get("step") != step or wf.get("state") != RunState.PENDING:
                return None
            if inc["state"] in UNCLAIMABLE_STATES:  # closed by a person (or failed) before it started
                return None
            if wf.get("lease_until", 0) > now:
                return None
            wf["lease_until"] = now + lease_s
            wf["attempts"] = wf.get("attempts", 0) + 1
            t.update(ref, {"workflow": wf})
            self._count_writes(1)
            return inc

        result: dict[str, Any] | None = self._serialised(iid, False, lambda: txn(self._txn()))
        return result

    def record_started(self, iid: str, step: int, execution: str, now: float) -> None:
        ref = self.incidents.document(iid)

        @firestore.transactional
        def txn(t: Any) -> None:
            inc = ref.get(transaction=t).to_dict() or {}
            wf = inc.get("workflow") or {}
            if wf.get("step") == step:
                wf.update({"state": RunState.STARTED, "execution": execution, "started_at": now})
                t.update(ref, {"workflow": wf, "updated_at": now})
                self._count_writes(1)

        self._serialised(iid, False, lambda: txn(self._txn()))

    def pending_starts(self, now: float) -> list[dict[str, Any]]:
        """Incidents whose decided workflow step has not been started (crash recovery)."""
        q = self.incidents.where(filter=firestore.FieldFilter("workflow.state", "==", RunState.PENDING))
        return [
            d for d in (s.to_dict() for s in q.stream()) if d and d["workflow"].get("lease_until", 0) <= now
        ]

    # -- remediation steps (actuate) ---------------------------------------------------

    def mutate(self, iid: str, fn: Callable[[dict[str, Any]], T]) -> T:
        """Change one incident in a transaction: ``fn`` edits the document in place and returns a value."""
        ref = self.incidents.document(iid)

        @firestore.transactional
        def txn(t: Any) -> T:
            inc = ref.get(transaction=t).to_dict()
            if inc is None:
                raise KeyError(iid)
            before = copy.deepcopy(inc)
            out = fn(inc)
            if inc != before:  # by value: a state written as State.X equals the stored "X"
                t.set(ref, inc)
                self._count_writes(1)
            return out

        result: T = self._serialised(iid, False, lambda: txn(self._txn()))
        return result

    def step_record(self, iid: str, key: str) -> dict[str, Any] | None:
        snap = self.incidents.document(iid).collection("steps").document(key).get()
        return snap.to_dict() if snap.exists else None

    def steps(self, iid: str) -> FirestoreStepStore:
        """The incident's step records (``steps/<step>-<op>``), for the step runner."""
        return FirestoreStepStore(self.incidents.document(iid).collection("steps"))

    def release_budget(self, inc: Mapping[str, Any]) -> None:
        """Mark an incident's blast-radius slots inactive (they still count until the window slides)."""

        @firestore.transactional
        def txn(t: Any) -> None:
            docs = {
                d: self.budgets.document(d).get(transaction=t).to_dict() for d in inc.get("budget_scopes", [])
            }
            for doc_id, doc in engine.release_slots(docs, inc["id"]).items():
                t.set(self.budgets.document(doc_id), doc)

        self._serialised(inc["id"], True, lambda: txn(self._txn()))

    # -- operator views and actions ----------------------------------------------------

    def get(self, iid: str) -> dict[str, Any] | None:
        snap = self.incidents.document(iid).get()
        return snap.to_dict() if snap.exists else None

    def get_node(self, key: str) -> dict[str, Any] | None:
        snap = self.nodes.document(key).get()
        return snap.to_dict() if snap.exists else None

    def set_node_fields(self, key: str, fields: Mapping[str, Any]) -> None:
        """Facts learned while acting (e.g. the reservation block from Compute's host topology)."""
        self.nodes.document(key).set(dict(fields), merge=True)
        self._count_writes(1)

    def put_node(self, key: str, doc: Mapping[str, Any]) -> None:
        self.nodes.document(key).set(dict(doc))

    def list(self, states: Iterable[State] | None = None) -> list[dict[str, Any]]:
        q: Any = self.incidents
        wanted = sorted(states or ())
        if wanted:
            q = q.where(filter=firestore.FieldFilter("state", "in", wanted))
        docs = [s.to_dict() for s in q.stream()]
        return sorted((d for d in docs if d), key=lambda d: d.get("created_at", 0))

    def budget(self, doc_id: str) -> dict[str, Any] | None:
        snap = self.budgets.document(doc_id).get()
        return snap.to_dict() if snap.exists else None

    def release(self, iid: str, policy: Policy, now: float, by: str) -> engine.Outcome:
        """Retry a HELD incident against its budgets now (operator release or the periodic sweep).

        An operator release (``by`` not ``sweep``) bypasses the budget; the sweep does not.
        """
        force = by != "sweep"
        return self._decide(
            iid, lambda inc, node, budgets: engine.release_held(inc, node, budgets, policy, now, by, force)
        )

    def step_up(self, iid: str, policy: Policy, now: float) -> engine.Outcome:
        """Decide the stronger action a fault asked for while it was being fixed (actuate's close)."""
        return self._decide(iid, lambda inc, node, budgets: engine.step_up(inc, node, budgets, policy, now))

    def close(self, iid: str, by: str, now: float, unfence: bool) -> engine.Outcome:
        """A person ends an OPEN, HELD or FAILED incident (``pitstop incidents --close``)."""
        return self._decide(
            iid, lambda inc, node, budgets: engine.close_by_person(inc, node, budgets, by, now, unfence)
        )

    def fail_stuck(self, iid: str, execution: str, why: str, now: float) -> engine.Outcome:
        """The watchdog fails an incident whose execution died or overran (if it is still there)."""
        return self._decide(
            iid, lambda inc, node, budgets: engine.fail_stuck(inc, node, budgets, execution, why, now)
        )

    def settle_failed(self, iid: str, now: float) -> engine.Outcome:
        """Let a FAILED incident's blast-radius slots go (its node stays fenced)."""
        return self._decide(iid, lambda inc, node, budgets: engine.settle_failed(inc, node, budgets, now))

    def _decide(
        self,
        iid: str,
        decide: Callable[
            [dict[str, Any], dict[str, Any], Mapping[str, dict[str, Any] | None]], engine.Outcome
        ],
    ) -> engine.Outcome:
        """Run one engine decision on an existing incident and write what it returns, in one transaction.

        A workflow step it schedules is recorded ``pending`` together with the decision, so
        the start that follows happens once, or is recovered by the sweep.
        """
        ref = self.incidents.document(iid)

        @firestore.transactional
        def txn(t: Any) -> engine.Outcome:
            inc = ref.get(transaction=t).to_dict()
            if not inc:
                return engine.Outcome("ignored")
            node_ref = self.nodes.document(inc["node_key"])
            node_doc = node_ref.get(transaction=t).to_dict() or engine.new_node(inc["node"])
            out = decide(inc, node_doc, _LazyBudgets(self.budgets, t))
            if out.result != "ignored":
                self._write(t, out)
            return out

        result: engine.Outcome = self._serialised(iid, True, lambda: txn(self._txn()))
        return result

    def close_bursts(self, now: float) -> int:
        """Resolve record-only/observe incidents whose burst has ended (the periodic sweep)."""
        closed = 0
        for inc in self.list((State.OPEN,)):
            ref = self.incidents.document(inc["id"])

            @firestore.transactional
            def txn(t: Any, ref: Any = ref) -> bool:
                cur = ref.get(transaction=t).to_dict()
                if not cur:
                    return False
                budgets = {
                    d: self.budgets.document(d).get(transaction=t).to_dict()
                    for d in cur.get("budget_scopes", [])
                }
                if not engine.close_if_burst_over(cur, now):
                    return False
                t.set(ref, cur)
                for doc_id, doc in engine.release_slots(budgets, cur["id"]).items():
                    t.set(self.budgets.document(doc_id), doc)
                return True

            def run(txn: Callable[[Any], bool] = txn) -> bool:
                return txn(self._txn())  # a fresh transaction per retry

            closed += bool(self._serialised(inc["id"], True, run))
        return closed

    def _write(self, t: Any, out: engine.Outcome) -> None:
        """Write a decision in its transaction (core/store.commit_of says what), with what the
        outbox records of it: the same rule as every other store."""
        done = commit_of(out)
        for inc in done.incidents:
            t.set(self.incidents.document(inc["id"]), inc)
        if done.node is not None:
            t.set(self.nodes.document(engine.node_key(done.node["node"])), done.node)
        for doc_id, doc in done.budgets.items():
            t.set(self.budgets.document(doc_id), doc)
        self._count_writes(done.count)
        if self.on_decision is not None:
            self.on_decision(t, out)

    # -- outbox: notifications recorded with the decision that causes them -------------------

    def outbox_put_in(self, t: Any, nid: str, entry: Mapping[str, Any]) -> None:
        """Record an outbox entry in the caller's transaction (committed with its decision or not at all)."""
        t.set(self.outbox.document(nid), dict(entry))
        self._count_writes(1)

    def outbox_add(self, nid: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Record an outbox entry unless one with this id exists; the stored entry either way."""
        ref = self.outbox.document(nid)
        try:
            ref.create(dict(entry))
        except gexc.AlreadyExists:
            return ref.get().to_dict() or dict(entry)
        self._count_writes(1)
        return dict(entry)

    def outbox_mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        """The entry's notification reached the topic; it expires (Firestore TTL) ``keep_s`` later."""
        expire = dt.datetime.fromtimestamp(now + keep_s, tz=dt.UTC)
        fields = {"sent": True, "sent_at": now, "message_id": message_id, "expire_at": expire}
        self.outbox.document(nid).set(fields, merge=True)
        self._count_writes(1)

    def outbox_note_failure(self, nid: str, now: float) -> None:
        """A publish of the entry failed (the sweep retries it without waiting)."""
        self.outbox.document(nid).update({"failed_at": now, "failures": firestore.Increment(1)})
        self._count_writes(1)

    def outbox_unsent(self, created_before: float) -> Iterator[dict[str, Any]]:
        """Unsent entries whose publish failed or that were recorded before ``created_before``."""
        q = self.outbox.where(filter=firestore.FieldFilter("sent", "==", False))
        docs = [d for d in (s.to_dict() for s in q.stream()) if d]
        due = [d for d in docs if d.get("failed_at") is not None or d.get("created_at", 0) <= created_before]
        yield from sorted(due, key=lambda d: float(d.get("created_at", 0)))  # oldest first
