"""The sweep service: what Cloud Scheduler's once-a-minute call does.

Ingest only acts when an entry arrives, so whatever must happen with no entry arriving
lives here: flush coalesced storm counts, end bursts, release incidents held for a budget
that has freed up, and restart workflow starts whose starter died mid-lease.

The work still runs in `Ingest.sweep` (services/ingest.py), because it shares ingest's
coalescer, workflow starting and follow-up; this class is the function's own entry so
that body can move here without touching functions/main.py again.
"""

from __future__ import annotations

from typing import Protocol


class Sweeper(Protocol):
    """What the sweep needs from ingest: its periodic upkeep (see `Ingest.sweep`)."""

    def sweep(self) -> dict[str, int]: ...


class Sweep:
    """One sweep run over the ingest side's store and in-memory coalescer."""

    def __init__(self, ingest: Sweeper) -> None:
        self.ingest = ingest

    def run(self) -> dict[str, int]:
        """Counts of what the run did: bursts `closed`, incidents `released`, starts `restarted`."""
        return self.ingest.sweep()
