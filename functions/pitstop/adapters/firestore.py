"""The incident store on Firestore: every decision is all or nothing (one batch conditioned on
what it read: adapters/firestore_commit.py).

Collections (``<prefix>_...``, adapters/firestore_docs.py): ``nodes`` (one per node: latest
incident, remediation history, cooldown clocks), ``incidents`` (each with its ``steps``),
``budgets`` (blast-radius slots per scope), ``dedup`` (one record per decided delivery, with an
``expire_at`` field for the Firestore TTL policy that infra/ deploys), ``outbox`` (notifications
to publish, each recorded with the decision that causes it; see services/outbox.py),
``resolved`` and ``counts`` (storm counts; see adapters/firestore_counts.py), ``jobs`` and
``job_restarts``.

Divided by responsibility into parts the store holds (composition; each given the client, the
collections, the snapshot cache and the tally it needs, adapters/firestore_docs.Shared):

- this module: the port's decisions and incident reads, and the turns decisions take in-process;
- adapters/firestore_commit.py: one decision's reads and its conditioned batch (the unit of work
  core/store.fold and run decide in, so the decision itself is written once, in core);
- adapters/firestore_counts.py (with adapters/firestore_latest.py's grouped lookups): the
  ``counts`` sub-port; adapters/firestore_outbox.py: ``outbox``; adapters/firestore_records.py:
  ``records`` (nodes, budgets, jobs); adapters/firestore_snaps.py: documents as last seen.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.cloud import firestore

from pitstop.adapters.firestore_commit import Optimistic, Writer
from pitstop.adapters.firestore_counts import FirestoreCounts
from pitstop.adapters.firestore_docs import LOST, Collections, Shared, doc
from pitstop.adapters.firestore_latest import LatestIncidents
from pitstop.adapters.firestore_outbox import FirestoreOutbox
from pitstop.adapters.firestore_records import FirestoreRecords
from pitstop.adapters.firestore_snaps import STALE, SnapCache
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.adapters.store_tally import Tally
from pitstop.core import aggregate, engine
from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.aggregate import Countable
from pitstop.core.domain import FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.states import RunState
from pitstop.core.store import EVERY, InStates, Query, fold, oldest_first, run

T = TypeVar("T")

# Contended documents (one node during a storm) refuse commits. A retry at once meets the same
# contenders again (a livelock: five instances absorbing into one incident kept failing for tens
# of seconds), so a decision is tried and then again after an exponentially growing, fully
# jittered pause (up to RETRIES tries, pauses capped at BACKOFF_CAP_S).
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


class Turns:
    """Decisions of this process take turns per node (and, if they may claim blast-radius slots,
    across nodes); one that lost to another instance runs again after a jittered pause."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self._node_locks = [threading.RLock() for _ in range(LOCK_STRIPES)]
        # Only node actions claim blast-radius slots; their decisions all touch the same budget
        # documents, so inside one instance they take turns instead of refusing each other.
        self._claim_lock = threading.Lock()

    def serialised(self, nkey: str, claims: bool, fn: Callable[[], T]) -> T:
        """Run one decision for a node: in turn with this process's others on that node.

        A storm on one node lands on few instances, so taking turns in-process removes most
        refusals; across instances Firestore's conditions decide, and a decision that loses (to a
        contender, or to a budget written since it was read) is retried after a fully jittered
        exponential pause. ``claims``: it may claim blast-radius slots, whose documents every node
        shares, so such decisions also take turns across nodes within the process.
        """
        for attempt in range(RETRIES):
            try:
                lock = self._node_locks[hash(nkey) % LOCK_STRIPES]
                with lock, self._claim_lock if claims else contextlib.nullcontext():
                    return fn()
            except LOST:
                if attempt == RETRIES - 1:
                    raise
                self._tally.retried()
                pause = min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt)
                time.sleep(_JITTER.uniform(0, pause))
        raise AssertionError("unreachable")


