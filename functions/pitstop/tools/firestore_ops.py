"""Billed Firestore operations of one process, counted at the client's API (``pitstop bench``).

Every path goes through the GAPIC client (the store, the coalescer's cache reads, the sweep),
so wrapping its three document RPCs counts what Firestore would bill: a document read per
document found or missing, at least one read per query, a write per document in a commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


class FirestoreOps:
    """Counts billed document reads and writes at the client's API (every path: store, cache, sweep)."""

    def __init__(self, client: Any) -> None:
        self.reads = self.writes = 0
        self._lock = threading.Lock()
        api = client._firestore_api  # the GAPIC client every Firestore call goes through
        get, commit, query = api.batch_get_documents, api.commit, api.run_query

        def counted_get(*a: Any, **kw: Any) -> Iterator[Any]:
            for resp in get(*a, **kw):
                if resp.found or resp.missing:
                    self._add(reads=1)
                yield resp

        def counted_query(*a: Any, **kw: Any) -> Iterator[Any]:
            docs = 0
            for resp in query(*a, **kw):
                docs += bool(resp.document)
                yield resp
            self._add(reads=max(docs, 1))  # a query is billed at least one read

        def counted_commit(*a: Any, **kw: Any) -> Any:
            request = kw.get("request") or (a[0] if a else {})
            writes = request.get("writes") if isinstance(request, dict) else request.writes
            self._add(writes=len(writes or ()))
            return commit(*a, **kw)

        api.batch_get_documents, api.commit, api.run_query = counted_get, counted_commit, counted_query

    def _add(self, reads: int = 0, writes: int = 0) -> None:
        with self._lock:
            self.reads += reads
            self.writes += writes
