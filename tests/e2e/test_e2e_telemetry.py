"""Faults that print no Xid, on the whole local stack: a real Slurm job writes its heartbeat with
the real client library, the Monitoring stand-in evaluates the deployed telemetry policies and
publishes real-format notifications to the alerts topic, ingest (pushed to as Eventarc would)
opens the incidents. `pitstop local chaos hang|straggler|degrading` causes each.

The stack runs in observe mode: what remediates a hang or a degraded node (localisation, the
planned move) is the workflow's, tested with it; here the signal, its provenance and the
incident's life (open, close before anything was done) are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import firestore

from pitstop.local import chaos
from pitstop.local.gke_stack import wait_for  # the stack's own waiting
from pitstop.local.stack import PROJECT, ZONE, ClusterSpec, Stack, emulator_env
from tests.pipeline import stack_up

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # the heartbeat's 120 s is 2.4 s here, a 600 s throttle window 12 s
    with stack_up("telemetry", ClusterSpec(nodes=4), policy_over={"mode": "observe"}, alert_scale=0.02) as s:
        yield s


def incidents(s: Stack) -> list[dict[str, Any]]:
    with emulator_env(s.endpoints):
        db = firestore.Client(project=PROJECT)
    return [d.to_dict() or {} for d in db.collection("pitstop_incidents").stream()]


def beating(s: Stack, job: str) -> bool:
    out = s.workdir / "metrics.jsonl"
    text = out.read_text() if out.exists() else ""
    return f'"job": "{job}"' in text and "pitstop/job/heartbeat" in text


def test_a_hung_job_is_an_incident_on_the_job_that_ends_when_it_beats_again(stack: Stack) -> None:
    job = stack.submit_training(2)
    wait_for(lambda: beating(stack, job), 90, "heartbeat")
    done = chaos.apply(stack, "hang", node="a3-node-001")
    assert job in done["runs"] and done["gpu"]["state"] == {"hung": True, "dcgm": "fail"}

    def hang_incident() -> dict[str, Any] | None:
        return next((i for i in incidents(stack) if i["kind"] == "hang" and i["job"]["job"] == job), None)

    inc = wait_for(hang_incident, 90, "hang incident")
    assert inc["node"] is None and inc["job"] == {"project": PROJECT, "cluster": "train", "job": job}
    assert (inc["action"], inc["trust"], inc["state"]) == ("RESTART_JOB", "verified", "OPEN")
    assert inc["node_key"] == f"job.{PROJECT}.train.{job}" and inc["alerts"][0]["state"] == "open"
    chaos.clear_flags(stack.chaos_dir)  # the run beats again: Monitoring closes the alert
    ended = wait_for(lambda: (i := hang_incident()) and i["state"] == "RESOLVED" and i, 90, "hang ended")
    assert ended["alert_ended"] and ended["alerts"][0]["state"] == "closed"


@pytest.mark.parametrize(
    ("kind", "node", "symptom"),
    [("straggler", "a3-node-002", "throttle"), ("degrading", "a3-node-003", "ecc")],
)
def test_a_node_fault_is_a_degraded_incident_on_that_node(
    stack: Stack, kind: str, node: str, symptom: str
) -> None:
    chaos.apply(stack, kind, node=node)

    def degraded() -> dict[str, Any] | None:
        return next(
            (i for i in incidents(stack) if i["kind"] == "degraded" and i["node"]["instance"] == node), None
        )

    inc = wait_for(degraded, 90, f"{kind} incident")
    assert (inc["action"], inc["trust"], inc["node"]["zone"], inc["cluster"]) == (
        "DRAIN_NODE",
        "verified",
        ZONE,
        "train",
    )
    assert inc["evidence"][0]["kind"] == "degraded" and symptom in inc["reason"]
    chaos.apply(stack, "heal", node=node)
    wait_for(lambda: (i := degraded()) and i["state"] == "RESOLVED" and i, 90, "degraded ended")
