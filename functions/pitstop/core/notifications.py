"""What a notification says on each channel: the bodies, built without I/O.

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
from typing import NotRequired, TypedDict

# A notification as the notify function reads it back from Pub/Sub: a core/domain.Notice, or a page
# (services/outbox.page_notification). Read as an object map: each field is narrowed where read.
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
    got = _map(n, "incident").get("alert_key")
    return got if isinstance(got, str) and ALERT_KEY.fullmatch(got) else None


def _escape_slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def subject(inc: Mapping[str, object], missing: str = "?") -> str:
    """What the incident is about: its node, or for a job's episode (a hang) the job."""
    job, node = inc.get("job"), inc.get("node")
    if not node and isinstance(job, Mapping):
        return f"job {job.get('job')} of {job.get('cluster')}"
    return str((node.get("instance") if isinstance(node, Mapping) else None) or missing)


def _map(n: Notification, key: str) -> Mapping[str, object]:
    """A field holding an object (the incident, the durations); empty when unset."""
    v = n.get(key)
    return v if isinstance(v, Mapping) else {}


def text_lines(n: Notification) -> list[str]:
    """The notification as a few lines of plain text (chat messages, PagerDuty details)."""
    inc = _map(n, "incident")
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
    d = _map(n, "durations_s")
    if d.get("resolved") is not None:
        lines.append(
            f"time to remediate: {d['resolved']:.0f} s (isolated after {d.get('fenced') or 0:.0f} s)"
        )
    jobs, todo = n.get("jobs"), n.get("todo")
    if jobs and isinstance(jobs, list):
        lines.append(f"jobs on the node: {', '.join(map(str, jobs))}")
    if todo:
        lines.append(f"what to do: {todo}")
    return lines


class SlackText(TypedDict):
    type: str  # mrkdwn
    text: str


class SlackBlock(TypedDict):
    type: str  # section
    text: SlackText


class ChatBody(TypedDict):
    """An incoming webhook's body: Google Chat reads ``text``; Slack shows ``blocks`` when present."""

    text: str
    blocks: NotRequired[list[SlackBlock]]


def render(n: Notification, fmt: str) -> ChatBody:
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
    inc = _map(n, "incident")
    if n.get("kind") == "page" or n.get("severity") == "critical":
        return "trigger"
    if str(inc.get("state")) in _ENDED and inc.get("id") and alert_key(n):
        return "resolve"
    return None


def pagerduty_event(n: Notification, routing_key: str, action: str) -> PagerDutyEvent:
    """One Events v2 body: all notifications of an incident share its dedup key (one alert), its
    sealed alert key; a notification without one (not sealed by Pitstop) is an alert of its own,
    keyed by its id, which no sealed notification's key can equal."""
    inc = _map(n, "incident")
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
