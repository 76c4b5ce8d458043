"""What a store counts for the bench (``pitstop bench ingest``), not part of the store's port.

Both stores keep one, shared by the parts they are built from (each part counts what it writes).
"""

from __future__ import annotations

import threading


class Tally:
    """Documents written by this process, decisions run again after losing to a contender, and
    (Firestore) decisions' commits by outcome, those refused and the writes they carried."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.writes = 0
        self.retries = 0
        self.refused = self.refused_writes = 0
        self.commits: dict[str, int] = {}  # "<committed|refused> <result>[ fresh]" -> decisions

    def wrote(self, n: int) -> None:
        with self._lock:
            self.writes += n

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

    def commit(self, how: str, result: str, fresh: bool, writes: int) -> None:
        """A decision's commit (``fresh``: decided on documents read for it, not remembered ones)."""
        what = f"{how} {result}" + (" fresh" if fresh else "")
        with self._lock:
            self.commits[what] = self.commits.get(what, 0) + 1
            if how == "refused":
                self.refused += 1
                self.refused_writes += writes
