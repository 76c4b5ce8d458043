"""The vertex scheduler folder against the Vertex AI stand-in, through the real client library.

google-cloud-aiplatform's JobServiceClient (REST transport, api_endpoint http://127.0.0.1:PORT)
drives local/fake_vertex.py, which models projects.locations.customJobs as the API reference
gives it (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs:
create → JOB_STATE_QUEUED, get, list with the documented ``labels.key=value`` filter, cancel →
CANCELLED) and Vertex's own retry of internal errors unless ``scheduling.disableRetries``
(https://cloud.google.com/vertex-ai/docs/training/understanding-training-service: the whole job
is retried up to 3 times before it fails).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud.aiplatform_v1.types import CustomJob, JobState

from pitstop.adapters.errors import ActuatorError
from pitstop.core import policy as policy_mod
from pitstop.core import steps, vertex
from pitstop.core.scheduling import JobRun, StepRef
from pitstop.core.scheduling import JobState as Contract
from pitstop.local.fake_vertex import FakeVertex, serve
from pitstop.plugins.schedulers import Wiring
from pitstop.plugins.schedulers.vertex.adapter import VertexJobs, VertexScheduler, job_service_client
from pitstop.services.schedulers import schedulers_for

PARENT = "projects/train-prod/locations/us-central1"
ACCOUNT = "llm-trainer@train-prod.iam.gserviceaccount.com"
REF = StepRef("iabcdefghi", 3)


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fake() -> Iterator[tuple[FakeVertex, str, Clock]]:
    clock = Clock()
    f = FakeVertex(step_s=10.0, clock=clock)
    server, endpoint = serve(f)
    try:
        yield f, endpoint, clock
    finally:
        server.shutdown()


def _spec(**scheduling: Any) -> dict[str, Any]:
    return {
        "displayName": "llama-pretrain",
        "labels": {"team": "llm"},
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {
                        "machineType": "a3-megagpu-8g",
                        "acceleratorType": "NVIDIA_H100_MEGA_80GB",
                        "acceleratorCount": 8,
                    },
                    "replicaCount": "2",
                    "containerSpec": {
                        "imageUri": "us-docker.pkg.dev/train-prod/r/train:1",
                        "env": [{"name": "PITSTOP_CHECKPOINT_URI", "value": "gs://ckpt/llama/run-7"}],
                    },
                }
            ],
            "serviceAccount": ACCOUNT,
            "scheduling": {"restartJobOnWorkerRestart": True, "strategy": "SPOT", **scheduling},
        },
    }


def _scheduler(endpoint: str) -> VertexScheduler:
    pol = policy_mod.from_doc(
        {
            "clusters": [
                {
                    "name": "llm",
                    "scheduler": "vertex",
                    "vertex": {"regions": ["us-central1"], "job_service_accounts": [ACCOUNT]},
                }
            ]
        }
    )
    sched = schedulers_for(pol, Wiring("train-prod", endpoints=(("vertex", endpoint),)))["llm"]
    assert isinstance(sched, VertexScheduler)
    return sched


def test_the_real_client_creates_reads_lists_and_cancels(fake: tuple[FakeVertex, str, Clock]) -> None:
    _, endpoint, clock = fake
    client = job_service_client("us-central1", endpoint)
    job = client.create_custom_job(parent=PARENT, custom_job=CustomJob.from_json(json.dumps(_spec())))
    assert job.state == JobState.JOB_STATE_QUEUED and job.name.startswith(PARENT + "/customJobs/")
    clock.t += 25  # two steps: PENDING, then RUNNING
    got = client.get_custom_job(name=job.name)
    assert got.state == JobState.JOB_STATE_RUNNING and got.start_time
    assert (
        got.job_spec.scheduling.strategy.name == "SPOT"
        and got.job_spec.scheduling.restart_job_on_worker_restart
    )
    listed = list(client.list_custom_jobs(request={"parent": PARENT, "filter": 'labels.team="llm"'}))
    assert [j.name for j in listed] == [job.name]
    assert list(client.list_custom_jobs(request={"parent": PARENT, "filter": 'labels.team="other"'})) == []
    client.cancel_custom_job(name=job.name)
    cancelled = client.get_custom_job(name=job.name)
    assert cancelled.state == JobState.JOB_STATE_CANCELLED and cancelled.error.code == 1
    with pytest.raises(exceptions.NotFound):
        client.get_custom_job(name=f"{PARENT}/customJobs/1")


def test_vertex_retries_an_internal_error_itself_unless_retries_are_disabled(
    fake: tuple[FakeVertex, str, Clock],
) -> None:
    f, _, clock = fake
    once = f.add(PARENT, _spec())
    f.fail(once, 13, "Internal error occurred for the current attempt.", times=1)
    clock.t += 30
    assert f.state(once) == "JOB_STATE_PENDING"  # retried by the platform, running again soon
    clock.t += 30
    assert f.state(once) == "JOB_STATE_SUCCEEDED" and f.jobs[once].attempt == 2
    always = f.add(PARENT, _spec())
    f.fail(always, 13, "Internal error occurred for the current attempt.", times=99)
    for _ in range(5):
        clock.t += 30
        f.state(always)
    assert f.state(always) == "JOB_STATE_FAILED" and f.jobs[always].attempt == 1 + 3  # 3 retries, then failed
    off = f.add(PARENT, _spec(disableRetries=True))
    f.fail(off, 13, "Internal error occurred for the current attempt.")
    clock.t += 30
    assert f.state(off) == "JOB_STATE_FAILED" and f.jobs[off].attempt == 1


def _failed(f: FakeVertex, clock: Clock, code: int, message: str, **scheduling: Any) -> str:
    name = f.add(PARENT, _spec(disableRetries=True, **scheduling))
    f.fail(name, code, message)
    clock.t += 30
    assert f.state(name) == "JOB_STATE_FAILED"
    return name


def _creates(f: FakeVertex) -> int:
    return sum(1 for m, p in f.calls if m == "POST" and p.endswith("/customJobs"))


def test_an_infrastructure_failure_is_resubmitted_once_from_its_checkpoint(
    fake: tuple[FakeVertex, str, Clock],
) -> None:
    f, endpoint, clock = fake
    old = _failed(f, clock, 14, "The service is currently unavailable.", maxWaitDuration="7200s")
    sched = _scheduler(endpoint)
    verdict, _ = sched.verdict(old)
    assert (verdict.klass, verdict.rule, verdict.vertex_retried) == (
        "infrastructure",
        "infra_internal",
        False,
    )
    out = sched.requeue(old, REF, JobRun())
    assert out.restarted and "from gs://ckpt/llama/run-7" in out.how
    new = [j for n, j in f.jobs.items() if n != old]
    assert len(new) == 1 and _creates(f) == 1
    doc = new[0].doc
    old_name = vertex.job_name(old)
    assert old_name is not None
    assert doc["labels"] == {
        "team": "llm",
        "pitstop_incident": "iabcdefghi",
        "pitstop_resubmit_of": old_name.job_id,
        "pitstop_lineage": old_name.job_id,
    }
    assert doc["jobSpec"]["scheduling"] == {
        "restartJobOnWorkerRestart": True,
        "strategy": "SPOT",
        "disableRetries": True,
        "maxWaitDuration": "7200s",
    }
    env = {e["name"]: e["value"] for e in doc["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]}
    assert env["PITSTOP_RESUME_FROM"] == "gs://ckpt/llama/run-7" and env["PITSTOP_RESUBMIT_OF"] == old
    assert sched.job_info(doc["name"], REF).state == Contract.PENDING


def test_a_retried_step_finds_its_resubmission_instead_of_creating_a_second(
    fake: tuple[FakeVertex, str, Clock],
) -> None:
    """The create lands but its answer is lost (the worker dies): the step runs again, lists by
    label, and finds the job its first attempt created; the runner then replays its record."""
    f, endpoint, clock = fake
    old = _failed(f, clock, 13, "Internal error occurred for the current attempt.")
    sched = _scheduler(endpoint)
    real = sched.jobs.resubmit

    def lost_answer(failed: Any, incident: str) -> Any:
        real(failed, incident)
        raise ConnectionResetError("the answer to customJobs.create was lost")

    runner: steps.StepRunner[Any] = steps.StepRunner(steps.MemoryStepStore(), claim_s=0.0, clock=clock)

    def step(_claim: Any) -> dict[str, Any]:
        out = sched.requeue(old, REF, JobRun())
        return {"restarted": out.restarted, "how": out.how}

    sched.jobs.resubmit = lost_answer  # type: ignore[method-assign]
    with pytest.raises(ConnectionResetError):
        runner.run(REF.key, {"op": "resubmit", "job": old}, step)
    sched.jobs.resubmit = real  # type: ignore[method-assign]
    clock.t += 1  # the dead attempt's claim has lapsed
    again = runner.run(REF.key, {"op": "resubmit", "job": old}, step)
    assert again["restarted"] and "(found again)" in again["how"]
    replay = runner.run(REF.key, {"op": "resubmit", "job": old}, step)
    assert replay["replayed"] and _creates(f) == 1 and len(f.jobs) == 2


def test_a_users_failure_is_never_resubmitted(fake: tuple[FakeVertex, str, Clock]) -> None:
    f, endpoint, clock = fake
    old = _failed(f, clock, 3, "The replica workerpool0-0 exited with a non-zero status of 1.")
    out = _scheduler(endpoint).requeue(old, REF, JobRun())
    assert not out.restarted and "user's code exited non-zero" in out.how and _creates(f) == 0


def test_a_job_running_as_another_account_is_not_resubmitted(fake: tuple[FakeVertex, str, Clock]) -> None:
    f, endpoint, clock = fake
    spec = _spec(disableRetries=True)
    spec["jobSpec"]["serviceAccount"] = "someone-else@train-prod.iam.gserviceaccount.com"
    old = f.add(PARENT, spec)
    f.fail(old, 13, "Internal error")
    clock.t += 30
    out = _scheduler(endpoint).requeue(old, REF, JobRun())
    assert not out.restarted and "may not act as" in out.how and _creates(f) == 0


def test_only_jobs_of_the_configured_regions_are_touched(fake: tuple[FakeVertex, str, Clock]) -> None:
    _, endpoint, _ = fake
    with pytest.raises(ActuatorError, match="configured regions"):
        _scheduler(endpoint).job_info("projects/train-prod/locations/asia-east1/customJobs/1", REF)


def test_an_entry_without_a_region_finds_its_job_in_the_configured_ones(
    fake: tuple[FakeVertex, str, Clock],
) -> None:
    f, endpoint, _ = fake
    name = f.add("projects/train-prod/locations/europe-west4", _spec())
    jobs = VertexJobs(lambda loc: job_service_client(loc, endpoint))
    found = jobs.find("train-prod", name.rsplit("/", 1)[1], ["us-central1", "europe-west4"])
    assert found is not None and found["name"] == name
    assert jobs.find("train-prod", "1", ["us-central1"]) is None


def test_the_stand_in_runs_as_a_local_process_for_the_stack(tmp_path: Any) -> None:
    import sys

    from pitstop.local import procs

    port = procs.free_port()
    argv = [sys.executable, "-m", "pitstop.local.serve", "vertex", "--port", str(port), "--step-s", "0"]
    proc = procs.Proc("vertex", argv, tmp_path / "vertex.log").start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(endpoint + "/", proc, accept_errors=True)
        client = job_service_client("us-central1", endpoint)
        job = client.create_custom_job(parent=PARENT, custom_job=CustomJob.from_json(json.dumps(_spec())))
        assert client.get_custom_job(name=job.name).state == JobState.JOB_STATE_SUCCEEDED
    finally:
        proc.stop()
