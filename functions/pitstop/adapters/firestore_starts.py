"""Workflow starts in the Firestore store: one starter at a time leases a step's start, records it,
and the sweep finds the starts whose starter died."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from google.cloud import firestore

from pitstop.core.domain import Incident
from pitstop.core.states import UNCLAIMABLE_STATES, RunState

T = TypeVar("T")


class StartRecords:
    """Mixed into the store (adapters/firestore.py), which provides its collection and transactions."""

    def _incidents(self) -> Any:
        raise NotImplementedError

    def _txn(self) -> Any:
        raise NotImplementedError

    def _count_writes(self, n: int) -> None:
        raise NotImplementedError

    def _serialised(self, nkey: str, claims: bool, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    def lease_start(self, iid: str, step: int, now: float, lease_s: float = 60.0) -> Incident | None:
        """Claim the right to start the execution of one incident step (one starter at a time)."""
        ref = self._incidents().document(iid)

        @firestore.transactional
        def txn(t: Any) -> Incident | None:
            snap = ref.get(transaction=t)
            inc = cast(
                Incident | None, snap.to_dict() if snap.exists else None
            )  # the edge: as its writers wrote it
            wf = inc.get("workflow") if inc is not None else None
            if inc is None or wf is None or wf.get("step") != step or wf.get("state") != RunState.PENDING:
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

        result: Incident | None = self._serialised(iid, False, lambda: txn(self._txn()))
        return result

    def record_started(self, iid: str, step: int, execution: str, now: float) -> None:
        ref = self._incidents().document(iid)

        @firestore.transactional
        def txn(t: Any) -> None:
            inc = ref.get(transaction=t).to_dict() or {}
            wf = inc.get("workflow") or {}
            if wf.get("step") == step:
                wf.update({"state": RunState.STARTED, "execution": execution, "started_at": now})
                t.update(ref, {"workflow": wf, "updated_at": now})
                self._count_writes(1)

        self._serialised(iid, False, lambda: txn(self._txn()))

    def pending_starts(self, now: float) -> list[Incident]:
        """Incidents whose decided workflow step has not been started (crash recovery)."""
        q = self._incidents().where(filter=firestore.FieldFilter("workflow.state", "==", RunState.PENDING))
        return [
            d for d in (s.to_dict() for s in q.stream()) if d and d["workflow"].get("lease_until", 0) <= now
        ]
