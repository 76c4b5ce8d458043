"""The incident store on Firestore: every state change is all or nothing (an event's decision is
one batch conditioned on what it read, see IncidentStore._apply; the others one transaction).

Collections (``<prefix>_...``): ``nodes`` (one per node: latest incident, remediation
history, cooldown clocks), ``incidents``, ``budgets`` (blast-radius slots per scope) and
``dedup`` (one record per state-changing delivery, with an ``expire_at`` field for the
Firestore TTL policy that infra/ deploys), ``outbox`` (notifications to publish, each
recorded with the decision that causes it; see services/outbox.py), ``resolved`` and each
incident's ``counts`` shards (storm counts; see adapters/firestore_counts.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, cast

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore_counts import CountShards
from pitstop.adapters.firestore_jobs import JobRecords
from pitstop.adapters.firestore_latest import Grouped, LatestIncidents
from pitstop.adapters.firestore_outbox import OutboxRecords
from pitstop.adapters.firestore_snaps import STALE, SnapCache
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.core import aggregate, engine
from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.domain import Budget, FaultEvent, Incident, NodeDoc, NodeFields, StepRecord
from pitstop.core.policy import Policy
from pitstop.core.states import RunState, State
from pitstop.core.store import Commit, Countable, commit_of, run

T = TypeVar("T")
D = TypeVar("D")


def _doc(snap: Any, kind: type[D]) -> D | None:
    """A stored document as the type its writers wrote (``kind``: Incident, NodeDoc, Budget, ...),
    or None if there is none. The edge: Firestore hands back untyped dicts."""
    return cast(D | None, snap.to_dict() if snap.exists else None)


# Contended documents (one node during a storm) abort transactions. A retry at once meets the
# same contenders again (a livelock: five instances absorbing into one incident kept failing for
# tens of seconds), so a transaction is tried once and then again after an exponentially growing,
# fully jittered pause (up to RETRIES tries, pauses capped at BACKOFF_CAP_S).
MAX_ATTEMPTS = 1
RETRIES = 10
BACKOFF_S = 0.1
_JITTER = random.Random()  # noqa: S311 - its own state, as services/coalesce.py's (a retry may run on any thread)
BACKOFF_CAP_S = 4.0
# Decisions that read blast-radius budgets all read and write the same few documents. Read inside
# transactions, two instances' reads of one deadlock until the database's lock timeout (2 s on the
# emulator); a cross-instance turn around such decisions (a turn document, polled) serialised every
# node action's first decision behind one lock held up to that timeout, and ten instances stalled
# (`pitstop bench ingest`, 50,000 lines / 64 nodes: 212 s waited for 51 turns in a 70 s run, 28 of
# them by decisions that then read no budget; one run stalled for minutes). So budgets are read
# outside the transaction (no lock) and written in it on condition that they are as read (their
# update time, or absent): optimistic, like the other documents' retries, and a decision that
# lost to another's claim runs again on the budget as it now stands.
# In-process turn-taking per node: a fixed set of locks, keys hashed onto them, so a long-lived
# instance that sees many nodes and incidents holds no per-key state.
LOCK_STRIPES = 512
QUEUED_S = 0.1  # a decision that waited its turn longer re-reads what it had read before (_apply)
SNAP_S = 5.0  # a command decides on documents this process read or wrote this recently
# A transaction that lost: to a contender (Aborted; ValueError once attempts are spent), to a
# budget changed since it was read (FailedPrecondition; AlreadyExists, a Conflict, if created).
LOST = (ValueError, gexc.Conflict, gexc.FailedPrecondition)


class _LazyBudgets(Mapping[str, Budget | None]):
    """Budget documents read only if the engine asks for them, outside the transaction, with the
    update time each was read at (None: absent) for the write's precondition.

    Most events are absorbed and never touch a budget; reading every scope on every event
    would serialise a whole zone's events on one document. ``read``: how a document is read (a
    decision's: as this process saw it lately, adapters/firestore_snaps.py; its write's condition
    refuses a stale one).
    """

    def __init__(self, coll: Any, read: Callable[[Any], Any] | None = None) -> None:
        self._coll, self._cache = coll, dict[str, Budget | None]()
        self._read = read or (lambda ref: ref.get())
        self.read_at: dict[str, Any] = {}
        self.paths: list[str] = []

    def __getitem__(self, key: str) -> Budget | None:
        if key not in self._cache:
            snap = self._read(self._coll.document(key))
            self.paths.append(snap.reference.path)
            self._cache[key] = _doc(snap, Budget)
            self.read_at[key] = snap.update_time if snap.exists else None
        return self._cache[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class _Read:
    """Documents a decision read outside a transaction, by path: what each held and when it was
    written, so that its write is conditioned on them (see IncidentStore._apply)."""

    def __init__(self, snaps: Mapping[str, Any]) -> None:
        self._snaps = dict(snaps)
        # What the batch writes, with each write's place in it (its result's): the cache's.
        self.done: list[tuple[Any, Incident | NodeDoc | Budget, int]] = []

    def keep(self, snap: Any) -> Incident | None:
        self._snaps[snap.reference.path] = snap
        return _doc(snap, Incident)

    @property
    def paths(self) -> list[str]:
        return list(self._snaps)

    def write(self, batch: Any, ref: Any, doc: Incident | NodeDoc, db: Any) -> None:
        """Replace the document on condition that it is as read (fields it lost deleted), or
        create it if it was absent or never read (a new incident)."""
        self.done.append((ref, doc, len(batch._write_pbs)))  # the client's list of the batch's writes
        snap = self._snaps.get(ref.path)
        if snap is None or not snap.exists:
            batch.create(ref, dict(doc))
            return
        gone = {k: firestore.DELETE_FIELD for k in snap.to_dict() or {} if k not in doc}
        batch.update(ref, {**doc, **gone}, option=db.write_option(last_update_time=snap.update_time))


class IncidentStore(CountShards, LatestIncidents, JobRecords, OutboxRecords):
    def __init__(self, client: firestore.Client, prefix: str = "pitstop") -> None:
        self.db, self.prefix = client, prefix
        self.nodes = client.collection(f"{prefix}_nodes")
        self.incidents = client.collection(f"{prefix}_incidents")
        self.budgets = client.collection(f"{prefix}_budgets")
        self.dedup = client.collection(f"{prefix}_dedup")
        self.outbox = client.collection(f"{prefix}_outbox")
        self.resolved = client.collection(f"{prefix}_resolved")
        self.counts = client.collection(f"{prefix}_counts")
        self._lock = threading.Lock()
        self._node_locks = [threading.RLock() for _ in range(LOCK_STRIPES)]
        # Only node actions claim blast-radius slots; their transactions all touch the same
        # budget documents, so inside one instance they take turns instead of aborting each other.
        self._claim_lock = threading.Lock()
        self.writes = 0  # documents written by this process, for `pitstop bench ingest`
        self.retries = 0  # transactions that lost to a contender and ran again (`pitstop bench ingest`)
        # Decisions' commits refused on their conditions (a contender wrote first), and the writes
        # they carried (`pitstop bench ingest`: what the race between instances costs).
        self.refused = self.refused_writes = 0
        self.commits: dict[str, int] = {}  # "<committed|refused> <result>" -> decisions (the bench's)
        self.snaps = SnapCache()  # node and incident documents as last read or written here
        self.latest_lookups = Grouped(self._latest_of)  # first contacts asked at once share two gets

    def _count_writes(self, n: int) -> None:
        with self._lock:
            self.writes += n

    def _incidents(self) -> Any:
        return self.incidents

    def pending_starts(self, now: float) -> list[Incident]:
        """Incidents whose decided workflow step has not been started (crash recovery)."""
        q = self.incidents.where(filter=firestore.FieldFilter("workflow.state", "==", RunState.PENDING))
        return [
            d for d in (s.to_dict() for s in q.stream()) if d and d["workflow"].get("lease_until", 0) <= now
        ]

    def _txn(self) -> Any:
        return self.db.transaction(max_attempts=MAX_ATTEMPTS)

    def _node_lock(self, nkey: str) -> threading.RLock:
        return self._node_locks[hash(nkey) % LOCK_STRIPES]

    # -- events ------------------------------------------------------------------------

    def _serialised(self, nkey: str, claims: bool, fn: Callable[[], T]) -> T:
        """Run one transaction for a node: in turn with this process's others on that node.

        A storm on one node lands on few instances, so taking turns in-process removes most
        aborts; across instances Firestore's transactions decide, and one that loses (to a
        contender, or to a budget written since it was read) is retried after a fully jittered
        exponential pause. ``claims``: it may claim blast-radius slots, whose documents every node
        shares, so such transactions also take turns across nodes within the process.
        """
        for attempt in range(RETRIES):
            try:
                with self._node_lock(nkey), self._claim_lock if claims else contextlib.nullcontext():
                    return fn()
            except LOST:
                if attempt == RETRIES - 1:
                    raise
                with self._lock:
                    self.retries += 1
                pause = min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt)
                time.sleep(_JITTER.uniform(0, pause))
        raise AssertionError("unreachable")

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> engine.Outcome:
        """Fold one event in, exactly once per delivery identity (core/store.py Decisions)."""
        nkey = engine.subject_key(ev)
        asked = time.monotonic()
        return self._serialised(
            nkey, ev["action"] in NODE_ACTIONS, lambda: self._apply(ev, policy, now, nkey, countable, asked)
        )

    def _apply(
        self,
        ev: FaultEvent,
        policy: Policy,
        now: float,
        nkey: str,
        countable: Countable | None,
        asked: float,
    ) -> engine.Outcome:
        """One decision, optimistically: its documents read without a transaction (no lock), its
        writes committed in one batch (all or none) on condition that every document it writes
        is as it was read (its update time) or still absent, the delivery's dedup record created
        only if absent. A commit refused on a condition runs the decision again (:meth:`_serialised`).

        Read inside a transaction, ten instances deciding one node's first lines at once held
        read locks on its documents that each other's commits waited for, until the emulator's
        lock timeout (`pitstop bench ingest`, 50,000 lines / 64 nodes at 10 instances: 54
        deliveries refused after ten "Transaction lock timeout"s each, and a stall).

        First from the documents as this process last saw them (adapters/firestore_snaps.py) and
        without reading the dedup record (its create is conditioned: a duplicate's commit is
        refused); refused, at once again on fresh reads. A decision that waited its turn (``asked``:
        when it asked for it) longer than ``QUEUED_S`` reads its incident again, and the node if
        it named none: a storm's decisions waited seconds in turn, meanwhile other instances
        opened and raised the incidents they had read, and each refused commit cost its writes
        and three reads where one or two find the line counted in memory after all.
        """
        ttl = float(policy.doc["store"]["cache_ttl_s"])
        waited = time.monotonic() - asked
        fresh = min(ttl, waited) if waited > QUEUED_S else ttl
        try:
            return self._decide_event(ev, policy, now, nkey, (ttl, fresh), countable)
        except (*LOST, *STALE):  # refused on its conditions
            with self._lock:
                self.retries += 1
        return self._decide_event(ev, policy, now, nkey, (0.0, 0.0), countable)

    def _decide_event(
        self,
        ev: FaultEvent,
        policy: Policy,
        now: float,
        nkey: str,
        ttls: tuple[float, float],
        countable: Countable | None,
    ) -> engine.Outcome:
        """:meth:`_apply` once: the node document younger than ``ttls[0]`` from the cache, its
        incident (and, for a node that names none, the node and its latest again) younger than ``ttls[1]``
        (0: all read). The delivery's record is read (on fresh reads) only for a line that must
        be decided: one counted in memory is checked against the incident's recent keys, like
        every line the coalescer counts."""
        ttl, fresh = ttls
        key = engine.event_key(ev)
        node_ref, dedup_ref = self.nodes.document(nkey), self.dedup.document(key)
        expiry = dt.datetime.fromtimestamp(now + policy.window("dedup_ttl_h") * 3600, tz=dt.UTC)
        node_snap, inc_snap = self._snap(node_ref, ttl), None
        node_doc = _doc(node_snap, NodeDoc)
        named = node_doc.get("latest_incident") if node_doc else None
        if not named and fresh < ttl and not self.snaps.younger(node_ref.path, fresh):
            node_snap, inc_snap = self.latest_read(nkey)  # another instance may have opened one meanwhile
            node_doc = _doc(node_snap, NodeDoc)
        read = _Read({node_ref.path: node_snap})
        latest = None
        if node_doc and node_doc.get("latest_incident"):
            inc_ref = self.incidents.document(node_doc["latest_incident"])
            latest = read.keep(inc_snap if inc_snap is not None else self._snap(inc_ref, fresh))
        if countable is not None and countable(latest):
            return engine.Outcome("absorbed", incident=latest, coalesced=True)
        if ttl <= 0 and (seen := dedup_ref.get()).exists:
            return engine.Outcome("duplicate", duplicate_of=(seen.to_dict() or {}).get("incident"))
        budgets = _LazyBudgets(self.budgets, lambda ref: self._snap(ref, ttl))
        out = aggregate.decide(
            latest, aggregate.FoldEvent(ev, key), aggregate.Given(now, policy, node_doc, budgets)
        )
        if out.result == "ignored":
            return out
        batch = self.db.batch()
        self._write(batch, commit_of(out, now), budgets, read)
        inc_id = out.incident["id"] if out.incident else None
        batch.create(dedup_ref, {"expire_at": expiry, "incident": inc_id, "node": nkey})
        self._count_writes(1)
        try:
            batch.commit()
        except (*LOST, *STALE):
            self._tally("refused", out.result, ttl, len(batch._write_pbs))
            self.snaps.drop(*read.paths, *budgets.paths)  # another instance wrote them: read them next time
            raise
        self._tally("committed", out.result, ttl, 0)
        for ref, doc, at in read.done:  # a write that changed nothing keeps its older update time
            self.snaps.written(ref, doc, batch.write_results[at].update_time)
        return out

    def _tally(self, how: str, result: str, ttl: float, writes: int) -> None:
        """Count a decision's commit for the bench (``ttl`` 0: decided on fresh reads)."""
        what = f"{how} {result}" + ("" if ttl > 0 else " fresh")
        with self._lock:
            self.commits[what] = self.commits.get(what, 0) + 1
            if how == "refused":
                self.refused += 1
                self.refused_writes += writes

    def _snap(self, ref: Any, ttl: float) -> Any:
        """A document for a decision: as this process saw it less than ``ttl`` ago, or read now."""
        snap = self.snaps.get(ref.path, ttl) if ttl > 0 else None
        if snap is None:
            snap = ref.get()
            self.snaps.put(snap)
        return snap

    # -- remediation steps (actuate) ---------------------------------------------------

    def step_record(self, iid: str, key: str) -> StepRecord | None:
        return _doc(self.incidents.document(iid).collection("steps").document(key).get(), StepRecord)

    def steps(self, iid: str) -> FirestoreStepStore:
        """The incident's step records (``steps/<step>-<op>``), for the step runner."""
        return FirestoreStepStore(self.incidents.document(iid).collection("steps"))

    # -- operator views and actions ----------------------------------------------------

    def get(self, iid: str) -> Incident | None:
        """The incident with its count shards summed (core/store.with_shards)."""
        snap = self.incidents.document(iid).get()
        inc = _doc(snap, Incident)
        return self._summed(inc) if inc is not None else None

    def get_node(self, key: str) -> NodeDoc | None:
        return _doc(self.nodes.document(key).get(), NodeDoc)

    def set_node_fields(self, key: str, fields: NodeFields) -> None:
        """Facts learned while acting (e.g. the reservation block from Compute's host topology)."""
        self.snaps.drop(self.nodes.document(key).path)
        self.nodes.document(key).set(dict(fields), merge=True)
        self._count_writes(1)

    def put_node(self, key: str, doc: NodeDoc) -> None:
        self.snaps.drop(self.nodes.document(key).path)
        self.nodes.document(key).set(dict(doc))

    def list(self, states: Iterable[State] | None = None) -> list[Incident]:
        q: Any = self.incidents
        wanted = sorted(states or ())
        if wanted:
            q = q.where(filter=firestore.FieldFilter("state", "in", wanted))
        docs = [self._summed(d) for d in (s.to_dict() for s in q.stream()) if d]
        return sorted(docs, key=lambda d: d.get("created_at", 0))

    def budget(self, doc_id: str) -> Budget | None:
        return _doc(self.budgets.document(doc_id).get(), Budget)

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> engine.Outcome:
        """Decide a command on the incident (core/store.run) and write its outcome all or nothing.

        Optimistic, like an event's decision (:meth:`_apply`): the documents read as this process
        saw them in the last ``SNAP_S`` seconds (the decision that scheduled a step wrote its
        incident a moment before its start is leased), the writes one batch conditioned on each
        being as read; refused, decided again on fresh reads. Commands that may claim or release
        blast-radius slots take turns in-process on the budgets.
        """

        def once() -> engine.Outcome:
            try:
                return self._decide_once(iid, cmd, policy, now, SNAP_S)
            except (*LOST, *STALE):  # refused on its conditions: read everything again
                with self._lock:
                    self.retries += 1
            try:
                return self._decide_once(iid, cmd, policy, now, 0.0)
            except STALE as exc:  # a contender again: the store's backoff retries it
                raise ValueError(f"incident {iid} changed while it was decided") from exc

        result: engine.Outcome = self._serialised(iid, aggregate.touches_budgets(cmd), once)
        return result

    def _decide_once(
        self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float, ttl: float
    ) -> engine.Outcome:
        uow = _Optimistic(self, ttl)
        try:
            return run(uow, iid, cmd, policy, now)
        except (*LOST, *STALE):
            self.snaps.drop(*uow.read.paths, *uow.budgets.paths)  # another writer: read them next time
            raise

    def _put_budget(self, t: Any, doc_id: str, doc: Budget) -> None:
        """A budget written in a transaction (a release, an ended burst): a decision reads it next,
        not the snapshot this process kept (a hold on it would wait for the sweep's retry)."""
        ref = self.budgets.document(doc_id)
        self.snaps.drop(ref.path)
        t.set(ref, doc)

    def _put(self, t: Any, ref: Any, doc: Incident | NodeDoc, read: _Read | None) -> None:
        """One node or incident write of a decision: conditioned on ``read``, or in a transaction
        (then the cached snapshot is dropped: the next decision reads the document)."""
        if read is not None:
            read.write(t, ref, doc, self.db)
        else:
            self.snaps.drop(ref.path)
            t.set(ref, doc)

    def _write(
        self, t: Any, done: Commit, budgets: _LazyBudgets | None = None, read: _Read | None = None
    ) -> None:
        """Write a decision in its transaction or batch (core/store.commit_of says what): the same
        rule as every other store. A document read outside a transaction (a budget; with ``read``,
        the node and its incident) is written on condition that it is still as read, and one that
        was not read is created. Its notifications are recorded in the outbox with it."""
        for inc in done.incidents:
            ref = self.incidents.document(inc["id"])
            self._put(t, ref, inc, read)
            self._note_resolved(t, inc)
        if done.node is not None:
            self._put(t, self.nodes.document(engine.subject_key(done.node)), done.node, read)
        for doc_id, doc in done.budgets.items():
            ref = self.budgets.document(doc_id)
            if read is not None:  # remembered as written, like the node and incident (written whole)
                read.done.append((ref, doc, len(t._write_pbs)))
            if budgets is None or doc_id not in budgets.read_at:
                self._put_budget(t, doc_id, doc)
            elif budgets.read_at[doc_id] is None:
                t.create(ref, doc)
            else:
                t.update(ref, doc, option=self.db.write_option(last_update_time=budgets.read_at[doc_id]))
        for entry in done.outbox:
            t.set(self.outbox.document(entry["id"]), dict(entry))
        self._count_writes(done.count)


class _Optimistic:
    """The unit of work core/store.run decides in, on Firestore: documents read as this process saw
    them less than ``ttl`` seconds ago (else read), the outcome written in one batch on condition
    that every document it writes is still as read (or still absent)."""

    def __init__(self, store: IncidentStore, ttl: float) -> None:
        self._store, self._ttl = store, ttl
        self.read = _Read({})
        self.budgets = _LazyBudgets(store.budgets, lambda ref: store._snap(ref, ttl))

    def incident(self, iid: str) -> Incident | None:
        return self.read.keep(self._store._snap(self._store.incidents.document(iid), self._ttl))

    def node(self, key: str) -> NodeDoc | None:
        snap = self._store._snap(self._store.nodes.document(key), self._ttl)
        self.read.keep(snap)
        return _doc(snap, NodeDoc)

    def write(self, commit: Commit) -> None:
        store = self._store
        batch = store.db.batch()
        store._write(batch, commit, self.budgets, self.read)
        batch.commit()
        for ref, doc, at in self.read.done:
            store.snaps.written(ref, doc, batch.write_results[at].update_time)
