"""Vertex AI custom training, decided without I/O: which ended CustomJob is the platform's failure
and which the user's (schemas/vertex-errors.yaml), and what its resubmission is.

Every job here is the REST form of ``projects.locations.customJobs`` (camelCase keys, enums by
name: https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs),
as the Vertex adapter read it back itself (``customJobs.get``): a log line only names a job, it
never decides anything about it.

The checkpoint a resubmission resumes from is the one the job declared: the environment variable
``PITSTOP_CHECKPOINT_URI`` of its worker pools' container (or Python package) spec, else its
``baseOutputDirectory`` + ``/checkpoints`` (Vertex sets ``AIP_CHECKPOINT_DIR`` to that for every
replica: the job's own checkpoints, which the resubmission keeps). A label cannot carry it (label
values allow only lower-case letters, digits, ``_`` and ``-``). The resubmission gets it as
``PITSTOP_RESUME_FROM`` in every worker pool.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal, cast

from pitstop.core import resources
from pitstop.core.domain import Incident, JsonObject, VertexRecord

SCHEDULER = "vertex"  # the policy's scheduler of Vertex AI clusters (plugins/schedulers/vertex/)
Klass = Literal["infrastructure", "user", "unknown", "not_ended", "hung"]
ENDED = frozenset({"JOB_STATE_FAILED", "JOB_STATE_EXPIRED", "JOB_STATE_CANCELLED", "JOB_STATE_CANCELLING"})
MAX_MESSAGE = 4096
CHECKPOINT_ENV, RESUME_ENV = "PITSTOP_CHECKPOINT_URI", "PITSTOP_RESUME_FROM"
INCIDENT_LABEL, RESUBMIT_OF_LABEL = "pitstop_incident", "pitstop_resubmit_of"
LINEAGE_LABEL = (
    "pitstop_lineage"  # the first job's id, kept by every resubmission: the job-restart budget's key
)
# Output-only fields of a CustomJob (the API reference marks them so): never sent in a create.
OUTPUT_ONLY = (
    "name", "state", "createTime", "startTime", "endTime", "updateTime", "error",
    "webAccessUris", "satisfiesPzs", "satisfiesPzi",
)  # fmt: skip
_JOB = re.compile(
    r"projects/((?:[a-z][-a-z0-9]{4,28}[a-z0-9])|[0-9]{1,20})/locations/([a-z]+(?:-[a-z]+)*[0-9]+)"
    r"/customJobs/([0-9]{1,20})",
    re.ASCII,
)
_LABEL = re.compile(r"[a-z0-9_-]{0,63}", re.ASCII)
_LINEAGE = re.compile(r"[0-9]{1,20}", re.ASCII)
_GCS = re.compile(r"gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](?:/[^\s\x00-\x1f]{0,1024})?", re.ASCII)


@dataclass(frozen=True)
class JobName:
    """A CustomJob's resource name, each part checked (it reaches API paths)."""

    project: str
    location: str
    job_id: str

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/customJobs/{self.job_id}"

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"


def job_name(s: object) -> JobName | None:
    """The resource name ``projects/P/locations/L/customJobs/ID``, or None for anything else."""
    m = _JOB.fullmatch(s) if isinstance(s, str) and len(s) <= 200 else None
    return JobName(m[1], m[2], m[3]) if m else None


@dataclass(frozen=True)
class Row:
    id: str
    klass: Klass
    states: frozenset[str]
    codes: frozenset[int] | None
    message: re.Pattern[str] | None
    strategy: str | None
    started: bool | None
    page: bool
    why: str

    def matches(self, state: str, code: int | None, message: str, strategy: str, started: bool) -> bool:
        return (
            state in self.states
            and (self.codes is None or code in self.codes)
            and (self.message is None or self.message.search(message) is not None)
            and (self.strategy is None or self.strategy == strategy)
            and (self.started is None or self.started == started)
        )


