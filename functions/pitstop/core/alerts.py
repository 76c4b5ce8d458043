"""Cloud Monitoring alert notifications as an event source: one notification → one FaultEvent.

Monitoring publishes one JSON document per incident change to a Pub/Sub notification channel, in
its documented "schema version 1.2" (https://cloud.google.com/monitoring/support/notification-options,
section Pub/Sub; real open and closed samples from a channel of type pubsub: tests/fixtures/
alert_notifications.yaml). The fields read here::

    {"version": "1.2",
     "incident": {"incident_id": "0.nrwotmyokd9n", "state": "open" | "closed",
                  "scoping_project_id": P, "scoping_project_number": N,
                  "started_at": epoch s, "ended_at": epoch s | null,
                  "policy_name": <display name>, "policy_user_labels": {k: v},
                  "condition_name": <display name>,
                  "condition": {"name": "projects/P/alertPolicies/ID/conditions/ID", ...},
                  "resource": {"type": T, "labels": {...}}, "resource_display_name": ...,
                  "metric": {"type": M, "displayName": ..., "labels": {...}},
                  "observed_value": "7679.000", "threshold_value": "2001", "summary": ..., "url": ...}}

Which Pitstop signal a policy raises is the policy's own data: its user labels (infra/monitoring/
telemetry/*.json), echoed in every notification as ``policy_user_labels``:

* ``pitstop_signal``: ``hang`` (job-level: the incident is on the job) or ``degraded`` (node-level);
* ``pitstop_job_label`` (hang): the metric label that carries the scheduler's job id (default ``job``),
  ``pitstop_cluster``: the cluster when the metric has no ``cluster`` label;
* ``pitstop_node_label`` (degraded, Managed Prometheus): the metric label naming the node (label
  values are lowercase, so ``hostname`` names dcgm-exporter's ``Hostname``);
* ``pitstop_symptom`` (degraded): what crossed the line (throttle, ecc, row_remap, nvlink, pcie).

Provenance, as for the other sources (core/trust.py): a notification counts only if it came in on
the alerts topic, which IAM lets only Monitoring's notification service agent
(``service-<project number>@gcp-sa-monitoring-notification``) publish to (infra/iam.yaml). Pub/Sub
stamps no publisher identity on a message; the topic a delivery came through is stamped by Pub/Sub
and Eventarc (the CloudEvent ``source``), not by the sender, so it stands for that identity. The
notification must also be about an alert policy of the topic's own project. Anything else shaped
like a notification is ``invalid``, with the reason; it starts nothing and nothing else is lost.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping

from pitstop.core import names, trust
from pitstop.core.actions import Action
from pitstop.core.domain import AlertDetail, AlertEventDetail, JobRef, NodeRef, Source
from pitstop.core.entry import Event, clean, invalid, new_event, new_source
from pitstop.core.envelope import Delivery
from pitstop.core.parse import identify_node

SCHEMA_VERSION = "1.2"
DEFAULT_TOPIC = "pitstop-alerts"
NOTIFICATION_LOG = "monitoring.googleapis.com/alert-notifications"  # source.log_name without a policy id
SIGNAL_LABEL, JOB_LABEL, CLUSTER_LABEL = "pitstop_signal", "pitstop_job_label", "pitstop_cluster"
NODE_LABEL, SYMPTOM_LABEL = "pitstop_node_label", "pitstop_symptom"
# What each signal proposes when its alert opens (a close proposes nothing): a hung job is
# restarted (after the lead's localisation), a degraded node is moved off at a checkpoint.
SIGNALS: Mapping[str, str] = {"hang": Action.RESTART_JOB, "degraded": Action.DRAIN_NODE}
STATES = ("open", "closed")
SYMPTOMS = ("throttle", "ecc", "row_remap", "nvlink", "pcie", "xid", "other")
# GKE managed DCGM (dcgm-exporter on Managed Service for Prometheus) names the node in a metric label.
NODE_LABELS = ("node", "node_name", "Hostname", "instance_name")
WHY_ALERT = (
    "Cloud Monitoring notification on the {topic} topic: only Monitoring's notification service"
    " agent may publish there (IAM), and Pub/Sub, not the sender, says which topic it came through"
)
MAX_LABELS, MAX_VALUE = 16, 256
_TOPIC = re.compile(
    r"(?://pubsub\.googleapis\.com/)?projects/([^/]{1,100})/topics/([A-Za-z][-\w.~+%]{2,254})"
)
_CONDITION = re.compile(r"projects/([^/]{1,100})/alertPolicies/([0-9]{1,30})/conditions/[0-9]{1,30}")
_INCIDENT_ID = re.compile(r"[0-9a-z][0-9a-z._-]{0,63}", re.ASCII)
_LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}", re.ASCII)


def topic_of(source: object) -> tuple[str, str] | None:
    """(project, topic) of a CloudEvent ``source`` or a topic path; None for anything else."""
    m = _TOPIC.fullmatch(source) if isinstance(source, str) else None
    return (m.group(1), m.group(2)) if m else None


def looks_like_notification(doc: Mapping[str, object]) -> bool:
    """A document shaped like a Monitoring notification (whatever topic it came on)."""
    return isinstance(doc.get("incident"), Mapping) and "version" in doc and "logName" not in doc


def _epoch(v: object) -> float | None:
    """Monitoring's epoch seconds (an integer; a numeric string is tolerated), 1971-9998 only."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    try:
        t = float(v)
    except ValueError:
        return None
    return t if math.isfinite(t) and 31_536_000 <= t < 253_370_764_800 else None


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(v: object) -> dict[str, str]:
    """A label map, bounded: string keys and values only, at most MAX_LABELS of them."""
    out: dict[str, str] = {}
    for k, val in v.items() if isinstance(v, Mapping) else ():
        if len(out) >= MAX_LABELS:
            break
        if isinstance(k, str) and _LABEL_KEY.fullmatch(k) and isinstance(val, str | int | float | bool):
            out[k] = clean(str(val), MAX_VALUE)
    return out


