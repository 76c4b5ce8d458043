"""A Vertex AI custom training job's log entry → a ``vertex_job`` FaultEvent (a hint, never evidence).

Vertex AI writes a CustomJob's logs under the monitored resource ``ml_job`` (labels ``project_id``,
``job_id``, ``task_name``): gcloud's own ``gcloud ai custom-jobs stream-logs`` reads them with
``resource.type="ml_job" resource.labels.job_id="<id>"`` (googlecloudsdk/command_lib/ai/log_util.py,
gcloud 528.0.0 here). The platform's own messages come from the task ``service``, in the log
``projects/<project>/logs/ml.googleapis.com%2F<job id>``, and a state change carries the label
``ml.googleapis.com/job_state`` (a real entry: GoogleCloudPlatform/cortex-data-foundation#42,
tests/fixtures/vertex_job_logs.yaml). Such an entry names no region: the event's ``location`` is
then None, and whoever reads the job back (customJobs.get) looks for it in the configured regions.

Every name is validated here, because it later reaches API paths; whatever the entry says about
the job's state is only a hint: the verdict (core/vertex.py) is taken on the job as the API returns
it. Infra/filters/vertex-jobs.filter selects these entries.
"""

from __future__ import annotations

import re

from pitstop.core import names
from pitstop.core.actions import Action
from pitstop.core.domain import EventDetail, JobRef, VertexJobRef
from pitstop.core.entry import (
    VERTEX_RESOURCE,
    Event,
    Raw,
    bounded_text,
    clean,
    invalid,
    new_event,
    new_source,
)
from pitstop.core.policy import Cluster, Policy
from pitstop.core.vertex import SCHEDULER

RESOURCE_TYPE = VERTEX_RESOURCE
# What a job Vertex ended asks for: its step reads it back (customJobs.get), classes it and, for a
# platform's failure, resubmits it from its checkpoint (services/actuate/resubmit.py).
ACTION = Action.RESCHEDULE_JOB
SERVICE_TASK = "service"
STATE_LABEL = "ml.googleapis.com/job_state"
KIND = "vertex_job"
ENDED_WORDS = frozenset({"FAILED", "EXPIRED", "CANCELLED", "CANCELLING"})
_JOB_ID = re.compile(r"[0-9]{1,20}", re.ASCII)
_TASK = re.compile(r"service|workerpool[0-9]{1,2}-[0-9]{1,6}", re.ASCII)
_STATE = re.compile(r"(?:JOB_STATE_)?([A-Z_]{1,24})", re.ASCII)
_FAILED_TEXT = re.compile(r"^Job failed\.?$", re.ASCII)


def _labels(v: object) -> Raw:
    return v if isinstance(v, dict) else {}


def _state(entry: Raw, text: str) -> str | None:
    """The state the entry reports, as a JobState name (a hint)."""
    word = _labels(entry.get("labels")).get(STATE_LABEL)
    m = _STATE.fullmatch(word) if isinstance(word, str) else None
    if m:
        return f"JOB_STATE_{m[1]}"
    return "JOB_STATE_FAILED" if _FAILED_TEXT.match(text.strip()) else None


def _text(entry: Raw) -> str:
    payload = entry.get("jsonPayload")
    found = _labels(payload).get("message") if isinstance(payload, dict) else entry.get("textPayload")
    return bounded_text(found)[0] if isinstance(found, str) else ""


