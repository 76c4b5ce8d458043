"""The hang scenarios' observations (tools/demo.py): when a job beats, which incidents its hang
opened, and where the time from its last heartbeat to training again went."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pitstop.local.stack import Stack

HEARTBEAT = "pitstop/job/heartbeat"
# What the Monitoring stand-in shortens (alert_scale) and what real Cloud Monitoring takes besides:
# the heartbeat policy's absence window (infra/monitoring/telemetry/, 120 s) and about a minute to
# evaluate and notify (an assumption issue 24's notes list as still to check).
ALERT_WINDOW_S = 120.0
MONITORING_DELAY_S = 60.0


def beats(stack: Stack, job: str) -> int:
    """Heartbeat points the job has written so far (the Monitoring stand-in's record)."""
    out = Path(stack.workdir, "metrics.jsonl")
    if not out.exists():
        return 0
    n = 0
    for line in out.read_text().splitlines():
        if HEARTBEAT in line and f'"job": "{job}"' in line:
            n += 1
    return n


def hang_incidents(db: Any, job: str) -> list[dict[str, Any]]:
    """The job's hang incidents, oldest first."""
    docs = [d.to_dict() or {} for d in db.collection("pitstop_incidents").stream()]
    mine = [d for d in docs if d.get("kind") == "hang" and (d.get("job") or {}).get("job") == job]
    return sorted(mine, key=lambda d: d["created_at"])


def node_incident(db: Any, iid: str) -> dict[str, Any] | None:
    snap = db.collection("pitstop_incidents").document(iid).get()
    return snap.to_dict() if snap.exists else None


def beating_again(stack: Stack, job: str, wait: Callable[..., Any], timeout: float) -> float:
    """When the job next writes a heartbeat (a new run training): the moment, epoch seconds."""
    before = beats(stack, job)

    def moved() -> float | None:
        return time.time() if beats(stack, job) > before else None

    found: float = wait(moved, timeout, f"job {job} to beat again")
    return found


def breakdown(
    stopped: float, hang: Mapping[str, Any], culprit: Mapping[str, Any] | None, training: float, scale: float
) -> dict[str, Any]:
    """Where the time from the last heartbeat to training again went, local and real-time equivalent.

    Only the alert runs shortened locally (the heartbeat window, ``scale``); the checks, Slurm, the
    workflow's calls and the restart run at real speed.
    """
    loc = hang.get("localisation") or {}
    rounds = loc.get("rounds") or []
    opened = float(hang["created_at"])
    judged = float(rounds[-1]["at"]) if rounds else opened
    tl = (culprit or hang).get("timeline") or {}
    requeued = tl.get("job_requeued")
    running = tl.get("job_running")
    parts = {
        "alert_s": round(opened - stopped, 1),
        "localise_s": round(judged - opened, 1),
        "to_requeue_s": round(float(requeued) - judged, 1) if requeued else None,
        "restart_s": round(float(running) - float(requeued), 1) if running and requeued else None,
        "first_beat_s": round(training - float(running), 1) if running else None,
    }
    local = round(training - stopped, 1)
    real = local - (opened - stopped) + ALERT_WINDOW_S + MONITORING_DELAY_S
    return {
        "local_s": local,
        "real_s": round(real, 1),
        "parts": parts,
        "rounds": [r.get("kind") for r in rounds],
        "note": f"alert window {ALERT_WINDOW_S:.0f} s scaled by {scale} locally; real adds"
        f" ~{MONITORING_DELAY_S:.0f} s for Monitoring to evaluate and notify",
    }


def summary(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)
