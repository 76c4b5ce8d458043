"""What a hung training job leaves on the local stack: its heartbeats (the Monitoring stand-in's
record) and the hang incidents its silence opened. Read by the demo's hang scenarios and the e2e
tests alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pitstop.core.domain import Incident
from pitstop.local.stack import Stack

HEARTBEAT = "pitstop/job/heartbeat"


def beats(stack: Stack, job: str) -> int:
    """Heartbeat points the job has written so far (the Monitoring stand-in's record)."""
    out = Path(stack.workdir, "metrics.jsonl")
    if not out.exists():
        return 0
    return sum(1 for line in out.read_text().splitlines() if HEARTBEAT in line and f'"job": "{job}"' in line)


def hang_incidents(db: Any, job: str) -> list[Incident]:
    """The job's hang incidents, oldest first, read through the store as Pitstop reads them."""
    from pitstop.adapters.firestore import IncidentStore

    return [
        d
        for d in IncidentStore(db).query()
        if d.get("kind") == "hang" and (ref := d.get("job")) is not None and ref["job"] == job
    ]


def beating_again(stack: Stack, job: str, wait: Callable[..., Any], timeout: float) -> float:
    """When the job next writes a heartbeat (a new run training): the moment, epoch seconds."""
    before = beats(stack, job)

    def moved() -> float | None:
        return time.time() if beats(stack, job) > before else None

    found: float = wait(moved, timeout, f"job {job} to beat again")
    return found


def hang_ended(db: Any, job: str, wait: Callable[..., Any], n: int = 1, timeout: float = 240.0) -> Incident:
    """The job's n-th hang incident, once resolved or failed."""

    def ended() -> Incident | None:
        incs = hang_incidents(db, job)
        return incs[n - 1] if len(incs) >= n and incs[n - 1]["state"] in ("RESOLVED", "FAILED") else None

    found: Incident = wait(ended, timeout, f"hang incident {n} of job {job} to end")
    return found
