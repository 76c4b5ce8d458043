"""How long a local incident's steps would have taken in production, and where a hang's time went.

Only the fake Compute's operations run shortened (the stack's ``compute_scale``); detection,
fencing, Slurm and the checks run at real speed. So the operations on the node that started
within an interval count at their real length, everything else as measured.
"""

from __future__ import annotations

from typing import TypedDict

from pitstop.core.domain import Incident, Milestone
from pitstop.local.compute_shapes import Effect
from pitstop.local.fake_compute import DURATIONS

# What each Compute method's operation lasts for real (the fake shortens it by its time scale).
OPERATION_S = {
    "reset": DURATIONS["reset"],
    "report_host_as_faulty": DURATIONS["report"] + DURATIONS["report_restart"],
    "perform_maintenance": DURATIONS["maintenance"],
    "recreate": DURATIONS["recreate"],
}


def real_s(
    inc: Incident, start: Milestone, end: Milestone, effects: list[Effect], scale: float
) -> float | None:
    """Seconds between two timeline milestones as they would pass in production (``effects``: the
    fake Compute's record of its operations)."""
    tl, node = inc.get("timeline") or {}, inc["node"]["instance"] if inc["node"] else None
    a, b = tl.get(start), tl.get(end)
    if a is None or b is None:
        return None
    shortened = sum(
        OPERATION_S.get(e["method"], 0.0)
        for e in effects
        if node in e["instances"] and a - 2.0 <= float(e["at"]) <= b
    )
    return round(float(b) - float(a) + shortened * (1.0 - scale), 1)


def resume_and_repair(
    inc: Incident, effects: list[Effect], scale: float
) -> tuple[float | None, float | None]:
    """(resume_s, repair_s): detected -> the gang running again, acted -> the node validated (or
    healthy), real-time equivalent.

    A gang that ran again before its node was healthy did not wait for any Compute operation: its
    resume_s is as measured. One that waited for the node (no spare) waited for them too.
    """
    tl = inc["timeline"]
    healed = tl.get("validated") or tl.get("healthy")
    resume: float | None = None
    if tl.get("job_running") is not None and healed is not None and tl["job_running"] >= healed:
        resume = real_s(inc, "detected", "job_running", effects, scale)
    elif tl.get("job_running") is not None:
        resume = round(float(tl["job_running"]) - float(tl["detected"]), 1)
    repair = real_s(inc, "acted", "validated" if tl.get("validated") else "healthy", effects, scale)
    return resume, repair


# What the Monitoring stand-in shortens (alert_scale) and what real Cloud Monitoring takes besides:
# the heartbeat policy's absence window (infra/monitoring/telemetry/, 120 s) and about a minute to
# evaluate and notify (an assumption issue 24's notes list as still to check).
ALERT_WINDOW_S = 120.0
MONITORING_DELAY_S = 60.0


class Breakdown(TypedDict):
    """Where a hang's time went: local seconds, the real-time equivalent, and each part."""

    local_s: float
    real_s: float
    parts: dict[str, float | None]
    rounds: list[str | None]
    note: str


def breakdown(
    stopped: float, hang: Incident, culprit: Incident | None, training: float, scale: float
) -> Breakdown:
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