def _ref(entry: Raw) -> tuple[VertexJobRef | None, str]:
    res = _labels(entry.get("resource"))
    rl = _labels(res.get("labels"))
    project, job_id, task = rl.get("project_id"), rl.get("job_id"), rl.get("task_name")
    location = rl.get("location")
    if not names.valid_project(project) or not isinstance(project, str):
        return None, "ml_job entry without a valid resource.labels.project_id"
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        return None, "ml_job entry whose resource.labels.job_id is not a CustomJob id (digits)"
    if not isinstance(task, str) or not _TASK.fullmatch(task):
        return None, "ml_job entry whose resource.labels.task_name is neither service nor a replica"
    if location is not None and (not isinstance(location, str) or not names.valid_region(location)):
        return None, "ml_job entry whose resource.labels.location is not a region"
    log = entry.get("logName")
    if task == SERVICE_TASK and log != f"projects/{project}/logs/ml.googleapis.com%2F{job_id}":
        return (
            None,
            "not the job's own log: logName must be projects/<project>/logs/ml.googleapis.com%2F<job id>",
        )
    job = f"projects/{project}/locations/{location}/customJobs/{job_id}" if location else None
    return {
        "project": project,
        "location": location,
        "job_id": job_id,
        "job": job,
        "state": None,
        "task": task,
    }, ""


def parse_vertex_entry(entry: Raw, message_id: str | None = None, observed_at: str | None = None) -> Event:
    """One ``ml_job`` LogEntry → a ``vertex_job`` event (the job ended, by the entry's word),
    ``unrelated`` (a replica's own output, or a state that needs nothing), or ``invalid``."""
    source = new_source(entry.get("logName"), entry.get("insertId"), message_id)
    if _labels(entry.get("resource")).get("type") != RESOURCE_TYPE:
        return invalid("not a Vertex AI training job's entry (resource.type ml_job)", source)
    ref, why = _ref(entry)
    if ref is None:
        source["trust_reason"] = why
        return invalid(why, source, observed_at=observed_at)
    source["trust_reason"] = "a job's log names it only: the job is read back from customJobs.get"
    text = _text(entry)
    ref["state"] = _state(entry, text)
    if ref["task"] != SERVICE_TASK:
        return new_event("unrelated", "a training replica's own output", source, observed_at=observed_at)
    if ref["state"] is None or ref["state"].removeprefix("JOB_STATE_") not in ENDED_WORDS:
        why = f"Vertex AI job {ref['job_id']}: {clean(ref['state'] or 'no state change', 64)}, nothing ended"
        return new_event("unrelated", why, source, observed_at=observed_at)
    detail: EventDetail = {"vertex": ref, "message": clean(text, 512)}
    reason = f"Vertex AI reports job {ref['job_id']} of {ref['project']} {ref['state']}: to be read back"
    return new_event(KIND, clean(reason, 512), source, observed_at=observed_at, detail=detail)


def cluster_for(policy: Policy, project: str, location: str | None) -> Cluster | None:
    """The policy's Vertex AI cluster of a job: its ``vertex.project`` (when it names one) is the
    job's, and the job's region (when the entry names it) is one of its ``vertex.regions``."""
    for c in policy.clusters:
        if c.scheduler != SCHEDULER:
            continue
        block = c.block(SCHEDULER)
        own, regions = block.get("project"), block.get("regions")
        if own is not None and own != project:
            continue
        if location is not None and (not isinstance(regions, list) or location not in regions):
            continue
        return c
    return None


def place(ev: Event, policy: Policy) -> Event:
    """A ``vertex_job`` event on its subject: the job of the policy's Vertex AI cluster (a job-level
    episode, keyed by the job), proposing its read-back and resubmission; ``unrelated`` when no
    cluster of the policy takes the job. Other events pass unchanged."""
    ref = ev.get("detail", {}).get("vertex")
    if ev["kind"] != KIND or ref is None:
        return ev
    cluster = cluster_for(policy, ref["project"], ref["location"])
    if cluster is None:
        where = f"{ref['project']}" + (f" in {ref['location']}" if ref["location"] else "")
        why = f"Vertex AI job {ref['job_id']} of {where}: no policy cluster with scheduler vertex takes it"
        return new_event("unrelated", why, ev["source"], observed_at=ev["observed_at"])
    job: JobRef = {"project": ref["project"], "cluster": cluster.name, "job": ref["job_id"]}
    return {**ev, "job": job, "action": ACTION}
