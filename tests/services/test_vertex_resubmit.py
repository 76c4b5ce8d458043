"""A Vertex AI job's episode through ingest and actuate's ops, on the memory store and the Vertex AI
stand-in (local/fake_vertex.py, driven by google-cloud-aiplatform's JobServiceClient).

The job's own log entry (``ml_job``, task ``service``, ``ml.googleapis.com/job_state``:
tests/fixtures/vertex_job_logs.yaml) opens a job-level incident; its step reads the job back
(``customJobs.get``: https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs/get),
classes it (schemas/vertex-errors.yaml) and resubmits it once from its checkpoint within
``budgets.job_restarts``, or leaves it with a page. Vertex retries internal errors itself unless
``scheduling.disableRetries`` (https://cloud.google.com/vertex-ai/docs/training/understanding-training-service):
a job it is still retrying is left alone. A job hung after a worker restart without
``restartJobOnWorkerRestart`` (Scheduling, aiplatform v1) comes in as a heartbeat alert.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud.aiplatform_v1.types import CustomJob

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import policy as policy_mod
from pitstop.core import vertex
from pitstop.core.domain import Incident, JsonObject
from pitstop.core.ops import Op
from pitstop.local import alerting
from pitstop.local.fake_vertex import FakeVertex, serve
from pitstop.plugins.schedulers import Wiring
from pitstop.plugins.schedulers.vertex.adapter import job_service_client
from pitstop.services.actuate import Actuator
from pitstop.services.ingest import Ingest
from pitstop.services.schedulers import schedulers_for
from tests.helpers import PROJECT, ManualClock, alert_delivery, cloud_event

REGION = "us-central1"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
ACCOUNT = "llm-trainer@train-prod.iam.gserviceaccount.com"
CHECKPOINT = "gs://ckpt/llama/run-7"
INTERNAL = "Internal error occurred for the current attempt."
USER_EXIT = (
    "The replica workerpool0-0 exited with a non-zero status of 1. To find out more about why your "
    "job exited please check the logs"
)


def _spec(**scheduling: Any) -> JsonObject:
    return {
        "displayName": "llama-pretrain",
        "labels": {"team": "llm"},
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {"machineType": "a3-megagpu-8g", "acceleratorCount": 8},
                    "replicaCount": "2",
                    "containerSpec": {
                        "imageUri": "us-docker.pkg.dev/train-prod/r/train:1",
                        "env": [{"name": "PITSTOP_CHECKPOINT_URI", "value": CHECKPOINT}],
                    },
                }
            ],
            "serviceAccount": ACCOUNT,
            "scheduling": {"strategy": "SPOT", **scheduling},
        },
    }


class Rig:
    """ingest and actuate of one deployment, a Vertex AI cluster ``llm``, the stand-in on loopback."""

    def __init__(self, restarts: int = 3) -> None:
        self.clock = ManualClock()
        self.fake = FakeVertex(step_s=10.0, clock=self.clock, run_s=3600.0)
        self.server, endpoint = serve(self.fake)
        self.store = MemoryStore()
        cluster = {"name": "llm", "scheduler": "vertex",
                   "vertex": {"regions": [REGION], "job_service_accounts": [ACCOUNT]}}  # fmt: skip
        self.policy = policy_mod.from_doc(
            {"mode": "enforce", "clusters": [cluster], "budgets": {"job_restarts": {"max": restarts}}}
        )
        schedulers = schedulers_for(self.policy, Wiring(PROJECT, endpoints=(("vertex", endpoint),)))
        compute = ComputeAdapter("http://127.0.0.1:9")  # never called: Vertex AI owns the VMs
        self.actuator = Actuator(self.policy, self.store, compute, schedulers, None, clock=self.clock)
        self.ingest = Ingest(self.policy, self.store, None, None, clock=self.clock)
        self.client = job_service_client(REGION, endpoint)
        self.read_logs = 0

    def create(self, **scheduling: Any) -> str:
        """A person's job, created through the real client; training after 20 s."""
        job = self.client.create_custom_job(
            parent=PARENT, custom_job=CustomJob.from_json(json.dumps(_spec(**scheduling)))
        )
        self.clock.t += 25
        assert self.fake.state(job.name) == "JOB_STATE_RUNNING"
        return str(job.name)

    def fail(self, name: str, code: int, message: str, times: int = 1) -> None:
        self.fake.fail(name, code, message, times)
        for _ in range(times * 3):  # each of Vertex's own retries goes through PENDING again
            self.clock.t += 25
            self.fake.state(name)

    def deliver_logs(self) -> list[Incident]:
        """The jobs' new log entries through ingest (as the sink publishes them); what they opened."""
        opened = []
        for e in self.fake.logs(self.read_logs):
            self.read_logs += 1
            out = self.ingest.handle_payload(cloud_event(e, message_id=str(self.read_logs)))
            if out.result == "opened" and out.incident is not None:
                opened.append(out.incident)
        return opened

    def call(self, op: Op, iid: str, step: int = 1) -> tuple[dict[str, Any], int]:
        req = {"op": str(op), "incident": iid, "step": step, "execution": "ex-1"}
        return self.actuator.handle(req)

    def ok(self, op: Op, iid: str) -> dict[str, Any]:
        body, status = self.call(op, iid)
        assert status == 200, (op, body)
        return body

    def run_step(self, iid: str) -> dict[str, Any]:
        """What the workflow's resubmit branch calls: claim, resubmit, close."""
        assert self.ok(Op.CLAIM, iid)["plan"] == "resubmit"
        out = self.ok(Op.RESUBMIT, iid)
        assert self.ok(Op.CLOSE, iid)["outcome"] == "resolved"
        return out

    def incident(self, iid: str) -> Incident:
        inc = self.store.get(iid)
        assert inc is not None
        return inc

    def resubmissions(self, of: str) -> list[str]:
        """The jobs whose label says they resubmit ``of`` (Pitstop's label, the fake's record)."""
        own = of.rsplit("/", 1)[1]
        return [
            n
            for n, j in self.fake.jobs.items()
            if (j.doc.get("labels") or {}).get("pitstop_resubmit_of") == own
        ]

    def notices(self, iid: str) -> list[JsonObject]:
        return [
            e["notification"]
            for e in self.store.docs.outbox.values()
            if (e["notification"].get("incident") or {}).get("id") == iid
        ]


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.server.shutdown()