@functools.cache
def rows() -> tuple[Row, ...]:
    """schemas/vertex-errors.yaml, checked against its schema."""
    doc = resources.load_yaml(resources.schema_dir() / "vertex-errors.yaml", "vertex-errors.schema.json")
    out = []
    for r in cast(list[JsonObject], doc["rows"]):
        klass = cast(Klass, r["class"])
        codes = r.get("codes")
        pattern = r.get("message")
        out.append(
            Row(
                str(r["id"]),
                klass,
                frozenset(cast(list[str], r["states"])),
                frozenset(cast(list[int], codes)) if isinstance(codes, list) else None,
                re.compile(pattern) if isinstance(pattern, str) else None,
                cast(str, r["strategy"]) if "strategy" in r else None,
                cast(bool, r["started"]) if "started" in r else None,
                bool(r.get("page", klass != "infrastructure")),
                str(r["why"]),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class VertexVerdict:
    """What an ended job is, and what Pitstop may do about it."""

    job: str
    state: str
    klass: Klass
    rule: str | None  # the vertex-errors.yaml row that decided (None: no row matched, or not ended)
    reason: str
    resubmit: bool  # infrastructure: resubmit from the checkpoint (within the job-restart budget)
    page: bool
    error_code: int | None
    error_message: str
    strategy: str
    vertex_retried: bool  # Vertex's own retries of internal errors were on (disableRetries false)
    restart_job_on_worker_restart: bool
    checkpoint: str | None


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def scheduling(job: Mapping[str, object]) -> Mapping[str, object]:
    return _map(_map(job.get("jobSpec")).get("scheduling"))


@dataclass(frozen=True)
class _Facts:
    """What a verdict reads from the job."""

    state: str
    code: int | None
    message: str
    strategy: str
    started: bool

    @classmethod
    def of(cls, job: Mapping[str, object]) -> _Facts:
        error = _map(job.get("error"))
        raw = error.get("code")
        code = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        start = job.get("startTime")
        return cls(
            str(job.get("state") or "JOB_STATE_UNSPECIFIED"),
            code,
            str(error.get("message") or "")[:MAX_MESSAGE],
            str(scheduling(job).get("strategy") or "STANDARD"),
            isinstance(start, str) and bool(start),
        )


def classify_job(job: Mapping[str, object]) -> VertexVerdict:
    """The verdict on a job as ``customJobs.get`` returned it; the first matching row decides."""
    f = _Facts.of(job)
    if f.state not in ENDED:
        return _verdict(job, f, "not_ended", None, f"{f.state}: the job has not ended in failure", False)
    for row in rows():
        if row.matches(f.state, f.code, f.message, f.strategy, f.started):
            return _verdict(job, f, row.klass, row.id, row.why, row.page)
    why = f"{f.state} with error code {f.code}: no documented cause matches; a person decides"
    return _verdict(job, f, "unknown", None, why, True)


def _verdict(
    job: Mapping[str, object], f: _Facts, klass: Klass, rule: str | None, reason: str, page: bool
) -> VertexVerdict:
    sched = scheduling(job)
    return VertexVerdict(
        job=str(job.get("name") or ""),
        state=f.state,
        klass=klass,
        rule=rule,
        reason=reason,
        resubmit=klass in ("infrastructure", "hung"),
        page=page,
        error_code=f.code,
        error_message=f.message,
        strategy=f.strategy,
        vertex_retried=sched.get("disableRetries") is not True,
        restart_job_on_worker_restart=sched.get("restartJobOnWorkerRestart") is True,
        checkpoint=checkpoint_of(job),
    )


def _pool_env(pool: Mapping[str, object]) -> list[Mapping[str, object]]:
    spec = _map(pool.get("containerSpec")) or _map(pool.get("pythonPackageSpec"))
    env = spec.get("env")
    return [e for e in env if isinstance(e, Mapping)] if isinstance(env, list) else []


def checkpoint_of(job: Mapping[str, object]) -> str | None:
    """The checkpoint location the job declared (see the module's doc), a ``gs://`` URI, or None."""
    spec = _map(job.get("jobSpec"))
    pools = spec.get("workerPoolSpecs")
    for pool in pools if isinstance(pools, list) else []:
        for e in _pool_env(_map(pool)):
            value = e.get("value")
            if e.get("name") == CHECKPOINT_ENV and isinstance(value, str) and _GCS.fullmatch(value):
                return value
    prefix = _map(spec.get("baseOutputDirectory")).get("outputUriPrefix")
    if isinstance(prefix, str) and _GCS.fullmatch(prefix):
        return prefix.rstrip("/") + "/checkpoints"
    return None


def display_name(job: Mapping[str, object], incident: str) -> str:
    """The resubmission's name: the job's own (cut) and the incident's, the same on every retry."""
    own = str(job.get("displayName") or "job")[:96]
    return f"{own}-pitstop-{incident}"[:128]


def resubmission(job: Mapping[str, object], incident: str) -> JsonObject:
    """The CustomJob to create for an infrastructure failure of ``job``: its spec (scheduling kept:
    restartJobOnWorkerRestart, strategy, maxWaitDuration, timeout), its labels plus the incident's
    and the old job's id, and the checkpoint in every worker pool's ``PITSTOP_RESUME_FROM``."""
    name = job_name(job.get("name"))
    if name is None or _LABEL.fullmatch(incident) is None:
        raise ValueError("not a CustomJob resource name, or not an incident id")
    new: JsonObject = {k: v for k, v in job.items() if k not in OUTPUT_ONLY}
    labels = {k: v for k, v in _map(job.get("labels")).items() if isinstance(v, str)}
    lineage = labels.get(LINEAGE_LABEL) if _LINEAGE.fullmatch(labels.get(LINEAGE_LABEL, "")) else None
    new["labels"] = {
        **labels,
        INCIDENT_LABEL: incident,
        RESUBMIT_OF_LABEL: name.job_id,
        LINEAGE_LABEL: lineage or name.job_id,
    }
    new["displayName"] = display_name(job, incident)
    spec = dict(_map(job.get("jobSpec")))
    extra = {"PITSTOP_INCIDENT": incident, "PITSTOP_RESUBMIT_OF": name.name}
    point = checkpoint_of(job)
    if point is not None:
        extra[RESUME_ENV] = point
    pools = spec.get("workerPoolSpecs")
    spec["workerPoolSpecs"] = [_with_env(_map(p), extra) for p in (pools if isinstance(pools, list) else [])]
    new["jobSpec"] = spec
    return new


def _with_env(pool: Mapping[str, object], extra: Mapping[str, str]) -> JsonObject:
    out: JsonObject = dict(pool)
    for key in ("containerSpec", "pythonPackageSpec"):
        if isinstance(pool.get(key), Mapping):
            spec = dict(_map(pool[key]))
            kept = [dict(e) for e in _pool_env(pool) if e.get("name") not in extra]
            spec["env"] = [*kept, *({"name": k, "value": v} for k, v in extra.items())]
            out[key] = spec
    return out


def lineage(job: Mapping[str, object]) -> str | None:
    """The id of the first job of a line of resubmissions (its own id for a first job)."""
    own = job_name(job.get("name"))
    found = _map(job.get("labels")).get(LINEAGE_LABEL)
    if isinstance(found, str) and _LINEAGE.fullmatch(found):
        return found
    return own.job_id if own else None


def list_filter(incident: str, old: JobName) -> str:
    """``customJobs.list``'s filter for the resubmission of ``old`` by ``incident`` (``labels.k=v``)."""
    return f'labels.{INCIDENT_LABEL}="{incident}" AND labels.{RESUBMIT_OF_LABEL}="{old.job_id}"'


def request_key(incident: str, old: JobName) -> str:
    """A short id of the resubmission (what a retried step asks about again)."""
    return hashlib.sha256(f"{incident}\0{old.name}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Resubmitted:
    """The resubmission of a failed job: its name, and whether this call created it."""

    job: str
    resubmit_of: str
    created: bool
    checkpoint: str | None


RUNNING = "JOB_STATE_RUNNING"
HANG_KIND = "hang"


def hung(job: Mapping[str, object]) -> VertexVerdict:
    """The verdict on a job whose heartbeat stopped (a verified Monitoring alert), as read back.

    Pitstop's place is a distributed job that hangs after a worker restart without
    ``restartJobOnWorkerRestart`` (with it, Vertex restarts the whole job itself: a job hung anyway
    is a person's to look at). A job Vertex is not running is not hung: it is (re)starting, or it
    ended, and its end is an episode of its own."""
    f = _Facts.of(job)
    if f.state != RUNNING:
        why = f"{f.state}: Vertex AI is not running the job, so it is not hung (an end is its own episode)"
        return _verdict(job, f, "not_ended", None, why, False)
    if scheduling(job).get("restartJobOnWorkerRestart") is True:
        why = (
            "hung while RUNNING with restartJobOnWorkerRestart: Vertex restarts it itself when a worker"
            " restarts, so this is not the hang Pitstop resubmits; a person decides"
        )
        return _verdict(job, f, "unknown", None, why, True)
    why = (
        "hung while RUNNING without restartJobOnWorkerRestart (a distributed job whose worker "
        "restarted waits for it forever): cancelled and resubmitted from its checkpoint"
    )
    return _verdict(job, f, "hung", None, why, False)


def judge(kind: str, job: Mapping[str, object] | None, accounts: Collection[str]) -> VertexRecord:
    """What a Vertex AI job's step does, decided on the job as ``customJobs.get`` returned it (never on
    the line that opened the episode): resubmit it (a hung one cancelled first), or leave it, with a
    page when a person must decide. The job-restart budget is applied after (it needs the store)."""
    if job is None:
        why = "Vertex AI has no such CustomJob in the cluster's project and regions (the line named it)"
        return {"job": None, "state": None, "klass": "not_found", "reason": why, "outcome": "left",
                "why": why, "page": True}  # fmt: skip
    v = hung(job) if kind == HANG_KIND else classify_job(job)
    rec = record(v, job)
    if not v.resubmit:
        return {**rec, "outcome": "left", "why": v.reason, "page": v.page}
    spec = job.get("jobSpec")
    account = spec.get("serviceAccount") if isinstance(spec, Mapping) else None
    if not isinstance(account, str) or account not in accounts:
        who = account if isinstance(account, str) else "Vertex AI's own service agent"
        why = f"it runs as {who}, not an account Pitstop may act as (policy vertex.job_service_accounts)"
        return {**rec, "outcome": "left", "why": why, "page": True}
    return {**rec, "outcome": "resubmit", "why": v.reason, "page": False, "cancel": kind == HANG_KIND}


def record(v: VertexVerdict, job: Mapping[str, object]) -> VertexRecord:
    """The verdict as the incident keeps it."""
    return {
        "job": v.job,
        "state": v.state,
        "klass": v.klass,
        "rule": v.rule,
        "reason": v.reason,
        "error_code": v.error_code,
        "error_message": v.error_message[:1024],
        "strategy": v.strategy,
        "vertex_retried": v.vertex_retried,
        "restart_job_on_worker_restart": v.restart_job_on_worker_restart,
        "lineage": lineage(job),
        "checkpoint": v.checkpoint,
    }


def close_note(inc: Incident) -> tuple[str, str, list[str], str | None] | None:
    """The closing notification of a Vertex AI job's episode: (text, severity, both jobs, what a person
    does); None for any other incident."""
    rec = inc.get("vertex")
    if rec is None:
        return None
    ref = inc.get("job")
    old = rec.get("job") or f"job {ref['job'] if ref else '?'}"
    error = f" (error {rec.get('error_code')}: {rec.get('error_message')})" if rec.get("error_code") else ""
    said = f"Vertex AI job {old} ({rec.get('state')}{error}): {rec.get('reason')}."
    new = rec.get("resubmitted_as")
    if rec.get("outcome") == "resubmitted" and new:
        where = f" from {rec['checkpoint']}" if rec.get("checkpoint") else " (it declared no checkpoint)"
        return f"{said} Resubmitted as {new}{where}.", "warning", [str(old), new], None
    jobs = [str(old)] if rec.get("job") else []
    if rec.get("page"):
        todo = f"Not resubmitted: {rec.get('why')}. Look at the job and decide whether to rerun it."
        return f"{said} Not resubmitted: {rec.get('why')}.", "critical", jobs, todo
    return f"{said} Nothing to do.", "info", jobs, None
