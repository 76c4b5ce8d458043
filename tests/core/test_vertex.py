"""An ended Vertex AI CustomJob, classed from schemas/vertex-errors.yaml: one case per documented error.

Jobs are in the REST form of projects.locations.customJobs (camelCase, enums by name:
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs), as the
Vertex adapter reads them back. Error codes are google.rpc.Code (google/rpc/code.proto: checked
against googleapis-common-protos' own enum below). Messages are real ones where a public report
shows one (the row's `source` names it).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.rpc import code_pb2

from pitstop.core import vertex

NAME = "projects/train-prod/locations/us-central1/customJobs/4606268999515242496"


def _job(
    state: str = "JOB_STATE_FAILED", code: int | None = None, message: str = "", **more: Any
) -> dict[str, Any]:
    scheduling = more.pop("scheduling", {"restartJobOnWorkerRestart": True, "strategy": "SPOT"})
    job: dict[str, Any] = {
        "name": NAME,
        "displayName": "llama-pretrain",
        "state": state,
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {
                        "machineType": "a3-megagpu-8g",
                        "acceleratorType": "NVIDIA_H100_MEGA_80GB",
                        "acceleratorCount": 8,
                    },
                    "replicaCount": "4",
                    "containerSpec": {
                        "imageUri": "us-docker.pkg.dev/p/r/train:1",
                        "env": [{"name": "EPOCHS", "value": "3"}],
                    },
                }
            ],
            "scheduling": scheduling,
            "baseOutputDirectory": {"outputUriPrefix": "gs://train-prod-out/llama"},
        },
        "createTime": "2026-11-20T01:00:00Z",
        "startTime": "2026-11-20T01:04:00Z",
        "labels": {"team": "llm"},
        **more,
    }
    if code is not None:
        job["error"] = {"code": code, "message": message}
    return job


def test_the_codes_in_the_table_are_google_rpc_codes() -> None:
    assert (code_pb2.INTERNAL, code_pb2.UNAVAILABLE, code_pb2.RESOURCE_EXHAUSTED) == (13, 14, 8)
    assert (code_pb2.PERMISSION_DENIED, code_pb2.UNAUTHENTICATED, code_pb2.INVALID_ARGUMENT) == (7, 16, 3)
    assert (code_pb2.FAILED_PRECONDITION, code_pb2.ABORTED, code_pb2.DATA_LOSS, code_pb2.UNKNOWN) == (
        9,
        10,
        15,
        2,
    )


CASES = [  # (row, job, class)
    (
        "infra_internal",
        _job(code=13, message="Internal error occurred for the current attempt."),
        "infrastructure",
    ),
    ("infra_internal", _job(code=14, message="The service is currently unavailable."), "infrastructure"),
    (
        "infra_stockout",
        _job(
            code=8,
            message="Resources are insufficient in region: us-central1. Please try a different region.",
        ),
        "infrastructure",
    ),
    (
        "infra_stockout",
        _job(code=8, message="STOCKOUT: the Spot VMs of workerpool0 were preempted"),
        "infrastructure",
    ),
    (
        "infra_flex_never_started",
        _job(
            "JOB_STATE_EXPIRED",
            scheduling={"strategy": "FLEX_START", "maxWaitDuration": "3600s"},
            startTime=None,
        ),
        "infrastructure",
    ),
    (
        "user_exit",
        _job(
            code=3,
            message=(
                "The replica workerpool0-0 exited with a non-zero status of 1. To find out more about why"
                " your job exited please check the logs: https://console.cloud.google.com/logs/viewer"
                "?project=619829274226&resource=ml_job%2Fjob_id%2F4606268999515242496"
            ),
        ),
        "user",
    ),
    (
        "user_oom",
        _job(
            code=3,
            message=(
                "The replica workerpool0-0 ran out-of-memory and exited with a non-zero status of 9(SIGKILL)."
            ),
        ),
        "user",
    ),
    (
        "user_image",
        _job(code=3, message="Unable to pull image us-docker.pkg.dev/p/r/train:2: manifest unknown"),
        "user",
    ),
    (
        "user_quota",
        _job(
            code=8,
            message=(
                "The following quota metrics exceed quota limits:"
                " aiplatform.googleapis.com/custom_model_training_nvidia_h100_gpus"
            ),
        ),
        "user",
    ),
    ("user_permission", _job(code=7, message="Permission 'storage.objects.get' denied on resource"), "user"),
    ("user_permission", _job(code=16, message="Request had invalid authentication credentials."), "user"),
    (
        "user_invalid_spec",
        _job(
            code=9,
            message=(
                "The Cloud Storage bucket of `gs://x` is in location `us`. It must be in the same"
                " regional location as the service location `us-central1`."
            ),
        ),
        "user",
    ),
    (
        "user_invalid_spec",
        _job(code=3, message="Machine type a3-megagpu-8g is not supported with accelerator NVIDIA_L4."),
        "user",
    ),
    ("user_cancelled", _job("JOB_STATE_CANCELLED", code=1, message="CANCELED"), "user"),
    ("unknown_expired", _job("JOB_STATE_EXPIRED"), "unknown"),
    ("unknown_code", _job(code=2, message="Unknown error."), "unknown"),
]


@pytest.mark.parametrize(("rule", "job", "klass"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_documented_error_is_classed_by_its_row(rule: str, job: dict[str, Any], klass: str) -> None:
    v = vertex.classify_job(job)
    assert (v.rule, v.klass) == (rule, klass)
    assert v.resubmit is (klass == "infrastructure")
    assert v.page is (klass == "unknown" or (klass == "user" and rule != "user_cancelled"))


def test_anything_else_is_unknown_paged_never_resubmitted() -> None:
    v = vertex.classify_job(_job(code=12, message="Something new."))
    assert (v.klass, v.rule, v.resubmit, v.page) == ("unknown", None, False, True)
    v = vertex.classify_job(_job())  # FAILED without an error at all
    assert (v.klass, v.resubmit, v.page) == ("unknown", False, True)


@pytest.mark.parametrize(
    "state", ["JOB_STATE_RUNNING", "JOB_STATE_PENDING", "JOB_STATE_SUCCEEDED", "JOB_STATE_QUEUED", None]
)
def test_a_job_that_has_not_failed_needs_nothing(state: str | None) -> None:
    v = vertex.classify_job({**_job(), "state": state})
    assert (v.klass, v.resubmit, v.page) == ("not_ended", False, False)


def test_a_user_exit_with_a_platform_code_is_still_the_users() -> None:
    """A non-zero exit is the user's whatever code carries it: the message decides before the code."""
    v = vertex.classify_job(
        _job(code=13, message="The replica workerpool1-3 exited with a non-zero status of 137.")
    )
    assert (v.rule, v.klass) == ("user_exit", "user")


