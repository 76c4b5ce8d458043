"""Per-job records of the Firestore store: a run's one requeue, and the job-disruption budget."""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.core import remediation


class JobRecords:
    """Mixed into the store (adapters/firestore.py), which provides the client and its counters."""

    db: Any  # a firestore.Client
    prefix: str

    def _count_writes(self, n: int) -> None:
        raise NotImplementedError

    def claim_job_restart(self, job_key: str, run_key: str, now: float, cap: int, window_s: float) -> bool:
        """The job-disruption budget in one transaction on the job's record (remediation.admit_restart)."""
        ref = self.db.collection(f"{self.prefix}_job_restarts").document(job_key)

        @firestore.transactional
        def claim(t: Any) -> bool:
            snap = ref.get(transaction=t)
            ok, doc = remediation.admit_restart(
                snap.to_dict() if snap.exists else None, run_key, now, cap, window_s
            )
            t.set(ref, doc)
            return ok

        result: bool = claim(self.db.transaction())
        self._count_writes(1)
        return result

    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool:
        """A gang moves once per fault: claim the requeue of one run of a job, whatever the time.

        ``key`` names the cluster, the job and its run (pitstop.core.ids.requeue_key). The first
        incident to claim a run requeues it, and its own retries may again (the Slurm command is
        replayed, not repeated); any other incident finds the run taken. A later run of the job
        has another key.
        """
        ref = self.db.collection(f"{self.prefix}_jobs").document(key)
        try:
            ref.create({"incident": incident, "at": now})
            self._count_writes(1)
            return True
        except gexc.Conflict:
            cur = ref.get().to_dict() or {}
            return bool(cur.get("incident") == incident)