def _typed(v: object) -> tuple[str | None, dict[str, str]]:
    """(type, labels) of the notification's ``metric`` or ``resource`` object."""
    if not isinstance(v, Mapping):
        return None, {}
    t = v.get("type")
    return (clean(t, 200) if isinstance(t, str) and t else None), _labels(v.get("labels"))


def provenance_problem(
    topic: tuple[str, str] | None, alerts_topic: str, inc: Mapping[str, object]
) -> str | None:
    """Why a notification is not Monitoring's own for this deployment; None when it is."""
    if topic is None or topic[1] != alerts_topic:
        where = f"topic {topic[1]}" if topic else "an unknown topic"
        return (
            f"a Cloud Monitoring notification counts only from the {alerts_topic} topic (only Monitoring's"
            f" notification service agent may publish there); this one came from {where}"
        )
    scoping = inc.get("scoping_project_id")
    number = inc.get("scoping_project_number")
    if scoping != topic[0] and str(number) != topic[0]:
        return f"notification about another project's alert policy: its scoping project is not {topic[0]}"
    cond = inc.get("condition")
    name = cond.get("name") if isinstance(cond, Mapping) else None
    m = _CONDITION.fullmatch(name) if isinstance(name, str) else None
    if name is not None and (m is None or m.group(1) not in (scoping, str(number))):
        return "the notification's condition is not an alert policy of its scoping project"
    return None


def _source(inc: Mapping[str, object], delivery: Delivery | None, state: str) -> Source:
    """Identity of the notification: one alert incident's one state change (a repeat is a duplicate)."""
    cond = inc.get("condition")
    name = cond.get("name") if isinstance(cond, Mapping) else None
    m = _CONDITION.fullmatch(name) if isinstance(name, str) else None
    log_name = f"projects/{m.group(1)}/alertPolicies/{m.group(2)}" if m else NOTIFICATION_LOG
    iid = inc.get("incident_id")
    insert_id = f"{iid}/{state}" if isinstance(iid, str) else None
    return new_source(log_name, insert_id, delivery.message_id if delivery else None)


