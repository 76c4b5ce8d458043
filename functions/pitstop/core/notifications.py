"""What a notification says on each channel: the bodies, built without I/O.

A notification (what actuate, the launcher and the sweep publish) carries ``id``, ``kind``
(``incident`` or ``page``), ``severity`` (critical, warning, info), ``summary``, the incident's
validated fields, and optionally durations, jobs and ``todo``. Text comes from validated names and
policy reasons, never from raw log lines, and each body escapes what its channel interprets.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}


def notification_id(kind: str, incident_id: Any, *facts: Any) -> str:
    """Deterministic for what it announces: the same decision always yields the same id."""
    digest = hashlib.sha256("\0".join(map(str, (incident_id, *facts))).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "-", str(incident_id))[:64]
    return f"{kind}-{readable}-{digest}"


def _escape_slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def subject(inc: Mapping[str, Any], missing: str = "?") -> str:
    """What the incident is about: its node, or for a job's episode (a hang) the job."""
    job = inc.get("job")
    if not inc.get("node") and isinstance(job, Mapping):
        return f"job {job.get('job')} of {job.get('cluster')}"
    return str((inc.get("node") or {}).get("instance") or missing)


def text_lines(n: Mapping[str, Any]) -> list[str]:
    """The notification as a few lines of plain text (chat messages, PagerDuty details)."""
    inc = n.get("incident") or {}
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
    d = n.get("durations_s") or {}
    if d.get("resolved") is not None:
        lines.append(
            f"time to remediate: {d['resolved']:.0f} s (isolated after {d.get('fenced') or 0:.0f} s)"
        )
    if n.get("jobs"):
        lines.append(f"jobs on the node: {', '.join(map(str, n['jobs']))}")
    if n.get("todo"):
        lines.append(f"what to do: {n['todo']}")
    return lines


def render(n: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """A chat webhook's body: Google Chat (``chat``) or Slack (``slack``, mrkdwn escaped)."""
    text = "\n".join(text_lines(n))
    if fmt == "slack":
        safe = _escape_slack(text)
        return {"text": safe, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": safe}}]}
    return {"text": text}


# -- PagerDuty Events API v2 ---------------------------------------------------------------------
# POST /v2/enqueue with {routing_key, event_action: trigger|acknowledge|resolve, dedup_key (<= 255),
# payload: {summary (<= 1024), source, severity: critical|error|warning|info, timestamp?, component?,
# group?, class?, custom_details?}}; answered 202 {"status": "success", "dedup_key": ...}.

PAGERDUTY_SEVERITIES = frozenset({"critical", "error", "warning", "info"})
_DEDUP_SAFE = re.compile(r"[^A-Za-z0-9_.:-]")
# incident states after which its PagerDuty alert is over
_ENDED = frozenset({"RESOLVED"})


def pagerduty_action(n: Mapping[str, Any]) -> str | None:
    """``trigger`` for what needs a person (a page, a failure), ``resolve`` once the incident ended;
    None for news nobody is woken for (a remediation under way or done by itself)."""
    inc = n.get("incident") or {}
    if n.get("kind") == "page" or n.get("severity") == "critical":
        return "trigger"
    if str(inc.get("state")) in _ENDED and inc.get("id"):
        return "resolve"
    return None


def pagerduty_event(n: Mapping[str, Any], routing_key: str, action: str) -> dict[str, Any]:
    """One Events v2 body: all notifications of an incident share its dedup key (one alert)."""
    inc = n.get("incident") or {}
    iid = str(inc.get("id") or n.get("id") or "pitstop")
    node = subject(inc, "unknown-node")
    severity = str(n.get("severity") or "info")
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": _DEDUP_SAFE.sub("-", f"pitstop-{iid}")[:255],
    }
    if action == "trigger":
        body["payload"] = {
            "summary": str(n.get("summary") or "Pitstop incident")[:1024],
            "source": node,
            "severity": severity if severity in PAGERDUTY_SEVERITIES else "error",
            "component": str(inc.get("cluster") or "none"),
            "group": "pitstop",
            "class": str(inc.get("action") or n.get("kind") or "incident"),
            "custom_details": {"text": "\n".join(text_lines(n)), "incident": iid},
        }
    return body
