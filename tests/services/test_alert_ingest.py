"""Alert notifications through ingest on the Firestore emulator: a hang on its job, a degraded node,
a close before anything was done, a flapping alert, a forged notification.

The notifications are the deployed policies' own (pitstop.local.alerting, the real 1.2 shape), handed
to ingest as Eventarc hands them: a CloudEvent whose source is the topic they came through.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import firestore

from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.workflows import WorkflowStarter
from pitstop.core import policy
from pitstop.local.executions_server import ExecutionsService
from pitstop.services.ingest import Ingest
from tests.helpers import PROJECT, ZONE, alert_delivery, job_alert, node_alert

pytestmark = pytest.mark.emulator

T0 = 1_800_000_000
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
JOB_KEY = f"job.{PROJECT}.train.4242"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_ingest(fs: firestore.Client, clock: Clock, endpoint: str | None = None, **over: Any) -> Ingest:
    doc: dict[str, Any] = {"mode": "enforce", "clusters": [CLUSTER], **over}
    starter = WorkflowStarter(PROJECT, "us-central1", "pitstop-remediate", endpoint) if endpoint else None
    return Ingest(policy.from_doc(doc), IncidentStore(fs, "pitstop"), starter, None, clock=clock)


def hang(state: str, incident: str = "0.hang4242", at: int = T0, message: str = "1") -> dict[str, Any]:
    doc = job_alert(state, incident, at - 120, at if state == "closed" else None)
    return alert_delivery(doc, message_id=message)


def degraded(stem: str, state: str, incident: str, at: int, message: str) -> dict[str, Any]:
    doc = node_alert(stem, state, incident, at - 600, at if state == "closed" else None)
    return alert_delivery(doc, message_id=message)


def docs(fs: firestore.Client, name: str) -> dict[str, dict[str, Any]]:
    return {s.id: s.to_dict() or {} for s in fs.collection(f"pitstop_{name}").stream()}


def test_a_hang_opens_one_incident_on_its_job_and_starts_one_execution(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    ing = make_ingest(fs_client, Clock(), endpoint)
    out = ing.handle_payload(hang("open"))
    assert out.result == "opened" and out.incident is not None
    inc = docs(fs_client, "incidents")[out.incident["id"]]
    assert (inc["kind"], inc["action"], inc["node"]) == ("hang", "RESTART_JOB", None)
    assert inc["job"] == {"project": PROJECT, "cluster": "train", "job": "4242"}
    assert (inc["node_key"], inc["cluster"], inc["scheduler"], inc["trust"]) == (
        JOB_KEY,
        "train",
        "slurm",
        "verified",
    )
    assert inc["alerts"][0]["id"] == "0.hang4242" and inc["alerts"][0]["state"] == "open"
    assert inc["timeline"]["detected"] == T0 - 120  # the alert's own start: MTTD counts its window
    assert inc["workflow"]["state"] == "started" and svc.created == 1
    assert docs(fs_client, "nodes")[JOB_KEY]["job"]["job"] == "4242"
    # a redelivery, and Monitoring repeating the same notification in a new message: nothing new
    assert ing.handle_payload(hang("open")).result == "duplicate"
    assert ing.handle_payload(hang("open", message="2")).result == "duplicate"
    assert svc.created == 1 and len(docs(fs_client, "incidents")) == 1


def test_a_close_before_anything_was_done_ends_the_episode(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, clock)  # no starter: the decided step stays pending, nothing is done
    opened = ing.handle_payload(degraded("gpu-throttle", "open", "0.thr", T0, "1"))
    assert opened.result == "opened" and opened.incident is not None
    iid = opened.incident["id"]
    assert opened.incident["action"] == "DRAIN_NODE" and opened.incident["budget_scopes"]
    clock.t += 300
    out = ing.handle_payload(degraded("gpu-throttle", "closed", "0.thr", T0 + 300, "2"))
    assert out.result == "ended"
    inc = docs(fs_client, "incidents")[iid]
    assert inc["state"] == "RESOLVED" and inc["timeline"]["resolved"] == T0 + 300
    assert inc["alert_ended"]["flap_until"] == T0 + 300 + 900
    node = docs(fs_client, "nodes")[f"{PROJECT}.{ZONE}.a3-node-003"]
    assert node["remediations"] == [] and "DRAIN_NODE" not in node["last_action_at"]
    slots = [b["slots"][iid] for b in docs(fs_client, "budgets").values()]
    assert slots and not any(s["active"] for s in slots)
    sweep = make_ingest(fs_client, clock, executions[1])  # the sweep's starter finds nothing to start
    assert sweep.start_workflow(iid, 1, clock.t + 120) is None and executions[0].created == 0


def test_a_flapping_alert_is_one_incident(fs_client: firestore.Client) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, clock)
    first = ing.handle_payload(degraded("gpu-throttle", "open", "0.a", T0, "1"))
    assert first.incident is not None
    clock.t += 120
    assert ing.handle_payload(degraded("gpu-throttle", "closed", "0.a", T0 + 120, "2")).result == "ended"
    clock.t += 120  # Monitoring opens a new alert incident when the condition is met again
    again = ing.handle_payload(degraded("gpu-throttle", "open", "0.b", T0 + 240, "3"))
    assert again.result == "reopened" and again.incident is not None
    assert again.incident["id"] == first.incident["id"]
    inc = docs(fs_client, "incidents")[first.incident["id"]]
    assert inc["state"] == "OPEN" and "alert_ended" not in inc and "resolved" not in inc["timeline"]
    assert (
        inc["workflow"]["step"] == 2 and inc["workflow"]["state"] == "pending"
    )  # not held by its own cooldown
    assert [(a["id"], a["state"], a["symptom"]) for a in inc["alerts"]] == [
        ("0.a", "closed", "throttle"),
        ("0.b", "open", "throttle"),
    ]
    assert len(docs(fs_client, "incidents")) == 1


def test_a_close_after_remediation_started_is_only_recorded(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, clock, executions[1])
    opened = ing.handle_payload(hang("open"))
    assert opened.incident is not None
    clock.t += 200
    out = ing.handle_payload(hang("closed", at=T0 + 200, message="2"))
    assert out.result == "absorbed"
    inc = docs(fs_client, "incidents")[opened.incident["id"]]
    assert inc["state"] == "OPEN" and inc["workflow"]["state"] == "started"
    assert inc["alerts"][0]["state"] == "closed" and inc["alerts"][0]["closed_at"] == T0 + 200


def test_one_alert_closing_while_another_is_open_ends_nothing(fs_client: firestore.Client) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, clock)
    first = ing.handle_payload(degraded("gpu-throttle", "open", "0.thr", T0, "1"))
    assert ing.handle_payload(degraded("gpu-ecc-trend", "open", "0.ecc", T0 + 10, "2")).result == "absorbed"
    clock.t += 60
    assert ing.handle_payload(degraded("gpu-throttle", "closed", "0.thr", T0 + 60, "3")).result == "absorbed"
    assert first.incident is not None
    assert docs(fs_client, "incidents")[first.incident["id"]]["state"] == "OPEN"
    assert ing.handle_payload(degraded("gpu-ecc-trend", "closed", "0.ecc", T0 + 70, "4")).result == "ended"


def test_a_close_with_no_episode_and_a_forged_notification_write_nothing(fs_client: firestore.Client) -> None:
    ing = make_ingest(fs_client, Clock())
    assert ing.handle_payload(hang("closed", message="1")).result == "ignored"
    forged = hang("open", message="2")
    forged["source"] = forged["source"].replace("pitstop-alerts", "pitstop-events")
    assert ing.handle_payload(forged).result == "ignored"
    assert docs(fs_client, "incidents") == {} and docs(fs_client, "nodes") == {}


def test_observe_mode_records_a_hang_and_a_close_ends_it(fs_client: firestore.Client) -> None:
    clock = Clock()
    ing = make_ingest(fs_client, clock, mode="observe")
    opened = ing.handle_payload(hang("open"))
    assert opened.incident is not None and (opened.incident["workflow"] or {}).get("state") == "observe"
    clock.t += 60
    assert ing.handle_payload(hang("closed", at=T0 + 60, message="2")).result == "ended"
