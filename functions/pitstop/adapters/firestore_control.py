"""The runtime control in Firestore: one document, ``<prefix>_control/current``, and its audit
records, ``<prefix>_control_changes/<v00000042>`` (core/control.py). A change reads the document,
decides and writes both in one transaction, so two people's changes never lose one another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.cloud import firestore

from pitstop.core.control import Change, Control, ControlDoc, as_changes


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

        done: Change = run(self.db.transaction())
        return done

    def control_changes(self, since: float) -> list[Change]:
        query = self.changes.where(filter=firestore.FieldFilter("at", ">=", since))
        return sorted(as_changes([s.to_dict() or {} for s in query.stream()]), key=lambda c: c["version"])
