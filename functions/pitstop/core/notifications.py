"""What a notification says, in words every channel uses; each channel's body is built in its own
folder (plugins/channels/<name>/body.py), without I/O, from these.

A notification (what actuate, the launcher and the sweep publish) carries ``id``, ``kind``
(``incident`` or ``page``), ``severity`` (critical, warning, info), ``summary``, the incident's
validated fields, and optionally durations, jobs and ``todo``. Text comes from validated names and
policy reasons, never from raw log lines, and each body escapes what its channel interprets.
"""

from __future__ import annotations

import hashlib
import hmac
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


# -- sealing: what a publisher to the topic cannot derive (issue 35, low) -------------------------
# A notification's id keys notify's ledger, and PagerDuty's dedup key ties an incident's trigger to
# its resolve. Derived from the incident alone, a publisher to pitstop-notifications could send a
# notification under the id of a page still to come (the ledger would then drop the real one) or
# resolve a real alert by naming its incident. Pitstop's publishers seal each notification with a
# per-deploy key (the secret pitstop-notify-key): its id and its incident's alert key are HMACs.
ALERT_KEY = re.compile(r"[0-9a-f]{32}")


def _mac(key: bytes, *parts: object) -> str:
    return hmac.new(key, "\0".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def sealed(n: Mapping[str, object], key: bytes) -> dict[str, object]:
    """The notification as Pitstop publishes it: its id's digest keyed (so the same notification
    keeps the same id, and no one without the key can name one still to come) and its incident's
    ``alert_key`` (PagerDuty's dedup key) an HMAC of the incident id."""
    out = dict(n)
    nid = str(n.get("id") or "")
    out["id"] = f"{nid.rsplit('-', 1)[0][:150]}-{_mac(key, 'id', nid)[:24]}"
    inc = n.get("incident")
    if isinstance(inc, Mapping) and inc.get("id"):
        out["incident"] = {**inc, "alert_key": _mac(key, "alert", inc["id"])[:32]}
    return out


def alert_key(n: Notification) -> str | None:
    """The incident's alert key when the notification carries a well-formed one (a sealed one)."""
    got = field_map(n, "incident").get("alert_key")
    return got if isinstance(got, str) and ALERT_KEY.fullmatch(got) else None


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
