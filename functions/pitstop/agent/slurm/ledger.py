"""The agent's claims and results, in SQLite on the controller: one row per command id.

``Ledger`` is the table; ``LedgerSteps`` is the same rows as a store of core/steps.py, so the
agent claims, finds and records its commands through the step runner actuate and notify use.
A row stays the wire record (core/slurm_wire.Result) the agent publishes whole.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

from pitstop.core.domain import JsonObject, StepRecord
from pitstop.core.slurm_wire import (
    FINAL_STATES,
    RESULT_RUNNING,
    RESULT_TRANSIENT,
    Result,
    result_state,
)
from pitstop.core.steps import DONE, IN_PROGRESS, RELEASED, Guard, Stored, checked


class Ledger:
    """The agent's claims and results, in SQLite on the controller: one row per command id.

    ``version`` goes up with every write; an UPDATE conditioned on it is the claim's
    precondition. One connection used under a lock (callbacks run on a thread pool), each
    read-modify-write inside ``BEGIN IMMEDIATE`` so two processes on one file serialize too; WAL
    with full sync so a claim that was answered survives a crash of the controller.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, version INTEGER NOT NULL,"
                " state TEXT NOT NULL, updated_at REAL NOT NULL, doc TEXT NOT NULL)"
            )

    def create(self, cid: str, doc: Result, now: float) -> int | None:
        """Insert the row at version 1 unless the id exists (then None): one insert of an id wins."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO results (id, version, state, updated_at, doc) VALUES (?, 1, ?, ?, ?)",
                (cid, result_state(doc), now, json.dumps(doc)),
            )
        return 1 if cur.rowcount == 1 else None

    def get(self, cid: str) -> tuple[Result, int] | None:
        """The row's document and version, or None."""
        with self._lock:
            row = self._db.execute("SELECT doc, version FROM results WHERE id = ?", (cid,)).fetchone()
        return None if row is None else (_doc(row[0]), int(row[1]))

    def update(self, cid: str, fields: Result, version: int, now: float) -> tuple[Result, int] | None:
        """Merge ``fields`` into the row if it is still at ``version``: (document, new version), or
        None when another write came first (the precondition failed) or the row is gone."""
        return self.merge(cid, lambda doc: fields, now, version)

    def merge(
        self,
        cid: str,
        fields_of: Callable[[Result], Result | None],
        now: float,
        version: int | None = None,
    ) -> tuple[Result, int] | None:
        """Merge what ``fields_of`` makes of the row (None: leave it) into it, read and written in
        one transaction, at ``version`` when given: (document, new version), or None when nothing
        was written."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT doc, version FROM results WHERE id = ? AND (? IS NULL OR version = ?)",
                    (cid, version, version),
                ).fetchone()
                fields = None if row is None else fields_of(_doc(row[0]))
                doc: Result | None = None if row is None or fields is None else {**_doc(row[0]), **fields}
                if doc is not None:
                    self._db.execute(
                        "UPDATE results SET doc = ?, state = ?, updated_at = ?, version = version + 1"
                        " WHERE id = ? AND version = ?",
                        (json.dumps(doc), result_state(doc), now, cid, row[1]),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return None if doc is None else (doc, int(row[1]) + 1)

    def prune(self, before: float) -> int:
        """Delete rows last written before ``before``; how many."""
        with self._lock:
            return self._db.execute("DELETE FROM results WHERE updated_at < ?", (before,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


class LedgerSteps:
    """The ledger's rows as a step store (core/steps.StepStore), versioned by the row's ``version``.

    A row stays the wire record (running, transient, done or failed), so what the agent publishes
    and what a ledger written by an older agent holds are unchanged; this class translates:

    - ``in_progress`` is ``running`` with ``claim_until`` for ``expires_at``;
    - ``done`` is a final row (done or failed): its ``result`` is the whole row, published again;
    - ``released`` is ``transient`` (the next delivery runs a new attempt), the released record's
      kept ``result`` written as the row; a take-over keeps the last attempt's error as
      ``previous_error``.

    No payload hash is kept: a command id is already a digest of its op and arguments
    (adapters/slurm.py), so an id never names another request.
    """

    def __init__(self, ledger: Ledger, clock: Callable[[], float]) -> None:
        self.ledger, self.clock = ledger, clock

    def read(self, key: str) -> Stored[int] | None:
        got = self.ledger.get(key)
        return None if got is None else Stored(step_record(got[0]), got[1])

    def row(self, key: str) -> Result | None:
        """The wire record as it stands (what the agent publishes)."""
        got = self.ledger.get(key)
        return None if got is None else got[0]

    def create(self, key: str, record: StepRecord, guard: Guard | None = None) -> bool:
        checked(guard, key, None)  # a command has no parent document: only a guard that needs none passes
        return self.ledger.create(key, wire_fields(key, record), self.clock()) is not None

    def replace(self, key: str, record: StepRecord, version: int, guard: Guard | None = None) -> bool:
        checked(guard, key, None)

        def taken(old: Result) -> Result:
            return {**wire_fields(key, record), "previous_error": old.get("error")}

        return self.ledger.merge(key, taken, self.clock(), version) is not None

    def update_held(self, key: str, token: str, fields: StepRecord) -> bool:
        def held(old: Result) -> Result | None:
            if old.get("token") != token or result_state(old) != RESULT_RUNNING:
                return None
            return wire_fields(key, fields)

        return self.ledger.merge(key, held, self.clock()) is not None


def step_record(row: Result) -> StepRecord:
    """A ledger row read as a step record."""
    state = result_state(row)
    rec: StepRecord = {
        "owner": str(row.get("owner") or ""),
        "token": str(row.get("token") or ""),
        "attempt": int(as_number(row.get("attempt")) or 1),
    }
    if state == RESULT_RUNNING:
        rec["state"], rec["op"] = IN_PROGRESS, str(row.get("op") or "")
        rec["claimed_at"], rec["expires_at"] = (
            as_number(row.get("claimed_at")),
            as_number(row.get("claim_until")),
        )
    elif state in FINAL_STATES:
        rec["state"], rec["result"] = DONE, dict(row)
    else:  # transient, or a state this agent does not know: a new attempt runs it
        rec["state"], rec["error"] = RELEASED, str(row.get("error") or "")
    return rec


def wire_fields(key: str, rec: StepRecord) -> Result:
    """What a step record's fields change in its ledger row."""
    state = rec.get("state")
    if state == DONE:
        return as_result(rec.get("result") or {})
    if state == RELEASED:
        kept = rec.get("result")
        if kept:
            return {**as_result(kept), "state": RESULT_TRANSIENT}
        return {"state": RESULT_TRANSIENT, "error": rec.get("error")}
    if state == IN_PROGRESS:
        claim: Result = {
            "id": key,
            "op": rec.get("op") or None,
            "state": RESULT_RUNNING,
            "owner": rec.get("owner", ""),
            "token": rec.get("token", ""),
            "attempt": rec.get("attempt", 1),
            "claimed_at": rec.get("claimed_at", 0.0),
            "claim_until": rec.get("expires_at", 0.0),
        }
        return claim
    # any other fields (core/steps.StepRunner.save's ``saved``; the agent saves nothing today) are
    # kept beside the row's as they are
    return cast(Result, dict(rec))


def as_result(doc: JsonObject) -> Result:
    """A record the step runner kept unread (core/steps: a handler's answer is free-form to it),
    read back as what it is here: the wire record this agent wrote into it."""
    return cast(Result, dict(doc))


def _doc(text: str) -> Result:
    doc: Result = json.loads(text)  # a row this class wrote (json.dumps of a Result)
    return doc


def as_number(v: object) -> float:
    """A number from a JSON field; 0.0 for anything else (or a string float() does not take)."""
    if not isinstance(v, str | int | float):
        return 0.0
    try:
        return float(v)
    except ValueError:
        return 0.0
