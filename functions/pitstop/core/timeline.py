"""Reading an incident's timeline: MTTD, time to isolate, MTTR, time until the job runs again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import cast

from pitstop.core.domain import Timeline
from pitstop.core.engine import TIMELINE_KEYS

# An incident, or any record that carries an incident's ``timeline`` (a report's row, a CLI's
# document): only its timeline is read.
HasTimeline = Mapping[str, object]


def _timeline(inc: HasTimeline) -> Timeline:
    tl = inc.get("timeline")
    return cast(Timeline, tl) if isinstance(tl, Mapping) else {}  # as the engine stamps it


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def durations(inc: HasTimeline) -> dict[str, float | None]:
    """Seconds from detection (the fault's log timestamp) to each later milestone."""
    tl = _timeline(inc)
    start = tl.get("detected")
    return {
        k: (round(tl[k] - start, 3) if start is not None and tl.get(k) is not None else None)
        for k in TIMELINE_KEYS
        if k != "detected"
    }


def resume_s(inc: HasTimeline) -> float | None:
    """Detected → the gang observed running again: how long the job stood still."""
    tl = _timeline(inc)
    if tl.get("detected") is None or tl.get("job_running") is None:
        return None
    return round(float(tl["job_running"]) - float(tl["detected"]), 3)


def repair_s(inc: HasTimeline) -> float | None:
    """Acted → the node healthy (validated, where a validation ran): how long the node was away."""
    tl = _timeline(inc)
    end = tl.get("validated") or tl.get("healthy")
    if tl.get("acted") is None or end is None:
        return None
    return round(float(end) - float(tl["acted"]), 3)


def returned_at(inc: HasTimeline) -> float | None:
    """When the node came back from the incident's repair (validated, else healthy): None if Pitstop
    acted on nothing or the node is not back."""
    tl = _timeline(inc)
    end = tl.get("validated") or tl.get("healthy")
    return None if tl.get("acted") is None or end is None else float(end)


def render(inc: HasTimeline) -> list[str]:
    tl = _timeline(inc)
    d = durations(inc)
    rows = []
    for k in TIMELINE_KEYS:
        if tl.get(k) is None:
            continue
        after = "" if k == "detected" else f"  +{d[k]:.1f}s"
        rows.append(f"    {k:<12} {iso(tl[k])}{after}")
    return rows