class IncidentStore:
    """core/store.IncidentStore on Firestore."""

    def __init__(self, client: firestore.Client, prefix: str = "pitstop") -> None:
        self.db: Any = client  # the client (its project names the store in reports)
        self.collections = Collections.of(client, prefix)
        self.snaps = SnapCache()  # node and incident documents as last read or written here
        self.tally = Tally()  # `pitstop bench ingest` reads it
        shared = Shared(client, self.collections, self.snaps, self.tally)
        self.latest = LatestIncidents(shared)  # first contacts asked at once share two gets
        self.counts = FirestoreCounts(shared, self.latest)
        self.outbox = FirestoreOutbox(shared)
        self.records = FirestoreRecords(shared)
        self._parts = (shared, Writer(shared, self.counts), self.latest)
        self._turns = Turns(self.tally)

    # -- decisions -----------------------------------------------------------------------------

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> engine.Outcome:
        """Fold one event in, exactly once per delivery identity (core/store.fold)."""
        nkey = engine.subject_key(ev)
        asked = time.monotonic()
        claims = ev["action"] in NODE_ACTIONS
        return self._turns.serialised(nkey, claims, lambda: self._apply(ev, policy, now, countable, asked))

    def _apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None, asked: float
    ) -> engine.Outcome:
        """One event's decision: first from the documents as this process last saw them
        (adapters/firestore_snaps.py) and without reading the dedup record (its create is
        conditioned: a duplicate's commit is refused); refused, at once again on fresh reads.

        A decision that waited its turn (``asked``: when it asked for it) longer than ``QUEUED_S``
        reads its incident again, and the node if it named none: a storm's decisions waited
        seconds in turn, meanwhile other instances opened and raised the incidents they had read,
        and each refused commit cost its writes and three reads where one or two find the line
        counted in memory after all.
        """
        ttl = float(policy.doc["store"]["cache_ttl_s"])
        waited = time.monotonic() - asked
        fresh = min(ttl, waited) if waited > QUEUED_S else ttl
        try:
            return fold(Optimistic(self._parts, ttl, fresh, tally=True), ev, policy, now, countable)
        except (*LOST, *STALE):  # refused on its conditions
            self.tally.retried()
        return fold(Optimistic(self._parts, 0.0, tally=True), ev, policy, now, countable)

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> engine.Outcome:
        """Decide a command on the incident (core/store.run) and write its outcome all or nothing.

        Optimistic, like an event's decision: the documents read as this process saw them in the
        last ``SNAP_S`` seconds (the decision that scheduled a step wrote its incident a moment
        before its start is leased), the writes one batch conditioned on each being as read;
        refused (on its write conditions, or a command refused on what was read), decided again
        on fresh reads. Commands that may claim or release blast-radius
        slots take turns in-process on the budgets.
        """

        def once() -> engine.Outcome:
            try:
                out = run(Optimistic(self._parts, SNAP_S), iid, cmd, policy, now)
                if out.result != "refused":
                    return out
                # a refusal writes nothing, so no write condition catches a stale read: a step's
                # claim refused as "superseded by step 1" on this process's own copy of a moment
                # ago, when another instance had raised the incident to step 2 since (seen in CI:
                # the step's execution ended, the incident was failed and paged)
            except (*LOST, *STALE):  # refused on its conditions: read everything again
                self.tally.retried()
            try:
                return run(Optimistic(self._parts, 0.0), iid, cmd, policy, now)
            except STALE as exc:  # a contender again: the store's backoff retries it
                raise ValueError(f"incident {iid} changed while it was decided") from exc

        return self._turns.serialised(iid, aggregate.touches_budgets(cmd), once)

    # -- reads ---------------------------------------------------------------------------------

    def get(self, iid: str) -> Incident | None:
        """The incident with its count shards summed (core/store.with_shards)."""
        inc = doc(self.collections.incidents.document(iid).get(), Incident)
        return self.counts.summed(inc) if inc is not None else None

    def query(self, where: Query = EVERY) -> list[Incident]:
        """The database narrows by state (the lease is compared here: no composite index needed)."""
        q = self.collections.incidents
        if not isinstance(where, InStates):  # StartDue
            q = q.where(filter=firestore.FieldFilter("workflow.state", "==", RunState.PENDING))
        elif where.states:
            q = q.where(filter=firestore.FieldFilter("state", "in", sorted(where.states)))
        docs = [d for d in (doc(s, Incident) for s in q.stream()) if d is not None and where.matches(d)]
        return oldest_first(map(self.counts.summed, docs)) if isinstance(where, InStates) else docs

    def steps(self, iid: str) -> FirestoreStepStore:
        """The incident's step records (``steps/<step>-<op>``), for the step runner."""
        return FirestoreStepStore(self.collections.incidents.document(iid).collection("steps"))
