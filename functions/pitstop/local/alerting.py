"""What Cloud Monitoring's alerting sends: schema version 1.2 notifications of Pitstop's policies.

The local stack's Monitoring stand-in (local/fake_monitoring.py) publishes these to the alerts
topic when a job's heartbeat stops or a node's stand-in telemetry crosses a policy, and the tests
build them the same way. The shape is Monitoring's documented Pub/Sub notification (schema
version 1.2, https://cloud.google.com/monitoring/support/notification-options), field for field
as the real open and closed samples in tests/fixtures/alert_notifications.yaml carry it; the
policy (display name, user labels, condition) is the deployed file itself
(infra/monitoring/telemetry/).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TypedDict

from pitstop.core.domain import JsonObject

ROOT = Path(__file__).resolve().parents[3]
TELEMETRY = ROOT / "infra" / "monitoring" / "telemetry"
RESOURCE_DISPLAY = {
    "gce_instance": "VM Instance",
    "global": "Global",
    "prometheus_target": "Prometheus Target",
}


class Documentation(TypedDict):
    content: str
    mime_type: str
    subject: str


class AlertIncident(TypedDict):
    """``incident`` of a Monitoring notification (schema version 1.2) as Pub/Sub channels carry it."""

    condition: JsonObject  # the policy's condition as deployed (open: Monitoring's own resource)
    condition_name: str
    documentation: Documentation
    ended_at: int | None
    incident_id: str
    metadata: dict[str, dict[str, str]]
    metric: dict[str, object]
    observed_value: str
    policy_name: str
    policy_user_labels: dict[str, str]
    resource: dict[str, object]
    resource_display_name: str
    resource_id: str
    scoping_project_number: int
    resource_name: str
    resource_type_display_name: str
    started_at: int
    scoping_project_id: str
    severity: str
    state: str
    summary: str
    threshold_value: str
    url: str


class AlertNotification(TypedDict):
    incident: AlertIncident
    version: str


@cache
def policies() -> dict[str, JsonObject]:
    """The deployed telemetry policies by file stem (what `pitstop deploy` creates): Monitoring's
    AlertPolicy resources as JSON files, read as they are."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(TELEMETRY.glob("*.json"))}


def policy_id(stem: str) -> str:
    """A stable numeric id per policy, as Monitoring gives one on creation."""
    return str(1_000_000_000_000_000_000 + sum(ord(c) * 31**i for i, c in enumerate(stem)) % 10**18)


def _condition(policy: JsonObject, project: str, pid: str) -> JsonObject:
    cond = dict(policy["conditions"][0])
    cond["name"] = f"projects/{project}/alertPolicies/{pid}/conditions/{int(pid) % 10**18 + 1}"
    return cond


def notification(
    stem: str,
    state: str,
    *,
    incident_id: str,
    project: str,
    metric_labels: Mapping[str, str],
    resource_type: str,
    resource_labels: Mapping[str, str],
    started_at: int,
    ended_at: int | None = None,
    observed: str = "0",
    display_name: str = "",
    project_number: int = 123456789012,
) -> AlertNotification:
    """One notification of the policy in ``infra/monitoring/telemetry/<stem>.json`` (open or closed)."""
    policy = policies()[stem]
    pid = policy_id(stem)
    cond = _condition(policy, project, pid)
    threshold = next((v.get("thresholdValue") for v in cond.values() if isinstance(v, dict)), None)
    word = "is above the threshold" if state == "open" else "returned to normal"
    banner = "ALERT" if state == "open" else "RESOLVED"
    incident: AlertIncident = {
        "condition": cond,
        "condition_name": cond["displayName"],
        "documentation": {
            "content": policy["documentation"]["content"],
            "mime_type": policy["documentation"]["mimeType"],
            "subject": f"[{banner} - No severity] {policy['displayName']}",
        },
        "ended_at": ended_at,
        "incident_id": incident_id,
        "metadata": {"system_labels": {"name": display_name} if display_name else {}, "user_labels": {}},
        "metric": {"displayName": cond["displayName"], "labels": dict(metric_labels), "type": _metric(cond)},
        "observed_value": observed,
        "policy_name": policy["displayName"],
        "policy_user_labels": dict(policy.get("userLabels", {})),
        "resource": {"labels": dict(resource_labels), "type": resource_type},
        "resource_display_name": display_name,
        "resource_id": "",
        "resource_name": f"{project} {display_name}".strip(),
        "resource_type_display_name": RESOURCE_DISPLAY.get(resource_type, resource_type),
        "scoping_project_id": project,
        "scoping_project_number": project_number,
        "severity": "No severity",
        "started_at": started_at,
        "state": state,
        "summary": f"{cond['displayName']} for {project} {display_name} {word} with a value of {observed}.",
        "threshold_value": "" if threshold is None else str(threshold),
        "url": f"https://console.cloud.google.com/monitoring/alerting/alerts/{incident_id}"
        f"?channelType=cloud-pubsub&project={project}",
    }
    return {"incident": incident, "version": "1.2"}


def _metric(cond: Mapping[str, object]) -> str:
    """The metric type a condition's filter or query names (what Monitoring puts in ``metric.type``)."""
    for v in cond.values():
        if isinstance(v, dict) and "filter" in v:
            return str(v["filter"]).split('metric.type="', 1)[1].split('"', 1)[0]
        if isinstance(v, dict) and "query" in v:
            name = str(v["query"]).split("(DCGM_", 1)[-1].split("[", 1)[0].split(")", 1)[0].split(" ", 1)[0]
            return f"prometheus.googleapis.com/DCGM_{name}/gauge"
    return ""
