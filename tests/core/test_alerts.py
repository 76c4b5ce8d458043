"""Cloud Monitoring notifications (schema 1.2) → FaultEvents: every field, provenance, bad input.

Real notifications: tests/fixtures/alert_notifications.yaml. Pitstop's own policies' notifications
are built from the deployed policy files by pitstop.local.alerting (the shape of the real ones).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import alerts, engine
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent, NodeRef, Remediation
from pitstop.local import alerting
from tests.helpers import (
    ALERTS_TOPIC,
    PROJECT,
    ZONE,
    alert_delivery,
    assert_valid_event,
    job_alert,
    load_fixture,
    node_alert,
    push_body,
)

REAL = {c["id"]: c["notification"] for c in load_fixture("alert_notifications.yaml")}
CLF = Classifier.default()
T_OPEN, T_CLOSE = 1_790_000_000, 1_790_000_300


def hang(state: str = "open", job: str = "4242") -> dict[str, Any]:
    return job_alert(state, "0.hang4242", T_OPEN, T_CLOSE if state == "closed" else None, job=job)


def throttle(state: str = "open", node: str = "a3-node-003", incident: str = "0.thr003") -> dict[str, Any]:
    return node_alert(
        "gpu-throttle", state, incident, T_OPEN, T_CLOSE if state == "closed" else None, node, "0.62"
    )


def on_topic(doc: Mapping[str, object], project: str = PROJECT, topic: str = ALERTS_TOPIC) -> FaultEvent:
    ev = CLF.classify(alert_delivery(doc, topic=topic, project=project))
    assert_valid_event(ev)
    return ev


def with_signal(doc: dict[str, Any], **labels: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["incident"]["policy_user_labels"] = labels
    return doc


# -- the real notifications -----------------------------------------------------------------


def test_a_real_notification_of_a_foreign_policy_is_believed_but_unrelated() -> None:
    ev = on_topic(REAL["real-open"], project="flanksource-sandbox")
    assert ev["kind"] == "unrelated" and ev["action"] == "NONE"
    assert "pitstop_signal" in ev["reason"]
    assert ev["source"]["trust"] == "verified"
    assert ev["source"]["insert_id"] == "0.nrwotmyokd9n/open"
    assert ev["source"]["log_name"] == "projects/flanksource-sandbox/alertPolicies/12942885046098191375"
    assert ev["source"]["message_id"] == "9001"


def test_a_real_open_notification_read_field_by_field() -> None:
    ev = on_topic(with_signal(REAL["real-open"], pitstop_signal="degraded"), project="flanksource-sandbox")
    assert (ev["kind"], ev["action"], ev["xid"], ev["gpu"]) == ("degraded", "DRAIN_NODE", None, None)
    assert ev["node"] == {
        "project": "flanksource-sandbox",
        "zone": "europe-west1-b",
        "instance": "gke-hub-cluster-private-pool-containe-de26c8a2-0se1",
        "instance_id": "1943820386402233898",
    }
    assert ev["observed_at"] == "2025-05-02T09:39:54Z"  # started_at 1746178794
    assert ev["detail"]["alert"] == {
        "incident_id": "0.nrwotmyokd9n",
        "state": "open",
        "signal": "degraded",
        "symptom": None,
        "policy": "Test-incident-canary",
        "condition": "VM Instance - Sent packets",
        "metric_type": "compute.googleapis.com/instance/network/sent_packets_count",
        "metric_labels": {
            "instance_name": "gke-hub-cluster-private-pool-containe-de26c8a2-0se1",
            "loadbalanced": "false",
        },
        "resource_type": "gce_instance",
        "resource_labels": {
            "instance_id": "1943820386402233898",
            "project_id": "flanksource-sandbox",
            "zone": "europe-west1-b",
        },
        "observed_value": "7679.000",
        "threshold_value": "2001",
        "started_at": 1746178794.0,
        "ended_at": None,
        "summary": REAL["real-open"]["incident"]["summary"],
    }
    assert "opened on gke-hub-cluster-private-pool-containe-de26c8a2-0se1" in ev["reason"]
    assert "observed 7679.000, threshold 2001" in ev["reason"]


def test_a_real_closed_notification_asks_for_nothing_and_is_dated_by_its_end() -> None:
    ev = on_topic(with_signal(REAL["real-closed"], pitstop_signal="degraded"), project="flanksource-sandbox")
    assert (ev["kind"], ev["action"]) == ("degraded", "NONE")
    assert ev["detail"]["alert"]["state"] == "closed"
    assert ev["detail"]["alert"]["ended_at"] == 1746178747.0
    assert ev["observed_at"] == "2025-05-02T09:39:07Z"
    assert str(ev["detail"]["alert"]["observed_value"]).startswith("Incident cancelled")  # text, kept as text
    assert ev["source"]["insert_id"] == "0.nrwo9fe1a4wg/closed"
    assert "closed on" in ev["reason"]


# -- Pitstop's own policies -----------------------------------------------------------------


def test_a_hang_is_on_the_job_not_a_node() -> None:
    ev = on_topic(hang())
    assert (ev["kind"], ev["action"], ev["node"]) == ("hang", "RESTART_JOB", None)
    assert ev["job"] == {"project": PROJECT, "cluster": "train", "job": "4242"}
    assert ev["detail"]["alert"]["metric_type"] == "custom.googleapis.com/pitstop/job/heartbeat"
    assert ev["detail"]["alert"]["signal"] == "hang"
    assert "on job 4242 of cluster train" in ev["reason"]
    closed = on_topic(hang("closed"))
    assert (closed["kind"], closed["action"], closed["job"]) == ("hang", "NONE", ev["job"])


def test_a_gke_job_id_is_a_job_too() -> None:
    ev = on_topic(hang(job="jobset/team-a/llama-70b"))
    assert ev["job"]["job"] == "jobset/team-a/llama-70b"


def test_a_policy_may_name_the_job_label_and_the_cluster() -> None:
    doc = hang()
    inc = doc["incident"]
    inc["metric"]["labels"] = {"slurm_job_id": "77"}
    inc["policy_user_labels"] = {
        "pitstop_signal": "hang",
        "pitstop_job_label": "slurm_job_id",
        "pitstop_cluster": "train",
    }
    ev = on_topic(doc)
    assert ev["job"] == {"project": PROJECT, "cluster": "train", "job": "77"}


@pytest.mark.parametrize("stem", sorted(s for s in alerting.policies() if s != "job-heartbeat"))
def test_every_node_policy_opens_a_degraded_event_on_its_node(stem: str) -> None:
    gke = alerting.policies()[stem]["userLabels"].get("pitstop_node_label") == "hostname"
    common: dict[str, Any] = {"incident_id": f"0.{stem}", "project": PROJECT, "started_at": T_OPEN}
    if gke:
        doc = alerting.notification(
            stem,
            "open",
            metric_labels={"Hostname": "gke-train-a3-pool-1f2e3d4c-0003"},
            resource_type="prometheus_target",
            resource_labels={"project_id": PROJECT, "location": "us-central1", "cluster": "train"},
            **common,
        )
    else:
        doc = alerting.notification(
            stem,
            "open",
            metric_labels={},
            resource_type="gce_instance",
            resource_labels={"project_id": PROJECT, "zone": ZONE, "instance_id": "7000000003"},
            display_name="a3-node-003",
            **common,
        )
    ev: Any = on_topic(doc)
    symptom = alerting.policies()[stem]["userLabels"]["pitstop_symptom"]
    assert (ev["kind"], ev["action"], ev["detail"]["alert"]["symptom"]) == ("degraded", "DRAIN_NODE", symptom)
    if gke:  # a regional cluster's node: ingest looks its zone up, as for its log entries
        assert ev["node"]["instance"] == "gke-train-a3-pool-1f2e3d4c-0003"
        assert (ev["node"]["zone"], ev["node"]["region"], ev["node"]["cluster"]) == (
            None,
            "us-central1",
            "train",
        )
    else:
        assert ev["node"] == {
            "project": PROJECT,
            "zone": ZONE,
            "instance": "a3-node-003",
            "instance_id": "7000000003",
        }


# -- provenance: only Monitoring's own notifications -------------------------------------------


@pytest.mark.parametrize(
    ("topic", "project", "why"),
    [
        ("pitstop-events", PROJECT, "counts only from the pitstop-alerts topic"),
        ("someone-elses", PROJECT, "came from topic someone-elses"),
        (ALERTS_TOPIC, "other-project", "scoping project is not other-project"),
    ],
)
def test_a_notification_from_anywhere_else_is_invalid(topic: str, project: str, why: str) -> None:
    ev = on_topic(throttle(), project=project, topic=topic)
    assert (ev["kind"], ev["action"], ev["node"]) == ("invalid", "NONE", None)
    assert why in ev["reason"] and ev["source"]["trust"] == "unverified"


def test_a_notification_without_its_topic_is_invalid() -> None:
    for envelope in (push_body(throttle()), throttle()):  # a raw push body or a bare document: no topic
        ev = CLF.classify(envelope)
        assert ev["kind"] == "invalid" and "an unknown topic" in ev["reason"]


def test_a_condition_of_another_project_is_invalid() -> None:
    doc = throttle()
    doc["incident"]["condition"]["name"] = "projects/evil-proj/alertPolicies/1/conditions/2"
    ev = on_topic(doc)
    assert (
        ev["kind"] == "invalid" and "condition is not an alert policy of its scoping project" in ev["reason"]
    )


def test_a_log_entry_on_the_alerts_topic_is_invalid() -> None:
    entry = {"logName": f"projects/{PROJECT}/logs/syslog", "insertId": "x", "jsonPayload": {"message": "hi"}}
    ev = CLF.classify(alert_delivery(entry))
    assert ev["kind"] == "invalid" and "carries Cloud Monitoring notifications only" in ev["reason"]


# -- malformed -----------------------------------------------------------------------------


def _broken(path: str, value: Any) -> dict[str, Any]:
    doc = hang()
    target = doc
    *parents, leaf = path.split(".")
    for p in parents:
        target = target[p]
    if value is KeyError:
        target.pop(leaf)
    else:
        target[leaf] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        ("version", "test", "not a schema version 1.2 notification"),  # the console's test notification
        ("version", KeyError, "carries Cloud Monitoring notifications only"),  # not even shaped like one
        ("incident.incident_id", KeyError, "incident_id is missing"),
        ("incident.incident_id", "../../x", "not an incident id"),
        ("incident.state", "acknowledged", "neither open nor closed"),
        ("incident.started_at", "yesterday", "started_at is not an epoch time"),
        ("incident.started_at", 10**15, "started_at is not an epoch time"),
        ("incident.metric", {"labels": {"cluster": "train"}}, "no valid job id"),
        ("incident.metric.labels.job", "4242; scontrol cancel 1", "no valid job id"),
        ("incident.metric.labels.job", "jobset/team-a/../../x", "no valid job id"),
        ("incident.metric.labels.cluster", "Train_Cluster", "no valid cluster name"),
    ],
)
def test_a_malformed_notification_is_a_clear_error_record(path: str, value: Any, why: str) -> None:
    ev = on_topic(_broken(path, value))
    assert (ev["kind"], ev["action"], ev["node"]) == ("invalid", "NONE", None) and "job" not in ev
    assert why in ev["reason"], ev["reason"]


def test_a_closed_notification_needs_its_end() -> None:
    doc = hang("closed")
    doc["incident"]["ended_at"] = None
    ev = on_topic(doc)
    assert ev["kind"] == "invalid" and "without an epoch ended_at" in ev["reason"]


@pytest.mark.parametrize("name", ["ALL", "a3-node-[000-003]", "A3-NODE", "x" * 64, ""])
def test_a_degraded_alert_on_no_valid_node_is_invalid(name: str) -> None:
    doc = throttle(node=name)
    ev = on_topic(doc)
    assert ev["kind"] == "invalid" and ev["reason"].startswith("degraded alert:")


def test_a_degraded_alert_on_another_resource_is_invalid() -> None:
    doc = throttle()
    doc["incident"]["resource"] = {"type": "k8s_container", "labels": {"project_id": PROJECT}}
    ev = on_topic(doc)
    assert ev["kind"] == "invalid" and "not k8s_container" in ev["reason"]


def test_label_maps_are_bounded() -> None:
    doc = throttle()
    doc["incident"]["metric"]["labels"] = {f"k{i}": "v" * 1000 for i in range(100)}
    ev = on_topic(doc)
    labels = ev["detail"]["alert"]["metric_labels"]
    assert len(labels) == alerts.MAX_LABELS and all(len(v) == alerts.MAX_VALUE for v in labels.values())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(hang()["incident"])), value=JSON)
def test_any_field_replaced_by_anything_never_raises(field: str, value: Any) -> None:
    doc = hang()
    doc["incident"][field] = value
    ev = on_topic(doc)
    assert ev["kind"] in ("hang", "invalid", "unrelated")


# -- the policies as data ---------------------------------------------------------------------

LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")  # Monitoring user label keys and values
SOURCES = ("NVIDIA/", "dcgm", "Greyhound", "ByteRobust", "opentelemetry-operations-collector")


@pytest.mark.parametrize("stem", sorted(alerting.policies()))
def test_each_telemetry_policy_is_an_alert_policy_that_says_what_it_raises_and_why(stem: str) -> None:
    """Each file parses, strictly, as the Monitoring API's AlertPolicy (gcloud sends it as is), names its
    Pitstop signal in user labels the parser reads, and cites where its metric and threshold come from."""
    from google.cloud import monitoring_v3

    text = (alerting.TELEMETRY / f"{stem}.json").read_text()
    policy = monitoring_v3.AlertPolicy.from_json(text)  # unknown fields raise
    labels = dict(policy.user_labels)
    assert all(LABEL.fullmatch(k) and LABEL.fullmatch(v) for k, v in labels.items())
    assert labels[alerts.SIGNAL_LABEL] in alerts.SIGNALS
    if labels[alerts.SIGNAL_LABEL] == "degraded":
        assert labels[alerts.SYMPTOM_LABEL] in alerts.SYMPTOMS
    assert len(policy.conditions) == 1 and policy.alert_strategy.auto_close.total_seconds() > 0
    assert any(s in policy.documentation.content for s in SOURCES), "cite the metric's and threshold's source"


def test_deploy_accepts_exactly_the_signals_the_parser_knows() -> None:
    from pitstop.tools import deploy

    assert tuple(alerts.SIGNALS) == deploy.SIGNALS


def test_a_page_about_a_hang_names_its_job_where_others_name_their_node() -> None:
    from pitstop.core import notifications
    from pitstop.plugins.channels.pagerduty.body import pagerduty_event

    job = {"project": PROJECT, "cluster": "train", "job": "4242"}
    page = {"severity": "critical", "summary": "held", "incident": {"id": "iabc", "node": None, "job": job}}
    assert "node: job 4242 of train" in notifications.text_lines(page)[1]
    event = pagerduty_event(page, "k" * 32, "trigger")
    assert "job 4242 of train" in str(event["payload"])


# -- the engine on alert episodes (the memory store: the same engine and commit rules) -------------

T_NOW = 1_800_000_000
XID79_LINE = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _feed(store: Any, pol: Any, doc: dict[str, Any], at: float) -> Any:
    ev = CLF.classify(alert_delivery(doc, message_id=f"m{at}"))
    ev["_observed_ts"] = at
    return store.apply(ev, pol, at)


def _policy(**over: Any) -> Any:
    from pitstop.core import policy

    cluster = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
    return policy.from_doc({"mode": "enforce", "clusters": [cluster], **over})


def test_a_held_episode_ends_with_its_alert_and_an_earlier_cooldown_stays() -> None:
    from pitstop.adapters.memory_store import MemoryStore

    store, pol = MemoryStore(), _policy(enabled_actions=["RESTART_JOB"])  # DRAIN_NODE needs a person
    node_key = f"{PROJECT}.{ZONE}.a3-node-003"
    vm: NodeRef = {"project": PROJECT, "zone": ZONE, "instance": "a3-node-003", "instance_id": "7000000003"}
    earlier: Remediation = {"at": 42.0, "action": "REBOOT_NODE", "incident": "iold", "mode": "enforce"}
    store.docs.nodes[node_key] = {
        **engine.new_node(vm),
        "last_action_at": {"REBOOT_NODE": 42.0},
        "remediations": [earlier],
    }
    opened = _feed(store, pol, node_alert("gpu-throttle", "open", "0.a", T_NOW, None), T_NOW)
    assert opened.result == "held" and opened.page is not None
    ended = _feed(store, pol, node_alert("gpu-throttle", "closed", "0.a", T_NOW, T_NOW + 60), T_NOW + 60)
    assert ended.result == "ended" and ended.incident is not None and ended.incident["held"] is None
    assert store.docs.nodes[node_key]["last_action_at"] == {"REBOOT_NODE": 42.0}  # not its own: kept


def test_a_close_that_overtakes_its_open_is_dropped_and_the_open_starts_an_episode() -> None:
    """Push delivery is unordered: a close with no episode asks nothing; its open still opens one
    (the policy's autoClose and a person bound it; the alert's own close is what ends it)."""
    from pitstop.adapters.memory_store import MemoryStore

    store, pol = MemoryStore(), _policy(mode="observe")
    assert _feed(store, pol, job_alert("closed", "0.z", T_NOW, T_NOW + 30), T_NOW + 30).result == "ignored"
    assert _feed(store, pol, job_alert("open", "0.z", T_NOW, None), T_NOW + 31).result == "opened"


def test_an_alert_opening_after_the_flap_window_is_a_new_episode() -> None:
    from pitstop.adapters.memory_store import MemoryStore

    store, pol = MemoryStore(), _policy(mode="observe")
    first = _feed(store, pol, job_alert("open", "0.1", T_NOW, None), T_NOW)
    assert _feed(store, pol, job_alert("closed", "0.1", T_NOW, T_NOW + 10), T_NOW + 10).result == "ended"
    late = _feed(store, pol, job_alert("open", "0.2", T_NOW + 1000, None), T_NOW + 1000)  # flap window: 900 s
    assert late.result == "opened" and late.incident is not None and first.incident is not None
    assert late.incident["id"] != first.incident["id"]


def test_an_alert_closing_does_not_end_an_episode_its_open_did_not_start() -> None:
    """A degraded alert absorbed into an Xid episode (held for a person) is recorded on it; its
    close leaves the Xid's episode as it was."""
    from pitstop.adapters.memory_store import MemoryStore
    from tests.helpers import journald_entry

    store, pol = MemoryStore(), _policy(enabled_actions=["RESTART_JOB"])  # REBOOT_NODE needs a person
    xid = CLF.classify(journald_entry(XID79_LINE, instance="a3-node-003"))
    xid["_observed_ts"] = T_NOW
    held = store.apply(xid, pol, T_NOW)
    assert held.result == "held" and held.incident is not None
    assert (
        _feed(store, pol, node_alert("gpu-throttle", "open", "0.q", T_NOW, None), T_NOW + 5).result
        == "absorbed"
    )
    after = _feed(store, pol, node_alert("gpu-throttle", "closed", "0.q", T_NOW, T_NOW + 9), T_NOW + 9)
    assert after.result == "absorbed" and after.incident is not None
    assert after.incident["state"] == "HELD" and after.incident["alerts"][0]["state"] == "closed"
