"""What a notification says, in words every channel uses; each channel's body is built in its own
folder (plugins/channels/<name>/body.py), without I/O, from these.

A notification (what actuate, the launcher and the sweep publish) carries ``id``, ``kind``
(``incident`` or ``page``), ``severity`` (critical, warning, info), ``summary``, the incident's
validated fields, and optionally durations, jobs and ``todo``. Text comes from validated names and
policy reasons, never from raw log lines, and each body escapes what its channel interprets.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

# A notification as the notify function reads it back from Pub/Sub: a core/domain.Notice, or a page
# (core/remediation.page_notification). Read as an object map: each field is narrowed where read.
Notification = Mapping[str, object]

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}


def notification_id(kind: str, incident_id: object, *facts: object) -> str:
    """Deterministic for what it announces: the same decision always yields the same id."""
    digest = hashlib.sha256("\0".join(map(str, (incident_id, *facts))).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "-", str(incident_id))[:64]
    return f"{kind}-{readable}-{digest}"


def subject(inc: Mapping[str, object], missing: str = "?") -> str:
    """What the incident is about: its node, or for a job's episode (a hang) the job."""
    job, node = inc.get("job"), inc.get("node")
    if not node and isinstance(job, Mapping):
        return f"job {job.get('job')} of {job.get('cluster')}"
    return str((node.get("instance") if isinstance(node, Mapping) else None) or missing)


def field_map(n: Notification, key: str) -> Mapping[str, object]:
    """A field holding an object (the incident, the durations); empty when unset."""
    v = n.get(key)
    return v if isinstance(v, Mapping) else {}


def text_lines(n: Notification) -> list[str]:
    """The notification as a few lines of plain text (chat messages, PagerDuty details)."""
    inc = field_map(n, "incident")
    sev = str(n.get("severity", "info"))
    node = subject(inc)
    lines = [f"{SEVERITY_ICON.get(sev, '')} [{sev.upper()}] {n.get('summary', '')}"]
    facts = [
        ("incident", inc.get("id")),
        ("node", node),
        ("cluster", inc.get("cluster")),
        ("action", inc.get("action")),
        ("state", inc.get("state")),
    ]
    lines.append(" · ".join(f"{k}: {v}" for k, v in facts if v))
    d = field_map(n, "durations_s")
    if d.get("resolved") is not None:
        lines.append(
            f"time to remediate: {d['resolved']:.0f} s (isolated after {d.get('fenced') or 0:.0f} s)"
        )
    jobs, todo = n.get("jobs"), n.get("todo")
    if jobs and isinstance(jobs, list):
        where = (
            "jobs on the node" if inc.get("node") else "jobs"
        )  # a job's episode: the job and its resubmission
        lines.append(f"{where}: {', '.join(map(str, jobs))}")
    if todo:
        lines.append(f"what to do: {todo}")
    return lines