def test_the_verdict_says_whether_vertex_itself_retried_and_keeps_the_scheduling() -> None:
    on = vertex.classify_job(_job(code=13, message="Internal error"))
    assert on.vertex_retried and on.restart_job_on_worker_restart and on.strategy == "SPOT"
    off = vertex.classify_job(_job(code=13, message="Internal error", scheduling={"disableRetries": True}))
    assert not off.vertex_retried and not off.restart_job_on_worker_restart and off.strategy == "STANDARD"


def test_a_flex_start_job_that_ran_and_expired_is_not_a_capacity_failure() -> None:
    v = vertex.classify_job(_job("JOB_STATE_EXPIRED", scheduling={"strategy": "FLEX_START"}))
    assert (v.rule, v.klass) == ("unknown_expired", "unknown")


def test_the_checkpoint_is_the_declared_env_else_the_output_directorys() -> None:
    job = _job()
    assert vertex.checkpoint_of(job) == "gs://train-prod-out/llama/checkpoints"  # AIP_CHECKPOINT_DIR
    env = job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]
    env.append({"name": "PITSTOP_CHECKPOINT_URI", "value": "gs://ckpt/llama/run-7"})
    assert vertex.checkpoint_of(job) == "gs://ckpt/llama/run-7"
    env[-1]["value"] = "file:///etc/passwd"  # not a Cloud Storage URI: ignored
    assert vertex.checkpoint_of(job) == "gs://train-prod-out/llama/checkpoints"
    del job["jobSpec"]["baseOutputDirectory"]
    assert vertex.checkpoint_of(job) is None


