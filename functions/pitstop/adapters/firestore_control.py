"""The runtime control in Firestore: one document, ``<prefix>_control/current``, and its audit
records, ``<prefix>_control_changes/<v00000042>`` (core/control.py). A change reads the document,
decides and writes both in one transaction, so two people's changes never lose one another.

A transaction that loses to another for all of the client's own attempts (it retries an Aborted
commit at once, five times) is run again after a growing wait, as Firestore's contention guidance
asks (cloud.google.com/firestore/docs/best-practices#transactions_and_contention): a person's
`pitstop silence` beside another's must land, not fail on the race."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters import retry
from pitstop.core.control import Change, Control, ControlDoc, as_changes


def _contended(exc: Exception) -> bool:
    """Lost to another writer: the client's transaction spent its attempts on Aborted commits (it
    raises ValueError from the last one, google/cloud/firestore_v1/transaction.py), or one Aborted."""
    return isinstance(exc, gexc.Aborted) or (
        isinstance(exc, ValueError) and isinstance(exc.__cause__, gexc.Aborted)
    )


CONTENDED = retry.Policy(_contended, attempts=8, backoff=retry.Backoff(0.1, 2.0, 2.0))


class FirestoreControl:
    def __init__(self, client: firestore.Client, prefix: str = "pitstop") -> None:
        self.db = client
        self.doc = client.collection(f"{prefix}_control").document("current")
        self.changes = client.collection(f"{prefix}_control_changes")

    def read_control(self) -> object:
        snap = self.doc.get()
        return snap.to_dict() if snap.exists else None

    def change_control(self, change: Callable[[ControlDoc], tuple[ControlDoc, Change]]) -> Change:
        @firestore.transactional
        def run(t: Any) -> Change:
            snap = self.doc.get(transaction=t)
            doc, record = change(Control.of(snap.to_dict() if snap.exists else None).doc)
            t.set(self.doc, dict(doc))
            t.create(self.changes.document(record["id"]), dict(record))
            return record

        done: Change = retry.call(lambda: run(self.db.transaction()), CONTENDED)
        return done

    def control_changes(self, since: float) -> list[Change]:
        query = self.changes.where(filter=firestore.FieldFilter("at", ">=", since))
        return sorted(as_changes([s.to_dict() or {} for s in query.stream()]), key=lambda c: c["version"])
