"""Where the time from a hung job's last heartbeat to training again went (the demo's hang steps,
tools/demo_steps.py); the beats and hang incidents themselves are read by pitstop.local.heartbeats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What the Monitoring stand-in shortens (alert_scale) and what real Cloud Monitoring takes besides:
# the heartbeat policy's absence window (infra/monitoring/telemetry/, 120 s) and about a minute to
# evaluate and notify (an assumption issue 24's notes list as still to check).
ALERT_WINDOW_S = 120.0
MONITORING_DELAY_S = 60.0


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
