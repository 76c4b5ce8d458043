"""Workflow starts in the Firestore store: one starter at a time leases a step's start, records it,
and the sweep finds the starts whose starter died.

Both writes are optimistic, like a decision's (adapters/firestore.py ``IncidentStore._apply``):
from the incident as this process last read or wrote it (the decision that scheduled the step
wrote it a moment before), written on condition that it is still as it was then (its update
time); refused, read again. A lease and its record then cost a write each and no read, where a
transaction each read the incident first (`pitstop bench ingest`: 2 reads per start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from google.cloud import firestore

from pitstop.adapters.firestore_snaps import STALE, SnapCache
from pitstop.core.domain import Incident, WorkflowRun
from pitstop.core.states import UNCLAIMABLE_STATES, RunState

T = TypeVar("T")
SNAP_S = 5.0  # an incident this process read or wrote this recently is leased from memory


class StartRecords:
    """Mixed into the store (adapters/firestore.py), which provides its collection and transactions."""

    db: Any  # the client
    snaps: SnapCache  # documents as last read or written (adapters/firestore_snaps.py)

    def _incidents(self) -> Any:
        raise NotImplementedError

    def _txn(self) -> Any:
        raise NotImplementedError

    def _count_writes(self, n: int) -> None:
        raise NotImplementedError

    def _serialised(self, nkey: str, claims: bool, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    def _snap(self, ref: Any, ttl: float) -> Any:
        raise NotImplementedError

    def _update_as_read(self, ref: Any, snap: Any, doc: Incident, fields: dict[str, Any]) -> None:
        """Write ``fields`` on condition that the incident is as ``snap`` (raises STALE if not), and
        remember the incident as written."""
        result = ref.update(fields, option=self.db.write_option(last_update_time=snap.update_time))
        self._count_writes(1)
        self.snaps.written(ref, doc, result.update_time)

    def lease_start(self, iid: str, step: int, now: float, lease_s: float = 60.0) -> Incident | None:
        """Claim the right to start the execution of one incident step (one starter at a time)."""
        ref = self._incidents().document(iid)
        tries = iter([SNAP_S])  # from memory first; then, refused, read

        def lease() -> Incident | None:
            snap = self._snap(ref, next(tries, 0.0))
            inc = cast(Incident | None, snap.to_dict() if snap.exists else None)  # as its writers wrote it
            wf = inc.get("workflow") if inc is not None else None
            if inc is None or wf is None or wf.get("step") != step or wf.get("state") != RunState.PENDING:
                return None
            if inc["state"] in UNCLAIMABLE_STATES:  # closed by a person (or failed) before it started
                return None
            if wf.get("lease_until", 0) > now:
                return None
            wf["lease_until"] = now + lease_s
            wf["attempts"] = wf.get("attempts", 0) + 1
            try:
                self._update_as_read(ref, snap, inc, {"workflow": wf})
            except STALE:
                self.snaps.drop(ref.path)
                raise ValueError("the incident changed since it was read") from None  # run again (LOST)
            return inc

        result: Incident | None = self._serialised(iid, False, lease)
        return result

    def record_started(self, iid: str, step: int, execution: str, now: float) -> None:
        ref = self._incidents().document(iid)
        started: WorkflowRun = {"state": RunState.STARTED, "execution": execution, "started_at": now}
        snap = self.snaps.get(ref.path, SNAP_S)  # as leased a moment ago
        inc = cast(Incident | None, snap.to_dict() if snap is not None else None)
        wf: WorkflowRun | None = inc.get("workflow") if inc is not None else None
        if inc is not None and wf is not None and wf.get("step") == step:
            wf.update(started)
            inc["updated_at"] = now
            try:
                return self._update_as_read(ref, snap, inc, {"workflow": wf, "updated_at": now})
            except STALE:
                self.snaps.drop(ref.path)  # changed since: read it in a transaction

        @firestore.transactional
        def txn(t: Any) -> None:
            inc = ref.get(transaction=t).to_dict() or {}
            wf = inc.get("workflow") or {}
            if wf.get("step") == step:
                wf.update(started)
                t.update(ref, {"workflow": wf, "updated_at": now})
                self.snaps.drop(ref.path)
                self._count_writes(1)

        self._serialised(iid, False, lambda: txn(self._txn()))

    def pending_starts(self, now: float) -> list[Incident]:
        """Incidents whose decided workflow step has not been started (crash recovery)."""
        q = self._incidents().where(filter=firestore.FieldFilter("workflow.state", "==", RunState.PENDING))
        return [
            d for d in (s.to_dict() for s in q.stream()) if d and d["workflow"].get("lease_until", 0) <= now
        ]
