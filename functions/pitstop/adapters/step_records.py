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
from pitstop.core.steps import IN_PROGRESS, Stored


class FirestoreStepStore:
    def __init__(self, collection: Any) -> None:
        self.coll = collection

    def read(self, key: str) -> Stored[dt.datetime] | None:
        snap = self.coll.document(key).get()
        if not snap.exists:
            return None
        return Stored(cast(StepRecord, snap.to_dict() or {}), snap.update_time)

    def create(self, key: str, record: StepRecord) -> bool:
        try:
            self.coll.document(key).create(dict(record))
        except gexc.Conflict:  # AlreadyExists: one create of an id wins
            return False
        return True

    def replace(self, key: str, record: StepRecord, version: dt.datetime) -> bool:
        option = firestore.Client.write_option(last_update_time=version)
        try:
            self.coll.document(key).update(dict(record), option=option)
        except (gexc.FailedPrecondition, gexc.NotFound):  # another write came first, or it is gone
            return False
        return True

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
