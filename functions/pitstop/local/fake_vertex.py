"""A stateful Vertex AI CustomJobs service (REST v1), driven by the real google-cloud-aiplatform
client (its REST transport, ``api_endpoint`` http://127.0.0.1:PORT).

What it models (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs):
``create`` (POST .../customJobs: a new numeric id, state JOB_STATE_QUEUED), ``get``, ``list`` (the
documented filter subset: ``labels.KEY="VALUE"``, ``state="..."``, ``display_name="..."`` joined by
AND; pages), ``cancel`` (POST ...:cancel: CANCELLING, then CANCELLED with error code 1). A job
goes QUEUED → PENDING → RUNNING → SUCCEEDED, one step per ``step_s`` seconds of the fake's clock.
On command (:meth:`FakeVertex.fail`) it fails with a chosen google.rpc error: an internal error
(INTERNAL, UNAVAILABLE) while ``scheduling.disableRetries`` is false is retried by "Vertex" itself:
the whole job runs again, up to 3 times, before it ends FAILED
(https://cloud.google.com/vertex-ai/docs/training/understanding-training-service); any other error,
or retries disabled, ends it FAILED at once. Bodies are read and written with the library's own
``CustomJob`` message type, so what the fake accepts and answers is what the API's schema allows.

What the local stack drives beside the API (``/_admin/...``, :meth:`FakeVertex.admin`): a job's
failure on command; a worker's restart (with ``scheduling.restartJobOnWorkerRestart`` Vertex
restarts the whole job; without it a distributed job waits for the worker forever: it stays
RUNNING and its heartbeat stops); the job's own log entries as Vertex writes them when it ends
(``ml_job``, task ``service``, label ``ml.googleapis.com/job_state``: core/vertex_log.py, shapes
from tests/fixtures/vertex_job_logs.yaml), which the stack's sink router publishes; and a lost
answer (the call lands, its answer does not: what a retried step must survive). A job whose
container env sets ``PITSTOP_HEARTBEAT_CLUSTER`` beats while it trains, as docs/telemetry.md tells
a training loop to (metric labels ``cluster`` and ``job``: its numeric id).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.cloud.aiplatform_v1.types import CustomJob

from pitstop.local.json_http import serve_json

INTERNAL_CODES = frozenset({13, 14})  # INTERNAL, UNAVAILABLE: what Vertex retries itself
HEARTBEAT_ENV = "PITSTOP_HEARTBEAT_CLUSTER"  # a job that beats: the cluster label its loop writes
END_TEXT = {  # the service task's message when a job ends (tests/fixtures/vertex_job_logs.yaml)
    "JOB_STATE_FAILED": "Job failed.",
    "JOB_STATE_CANCELLED": "Job was cancelled.",
    "JOB_STATE_EXPIRED": "Job expired.",  # [U]: the label value and text inferred from QUEUED's
}
JOB_RETRIES = 3  # whole-job retries before the job fails (understanding-training-service)
PROGRESS = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED")
ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"})
_PARENT = r"projects/([^/]+)/locations/([^/]+)"
_COLLECTION = re.compile(rf"/v1/({_PARENT})/customJobs")
_ONE = re.compile(rf"/v1/({_PARENT}/customJobs/([0-9]+))(:cancel)?")
_CLAUSE = re.compile(r'\s*(labels\.([a-z0-9_-]+)|state|display_name)\s*=\s*"([^"]*)"\s*')
PAGE = 50


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


@dataclass
class _Failure:
    code: int
    message: str
    times: int  # how many runs in a row hit it


@dataclass
class _Job:
    doc: dict[str, Any]  # the CustomJob in REST JSON, enums by name
    started: float  # when its current run (attempt) began
    attempt: int = 1
    failure: _Failure | None = None
    history: list[str] = field(default_factory=list)
    hung: bool = False  # a worker restarted without restartJobOnWorkerRestart: RUNNING, no progress


class FakeVertex:
    """The service's state; :meth:`serve` puts it behind the REST API."""

    def __init__(
        self, step_s: float = 1.0, clock: Callable[[], float] = time.time, run_s: float | None = None
    ) -> None:
        self.step_s, self.clock = step_s, clock
        self.run_s = step_s if run_s is None else run_s  # how long a job trains before it succeeds
        self.jobs: dict[str, _Job] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path): what the client asked
        self.entries: list[dict[str, Any]] = []  # the jobs' log entries, as Vertex writes them
        self.lose: dict[str, int] = {}  # method -> how many more answers are lost after the call lands
        self.lock = threading.Lock()
        self._ids = itertools.count(4_606_268_999_515_242_496)

    # -- commands a test or the local stack gives -----------------------------------------------

    def fail(self, name: str, code: int, message: str, times: int = 1) -> None:
        """The job's next ``times`` runs fail with this error (Vertex retries internal ones itself)."""
        with self.lock:
            self.jobs[name].failure = _Failure(code, message, times)

    def add(self, parent: str, job: dict[str, Any]) -> str:
        """A job as if a person had created it (same path as the API's create)."""
        return str(self._create(parent, job)["name"])

    def state(self, name: str) -> str:
        with self.lock:
            self._advance(self.jobs[name])
            return str(self.jobs[name].doc["state"])

    def worker_restart(self, name: str) -> str:
        """A worker of the running job restarts: with ``restartJobOnWorkerRestart`` Vertex restarts
        the whole job (a new attempt); without it the others wait for it forever (hung). What happened."""
        with self.lock:
            job = self.jobs[name]
            self._advance(job)
            if job.doc["state"] != "JOB_STATE_RUNNING":
                return f"not running ({job.doc['state']})"
            if _scheduling(job.doc).get("restartJobOnWorkerRestart") is True:
                job.attempt, job.started = job.attempt + 1, self.clock()
                job.history.append("restarted: a worker restarted")
                self._set(job, "JOB_STATE_PENDING")
                return "restarted by Vertex (restartJobOnWorkerRestart)"
            job.hung = True
            job.history.append("hung: a worker restarted")
            return "hung"

    def beating(self) -> list[tuple[str, str, str]]:
        """(project, cluster, job id) of each job training now that writes a heartbeat (not hung)."""
        out = []
        with self.lock:
            for name, job in self.jobs.items():
                self._advance(job)
                cluster = _env(job.doc).get(HEARTBEAT_ENV)
                if cluster and job.doc["state"] == "JOB_STATE_RUNNING" and not job.hung:
                    out.append((name.split("/")[1], cluster, name.rsplit("/", 1)[1]))
        return out

    def logs(self, after: int = 0) -> list[dict[str, Any]]:
        """The jobs' log entries from the ``after``-th on (jobs that ended meanwhile write theirs)."""
        with self.lock:
            for job in self.jobs.values():
                self._advance(job)
            return [dict(e) for e in self.entries[after:]]

    def admin(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """``/_admin/...``: what the local stack and its tests drive beside the API."""
        if path == "/_admin/fail":
            self.fail(str(body["name"]), int(body["code"]), str(body["message"]), int(body.get("times", 1)))
            return 200, {"failing": body["name"]}
        if path == "/_admin/worker_restart":
            return 200, {"job": body["name"], "what": self.worker_restart(str(body["name"]))}
        if path == "/_admin/logs":
            after = int(body.get("after", 0))
            entries = self.logs(after)
            return 200, {"entries": entries, "next": after + len(entries)}
        if path == "/_admin/lose":
            with self.lock:
                self.lose[str(body["method"])] = int(body.get("count", 1))
            return 200, {"lose": self.lose}
        if path == "/_admin/state":
            with self.lock:
                jobs = {n: {"state": j.doc["state"], "attempt": j.attempt, "history": j.history,
                            "labels": j.doc.get("labels") or {}} for n, j in self.jobs.items()}  # fmt: skip
                return 200, {"jobs": jobs, "calls": [list(c) for c in self.calls]}
        return _error(404, "NOT_FOUND", f"no such admin path: {path}")

    # -- the API -------------------------------------------------------------------------------

    def dispatch(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        if url.path.startswith("/_admin/"):
            return self.admin(url.path, json.loads(body or b"{}"))
        query = urllib.parse.parse_qs(url.query)
        ints = any("enum-encoding=int" in v for v in query.get("$alt", []))
        self.calls.append((method, url.path))
        one, many = _ONE.fullmatch(url.path), _COLLECTION.fullmatch(url.path)
        with self.lock:
            if method == "POST" and many:
                created = self._out(self._create_locked(many[1], json.loads(body or b"{}")), ints)
                return self._lost("create") or (200, created)
            if method == "POST" and one and one[5] and one[1] in self.jobs:
                return self._lost("cancel") or (200, self._cancel(one[1]))
            if one and one[1] not in self.jobs:
                return _error(404, "NOT_FOUND", f"CustomJob {one[1]} not found")
            if method == "GET" and one and not one[5]:
                return 200, self._out(self._read(one[1]), ints)
            if method == "POST" and one and one[5]:
                return 200, self._cancel(one[1])
            if method == "GET" and many:
                return self._list(many[1], query, ints)
        return _error(404, "NOT_FOUND", f"no such method: {method} {url.path}")

    def _lost(self, method: str) -> tuple[int, Any] | None:
        """The call landed but its answer is lost (the front end's 503), while ``lose`` says so."""
        if self.lose.get(method, 0) <= 0:
            return None
        self.lose[method] -= 1
        return _error(503, "UNAVAILABLE", "The service is currently unavailable.")

    def _create(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            return self._create_locked(parent, body)

    def _create_locked(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        doc = _canonical(body)  # the library's own message type: an unknown field is refused
        now = self.clock()
        name = f"{parent}/customJobs/{next(self._ids)}"
        doc.update(name=name, state=PROGRESS[0], createTime=_iso(now), updateTime=_iso(now))
        for out in ("startTime", "endTime", "error"):
            doc.pop(out, None)
        self.jobs[name] = _Job(doc, now)
        return doc

    def _read(self, name: str) -> dict[str, Any]:
        job = self.jobs[name]
        self._advance(job)
        return job.doc

    def _cancel(self, name: str) -> dict[str, Any]:
        job = self.jobs[name]
        self._advance(job)
        if job.doc["state"] not in ENDED:
            self._end(job, "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"})
        return {}

    def _list(self, parent: str, query: dict[str, list[str]], ints: bool) -> tuple[int, Any]:
        try:
            wanted = _clauses(query.get("filter", [""])[0])
        except ValueError as exc:
            return _error(400, "INVALID_ARGUMENT", str(exc))
        found = []
        for name, job in self.jobs.items():
            if name.startswith(parent + "/"):
                self._advance(job)
                if all(_value(job.doc, k) == v for k, v in wanted):
                    found.append(job.doc)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        size = int(query.get("pageSize", [str(PAGE)])[0] or PAGE)
        page = found[start : start + size]
        body: dict[str, Any] = {"customJobs": [self._out(d, ints) for d in page]}
        if start + size < len(found):
            body["nextPageToken"] = str(start + size)
        return 200, body

    # -- time ------------------------------------------------------------------------------------

    def _advance(self, job: _Job) -> None:
        """Move the job along its states as the clock says; a failure ends (or retries) a run."""
        while job.doc["state"] not in ENDED:
            at = PROGRESS.index(job.doc["state"]) if job.doc["state"] in PROGRESS else 0
            if job.failure is not None and at >= 2:  # a running job hits its failure
                self._fail_run(job)
                continue
            nxt = self._due(self.clock() - job.started, job.hung)
            if nxt <= at:
                return
            self._set(job, PROGRESS[at + 1])

    def _due(self, elapsed: float, hung: bool) -> int:
        """The state (index of PROGRESS) a run has reached after ``elapsed`` seconds: a step_s each
        queued and pending, run_s training (a hung job never finishes)."""
        if self.step_s <= 0:
            return 2 if hung else 3
        steps = min(int(elapsed / self.step_s), 2)
        if steps < 2 or hung:
            return steps
        return 3 if elapsed >= 2 * self.step_s + self.run_s else 2

    def _fail_run(self, job: _Job) -> None:
        f = job.failure
        assert f is not None
        retries = not _scheduling(job.doc).get("disableRetries")
        if f.code in INTERNAL_CODES and retries and job.attempt <= JOB_RETRIES:
            f.times -= 1
            job.failure = f if f.times > 0 else None
            job.attempt += 1
            job.started = self.clock()
            job.history.append(f"retried after {f.code}")
            self._set(job, "JOB_STATE_PENDING")
            return
        self._end(job, "JOB_STATE_FAILED", {"code": f.code, "message": f.message})

    def _set(self, job: _Job, state: str) -> None:
        now = self.clock()
        job.doc["state"], job.doc["updateTime"] = state, _iso(now)
        job.history.append(state)
        if state == "JOB_STATE_RUNNING" and "startTime" not in job.doc:
            job.doc["startTime"] = _iso(now)

    def _end(self, job: _Job, state: str, error: dict[str, Any]) -> None:
        self._set(job, state)
        job.doc["endTime"], job.doc["error"] = job.doc["updateTime"], error
        job.failure = None
        if state in END_TEXT:
            self.entries.append(_log_entry(job.doc, state, self.clock()))

    @staticmethod
    def _out(doc: dict[str, Any], ints: bool) -> Any:
        return json.loads(
            CustomJob.to_json(CustomJob.from_json(json.dumps(doc)), use_integers_for_enums=ints)
        )


def _canonical(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the API would store it: parsed by the library's CustomJob (enums as names)."""
    msg = CustomJob.from_json(json.dumps(body))
    out: dict[str, Any] = json.loads(CustomJob.to_json(msg, use_integers_for_enums=False))
    return out


def _log_entry(doc: dict[str, Any], state: str, now: float) -> dict[str, Any]:
    """The ``service`` task's entry of a job's end, as Vertex AI writes it (resource ``ml_job``)."""
    project, job_id = doc["name"].split("/")[1], doc["name"].rsplit("/", 1)[1]
    word = state.removeprefix("JOB_STATE_")
    return {
        "insertId": uuid.uuid4().hex[:12],
        "logName": f"projects/{project}/logs/ml.googleapis.com%2F{job_id}",
        "resource": {
            "type": "ml_job",
            "labels": {"job_id": job_id, "project_id": project, "task_name": "service"},
        },
        "timestamp": _iso(now),
        "receiveTimestamp": _iso(now),
        "severity": "ERROR" if word == "FAILED" else "INFO",
        "labels": {"ml.googleapis.com/endpoint": "", "ml.googleapis.com/job_state": word},
        "textPayload": END_TEXT[state],
    }


def _env(doc: dict[str, Any]) -> dict[str, str]:
    """The first worker pool's container env (what the job's training code reads)."""
    pools = (doc.get("jobSpec") or {}).get("workerPoolSpecs") or [{}]
    spec = pools[0].get("containerSpec") or pools[0].get("pythonPackageSpec") or {}
    return {str(e.get("name")): str(e.get("value")) for e in spec.get("env") or []}


def _scheduling(doc: dict[str, Any]) -> dict[str, Any]:
    found = (doc.get("jobSpec") or {}).get("scheduling") or {}
    return found if isinstance(found, dict) else {}


def _clauses(text: str) -> list[tuple[str, str]]:
    """The filter's ``key="value"`` clauses joined by AND (the subset the adapter uses)."""
    out = []
    for part in [p for p in re.split(r"\s+AND\s+", text.strip()) if p]:
        m = _CLAUSE.fullmatch(part)
        if m is None:
            raise ValueError(f"unsupported filter clause: {part!r}")
        out.append((m[1], m[3]))
    return out


def _value(doc: dict[str, Any], key: str) -> object:
    if key.startswith("labels."):
        return (doc.get("labels") or {}).get(key[7:])
    return doc.get({"display_name": "displayName"}.get(key, key))


def _error(status: int, word: str, message: str) -> tuple[int, Any]:
    return status, {"error": {"code": status, "message": message, "status": word}}


def serve(fake: FakeVertex, host: str = "127.0.0.1", port: int = 0) -> tuple[Any, str]:
    """The fake on a loopback port: (server, ``http://host:port`` for ``api_endpoint``)."""
    server = serve_json(fake.dispatch, "fake-vertex", host, port)
    return server, f"http://{host}:{server.server_address[1]}"
