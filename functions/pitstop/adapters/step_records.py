"""Step records (core/steps.py) in a Firestore collection: one document per key.

The version a conditioned write must find unchanged is the document's update time, which
Firestore checks on the server (a ``last_update_time`` precondition), so two takers of one
expired claim cannot both win. Used for actuate's ``incidents/<id>/steps`` and notify's ledger.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.core.domain import StepRecord
from pitstop.core.steps import IN_PROGRESS, Guard, Stored, checked


class FirestoreStepStore:
    def __init__(self, collection: Any) -> None:
        self.coll = collection

    def read(self, key: str) -> Stored[dt.datetime] | None:
        snap = self.coll.document(key).get()
        if not snap.exists:
            return None
        return Stored(cast(StepRecord, snap.to_dict() or {}), snap.update_time)

    def create(self, key: str, record: StepRecord, guard: Guard | None = None) -> bool:
        if guard is not None:
            return self._guarded(key, record, None, guard)
        try:
            self.coll.document(key).create(dict(record))
        except gexc.Conflict:  # AlreadyExists: one create of an id wins
            return False
        return True

    def replace(self, key: str, record: StepRecord, version: dt.datetime, guard: Guard | None = None) -> bool:
        if guard is not None:
            return self._guarded(key, record, version, guard)
        option = firestore.Client.write_option(last_update_time=version)
        try:
            self.coll.document(key).update(dict(record), option=option)
        except (gexc.FailedPrecondition, gexc.NotFound):  # another write came first, or it is gone
            return False
        return True

    def _guarded(self, key: str, record: StepRecord, version: dt.datetime | None, guard: Guard) -> bool:
        """Create (``version`` None) or replace the record in one transaction with a read of the
        parent document (the incident) that the guard must accept: the precondition and the claim
        are one atomic operation. The parent's read puts it in the transaction's read set, so a
        change to it before the commit aborts and retries the claim."""
        ref, parent = self.coll.document(key), self.coll.parent

        @firestore.transactional
        def txn(t: Any) -> bool:
            doc = parent.get(transaction=t).to_dict() if parent is not None else None
            cur = ref.get(transaction=t)
            if cur.exists if version is None else (not cur.exists or cur.update_time != version):
                return False  # created meanwhile, or another write came first
            checked(guard, key, doc)
            t.set(ref, dict(record))
            return True

        claimed: bool = txn(self.coll._client.transaction())
        return claimed

    def update_held(self, key: str, token: str, fields: StepRecord) -> bool:
        ref = self.coll.document(key)

        @firestore.transactional
        def txn(t: Any) -> bool:
            cur = ref.get(transaction=t).to_dict() or {}
            if cur.get("token") != token or cur.get("state") != IN_PROGRESS:
                return False
            t.update(ref, dict(fields))
            return True

        held: bool = txn(self.coll._client.transaction())
        return held
