"""Storm counts of the Firestore store: count shards beside each incident, and the resolved feed.

``<prefix>_incidents/{iid}/counts/{shard}``: one document per writer (a node state of one ingest
instance) holding its totals, written whole without a read (core/store.py ``with_shards``: Google's
distributed counter, https://cloud.google.com/firestore/docs/solutions/counters). A write that
only sets a document needs no read and no transaction, so ten instances merging into one incident
do not contend: each writes its own document.

``<prefix>_resolved/{iid}``: a record per incident written RESOLVED, in the transaction that
resolves it (``expire_at`` for the Firestore TTL policy that infra/ deploys). An instance asks for
the records since its last look, one query per look, billed one read when nothing matched
(https://cloud.google.com/firestore/pricing: "a minimum charge of one document read for each
query"), instead of reading every incident it counts lines for to see whether it stopped absorbing.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, cast

from google.api_core.retry import Retry
from google.cloud import firestore

from pitstop.adapters.firestore_snaps import SnapCache
from pitstop.core.domain import CountShard, Incident, Resolution
from pitstop.core.store import resolution, with_shards

# The feed is read on every tick and once more at shutdown, where Cloud Run allows 10 s after SIGTERM:
# a look that cannot finish in a few seconds is skipped (the next tick, or the cache's TTL, covers
# it) rather than retried for the client's default 300 s, which held a stopping process that long.
FEED_TIMEOUT_S = 5.0


class CountShards:
    """Mixed into the store (adapters/firestore.py), which provides the collections and counters."""

    incidents: Any  # the incidents collection
    resolved: Any  # the resolved feed's collection
    snaps: SnapCache  # documents as last read or written (adapters/firestore_snaps.py)

    def _count_writes(self, n: int) -> None:
        raise NotImplementedError

    def _shards(self, iid: str) -> Any:
        return self.incidents.document(iid).collection("counts")

    def put_count_shard(self, iid: str, shard: str, totals: CountShard) -> None:
        self._shards(iid).document(shard).set(dict(totals))
        self._count_writes(1)

    def incident_as_decided(self, iid: str) -> Incident | None:
        snap = self.incidents.document(iid).get()
        self.snaps.put(snap)  # a decision that follows need not read it again
        return cast(Incident | None, snap.to_dict() if snap.exists else None)  # the edge: untyped dicts

    def resolved_since(self, since: float) -> list[Resolution]:
        q = self.resolved.where(filter=firestore.FieldFilter("at", ">=", since))
        bounded = Retry(initial=0.1, maximum=1.0, timeout=FEED_TIMEOUT_S)
        stream = q.stream(retry=bounded, timeout=FEED_TIMEOUT_S)
        docs: list[Resolution | None] = [s.to_dict() for s in stream]  # the edge, untyped
        return [d for d in docs if d]

    def _summed(self, inc: Incident) -> Incident:
        """The incident with its shards' counts added (one query: at least one read)."""
        shards: list[CountShard | None] = [s.to_dict() for s in self._shards(inc["id"]).stream()]  # the edge
        return with_shards(inc, (d for d in shards if d))

    def _note_resolved(self, t: Any, inc: Incident) -> None:
        """In the transaction that writes ``inc``: its resolved feed record, if it is RESOLVED."""
        rec = resolution(inc, time.time())
        if rec is None:
            return
        rec["expire_at"] = dt.datetime.fromtimestamp(rec["expire_at"], tz=dt.UTC)
        t.set(self.resolved.document(inc["id"]), rec)
        self._count_writes(1)
