"""Builders for log entries in every carrier and envelope the pipeline receives."""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from pitstop.core import resources
from pitstop.core.domain import Incident
from pitstop.local.fake_compute import default_id
from pitstop.local.fake_k8s import FakeKube

FIXTURES = Path(__file__).parent / "fixtures"
PROJECT = "train-prod"
ZONE = "us-central1-a"


def load_fixture(name: str) -> list[dict[str, Any]]:
    with open(FIXTURES / name, encoding="utf-8") as f:
        data: list[dict[str, Any]] = yaml.safe_load(f)
    return data


KERNEL_LOG_ID = "pitstop-kernel"  # the systemd_journald receiver's id in infra/ops-agent/config.yaml


def gce_resource(
    instance: str, project: str = PROJECT, zone: str = ZONE, instance_id: str | None = None
) -> dict[str, Any]:
    """The monitored resource the logging pipeline attaches: the VM's numeric id (by default the id
    the fake Compute Engine gives that VM before any recreate), project and zone."""
    iid = instance_id or default_id(project, zone, instance)
    return {"type": "gce_instance", "labels": {"instance_id": iid, "project_id": project, "zone": zone}}


def journald_entry(
    line: str,
    instance: str = "a3-node-001",
    insert_id: str = "ins-1",
    transport: str | None = "kernel",
    facility: str | None = "0",
    project: str = PROJECT,
    resource: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One journal record as the Ops Agent's systemd_journald receiver ships it (infra/ops-agent/).

    Journal fields pass through unchanged (string values, trusted fields keep their leading
    underscore). ``transport="kernel"`` is a line the kernel logged: verified evidence. Any other
    transport (``syslog`` for logger, ``stdout`` for systemd-cat, ``journal`` for sd_journal_send)
    or none is what a process on the VM can write: unverified.
    """
    payload: dict[str, Any] = {
        "MESSAGE": line,
        "PRIORITY": "4",
        "SYSLOG_FACILITY": facility,
        "SYSLOG_IDENTIFIER": "kernel",
        "_BOOT_ID": "3f1c0a9d2b8e4c6f9a7d5e1b2c3d4e5f",
        "_MACHINE_ID": "9b2e6d4c1a0f4e3d8c7b6a5f4e3d2c1b",
        "_HOSTNAME": instance,
        "_SOURCE_MONOTONIC_TIMESTAMP": "6781741548779",
        "_TRANSPORT": transport,
    }
    if transport != "kernel":
        payload.update({"SYSLOG_IDENTIFIER": "mallory", "_PID": "4242", "_UID": "1000", "_COMM": "logger"})
    payload = {k: v for k, v in payload.items() if v is not None}
    return {
        "insertId": insert_id,
        "jsonPayload": payload,
        "labels": {"compute.googleapis.com/resource_name": instance},
        "logName": f"projects/{project}/logs/{KERNEL_LOG_ID}",
        "receiveTimestamp": "2026-11-21T10:42:31.782066320Z",
        "resource": resource or gce_resource(instance),
        "severity": "WARNING",
        "timestamp": "2026-11-21T10:42:31.325309Z",
    }


def ops_agent_entry(line: str, instance: str = "a3-node-001", insert_id: str = "ins-1") -> dict[str, Any]:
    """The default: a driver line as the kernel logged it, from Pitstop's Ops Agent config (verified)."""
    return journald_entry(line, instance, insert_id)


def syslog_entry(line: str, instance: str = "a3-node-001", insert_id: str = "ins-1") -> dict[str, Any]:
    """The Ops Agent's built-in text syslog receiver (/var/log/syslog, /var/log/messages): unverified."""
    return {
        "insertId": insert_id,
        "jsonPayload": {"message": line},
        "labels": {"compute.googleapis.com/resource_name": instance},
        "logName": f"projects/{PROJECT}/logs/syslog",
        "receiveTimestamp": "2026-11-21T10:42:31.782066320Z",
        "resource": gce_resource(instance),
        "severity": "DEFAULT",
        "timestamp": "2026-11-21T10:42:31.325309Z",
    }


def legacy_agent_entry(line: str, instance: str = "a3-node-001", insert_id: str = "ins-1") -> dict[str, Any]:
    """The legacy (fluentd) logging agent's text syslog: textPayload, unverified."""
    e = syslog_entry(line, instance, insert_id)
    del e["jsonPayload"]
    e["textPayload"] = line
    return e


def gke_journal_entry(
    line: str, instance: str = "a3-node-001", insert_id: str = "ins-1", transport: str | None = "kernel"
) -> dict[str, Any]:
    """GKE's node-journal (k8s_node). Its exact field set is unverified (reference/gke.md §1);
    kernel records are assumed to keep journald's ``_TRANSPORT``."""
    payload: dict[str, Any] = {"MESSAGE": line, "SYSLOG_IDENTIFIER": "kernel", "_HOSTNAME": instance}
    if transport is not None:
        payload["_TRANSPORT"] = transport
    return {
        "insertId": insert_id,
        "jsonPayload": payload,
        "logName": f"projects/{PROJECT}/logs/node-journal",
        "resource": {
            "type": "k8s_node",
            "labels": {
                "project_id": PROJECT,
                "location": ZONE,
                "cluster_name": "train",
                "node_name": instance,
            },
        },
        "timestamp": "2026-11-21T10:42:31.325309Z",
    }


CARRIERS = {
    "ops_agent": ops_agent_entry,
    "syslog": syslog_entry,
    "legacy_agent": legacy_agent_entry,
    "gke_journal": gke_journal_entry,
}
# What each carrier's lines count as (core/trust.py).
CARRIER_TRUST = {
    "ops_agent": "verified",
    "syslog": "unverified",
    "legacy_agent": "unverified",
    "gke_journal": "verified",
}


def system_event_entry(case: dict[str, Any]) -> dict[str, Any]:
    """A fixture's real entry, or the real host-error shape with the case's method/status/metadata."""
    if "entry" in case:
        entry: dict[str, Any] = copy.deepcopy(case["entry"])
        return entry
    base: dict[str, Any] = copy.deepcopy(
        next(c for c in load_fixture("system_events.yaml") if c["id"] == "host-error")["entry"]
    )
    method = case["method"]
    base["protoPayload"]["methodName"] = method
    base["protoPayload"]["request"]["@type"] = f"type.googleapis.com/{method}"
    base["operation"]["producer"] = method
    if "status" in case:
        base["protoPayload"]["status"]["message"] = case["status"]
    if "metadata" in case:
        base["protoPayload"]["metadata"] = case["metadata"]
    if "resource_name" in case:
        base["protoPayload"]["resourceName"] = case["resource_name"]
        base["resource"]["labels"]["project_id"] = "my-training-proj"
        base["logName"] = "projects/my-training-proj/logs/cloudaudit.googleapis.com%2Fsystem_event"
    return base


def retarget_system_event(
    entry: dict[str, Any], instance: str, project: str = PROJECT, zone: str = ZONE
) -> dict[str, Any]:
    """Point a system event at another VM and keep it Google's: the resource, its labels and the
    log name (which must name the resource's project) move together."""
    entry["protoPayload"]["resourceName"] = f"projects/{project}/zones/{zone}/instances/{instance}"
    entry["resource"]["labels"].update({"project_id": project, "zone": zone})
    entry["logName"] = f"projects/{project}/logs/cloudaudit.googleapis.com%2Fsystem_event"
    return entry


def push_body(entry: dict[str, Any], message_id: str = "4711") -> dict[str, Any]:
    data = base64.b64encode(json.dumps(entry).encode()).decode()
    return {
        "subscription": f"projects/{PROJECT}/subscriptions/pitstop-events-push",
        "message": {
            "data": data,
            "attributes": {"logging.googleapis.com/timestamp": "2026-11-21T10:42:31Z"},
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": "2026-11-21T10:42:32.100Z",
            "publish_time": "2026-11-21T10:42:32.100Z",
        },
    }


def cloud_event(entry: dict[str, Any], message_id: str = "4711") -> dict[str, Any]:
    push = push_body(entry, message_id)
    return {
        "specversion": "1.0",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/pitstop-events",
        "id": message_id,
        "time": "2026-11-21T10:42:32.100Z",
        "datacontenttype": "application/json",
        "data": {
            "subscription": push["subscription"],
            "message": {"@type": "type.googleapis.com/google.pubsub.v1.PubsubMessage", **push["message"]},
        },
    }


def bare(entry: dict[str, Any]) -> dict[str, Any]:
    return entry


ENVELOPES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "bare": bare,
    "push": push_body,
    "cloudevent": cloud_event,
}


