"""Node, budget and job documents of the Firestore store (core/store.Records): what remediation
reads and writes beside incidents. A decision writes nodes and budgets with its incident
(adapters/firestore_commit.py); these are the reads and the writes made outside a decision."""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore_docs import Shared, doc
from pitstop.core import remediation
from pitstop.core.domain import Budget, NodeDoc, NodeFields


class FirestoreRecords:
    def __init__(self, shared: Shared) -> None:
        self._s = shared

    def node(self, key: str) -> NodeDoc | None:
        return doc(self._s.coll.nodes.document(key).get(), NodeDoc)

    def put_node(self, key: str, node: NodeDoc) -> None:
        ref = self._s.coll.nodes.document(key)
        self._s.snaps.drop(ref.path)
        ref.set(dict(node))

    def set_node_fields(self, key: str, fields: NodeFields) -> None:
        """Facts learned while acting (e.g. the reservation block from Compute's host topology)."""
        ref = self._s.coll.nodes.document(key)
        self._s.snaps.drop(ref.path)
        ref.set(dict(fields), merge=True)
        self._s.tally.wrote(1)

    def budget(self, doc_id: str) -> Budget | None:
        return doc(self._s.coll.budgets.document(doc_id).get(), Budget)

    def claim_job_restart(self, job_key: str, run_key: str, now: float, cap: int, window_s: float) -> bool:
        """The job-disruption budget in one transaction on the job's record (remediation.admit_restart)."""
        ref = self._s.coll.job_restarts.document(job_key)

        @firestore.transactional
        def claim(t: Any) -> bool:
            snap = ref.get(transaction=t)
            ok, rec = remediation.admit_restart(
                snap.to_dict() if snap.exists else None, run_key, now, cap, window_s
            )
            t.set(ref, rec)
            return ok

        result: bool = claim(self._s.db.transaction())
        self._s.tally.wrote(1)
        return result

    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool:
        """A gang moves once per fault: claim the requeue of one run of a job, whatever the time.

        ``key`` names the cluster, the job and its run (pitstop.core.ids.requeue_key). The first
        incident to claim a run requeues it, and its own retries may again (the Slurm command is
        replayed, not repeated); any other incident finds the run taken. A later run of the job
        has another key.
        """
        ref = self._s.coll.jobs.document(key)
        try:
            ref.create({"incident": incident, "at": now})
            self._s.tally.wrote(1)
            return True
        except gexc.Conflict:
            cur = ref.get().to_dict() or {}
            return bool(cur.get("incident") == incident)