@pytest.fixture
def tight() -> Iterator[Rig]:
    r = Rig(restarts=1)
    yield r
    r.server.shutdown()


def test_an_infrastructure_failure_is_resubmitted_once_from_its_checkpoint(rig: Rig) -> None:
    old = rig.create(restartJobOnWorkerRestart=True, maxWaitDuration="7200s")
    rig.fail(old, 13, INTERNAL, times=4)  # Vertex retries it 3 times itself, then it fails
    assert rig.fake.state(old) == "JOB_STATE_FAILED" and rig.fake.jobs[old].attempt == 4
    [inc] = rig.deliver_logs()
    job_id = old.rsplit("/", 1)[1]
    assert (inc["kind"], inc["action"], inc["node"], inc["scheduler"]) == (
        "vertex_job",
        "RESCHEDULE_JOB",
        None,
        "vertex",
    )
    assert inc["job"] == {"project": PROJECT, "cluster": "llm", "job": job_id}
    assert inc["trust"] == "unverified" and (inc["workflow"] or {}).get("step") == 1
    out = rig.run_step(inc["id"])
    [new] = rig.resubmissions(old)
    assert out == {"outcome": "resubmitted", "job": old, "why": out["why"], "resubmitted_as": new}
    doc = rig.fake.jobs[new].doc
    assert doc["labels"]["pitstop_incident"] == inc["id"] and doc["labels"]["pitstop_lineage"] == job_id
    kept = {"strategy": "SPOT", "restartJobOnWorkerRestart": True, "maxWaitDuration": "7200s"}
    assert kept.items() <= doc["jobSpec"]["scheduling"].items()
    env = {e["name"]: e["value"] for e in doc["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]}
    assert env["PITSTOP_RESUME_FROM"] == CHECKPOINT
    done = rig.incident(inc["id"])
    rec = done.get("vertex") or {}
    assert done["state"] == "RESOLVED" and done["timeline"].get("job_requeued")
    assert (rec.get("klass"), rec.get("rule"), rec.get("vertex_retried")) == (
        "infrastructure",
        "infra_internal",
        True,
    )
    [note] = rig.notices(inc["id"])
    assert note["severity"] == "warning" and note["jobs"] == [old, new]
    assert old in note["summary"] and new in note["summary"] and CHECKPOINT in note["summary"]
    again = rig.ok(Op.RESUBMIT, inc["id"])
    assert again["replayed"] is True and rig.resubmissions(old) == [new]


def test_a_create_whose_answer_was_lost_is_found_again_not_made_twice(rig: Rig) -> None:
    """Exactly once under a retried step: the create lands, its answer is lost (503), the step's
    claim is let go; the workflow asks again and the step, on its saved verdict, finds the job by
    its labels."""
    old = rig.create(disableRetries=True)
    rig.fail(old, 14, "The service is currently unavailable.")
    [inc] = rig.deliver_logs()
    assert rig.ok(Op.CLAIM, inc["id"])["plan"] == "resubmit"
    rig.fake.lose["create"] = 1
    body, status = rig.call(Op.RESUBMIT, inc["id"])
    assert status == 503 and body["retryable"] is True
    assert len(rig.resubmissions(old)) == 1  # it landed
    out = rig.ok(Op.RESUBMIT, inc["id"])
    assert out["outcome"] == "resubmitted" and rig.resubmissions(old) == [out["resubmitted_as"]]
    assert (rig.incident(inc["id"]).get("vertex") or {}).get("created") is False


def test_a_user_error_is_paged_and_not_resubmitted(rig: Rig) -> None:
    old = rig.create()
    rig.fail(old, 3, USER_EXIT)
    [inc] = rig.deliver_logs()
    out = rig.run_step(inc["id"])
    assert out["outcome"] == "left" and rig.resubmissions(old) == []
    rec = rig.incident(inc["id"]).get("vertex") or {}
    assert (rec.get("klass"), rec.get("rule"), rec.get("page")) == ("user", "user_exit", True)
    [note] = rig.notices(inc["id"])
    assert note["severity"] == "critical" and "Not resubmitted" in note["summary"] and note.get("todo")


def test_a_failure_past_the_job_restart_budget_is_paged(tight: Rig) -> None:
    """The budget counts on the job's lineage: its resubmission failing again spends the same one."""
    first = tight.create(disableRetries=True)
    tight.fail(first, 13, INTERNAL)
    [inc] = tight.deliver_logs()
    assert tight.run_step(inc["id"])["outcome"] == "resubmitted"
    [second] = tight.resubmissions(first)
    tight.clock.t += 25
    assert tight.fake.state(second) == "JOB_STATE_RUNNING"
    tight.fail(second, 13, INTERNAL)
    [again] = tight.deliver_logs()
    out = tight.run_step(again["id"])
    assert out["outcome"] == "left" and "budgets.job_restarts" in out["why"]
    assert tight.resubmissions(second) == []
    rec = tight.incident(again["id"]).get("vertex") or {}
    assert rec.get("lineage") == first.rsplit("/", 1)[1] and rec.get("page") is True
    [note] = tight.notices(again["id"])
    assert note["severity"] == "critical"


def _failed_line(job_id: str, insert_id: str) -> JsonObject:
    """A job's FAILED line of the shape Vertex writes (tests/fixtures/vertex_job_logs.yaml)."""
    return {
        "insertId": insert_id,
        "logName": f"projects/{PROJECT}/logs/ml.googleapis.com%2F{job_id}",
        "resource": {
            "type": "ml_job",
            "labels": {"job_id": job_id, "project_id": PROJECT, "task_name": "service"},
        },
        "timestamp": "2027-01-15T08:00:00Z",
        "labels": {"ml.googleapis.com/job_state": "FAILED"},
        "textPayload": "Job failed.",
    }


def test_a_job_vertex_is_still_retrying_is_left_to_vertex(rig: Rig) -> None:
    """A FAILED line while Vertex retries the job (a stale or forged line): the job read back is
    PENDING, so nothing is resubmitted and nobody is paged."""
    old = rig.create()
    rig.fake.fail(old, 14, "The service is currently unavailable.", times=2)
    rig.clock.t += 1
    assert rig.fake.state(old) == "JOB_STATE_PENDING"  # Vertex's own retry
    out = rig.ingest.handle_payload(cloud_event(_failed_line(old.rsplit("/", 1)[1], "early1")))
    assert out.incident is not None
    step = rig.run_step(out.incident["id"])
    assert step["outcome"] == "left" and rig.resubmissions(old) == []
    rec = rig.incident(out.incident["id"]).get("vertex") or {}
    assert (rec.get("klass"), rec.get("page")) == ("not_ended", False)
    [note] = rig.notices(out.incident["id"])
    assert note["severity"] == "info"


def test_a_line_about_a_job_vertex_does_not_have_is_paged(rig: Rig) -> None:
    out = rig.ingest.handle_payload(cloud_event(_failed_line("123", "ghost1")))
    assert out.incident is not None
    assert rig.run_step(out.incident["id"])["outcome"] == "left"
    rec = rig.incident(out.incident["id"]).get("vertex") or {}
    assert (rec.get("klass"), rec.get("page"), rec.get("job")) == ("not_found", True, None)
    assert len(rig.fake.jobs) == 0


def _hang(rig: Rig, job: str) -> Incident:
    """The heartbeat policy's alert about the job (cluster ``llm``), as Monitoring publishes it."""
    doc = alerting.notification(
        "job-heartbeat", "open", incident_id="0.vx", project=PROJECT,
        metric_labels={"cluster": "llm", "job": job.rsplit("/", 1)[1]}, resource_type="global",
        resource_labels={"project_id": PROJECT}, started_at=int(rig.clock()) - 120, ended_at=None,
    )  # fmt: skip
    out = rig.ingest.handle_payload(alert_delivery(dict(doc)))
    assert out.result == "opened" and out.incident is not None
    assert out.incident["kind"] == "hang" and "localise" not in out.incident  # no nodes of Pitstop's there
    return out.incident


def test_a_job_hung_after_a_worker_restart_is_cancelled_and_resubmitted_once(rig: Rig) -> None:
    old = rig.create(restartJobOnWorkerRestart=False)
    assert rig.fake.worker_restart(old) == "hung"
    inc = _hang(rig, old)
    assert rig.ok(Op.CLAIM, inc["id"])["plan"] == "resubmit"
    rig.fake.lose["create"] = 1  # the cancel done, the create landed, its answer lost
    assert rig.call(Op.RESUBMIT, inc["id"])[1] == 503
    assert rig.fake.state(old) == "JOB_STATE_CANCELLED"
    out = rig.ok(Op.RESUBMIT, inc["id"])  # on the saved verdict: the cancelled job is not judged again
    assert out["outcome"] == "resubmitted" and rig.resubmissions(old) == [out["resubmitted_as"]]
    assert rig.ok(Op.CLOSE, inc["id"])["outcome"] == "resolved"
    rec = rig.incident(inc["id"]).get("vertex") or {}
    assert (rec.get("klass"), rec.get("cancel")) == ("hung", True)


def test_a_hung_job_vertex_restarts_itself_is_left_to_vertex(rig: Rig) -> None:
    old = rig.create(restartJobOnWorkerRestart=True)
    assert rig.fake.worker_restart(old).startswith("restarted")
    inc = _hang(rig, old)
    assert rig.run_step(inc["id"])["outcome"] == "left"
    assert rig.fake.state(old) == "JOB_STATE_PENDING" and rig.resubmissions(old) == []
    rec = rig.incident(inc["id"]).get("vertex") or {}
    assert (rec.get("klass"), rec.get("page")) == ("not_ended", False)


def test_a_job_no_vertex_cluster_takes_is_acknowledged_and_nothing_opens() -> None:
    r = Rig()
    try:
        r.policy = policy_mod.from_doc({"mode": "enforce"})
        r.ingest = Ingest(r.policy, r.store, None, None, clock=r.clock)
        old = r.create(disableRetries=True)
        r.fail(old, 13, INTERNAL)
        assert r.deliver_logs() == [] and r.store.docs.incidents == {}
    finally:
        r.server.shutdown()


def test_the_verdict_on_a_job_outside_the_accounts_pitstop_may_act_as_is_a_page() -> None:
    job = {"name": f"{PARENT}/customJobs/7", "state": "JOB_STATE_FAILED", "error": {"code": 13},
           "jobSpec": {"serviceAccount": "other@train-prod.iam.gserviceaccount.com"}}  # fmt: skip
    rec = vertex.judge("vertex_job", job, {ACCOUNT})
    assert (rec.get("outcome"), rec.get("page"), rec.get("klass")) == ("left", True, "infrastructure")
    assert "other@train-prod" in str(rec.get("why"))
    assert (
        vertex.judge("vertex_job", {**job, "jobSpec": {"serviceAccount": ACCOUNT}}, {ACCOUNT})["outcome"]
        == "resubmit"
    )


def test_the_end_of_a_job_pitstop_cancelled_raising_the_episode_keeps_its_resubmission(rig: Rig) -> None:
    """Pitstop cancels a hung job and resubmits it; the cancelled job's own end (Vertex's log line)
    arrives before the step closes and raises the episode (a later step). That step finds the
    resubmission on the incident: it neither judges the cancelled job again ("not hung: nothing to
    do") nor overwrites the record (found by a whole-demo run beside CI)."""
    old = rig.create(restartJobOnWorkerRestart=False)
    assert rig.fake.worker_restart(old) == "hung"
    inc = _hang(rig, old)
    assert rig.ok(Op.CLAIM, inc["id"])["plan"] == "resubmit"
    first = rig.ok(Op.RESUBMIT, inc["id"])
    assert first["outcome"] == "resubmitted" and rig.fake.state(old) == "JOB_STATE_CANCELLED"
    rig.deliver_logs()  # the cancelled job's end, through ingest
    raised = rig.incident(inc["id"])
    assert int(raised.get("step") or 1) == 2, "the end did not raise the episode: the case is not reached"
    assert rig.call(Op.CLOSE, inc["id"])[0]["outcome"] == "superseded"  # step 1's close
    assert rig.call(Op.CLAIM, inc["id"], step=2)[0]["plan"] == "resubmit"
    again, status = rig.call(Op.RESUBMIT, inc["id"], step=2)
    assert status == 200 and again["outcome"] == "resubmitted", again
    assert again["resubmitted_as"] == first["resubmitted_as"]
    assert rig.call(Op.CLOSE, inc["id"], step=2)[0]["outcome"] == "resolved"
    rec = rig.incident(inc["id"]).get("vertex") or {}
    assert (rec.get("outcome"), rec.get("resubmitted_as")) == ("resubmitted", first["resubmitted_as"])
    assert rig.resubmissions(old) == [first["resubmitted_as"]]
