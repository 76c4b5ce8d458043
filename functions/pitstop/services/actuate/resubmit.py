"""A Vertex AI job's step: read the job back, judge it, and resubmit it once from its checkpoint
within the job-restart budget, or leave it (a page when a person must decide).

The line that opened the episode only named the job; what is decided rests on the job as
``customJobs.get`` returns it (core/vertex.judge: schemas/vertex-errors.yaml for a job Vertex
ended, the job's own ``scheduling`` for a hung one). Vertex's own retries are not repeated: a job
it is still running or restarting is left alone.

Exactly once: the op is an effect of the step runner (one attempt at a time, its answer replayed).
Its verdict, and the job-restart budget's claim (keyed by the job's lineage, admitted again for
the same failed job), are saved in the step record before the first effect, so a retry of an
attempt that died after a hung job's cancel resubmits the same job rather than judging the
cancelled one; the resubmission itself is found again by its labels (plugins/schedulers/vertex/).
"""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import vertex
from pitstop.core.aggregate import RecordVertex
from pitstop.core.answers import Resubmission
from pitstop.core.domain import JsonObject, VertexRecord
from pitstop.core.evidence import Warrant
from pitstop.core.ids import job_key, requeue_key
from pitstop.core.scheduling import JobResubmission
from pitstop.services.actuate.context import Step


def _platform(s: Step) -> JobResubmission:
    sched = s.scheduler
    if not isinstance(sched, JobResubmission):
        raise ActuatorError(409, f"the {sched.name} scheduler cannot resubmit a job", False)
    return sched


def _job(s: Step) -> str:
    job = s.inc.get("job")
    if job is None:
        raise ActuatorError(409, f"incident {s.iid} names no job", False)
    return str(job["job"])


def resubmit(s: Step, warrant: Warrant) -> Resubmission:
    """Judge the job (or reuse an earlier attempt's verdict), then resubmit it once or leave it."""
    sched = _platform(s)
    done = _resubmitted_before(s)
    if done is not None:
        return done
    rec, doc = s.decided().get("vertex"), None
    if rec is None:
        doc = sched.read_job(_job(s))
        rec = _within_budget(s, vertex.judge(s.inc["kind"], doc, sched.job_service_accounts()))
        s.save({"vertex": rec})  # before the first effect: a retry acts on this verdict
    if rec.get("outcome") != "resubmit":
        s.decide(RecordVertex(s.at, rec))
        log.emit("WARNING" if rec.get("page") else "INFO", "Vertex AI job left", incident=s.iid,
                 job=rec.get("job"), why=rec.get("why"))  # fmt: skip
        return {"outcome": "left", "job": rec.get("job"), "why": str(rec.get("why"))}
    name = str(rec.get("job"))
    doc = doc or sched.read_job(name)  # the spec, unchanged by its end (or by this step's cancel)
    if doc is None:
        raise ActuatorError(409, f"{name} is gone: nothing to resubmit", False)
    return _resubmit(s, sched, rec, doc)


def _resubmitted_before(s: Step) -> Resubmission | None:
    """An earlier step of this episode resubmitted the job: its answer, found on the incident.

    A hung job's cancel is Pitstop's own, and Vertex logs that end; when the line arrives before the
    step closes it raises the episode, and the new step would judge the cancelled job ("not hung")
    and overwrite the resubmission with "nothing to do". One resubmission per episode."""
    rec = s.inc.get("vertex") or {}
    name = str(rec.get("job") or "")
    if rec.get("outcome") != "resubmitted" or name.rsplit("/", 1)[-1] != _job(s).rsplit("/", 1)[-1]:
        return None
    log.emit("INFO", "Vertex AI job resubmitted before", incident=s.iid, job=name,
             resubmitted_as=rec.get("resubmitted_as"))  # fmt: skip
    return {"outcome": "resubmitted", "job": name, "why": str(rec.get("why")),
            "resubmitted_as": str(rec.get("resubmitted_as"))}  # fmt: skip


def _resubmit(s: Step, sched: JobResubmission, rec: VertexRecord, doc: JsonObject) -> Resubmission:
    name = str(rec.get("job"))
    if rec.get("cancel"):
        sched.cancel_job(name)  # a hung job holds its capacity until it is cancelled
    done = sched.resubmit_job(doc, s.ref)
    out: VertexRecord = {**rec, "outcome": "resubmitted", "resubmitted_as": done.job, "created": done.created}
    s.decide(RecordVertex(s.at, out))
    log.emit("INFO", "Vertex AI job resubmitted", incident=s.iid, job=name, resubmitted_as=done.job,
             created=done.created, checkpoint=done.checkpoint)  # fmt: skip
    return {"outcome": "resubmitted", "job": name, "why": str(rec.get("why")), "resubmitted_as": done.job}


def _within_budget(s: Step, rec: VertexRecord) -> VertexRecord:
    """The verdict after the job-restart budget: one slot per failed job, counted on its lineage
    (the first job of its resubmissions), so a line of resubmissions spends one budget."""
    if rec.get("outcome") != "resubmit":
        return rec
    cluster, name = s.inc.get("cluster") or "none", str(rec.get("job"))
    line = rec.get("lineage") or name
    key = requeue_key(cluster, name, {})  # the failed job itself: it is resubmitted once
    cap, window = s.deps.policy.job_restarts()
    now = s.deps.clock()
    if not s.deps.store.records.claim_job_restart(job_key(cluster, f"vertex:{line}"), key, now, cap, window):
        why = (
            f"job {line} and its resubmissions were resubmitted by Pitstop {cap} times within"
            f" {int(window)} s (budgets.job_restarts): not again"
        )
        return {**rec, "outcome": "left", "why": why, "page": True}
    if not s.deps.store.records.mark_job_requeue(key, s.iid, now):
        return {**rec, "outcome": "left", "why": "already resubmitted for another incident", "page": False}
    return rec
