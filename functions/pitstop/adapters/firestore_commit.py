"""One decision on Firestore, optimistically: the unit of work core/store.fold and run decide in.

A decision's documents are read without a transaction (no lock), as this process last saw them
if that was recently enough (adapters/firestore_snaps.py), and its writes committed in one
batch (all or none) on condition that every document it writes is as it was read (its update
time) or still absent; an event's delivery record is created only if absent. A commit refused on
a condition is decided again (adapters/firestore.py says when, and on which reads).

Read inside a transaction, ten instances deciding one node's first lines at once held read
locks on its documents that each other's commits waited for, until the emulator's lock timeout
(`pitstop bench ingest`, 50,000 lines / 64 nodes at 10 instances: 54 deliveries refused after
ten "Transaction lock timeout"s each, and a stall).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from google.cloud import firestore

from pitstop.adapters.firestore_counts import FirestoreCounts
from pitstop.adapters.firestore_docs import LOST, Shared, doc
from pitstop.adapters.firestore_latest import LatestIncidents, Snapshot
from pitstop.adapters.firestore_snaps import STALE
from pitstop.core import engine
from pitstop.core.domain import Budget, Incident, NodeDoc
from pitstop.core.store import Commit, Delivery


class LazyBudgets(Mapping[str, Budget | None]):
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
            self._cache[key] = doc(snap, Budget)
            self.read_at[key] = snap.update_time if snap.exists else None
        return self._cache[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class ReadSet:
    """Documents a decision read outside a transaction, by path: what each held and when it was
    written, so that its write is conditioned on them."""

    def __init__(self) -> None:
        self._snaps: dict[str, Any] = {}
        # What the batch writes, with each write's place in it (its result's): the cache's.
        self.done: list[tuple[Any, Incident | NodeDoc | Budget, int]] = []

    def keep(self, snap: Any) -> Incident | None:
        self._snaps[snap.reference.path] = snap
        return doc(snap, Incident)

    @property
    def paths(self) -> list[str]:
        return list(self._snaps)

    def write(self, batch: Any, ref: Any, new: Incident | NodeDoc, db: Any) -> None:
        """Replace the document on condition that it is as read (fields it lost deleted), or
        create it if it was absent or never read (a new incident)."""
        self.done.append((ref, new, len(batch._write_pbs)))  # the client's list of the batch's writes
        snap = self._snaps.get(ref.path)
        if snap is None or not snap.exists:
            batch.create(ref, dict(new))
            return
        gone = {k: firestore.DELETE_FIELD for k in snap.to_dict() or {} if k not in new}
        batch.update(ref, {**new, **gone}, option=db.write_option(last_update_time=snap.update_time))


class Writer:
    """A decision's commit (core/store.Commit) as one batch's writes: the same rule for every
    decision, each document it read conditioned on being as read, its notifications recorded in
    the outbox and a resolution in the resolved feed with it."""

    def __init__(self, shared: Shared, counts: FirestoreCounts) -> None:
        self._s, self._counts = shared, counts

    def write(self, batch: Any, done: Commit, budgets: LazyBudgets, read: ReadSet) -> None:
        coll, db = self._s.coll, self._s.db
        for inc in done.incidents:
            read.write(batch, coll.incidents.document(inc["id"]), inc, db)
            self._counts.note_resolved(batch, inc)
        if done.node is not None:
            read.write(batch, coll.nodes.document(engine.subject_key(done.node)), done.node, db)
        for doc_id, budget in done.budgets.items():
            self._budget(batch, doc_id, budget, budgets, read)
        for entry in done.outbox:
            batch.set(coll.outbox.document(entry["id"]), dict(entry))
        if (d := done.delivery) is not None:
            expiry = dt.datetime.fromtimestamp(d.expire_at, tz=dt.UTC)
            batch.create(
                coll.dedup.document(d.key), {"expire_at": expiry, "incident": d.incident, "node": d.node}
            )
        self._s.tally.wrote(done.count)

    def _budget(self, batch: Any, doc_id: str, budget: Budget, budgets: LazyBudgets, read: ReadSet) -> None:
        """A budget read outside the batch is written on condition that it is still as read (created
        if it was absent); one not read is written whole, and the next decision reads it (not the
        snapshot this process kept: a hold on it would wait for the sweep's retry)."""
        ref = self._s.coll.budgets.document(doc_id)
        read.done.append((ref, budget, len(batch._write_pbs)))  # remembered as written, like the node
        if doc_id not in budgets.read_at:
            self._s.snaps.drop(ref.path)
            batch.set(ref, budget)
        elif budgets.read_at[doc_id] is None:
            batch.create(ref, budget)
        else:
            batch.update(
                ref, budget, option=self._s.db.write_option(last_update_time=budgets.read_at[doc_id])
            )


class Optimistic:
    """The unit of work (core/store.UnitOfWork): the node and budgets as this process saw them less
    than ``ttl`` seconds ago (0: read them), the incident less than ``fresh`` ago (a decision that
    waited its turn reads it again, and the node too if it names none: another instance may have
    opened one meanwhile); an event's delivery record read only on fresh reads (``ttl`` 0), since
    its create is conditioned anyway. ``tally``: count the commit by its result, for the bench."""

    def __init__(
        self,
        parts: tuple[Shared, Writer, LatestIncidents],
        ttl: float,
        fresh: float | None = None,
        tally: bool = False,
    ) -> None:
        self._s, self._writer, self._latest = parts
        self._ttl, self._fresh = ttl, ttl if fresh is None else fresh
        self._tally = tally
        self.read = ReadSet()
        self.budgets = LazyBudgets(self._s.coll.budgets, lambda ref: self._s.snap(ref, ttl))
        self._named: Snapshot | None = None  # the node's latest incident, read with it

    def node(self, key: str) -> NodeDoc | None:
        ref = self._s.coll.nodes.document(key)
        snap = self._s.snap(ref, self._ttl)
        node = doc(snap, NodeDoc)
        stale = self._fresh < self._ttl and not self._s.snaps.younger(ref.path, self._fresh)
        if not (node and node.get("latest_incident")) and stale:
            snap, self._named = self._latest.read(key)
            node = doc(snap, NodeDoc)
        self.read.keep(snap)
        return node

    def incident(self, iid: str) -> Incident | None:
        named = self._named
        if named is not None and named.id == iid:
            return self.read.keep(named)
        return self.read.keep(self._s.snap(self._s.coll.incidents.document(iid), self._fresh))

    def delivered(self, key: str) -> Delivery | None:
        if self._ttl > 0:
            return None
        seen = self._s.coll.dedup.document(key).get()
        if not seen.exists:
            return None
        d = seen.to_dict() or {}
        expiry = d.get("expire_at")
        at = expiry.timestamp() if isinstance(expiry, dt.datetime) else 0.0
        return Delivery(key, d.get("incident"), str(d.get("node") or ""), at)

    def write(self, commit: Commit) -> None:
        batch = self._s.db.batch()
        self._writer.write(batch, commit, self.budgets, self.read)
        fresh, tally = self._ttl <= 0, self._s.tally
        try:
            batch.commit()
        except (*LOST, *STALE):  # another writer came first: read its documents next time
            if self._tally:
                tally.commit("refused", commit.result, fresh, len(batch._write_pbs))
            self._s.snaps.drop(*self.read.paths, *self.budgets.paths)
            raise
        if self._tally:
            tally.commit("committed", commit.result, fresh, 0)
        for ref, written, at in self.read.done:  # a write that changed nothing keeps its older update time
            self._s.snaps.written(ref, written, batch.write_results[at].update_time)