def assert_valid_event(ev: Mapping[str, Any]) -> None:
    resources.validate(ev, "fault_event.schema.json", "FaultEvent")


def subset(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    for k, v in expected.items():
        assert k in actual, f"missing {k!r} in {actual}"
        assert actual[k] == v, f"{k}: expected {v!r}, got {actual[k]!r}"


ALERTS_TOPIC = "pitstop-alerts"


def alert_delivery(
    notification: Mapping[str, object],
    topic: str = ALERTS_TOPIC,
    project: str = PROJECT,
    message_id: str = "9001",
) -> dict[str, Any]:
    """A Monitoring notification as Eventarc hands it to ingest: a CloudEvent whose ``source`` is the
    topic it came through (reference/gcp-events.md §4), the notification as the message's data."""
    data = base64.b64encode(json.dumps(notification).encode()).decode()
    return {
        "specversion": "1.0",
        "type": "google.cloud.pubsub.topic.v1.messagePublished",
        "source": f"//pubsub.googleapis.com/projects/{project}/topics/{topic}",
        "id": message_id,
        "time": "2026-11-21T10:42:32.100Z",
        "datacontenttype": "application/json",
        "data": {
            "subscription": f"projects/{project}/subscriptions/eventarc-us-central1-pitstop-ingest-alerts",
            "message": {
                "@type": "type.googleapis.com/google.pubsub.v1.PubsubMessage",
                "data": data,
                "messageId": message_id,
                "publishTime": "2026-11-21T10:42:32.100Z",
            },
        },
    }


def node_alert(
    stem: str,
    state: str,
    incident: str,
    started_at: int,
    ended_at: int | None,
    node: str = "a3-node-003",
    observed: str = "0.6",
) -> dict[str, Any]:
    """A notification of a node policy (infra/monitoring/telemetry/<stem>.json) on a VM of PROJECT."""
    from pitstop.local import alerting

    return dict(
        alerting.notification(
            stem,
            state,
            incident_id=incident,
            project=PROJECT,
            metric_labels={},
            resource_type="gce_instance",
            resource_labels={"project_id": PROJECT, "zone": ZONE, "instance_id": "7000000003"},
            display_name=node,
            started_at=started_at,
            ended_at=ended_at,
            observed=observed,
        )
    )


def job_alert(
    state: str, incident: str, started_at: int, ended_at: int | None, job: str = "4242"
) -> dict[str, Any]:
    """A notification of the heartbeat policy about one job of cluster ``train``."""
    from pitstop.local import alerting

    return dict(
        alerting.notification(
            "job-heartbeat",
            state,
            incident_id=incident,
            project=PROJECT,
            metric_labels={"cluster": "train", "job": job},
            resource_type="global",
            resource_labels={"project_id": PROJECT},
            started_at=started_at,
            ended_at=ended_at,
        )
    )


class ManualClock:
    """A clock a test moves by hand (``clock.t += 60``)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class RecordingTopic:
    """An in-memory notifications topic: what was published, as JSON carried it."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, notification: Mapping[str, Any]) -> str:
        self.published.append(json.loads(json.dumps(notification)))
        return str(len(self.published))


def partial_incident(doc: Mapping[str, Any]) -> Incident:
    """An incident document with only the fields a core decision reads (tests of one rule)."""
    return cast(Incident, dict(doc))


def kube_running_checks(state: Path, namespace: str = "pitstop-system") -> FakeKube:
    """A started fake API server whose kubelet runs pods' commands as processes, the GPU stand-ins
    in them reading each node's outcome from ``state``; with Pitstop's check namespace (deploy
    creates it). The caller adds the nodes and stops it."""
    env = {"PATH": os.environ["PATH"], "PITSTOP_GPU_STATE": str(state)}
    env.update({k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ})
    k = FakeKube(vm_status=None, auto=True, interval=0.05, run_containers=True, container_env=env)
    k.start()
    k.create({"kind": "Namespace", "metadata": {"name": namespace}})
    return k


def hand_edit(store: object, iid: str, change: Callable[[Any], object]) -> None:
    """Change a stored incident as a person (or another writer) would, outside Pitstop's decisions:
    what a test stages (a state the watchdog or a console left) before it asks Pitstop to act.
    Product code has no such door: every change to an incident is core/aggregate.decide's."""
    incidents = getattr(store, "incidents", None)
    if isinstance(incidents, dict):  # the memory store
        doc = copy.deepcopy(incidents[iid])
        change(doc)
        incidents[iid] = doc
        return
    ref = cast(Any, incidents).document(iid)  # a Firestore collection
    doc = ref.get().to_dict()
    change(doc)
    ref.set(doc)
    snaps = getattr(store, "snaps", None)
    if snaps is not None:
        snaps.drop(ref.path)
