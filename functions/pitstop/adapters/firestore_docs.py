"""What every part of the Firestore store shares: the client, the collections, the snapshots this
process last read or wrote, and the bench's tally (adapters/firestore.py says how the store is
divided)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore_snaps import SnapCache
from pitstop.adapters.store_tally import Tally

D = TypeVar("D")

# A write that lost: to a contender (Aborted; ValueError once a transaction's attempts are spent),
# to a document changed since it was read (FailedPrecondition; AlreadyExists, a Conflict, if created).
LOST = (ValueError, gexc.Conflict, gexc.FailedPrecondition)


def doc(snap: Any, kind: type[D]) -> D | None:
    """A stored document as the type its writers wrote (``kind``: Incident, NodeDoc, Budget, ...),
    or None if there is none. The edge: Firestore hands back untyped dicts."""
    return cast(D | None, snap.to_dict() if snap.exists else None)


@dataclass(frozen=True)
class Collections:
    """The store's collections (``<prefix>_...``)."""

    nodes: Any  # one per node: latest incident, remediation history, cooldown clocks
    incidents: Any  # each with its ``steps`` subcollection (the step runner's records)
    budgets: Any  # blast-radius slots per scope
    dedup: Any  # one record per decided delivery, ``expire_at`` for the TTL policy infra/ deploys
    outbox: Any  # notifications until published (services/outbox.py)
    resolved: Any  # the resolved feed (adapters/firestore_counts.py)
    counts: Any  # count pages (adapters/firestore_counts.py)
    jobs: Any  # a run's one requeue
    job_restarts: Any  # the job-disruption budget

    @classmethod
    def of(cls, client: firestore.Client, prefix: str) -> Collections:
        """Each collection named ``<prefix>_<field>``."""
        return cls(*(client.collection(f"{prefix}_{f.name}") for f in fields(cls)))


@dataclass(frozen=True)
class Shared:
    """What the store's parts are given: one client, its collections, one snapshot cache (a
    document one part wrote is the next decision's to start from) and one tally."""

    db: Any  # a firestore.Client
    coll: Collections
    snaps: SnapCache
    tally: Tally

    def snap(self, ref: Any, ttl: float) -> Any:
        """A document for a decision: as this process saw it less than ``ttl`` ago, or read now."""
        snap = self.snaps.get(ref.path, ttl) if ttl > 0 else None
        if snap is None:
            snap = ref.get()
            self.snaps.put(snap)
        return snap
