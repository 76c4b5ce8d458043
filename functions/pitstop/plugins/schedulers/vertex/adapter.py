"""Vertex AI custom training through the google-cloud-aiplatform client (JobService, REST transport).

Reads a CustomJob back (``projects.locations.customJobs.get``: the evidence for every decision, a
log line never is one), finds a resubmission again by its labels (``customJobs.list``) and creates
it (``customJobs.create``). Vertex AI is regional: each location has its own endpoint
(``<location>-aiplatform.googleapis.com``); the local stack's stand-in (local/fake_vertex.py)
answers for every location at ``PITSTOP_VERTEX_ENDPOINT``.

Exactly once: ``CreateCustomJobRequest`` takes no request id, so the resubmission carries the
labels ``pitstop_incident`` and ``pitstop_resubmit_of`` and, before creating, the adapter lists the
jobs with both: a step retried after its create landed (its answer lost, its worker killed) finds
that job and creates none. The step runner's claim keeps two attempts of one step from running at
once, so the list and the create are never raced by Pitstop itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pitstop.adapters.errors import ActuatorError
from pitstop.core import vertex
from pitstop.core.domain import CheckSpec, JsonObject
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    JobInfo,
    JobRun,
    JobState,
    NoNodes,
    RequeueOutcome,
    StepRef,
)
from pitstop.core.vertex import Resubmitted

# Vertex's states in the contract's words (JobState of aiplatform v1)
STATES = {
    "JOB_STATE_QUEUED": JobState.PENDING,
    "JOB_STATE_PENDING": JobState.PENDING,
    "JOB_STATE_RUNNING": JobState.RUNNING,
    "JOB_STATE_UPDATING": JobState.RUNNING,
    "JOB_STATE_PAUSED": JobState.SUSPENDED,
    "JOB_STATE_SUCCEEDED": JobState.COMPLETED,
    "JOB_STATE_PARTIALLY_SUCCEEDED": JobState.COMPLETED,
    "JOB_STATE_FAILED": JobState.FAILED,
    "JOB_STATE_EXPIRED": JobState.FAILED,
    "JOB_STATE_CANCELLING": JobState.COMPLETING,
    "JOB_STATE_CANCELLED": JobState.CANCELLED,
}


def job_service_client(location: str, endpoint: str | None = None) -> Any:
    """The JobService client of one location (its regional endpoint, or the local stand-in)."""
    from google.cloud.aiplatform_v1.services.job_service import JobServiceClient

    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        options = {"api_endpoint": endpoint}
        return JobServiceClient(transport="rest", credentials=AnonymousCredentials(), client_options=options)  # type: ignore[no-untyped-call]
    return JobServiceClient(
        transport="rest", client_options={"api_endpoint": f"{location}-aiplatform.googleapis.com"}
    )


class VertexJobs:
    """customJobs.get, list and create, each answered in the REST form core/vertex.py reads."""

    def __init__(self, client_for: Callable[[str], Any]) -> None:
        self.client_for = client_for  # location -> JobServiceClient
        self._clients: dict[str, Any] = {}

    def _client(self, location: str) -> Any:
        if location not in self._clients:
            self._clients[location] = self.client_for(location)
        return self._clients[location]

    def read(self, name: vertex.JobName) -> JsonObject:
        """The job as the API has it now (REST JSON: camelCase, enums by name)."""
        from google.api_core import exceptions

        try:
            job = self._client(name.location).get_custom_job(name=name.name)
        except exceptions.NotFound as exc:
            raise ActuatorError(404, f"no CustomJob {name.name}", False) from exc
        return _rest(job)

    def find(self, project: str, job_id: str, locations: Sequence[str]) -> JsonObject | None:
        """A job an entry named without its region (``ml_job``): looked for in each configured one."""
        from google.api_core import exceptions

        for loc in locations:
            name = vertex.job_name(f"projects/{project}/locations/{loc}/customJobs/{job_id}")
            if name is None:
                continue
            try:
                return _rest(self._client(loc).get_custom_job(name=name.name))
            except exceptions.NotFound:
                continue
        return None

    def cancel(self, name: vertex.JobName) -> None:
        """customJobs.cancel; a job that already ended (FAILED_PRECONDITION) is left as it is."""
        from google.api_core import exceptions

        try:
            self._client(name.location).cancel_custom_job(name=name.name)
        except exceptions.FailedPrecondition:
            return

    def resubmit(self, failed: Mapping[str, object], incident: str) -> Resubmitted:
        """Create the resubmission of ``failed`` for ``incident``, or find the one already created."""
        name = vertex.job_name(failed.get("name"))
        if name is None:
            raise ActuatorError(400, "not a CustomJob resource name", False)
        client = self._client(name.location)
        request = {"parent": name.parent, "filter": vertex.list_filter(incident, name)}
        found = [_rest(j) for j in client.list_custom_jobs(request=request)]
        checkpoint = vertex.checkpoint_of(failed)
        if found:
            return Resubmitted(str(found[0]["name"]), name.name, False, checkpoint)
        from google.cloud.aiplatform_v1.types import CustomJob

        body = CustomJob.from_json(json.dumps(vertex.resubmission(failed, incident)))
        created = client.create_custom_job(parent=name.parent, custom_job=body)
        return Resubmitted(str(created.name), name.name, True, checkpoint)


def _rest(job: Any) -> JsonObject:
    """A CustomJob message as its REST JSON (what the API reference documents)."""
    out: JsonObject = json.loads(type(job).to_json(job, use_integers_for_enums=False))
    return out


@dataclass
class VertexScheduler(NoNodes):
    """The scheduler contract for Vertex AI: no node is Pitstop's (the platform owns the VMs), a job
    is a CustomJob's resource name, and requeueing it is a resubmission from its checkpoint, only
    for a failure the verdict (schemas/vertex-errors.yaml) calls the platform's."""

    jobs: VertexJobs
    regions: tuple[str, ...]
    service_accounts: frozenset[str]
    name: str = "vertex"
    project: str | None = field(default=None)  # the jobs' project (None: any the names carry)

    def _name(self, job: str) -> vertex.JobName:
        name = vertex.job_name(job)
        if name is None or name.location not in self.regions:
            raise ActuatorError(400, "not a CustomJob of the configured regions", False)
        if self.project is not None and name.project != self.project:
            raise ActuatorError(400, f"not a CustomJob of project {self.project}", False)
        return name

    # -- the platform's jobs, whole (core/scheduling.JobResubmission) ------------------------------

    def job_service_accounts(self) -> frozenset[str]:
        return self.service_accounts

    def read_job(self, job: str) -> JsonObject | None:
        if vertex.job_name(job) is None:  # an entry's job id, without its region: looked for in each
            if self.project is None or not job.isdigit():
                raise ActuatorError(400, "a CustomJob id needs the cluster's project", False)
            return self.jobs.find(self.project, job, self.regions)
        try:
            return self.jobs.read(self._name(job))
        except ActuatorError as exc:
            if exc.status == 404:
                return None
            raise

    def cancel_job(self, job: str) -> None:
        self.jobs.cancel(self._name(job))

    def resubmit_job(self, job: JsonObject, ref: StepRef) -> Resubmitted:
        self._name(str(job.get("name")))  # of this cluster's project and regions only
        return self.jobs.resubmit(job, ref.incident)

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        doc = self.jobs.read(self._name(job))
        state = STATES.get(str(doc.get("state")), JobState.UNKNOWN)
        return JobInfo(job, state, JobRun(restarts=0, start_time=_str(doc.get("startTime"))))

    def verdict(self, job: str) -> tuple[vertex.VertexVerdict, JsonObject]:
        """The job read back, and what it is (the evidence an engine decides on)."""
        doc = self.jobs.read(self._name(job))
        return vertex.classify_job(doc), doc

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        verdict, doc = self.verdict(job)
        if not verdict.resubmit:
            return RequeueOutcome(
                job, False, f"not resubmitted: {verdict.reason}", "decide whether to rerun it"
            )
        spec = doc.get("jobSpec")
        account = spec.get("serviceAccount") if isinstance(spec, dict) else None
        if account not in self.service_accounts:
            why = "it runs as an account Pitstop may not act as (policy vertex.job_service_accounts)"
            return RequeueOutcome(job, False, f"not resubmitted: {why}", "resubmit it yourself")
        done = self.jobs.resubmit(doc, ref.incident)
        how = f"resubmitted as {done.job}" + (f" from {done.checkpoint}" if done.checkpoint else "")
        return RequeueOutcome(job, True, how if done.created else f"{how} (found again)")

    # -- node-level asks: the platform owns the VMs (jobs_on, fence, unfence, node_healthy: NoNodes) --

    def checkpoint(self, job: str, ref: StepRef) -> str:
        return "nothing: Vertex AI owns the VMs; the resubmission resumes from the job's own checkpoints"

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(False, "Vertex AI provisions its own capacity (scheduling.strategy kept)")

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart:
        raise ActuatorError(409, "Vertex AI runs no check on a node Pitstop can reach", False)

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult:
        raise ActuatorError(409, "Vertex AI runs no check on a node Pitstop can reach", False)


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None
