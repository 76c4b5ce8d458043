"""Storm counts of the Firestore store: count shards in pages, the resolved feed, and the reads
that refresh a coalescer's cache (an incident as decided; a node's latest incident, whose grouped
lookups are adapters/firestore_latest.py's): core/store.Counts.

``<prefix>_counts/{page}``: an ingest instance's page of up to PAGE_SHARDS shards (services/
coalesce.py), one per node state, each holding its totals for one incident (core/store.py
``with_shards``: Google's distributed counter, https://cloud.google.com/firestore/docs/solutions/
counters), in a field named after the incident and the shard; ``incidents`` lists the incidents
the page counts for, so a reader finds an incident's shards with one ``array-contains`` query
(served by Firestore's automatic single-field index). An instance writes every shard due in
one page with one ``set(merge=True)`` of those fields: one write per page and flush interval,
not one per node; no read, no transaction, so ten instances counting into one incident do
not contend: each writes its own page.

``<prefix>_resolved/{iid}``: a record per incident written RESOLVED, in the transaction that
resolves it (``expire_at`` for the Firestore TTL policy that infra/ deploys). An instance asks for
the records since its last look, one query per look, billed one read when nothing matched
(https://cloud.google.com/firestore/pricing: "a minimum charge of one document read for each
query"), instead of reading every incident it counts lines for to see whether it stopped absorbing.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zlib
from collections.abc import Mapping
from typing import Any, cast

from google.api_core.retry import Retry
from google.cloud import firestore

from pitstop.adapters.firestore_docs import Shared
from pitstop.adapters.firestore_latest import LatestIncidents
from pitstop.core.domain import CountShard, Incident, Resolution
from pitstop.core.store import COUNT_PAGE_KEEP_S, resolution, with_shards

PAGES_PER_COMMIT = 8  # a commit's request stays far below Firestore's 10 MiB (a page <= 1 MiB)


def _field(iid: str, shard: str) -> str:
    """A shard's field in its page: the incident first, so a reader unpacks only its own."""
    return f"{iid}~{shard}"


def _pack(totals: CountShard) -> bytes:
    """One field, one index entry (a map of maps would index every count, past the 40,000 entries
    a document may have: https://cloud.google.com/firestore/quotas#indexes); compressed, so a
    page of PAGE_SHARDS shards stays well inside a document's 1 MiB."""
    return zlib.compress(json.dumps(totals, separators=(",", ":")).encode())


def _unpack(blob: bytes) -> CountShard:
    return cast(CountShard, json.loads(zlib.decompress(blob)))  # written by _pack: the edge


# The feed is read on every tick and once more at shutdown, where Cloud Run allows 10 s after SIGTERM:
# a look that cannot finish in a few seconds is skipped (the next tick, or the cache's TTL, covers
# it) rather than retried for the client's default 300 s, which held a stopping process that long.
FEED_TIMEOUT_S = 5.0


class FirestoreCounts:
    """Count pages, the resolved feed and the cache's reads (core/store.Counts), given the store's
    client, collections, cache and tally, and its grouped latest-incident lookups."""

    def __init__(self, shared: Shared, latest: LatestIncidents) -> None:
        self._s, self._latest = shared, latest

    def put_shards(self, pages: Mapping[str, Mapping[str, CountShard]]) -> None:
        """Each page's due shards in one ``set(merge=True)``, with the page's ``expire_at`` (a
        timestamp, as a TTL policy's field must be: firebase.google.com/docs/firestore/ttl)
        moved on to COUNT_PAGE_KEEP_S from now."""
        items = list(pages.items())
        for at in range(0, len(items), PAGES_PER_COMMIT):
            batch = self._s.db.batch()
            now = time.time()
            expiry = dt.datetime.fromtimestamp(now + COUNT_PAGE_KEEP_S, tz=dt.UTC)
            for page, shards in items[at : at + PAGES_PER_COMMIT]:
                fields = {_field(t["incident"], shard): _pack(t) for shard, t in shards.items()}
                iids = sorted({t["incident"] for t in shards.values()})
                doc = {"shards": fields, "incidents": firestore.ArrayUnion(iids), "at": now}
                doc["expire_at"] = expiry
                batch.set(self._s.coll.counts.document(page), doc, merge=True)  # only these shards' fields
            batch.commit()
            self._s.tally.wrote(len(items[at : at + PAGES_PER_COMMIT]))

    def as_decided(self, iid: str) -> Incident | None:
        snap = self._s.coll.incidents.document(iid).get()
        self._s.snaps.put(snap)  # a decision that follows need not read it again
        return cast(Incident | None, snap.to_dict() if snap.exists else None)  # the edge: untyped dicts

    def latest(self, nkey: str) -> Incident | None:
        """The node's latest incident as decided, grouped with other nodes' first contacts."""
        return self._latest.incident(nkey)

    def resolved_since(self, since: float) -> list[Resolution]:
        q = self._s.coll.resolved.where(filter=firestore.FieldFilter("at", ">=", since))
        bounded = Retry(initial=0.1, maximum=1.0, timeout=FEED_TIMEOUT_S)
        stream = q.stream(retry=bounded, timeout=FEED_TIMEOUT_S)
        docs: list[Resolution | None] = [s.to_dict() for s in stream]  # the edge, untyped
        return [d for d in docs if d]

    def summed(self, inc: Incident) -> Incident:
        """The incident with its shards' counts added (one query: at least one read, one per page)."""
        where = firestore.FieldFilter("incidents", "array_contains", inc["id"])
        prefix = _field(inc["id"], "")
        shards = [
            _unpack(blob)
            for page in self._s.coll.counts.where(filter=where).stream()
            for name, blob in ((page.to_dict() or {}).get("shards") or {}).items()
            if name.startswith(prefix)
        ]
        return with_shards(inc, shards)

    def note_resolved(self, t: Any, inc: Incident) -> None:
        """In the transaction or batch that writes ``inc``: its resolved feed record, if it is RESOLVED."""
        rec = resolution(inc, time.time())
        if rec is None:
            return
        rec["expire_at"] = dt.datetime.fromtimestamp(rec["expire_at"], tz=dt.UTC)
        t.set(self._s.coll.resolved.document(inc["id"]), rec)
        self._s.tally.wrote(1)
