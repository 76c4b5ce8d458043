"""The outbox of the Firestore store (core/store.Outbox): notifications recorded before they are
published. A decision's own are written in its commit (adapters/firestore_commit.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.firestore_docs import Shared
from pitstop.core.domain import OutboxEntry
from pitstop.core.store import due


class FirestoreOutbox:
    def __init__(self, shared: Shared) -> None:
        self._coll, self._tally = shared.coll.outbox, shared.tally

    def add(self, nid: str, entry: OutboxEntry) -> OutboxEntry:
        """Record an outbox entry unless one with this id exists; the stored entry either way."""
        ref = self._coll.document(nid)
        try:
            ref.create(dict(entry))
        except gexc.AlreadyExists:
            stored: OutboxEntry = ref.get().to_dict() or entry.copy()  # the edge: as its writer wrote it
            return stored
        self._tally.wrote(1)
        return entry.copy()

    def mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        """The entry's notification reached the topic; it expires (Firestore TTL) ``keep_s`` later."""
        expire = dt.datetime.fromtimestamp(now + keep_s, tz=dt.UTC)
        fields = {"sent": True, "sent_at": now, "message_id": message_id, "expire_at": expire}
        self._coll.document(nid).set(fields, merge=True)
        self._tally.wrote(1)

    def note_failure(self, nid: str, now: float) -> None:
        """A publish of the entry failed (the sweep retries it without waiting)."""
        self._coll.document(nid).update({"failed_at": now, "failures": firestore.Increment(1)})
        self._tally.wrote(1)

    def unsent(self, created_before: float) -> Iterator[OutboxEntry]:
        """Unsent entries whose publish failed or that were recorded before ``created_before``."""
        q = self._coll.where(filter=firestore.FieldFilter("sent", "==", False))
        docs: list[OutboxEntry | None] = [s.to_dict() for s in q.stream()]  # the edge, untyped
        yield from due((d for d in docs if d), created_before)