def _label(labels: Mapping[str, str], name: str) -> str | None:
    """A metric label by the name a policy user label gives, which Monitoring keeps lowercase."""
    if name in labels:
        return labels[name]
    return next((v for k, v in labels.items() if k.lower() == name.lower()), None)


def _job(
    inc: Mapping[str, object], labels: dict[str, str], policy: dict[str, str]
) -> tuple[JobRef | None, str]:
    """The hung job: the metric label the policy names, the cluster label (or the policy's cluster)."""
    _, res = _typed(inc.get("resource"))
    job_label = policy.get(JOB_LABEL, "job")
    job = _label(labels, job_label)
    cluster = labels.get("cluster") or policy.get(CLUSTER_LABEL)
    project = res.get("project_id") or inc.get("scoping_project_id")
    if not names.valid_job_id(job):
        return None, f"no valid job id in metric label {job_label!r} (a Slurm id or kind/namespace/name)"
    if not names.valid_cluster(cluster):
        return None, "no valid cluster name (metric label cluster, or the policy's pitstop_cluster label)"
    if not names.valid_project(project):
        return None, "no valid project id (resource label project_id or the scoping project)"
    assert isinstance(job, str) and isinstance(cluster, str) and isinstance(project, str)
    return {"project": project, "cluster": cluster, "job": job}, ""


def _node(
    inc: Mapping[str, object], labels: dict[str, str], policy: dict[str, str]
) -> tuple[NodeRef | None, str]:
    """The degraded node, named as parse.identify_node reads a LogEntry's resource (same checks)."""
    res_type, typed = _typed(inc.get("resource"))
    res: dict[str, str | None] = dict(typed)
    display = inc.get("resource_display_name")
    keys = (policy[NODE_LABEL],) if NODE_LABEL in policy else NODE_LABELS
    name = next((v for k in keys if (v := _label(labels, k)) is not None), None)
    meta = inc.get("metadata")
    system = _labels(meta.get("system_labels")) if isinstance(meta, Mapping) else {}
    if (
        res_type == "gce_instance"
    ):  # a compute metric's label, a group-by on the VM's name, or its display name
        name = (
            labels.get("instance_name")
            or system.get("name")
            or (display if isinstance(display, str) else None)
        )
    elif res_type == "prometheus_target":  # Managed Prometheus: cluster, location, and the node in a label
        res = {"project_id": res.get("project_id"), "location": res.get("location"),
               "cluster_name": res.get("cluster"), "node_name": name}  # fmt: skip
        res_type = "k8s_node"
    elif res_type == "k8s_node":
        name = res.get("node_name")
    else:
        return (
            None,
            f"a degraded alert must be on a gce_instance, k8s_node or prometheus_target, not {res_type}",
        )
    entry = {"resource": {"type": res_type, "labels": {k: v for k, v in res.items() if v is not None}}}
    entry["labels"] = {"compute.googleapis.com/resource_name": name} if name else {}
    return identify_node(entry, None)


def _detail(inc: Mapping[str, object], signal: str, state: str, policy: dict[str, str]) -> AlertDetail:
    metric_type, metric = _typed(inc.get("metric"))
    res_type, res = _typed(inc.get("resource"))

    def text(key: str, limit: int = MAX_VALUE) -> str | None:
        v = inc.get(key)
        return clean(str(v), limit) if isinstance(v, str | int | float) and not isinstance(v, bool) else None

    symptom = policy.get(SYMPTOM_LABEL)
    return {
        "incident_id": str(inc["incident_id"]),  # checked: an incident id (_shape_problem)
        "state": state,
        "signal": signal,
        "symptom": symptom if symptom in SYMPTOMS else None,
        "policy": text("policy_name", 256) or "",
        "condition": text("condition_name", 256),
        "metric_type": metric_type,
        "metric_labels": metric,
        "resource_type": res_type,
        "resource_labels": res,
        "observed_value": text("observed_value", 128),
        "threshold_value": text("threshold_value", 128),
        "started_at": _epoch(inc.get("started_at")),
        "ended_at": _epoch(inc.get("ended_at")),
        "summary": text("summary", 512),
    }


