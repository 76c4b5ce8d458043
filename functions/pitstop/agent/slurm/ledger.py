"""The agent's claims and results, in SQLite on the controller: one row per command id."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pitstop.core.slurm_wire import (
    result_state,
)


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

    def create(self, cid: str, doc: Mapping[str, Any], now: float) -> int | None:
        """Insert the row at version 1 unless the id exists (then None): one insert of an id wins."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO results (id, version, state, updated_at, doc) VALUES (?, 1, ?, ?, ?)",
                (cid, result_state(doc), now, json.dumps(doc)),
            )
        return 1 if cur.rowcount == 1 else None

    def get(self, cid: str) -> tuple[dict[str, Any], int] | None:
        """The row's document and version, or None."""
        with self._lock:
            row = self._db.execute("SELECT doc, version FROM results WHERE id = ?", (cid,)).fetchone()
        return None if row is None else (dict(json.loads(row[0])), int(row[1]))

    def update(
        self, cid: str, fields: Mapping[str, Any], version: int, now: float
    ) -> tuple[dict[str, Any], int] | None:
        """Merge ``fields`` into the row if it is still at ``version``: (document, new version), or
        None when another write came first (the precondition failed) or the row is gone."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT doc FROM results WHERE id = ? AND version = ?", (cid, version)
                ).fetchone()
                doc = None if row is None else {**json.loads(row[0]), **fields}
                if doc is not None:
                    self._db.execute(
                        "UPDATE results SET doc = ?, state = ?, updated_at = ?, version = version + 1"
                        " WHERE id = ? AND version = ?",
                        (json.dumps(doc), result_state(doc), now, cid, version),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return None if doc is None else (doc, version + 1)

    def prune(self, before: float) -> int:
        """Delete rows last written before ``before``; how many."""
        with self._lock:
            return self._db.execute("DELETE FROM results WHERE updated_at < ?", (before,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
