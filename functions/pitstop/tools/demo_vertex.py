"""The Vertex AI scenarios (stack ``vertex``): a CustomJob a person created, what happens to it, and
what Pitstop did about it.

The job is created through the real client (google-cloud-aiplatform's JobServiceClient) on the
stand-in (local/fake_vertex.py), which the stack runs for its Vertex AI cluster; the fault is the
stand-in's own (a failure with a google.rpc error, which Vertex retries itself when it is internal;
a worker's restart); the job's log entries, as Vertex writes them when it ends, go through the
sink's router (infra/filters/vertex-jobs.filter) to ingest; a hung job's heartbeat stops, and the
Monitoring stand-in's alert comes in on the alerts topic. What is observed is the incident, the
jobs as the API answers for them, and the notification.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from pitstop.core import vertex
from pitstop.local.heartbeats import beats
from pitstop.local.stack import PROJECT, REGION, VERTEX_ACCOUNT
from pitstop.tools.demo_runner import Seen, incident_obs
from pitstop.tools.demo_stage import Observations, Stage

if TYPE_CHECKING:
    from pitstop.core.domain import Incident, JsonObject
    from pitstop.tools.demo_runner import Spec, VertexSpec

BUCKET = "gs://pitstop-demo"
ENDED = ("JOB_STATE_FAILED", "JOB_STATE_EXPIRED", "JOB_STATE_CANCELLED", "JOB_STATE_SUCCEEDED")


class VertexStage:
    """The Vertex AI stand-in as a person and the platform drive it; the stage's incidents out."""

    def __init__(self, stage: Stage) -> None:
        from pitstop.plugins.schedulers.vertex.adapter import job_service_client

        self.stage, self.endpoint = stage, stage.state.endpoints["vertex"]
        self.client = job_service_client(REGION, self.endpoint)
        self.cluster = stage.state.cluster["name"]

    def admin(self, path: str, body: JsonObject | None = None) -> Any:
        import urllib.request

        req = urllib.request.Request(  # noqa: S310 - the stand-in's loopback URL from stack.json
            self.endpoint + path, data=json.dumps(body or {}).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            return json.loads(resp.read())

    def create(self, key: str, spec: VertexSpec) -> str:
        """The scenario's job: two A3 Mega workers, its checkpoints under the demo bucket."""
        from google.cloud.aiplatform_v1.types import CustomJob

        env = [{"name": vertex.CHECKPOINT_ENV, "value": f"{BUCKET}/ckpt/{key}"}]
        if spec.get("heartbeat"):
            env.append({"name": "PITSTOP_HEARTBEAT_CLUSTER", "value": self.cluster})
        pool = {
            "machineSpec": {
                "machineType": "a3-megagpu-8g",
                "acceleratorType": "NVIDIA_H100_MEGA_80GB",
                "acceleratorCount": 8,
            },
            "replicaCount": "2",
            "containerSpec": {"imageUri": f"us-docker.pkg.dev/{PROJECT}/train/llm:1", "env": env},
        }
        body = {
            "displayName": key.replace("_", "-"),
            "labels": {"team": "llm"},
            "jobSpec": {
                "workerPoolSpecs": [pool],
                "serviceAccount": VERTEX_ACCOUNT,
                "scheduling": dict(spec.get("scheduling") or {}),
            },
        }
        job = self.client.create_custom_job(
            parent=f"projects/{PROJECT}/locations/{REGION}", custom_job=CustomJob.from_json(json.dumps(body))
        )
        return str(job.name)

    def get(self, name: str) -> JsonObject:
        job = self.client.get_custom_job(name=name)
        out: JsonObject = json.loads(type(job).to_json(job, use_integers_for_enums=False))
        return out

    def wait_state(self, name: str, states: tuple[str, ...], timeout: float = 60.0) -> str:
        def there() -> str | None:
            state = str(self.get(name).get("state"))
            return state if state in states else None

        found: str = self.stage.wait(there, timeout, f"{name} to be {' or '.join(states)}")
        return found

    def jobs(self) -> dict[str, JsonObject]:
        """Every job the stand-in holds: state, attempts, labels."""
        found: dict[str, JsonObject] = self.admin("/_admin/state")["jobs"]
        return found

    def pump(self) -> int:
        """The jobs' new log entries through the sink router (its filter decides); how many went."""
        seen = getattr(self, "_read", 0)
        got = self.admin("/_admin/logs", {"after": seen})
        self._read = int(got["next"])
        return sum(1 for e in got["entries"] if self.stage.router.publish(e))

    def incidents(self, job_id: str) -> list[Incident]:
        from pitstop.adapters.firestore import IncidentStore

        docs = IncidentStore(self.stage.db).query()
        return [d for d in docs if (ref := d.get("job")) is not None and ref["job"] == job_id]

    def ended(self, job_id: str, kind: str, timeout: float) -> Incident:
        """The job's episode of ``kind`` once resolved or failed (the log pumped while waiting)."""

        def done() -> Incident | None:
            self.pump()
            found = [i for i in self.incidents(job_id) if i["kind"] == kind]
            return found[-1] if found and found[-1]["state"] in ("RESOLVED", "FAILED") else None

        found: Incident = self.stage.wait(done, timeout, f"the {kind} incident of job {job_id} to end")
        return found

    def fault(self, name: str, spec: VertexSpec, timeout: float) -> Incident:
        """The scenario's fault on a running job, and the episode it opened, once ended."""
        self.wait_state(name, ("JOB_STATE_RUNNING",))
        job_id = name.rsplit("/", 1)[1]
        fault = spec["fault"]
        if fault == "worker_restart":
            time.sleep(3)  # it trains (and beats) a while first
            self.admin("/_admin/worker_restart", {"name": name})
            return self.ended(job_id, "hang", timeout)
        self.admin("/_admin/fail", {"name": name, **fault})
        self.wait_state(name, ENDED, timeout)
        return self.ended(job_id, "vertex_job", timeout)


def on_vertex(stage: Stage, spec: Spec) -> Seen:
    """A job fails (or hangs); with ``again`` its resubmission fails too. The last episode reports."""
    v, vs = VertexStage(stage), spec["vertex"]
    timeout = spec.get("timeout_s", 120.0)
    first_job = v.create(spec["key"], vs)
    inc = first = v.fault(first_job, vs, timeout)
    if vs.get("again"):
        resubmitted = (first.get("vertex") or {}).get("resubmitted_as")
        if not resubmitted:
            raise AssertionError(f"incident {first['id']} resubmitted nothing: {first.get('vertex')}")
        inc = v.fault(resubmitted, vs, timeout)
    v.pump()  # whatever else Vertex wrote (a cancelled hung job's end): the sink routes it as any
    obs = {
        **incident_obs(inc),
        **_observed(v, inc, vs),
        "first_outcome": (first.get("vertex") or {}).get("outcome"),
    }
    notes = stage.wait(lambda: stage.notes_for(inc["id"]), 30, "the notification")
    text = " ".join(str(n["body"].get("text")) for n in notes)
    new = str(obs.get("resubmitted_as") or "")
    obs.update(notes=len(notes), notes_text=text, severity=_severity(text))
    obs["both_jobs_named"] = bool(new) and new in text and str(obs["job_name"]) in text
    return Seen(inc, obs)


def _observed(v: VertexStage, inc: Incident, spec: VertexSpec) -> Observations:
    """The episode's verdict and outcome, the jobs as the stand-in holds them, the new one as read."""
    rec = inc.get("vertex") or {}
    name = str(rec.get("job") or "")
    job_id = name.rsplit("/", 1)[-1]
    jobs = v.jobs()
    mine = jobs.get(name) or {}
    resubs = [n for n, j in jobs.items() if (j.get("labels") or {}).get(vertex.RESUBMIT_OF_LABEL) == job_id]
    obs: Observations = {
        "job": job_id,
        "job_name": name,
        "job_state": mine.get("state"),
        "vertex_retries": int(mine.get("attempt") or 1) - 1,
        **{
            k: rec.get(k) for k in ("klass", "rule", "outcome", "page", "why", "resubmitted_as", "checkpoint")
        },
        "resubmissions": len(resubs),
    }
    new = rec.get("resubmitted_as")
    if new:
        doc = v.get(new)
        pools = doc["jobSpec"]["workerPoolSpecs"]
        env = {e["name"]: e["value"] for e in pools[0]["containerSpec"].get("env", [])}
        wanted = dict(spec.get("scheduling") or {})
        kept = doc["jobSpec"].get("scheduling") or {}
        obs.update(resume_from=env.get(vertex.RESUME_ENV), new_state=doc.get("state"))
        obs["scheduling_kept"] = all(kept.get(k) == val for k, val in wanted.items())
        if spec.get("heartbeat"):  # the resubmission trains: its loop beats again
            new_id = new.rsplit("/", 1)[1]
            obs["beating_again"] = v.stage.wait(lambda: beats(v.stage.stack, new_id) > 0 or None, 30,
                                                f"job {new_id} to beat")  # fmt: skip
    return obs


def _severity(text: str) -> str | None:
    """The notification's severity as the chat line shows it (``[CRITICAL]``)."""
    for word in ("CRITICAL", "WARNING", "INFO"):
        if f"[{word}]" in text:
            return word.lower()
    return None
