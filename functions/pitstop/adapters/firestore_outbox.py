"""The outbox of the Firestore store: notifications recorded with the decision that causes them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.core.domain import OutboxEntry


class OutboxRecords:
    """Mixed into the store (adapters/firestore.py), which provides the collection and its counters."""

    outbox: Any  # the outbox collection

    def _count_writes(self, n: int) -> None:
        raise NotImplementedError

    def outbox_put_in(self, t: Any, nid: str, entry: OutboxEntry) -> None:
        """Record an outbox entry in the caller's transaction (committed with its decision or not at all)."""
        t.set(self.outbox.document(nid), dict(entry))
        self._count_writes(1)

    def outbox_add(self, nid: str, entry: OutboxEntry) -> OutboxEntry:
        """Record an outbox entry unless one with this id exists; the stored entry either way."""
        ref = self.outbox.document(nid)
        try:
            ref.create(dict(entry))
        except gexc.AlreadyExists:
            stored: OutboxEntry = ref.get().to_dict() or entry.copy()  # the edge: as its writer wrote it
            return stored
        self._count_writes(1)
        return entry.copy()

    def outbox_mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        """The entry's notification reached the topic; it expires (Firestore TTL) ``keep_s`` later."""
        expire = dt.datetime.fromtimestamp(now + keep_s, tz=dt.UTC)
        fields = {"sent": True, "sent_at": now, "message_id": message_id, "expire_at": expire}
        self.outbox.document(nid).set(fields, merge=True)
        self._count_writes(1)

    def outbox_note_failure(self, nid: str, now: float) -> None:
        """A publish of the entry failed (the sweep retries it without waiting)."""
        self.outbox.document(nid).update({"failed_at": now, "failures": firestore.Increment(1)})
        self._count_writes(1)

    def outbox_unsent(self, created_before: float) -> Iterator[OutboxEntry]:
        """Unsent entries whose publish failed or that were recorded before ``created_before``."""
        q = self.outbox.where(filter=firestore.FieldFilter("sent", "==", False))
        docs = [d for d in (s.to_dict() for s in q.stream()) if d]
        due = [d for d in docs if d.get("failed_at") is not None or d.get("created_at", 0) <= created_before]
        yield from sorted(due, key=lambda d: float(d.get("created_at", 0)))  # oldest first
