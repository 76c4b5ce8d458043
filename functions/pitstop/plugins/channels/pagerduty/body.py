"""PagerDuty Events API v2 bodies, built without I/O (imports no google.*, no I/O layer:
lint-imports checks it).

POST /v2/enqueue with {routing_key, event_action: trigger|acknowledge|resolve, dedup_key (<= 255),
payload: {summary (<= 1024), source, severity: critical|error|warning|info, timestamp?, component?,
group?, class?, custom_details?}}; answered 202 {"status": "success", "dedup_key": ...}.
"""

from __future__ import annotations

import re
from typing import NotRequired, TypedDict

from pitstop.core.notifications import Notification, alert_key, field_map, subject, text_lines

PAGERDUTY_SEVERITIES = frozenset({"critical", "error", "warning", "info"})
_DEDUP_SAFE = re.compile(r"[^A-Za-z0-9_.:-]")
# incident states after which its PagerDuty alert is over
_ENDED = frozenset({"RESOLVED"})


# ``class`` is a Python keyword: the functional form.
PagerDutyPayload = TypedDict(
    "PagerDutyPayload",
    {
        "summary": str,  # <= 1024
        "source": str,
        "severity": str,  # one of PAGERDUTY_SEVERITIES
        "component": str,
        "group": str,
        "class": str,
        "custom_details": dict[str, str],
    },
)


class PagerDutyEvent(TypedDict):
    """One Events v2 body (the fields above)."""

    routing_key: str
    event_action: str  # trigger | acknowledge | resolve
    dedup_key: str  # <= 255
    payload: NotRequired[PagerDutyPayload]  # a trigger's only


def pagerduty_action(n: Notification) -> str | None:
    """``trigger`` for what needs a person (a page, a failure), ``resolve`` once the incident ended;
    None for news nobody is woken for (a remediation under way or done by itself), and for an end
    without the incident's alert key: only Pitstop's sealed notifications resolve an alert."""
    inc = field_map(n, "incident")
    if n.get("kind") == "page" or n.get("severity") == "critical":
        return "trigger"
    if str(inc.get("state")) in _ENDED and inc.get("id") and alert_key(n):
        return "resolve"
    return None


def pagerduty_event(n: Notification, routing_key: str, action: str) -> PagerDutyEvent:
    """One Events v2 body: all notifications of an incident share its dedup key (one alert), its
    sealed alert key; a notification without one (not sealed by Pitstop) is an alert of its own,
    keyed by its id, which no sealed notification's key can equal."""
    inc = field_map(n, "incident")
    iid = str(inc.get("id") or n.get("id") or "pitstop")
    node = subject(inc, "unknown-node")
    severity = str(n.get("severity") or "info")
    sealed_key = alert_key(n)
    dedup = f"pitstop-{sealed_key}" if sealed_key else f"pitstop-unsealed-{n.get('id') or iid}"
    body: PagerDutyEvent = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": _DEDUP_SAFE.sub("-", dedup)[:255],
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