def _shape_problem(doc: Mapping[str, object], inc: Mapping[str, object]) -> str | None:
    if doc.get("version") != SCHEMA_VERSION:
        version = clean(str(doc.get("version")), 20)
        return f"not a schema version {SCHEMA_VERSION} notification (version {version!r})"
    iid = inc.get("incident_id")
    if not isinstance(iid, str) or not _INCIDENT_ID.fullmatch(iid):
        return "incident.incident_id is missing or not an incident id"
    state = inc.get("state")
    if not isinstance(state, str) or state.lower() not in STATES:
        return "incident.state is neither open nor closed"
    if _epoch(inc.get("started_at")) is None:
        return "incident.started_at is not an epoch time"
    if state.lower() == "closed" and _epoch(inc.get("ended_at")) is None:
        return "a closed incident without an epoch ended_at"
    return None


def parse_notification(
    doc: Mapping[str, object], delivery: Delivery | None, topic: tuple[str, str] | None, alerts_topic: str
) -> Event:
    """One notification → one event: ``hang``/``degraded``, ``unrelated`` (not a Pitstop policy's)
    or ``invalid`` (forged, malformed); never raises."""
    inc = doc.get("incident")
    if not isinstance(inc, Mapping):
        return invalid("alert notification without an incident object", new_source(NOTIFICATION_LOG))
    raw_state = inc.get("state")
    state = raw_state.lower() if isinstance(raw_state, str) else "?"
    source = _source(inc, delivery, state)
    problem = provenance_problem(topic, alerts_topic, inc) or _shape_problem(doc, inc)
    if problem is not None:
        source["trust_reason"] = problem
        return invalid(problem, source)
    assert topic is not None
    source["trust"], source["trust_reason"] = trust.VERIFIED, WHY_ALERT.format(topic=topic[1])
    at = _epoch(inc.get("ended_at") if state == "closed" else inc.get("started_at"))
    observed_at = _rfc3339(at) if at is not None else None
    policy = _labels(inc.get("policy_user_labels"))
    signal = policy.get(SIGNAL_LABEL)
    if signal is None or signal not in SIGNALS:
        why = "alert policy without a pitstop_signal user label (hang or degraded): not Pitstop's to act on"
        return new_event("unrelated", why, source, observed_at=observed_at)
    detail: AlertEventDetail = {"alert": _detail(inc, signal, state, policy)}
    _, labels = _typed(inc.get("metric"))
    return _subject_event(inc, signal, state, labels, policy, source, observed_at, detail)


def _subject_event(
    inc: Mapping[str, object],
    signal: str,
    state: str,
    labels: dict[str, str],
    policy: dict[str, str],
    source: Source,
    observed_at: str | None,
    detail: AlertEventDetail,
) -> Event:
    """The event on its subject (a job for a hang, a node for a degraded GPU), with its reason."""
    action = SIGNALS[signal] if state == "open" else Action.NONE
    alert = detail["alert"]
    what = f"alert {alert['policy']!r} {'opened' if state == 'open' else 'closed'}"
    value = f" (observed {alert['observed_value']}, threshold {alert['threshold_value']})"
    value = value if state == "open" and alert["observed_value"] else ""
    if signal == "hang":
        job, why = _job(inc, labels, policy)
        if job is None:
            return invalid(f"hang alert: {why}", source, observed_at=observed_at, detail=detail)
        reason = f"{what} on job {job['job']} of cluster {job['cluster']}{value}"
        return new_event(
            "hang", reason[:512], source, action=action, observed_at=observed_at, detail=detail, job=job
        )
    node, why = _node(inc, labels, policy)
    if node is None:
        return invalid(f"degraded alert: {why}", source, observed_at=observed_at, detail=detail)
    symptom = f" [{alert['symptom']}]" if alert["symptom"] else ""
    reason = f"{what} on {node['instance']}{symptom}{value}"
    return new_event(
        "degraded", reason[:512], source, action=action, node=node, observed_at=observed_at, detail=detail
    )


def is_alert(ev: Mapping[str, object]) -> bool:
    """An event from a Monitoring notification (its open or close changes an episode's state)."""
    detail = ev.get("detail")
    return isinstance(detail, Mapping) and isinstance(detail.get("alert"), Mapping)