def test_the_resubmission_keeps_spec_and_scheduling_and_links_both_jobs() -> None:
    job = _job(
        code=13,
        message="Internal error",
        scheduling={"restartJobOnWorkerRestart": True, "strategy": "FLEX_START", "maxWaitDuration": "7200s"},
    )
    job["endTime"], job["webAccessUris"] = "2026-11-20T03:00:00Z", {"workerpool0-0": "x"}
    new = vertex.resubmission(job, "iabcdefghi")
    assert not {"name", "state", "error", "createTime", "startTime", "endTime", "webAccessUris"} & set(new)
    assert new["jobSpec"]["scheduling"] == {
        "restartJobOnWorkerRestart": True,
        "strategy": "FLEX_START",
        "maxWaitDuration": "7200s",
    }
    assert new["jobSpec"]["baseOutputDirectory"] == job["jobSpec"]["baseOutputDirectory"]
    assert new["labels"] == {
        "team": "llm",
        "pitstop_incident": "iabcdefghi",
        "pitstop_resubmit_of": "4606268999515242496",
        "pitstop_lineage": "4606268999515242496",
    }
    assert vertex.lineage(job) == "4606268999515242496"
    second = {**job, **new, "name": "projects/train-prod/locations/us-central1/customJobs/77"}
    assert vertex.lineage(second) == "4606268999515242496"  # the budget follows the first job
    assert vertex.resubmission(second, "ijklmnopqr")["labels"]["pitstop_lineage"] == "4606268999515242496"
    assert (
        new["displayName"]
        == "llama-pretrain-pitstop-iabcdefghi"
        == vertex.resubmission(job, "iabcdefghi")["displayName"]
    )
    env = {e["name"]: e["value"] for e in new["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]}
    assert env == {
        "EPOCHS": "3",
        "PITSTOP_INCIDENT": "iabcdefghi",
        "PITSTOP_RESUBMIT_OF": NAME,
        "PITSTOP_RESUME_FROM": "gs://train-prod-out/llama/checkpoints",
    }
    assert job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] == [{"name": "EPOCHS", "value": "3"}]


@pytest.mark.parametrize(
    "name",
    [
        "projects/p/locations/us-central1/customJobs/1",  # project id too short
        "projects/train-prod/locations/us-central1/customJobs/12a",
        "projects/train-prod/locations/us-central1/customJobs/1/../../x",
        "projects/train-prod/locations/US-CENTRAL1/customJobs/1",
        "projects/train-prod/locations/us-central1/trainingPipelines/1",
        "projects/train-prod/locations/us-central1/customJobs/1\n",
        "//aiplatform.googleapis.com/projects/train-prod/locations/us-central1/customJobs/1",
        42,
    ],
)
def test_hostile_job_names_are_refused(name: object) -> None:
    assert vertex.job_name(name) is None
    with pytest.raises(ValueError):
        vertex.resubmission({**_job(), "name": name}, "iabcdefghi")


def test_a_job_name_is_read_into_its_parts() -> None:
    n = vertex.job_name(NAME)
    assert n is not None and (n.project, n.location, n.job_id) == (
        "train-prod",
        "us-central1",
        "4606268999515242496",
    )
    assert n.name == NAME and n.parent == "projects/train-prod/locations/us-central1"
    assert (
        vertex.list_filter("iabcdefghi", n)
        == 'labels.pitstop_incident="iabcdefghi" AND labels.pitstop_resubmit_of="4606268999515242496"'
    )
