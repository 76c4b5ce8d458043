"""Billed Firestore operations of one process, counted at the client's API (``pitstop bench``).

Every path goes through the GAPIC client (the store, the coalescer's cache reads, the sweep),
so wrapping its three document RPCs counts what Firestore would bill: a document read per
document found or missing, at least one read per query, a write per document in a commit.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

SITE_DEPTH = 3  # Pitstop functions named per call site (innermost first)


def collection_of(name: str) -> str:
    """The collection a document path names (its innermost: ``.../incidents/X/counts/Y`` is
    ``counts``), so the bench can say where a storm's operations go."""
    parts = name.split("/documents/", 1)[-1].split("/")
    return parts[-2] if len(parts) >= 2 else parts[0]


def call_site(depth: int = SITE_DEPTH) -> str:
    """The innermost Pitstop functions on the calling thread's stack (``a<b<c``): which part of
    the code an operation served, so a run's operations can be broken down by call site."""
    names: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(names) < depth:
        path = frame.f_code.co_filename
        if "/pitstop/" in path and not path.endswith("firestore_ops.py"):
            names.append(f"{path.rsplit('/', 1)[-1][:-3]}.{frame.f_code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return "<".join(names) or "?"


def added(tallies: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Tallies added key by key (an instance's clients', a fleet's instances')."""
    out: Counter[str] = Counter()
    for tally in tallies:
        out.update(tally)
    return dict(out)


class FirestoreOps:
    """Counts billed document reads and writes at the client's API (every path: store, cache, sweep)."""

    def __init__(self, client: Any) -> None:
        self.reads = self.writes = 0
        self.by_collection: dict[str, int] = {}  # "read:<collection>" / "write:<collection>" -> ops
        self.by_site: dict[str, int] = {}  # "<kind>:<collection> <call site>" -> ops
        self.calls: dict[str, int] = {}  # "get" / "commit" / "query:<collection>" -> requests sent
        self._lock = threading.Lock()
        api = client._firestore_api  # the GAPIC client every Firestore call goes through
        get, commit, query = api.batch_get_documents, api.commit, api.run_query

        def counted_get(*a: Any, **kw: Any) -> Iterator[Any]:
            site = call_site()
            self._call("get")
            for resp in get(*a, **kw):
                if resp.found or resp.missing:
                    where = f"read:{collection_of(resp.found.name or resp.missing)}"
                    self._add(reads=1, where=where, site=site)
                yield resp

        def counted_query(*a: Any, **kw: Any) -> Iterator[Any]:
            docs = 0
            request = kw.get("request") or (a[0] if a else {})
            q = request.get("structured_query") if isinstance(request, dict) else request.structured_query
            frm = q.get("from_", []) if isinstance(q, dict) else getattr(q, "from_", [])
            where = "query:" + ",".join(getattr(f, "collection_id", "?") for f in frm)
            site = call_site()
            self._call(where)
            for resp in query(*a, **kw):
                docs += bool(resp.document)
                yield resp
            self._add(reads=max(docs, 1), where=where, site=site)  # a query is billed at least one read

        def counted_commit(*a: Any, **kw: Any) -> Any:
            request = kw.get("request") or (a[0] if a else {})
            writes = request.get("writes") if isinstance(request, dict) else request.writes
            site = call_site()
            self._call("commit")
            for w in writes or ():
                self._add(writes=1, where=f"write:{collection_of(w.update.name or w.delete)}", site=site)
            return commit(*a, **kw)

        api.batch_get_documents, api.commit, api.run_query = counted_get, counted_commit, counted_query

    def _call(self, what: str) -> None:
        with self._lock:
            self.calls[what] = self.calls.get(what, 0) + 1

    def _add(self, reads: int = 0, writes: int = 0, where: str = "", site: str = "?") -> None:
        with self._lock:
            self.reads += reads
            self.writes += writes
            self.by_collection[where] = self.by_collection.get(where, 0) + reads + writes
            self.by_site[f"{where} {site}"] = self.by_site.get(f"{where} {site}", 0) + reads + writes
