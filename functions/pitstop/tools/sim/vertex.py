"""Vertex AI custom training jobs in `pitstop simulate`: Pitstop's resubmission against a person in
the morning, on one seeded trace of job failures.

Each failure is a CustomJob Vertex ended (after its own retries) with an error of the scenario's
mix; the real classifier (core/vertex.py, schemas/vertex-errors.yaml) says what it is. ``morning``:
nobody is told; the job sits idle until someone looks (the next working-hours check, then
``human_detect``) and resubmits it. ``pitstop``: an infrastructure failure is resubmitted from its
checkpoint at once (detection, then the new job's provisioning), within the policy's job-restart
budget; past it, or for the user's or an unknown failure, a person is paged and answers after
``human_detect``, at any hour. Both lose the work since the job's last checkpoint alike; what
differs is the idle time, in GPU-hours.
"""

from __future__ import annotations

import random
from typing import Literal, NotRequired, TypedDict

from pitstop.core import vertex

Who = Literal["morning", "pitstop"]
DAY_MIN = 1440.0


class VertexError(TypedDict):
    """One kind of job failure: how often, and the error the API reports for it."""

    weight: float
    state: str
    code: NotRequired[int]
    message: NotRequired[str]
    strategy: NotRequired[str]
    started: NotRequired[bool]


class VertexConf(TypedDict):
    """The scenario's ``vertex`` section (minutes, as the rest of the file)."""

    jobs: int
    gpus_per_job: int
    failures_per_job_day: float
    checkpoint_interval_min: float
    resubmit_min: float  # a resubmission's queue and provisioning until it runs again
    workday: list[float]  # [start hour, end hour] in which a person looks without a page
    errors: dict[str, VertexError]


class VertexRun(TypedDict):
    strategy: str
    failures: int
    resubmitted: int
    paged: int
    idle_gpu_hours: float
    lost_work_gpu_hours: float
    time_to_resume_min: float  # mean


def _job(err: VertexError) -> dict[str, object]:
    """The job as customJobs.get would return it after this failure (REST form)."""
    job: dict[str, object] = {
        "name": "projects/sim-proj/locations/us-central1/customJobs/1",
        "state": err["state"],
        "jobSpec": {"scheduling": {"strategy": err.get("strategy", "STANDARD")}},
    }
    if "code" in err:
        job["error"] = {"code": err["code"], "message": err.get("message", "")}
    if err.get("started", True):
        job["startTime"] = "2026-11-20T01:00:00Z"
    return job


def _until_seen(t_min: float, workday: list[float], rng: random.Random, human: list[float]) -> float:
    """Minutes from a failure at ``t_min`` until a person unprompted looks and acts."""
    start, end = workday[0] * 60.0, workday[1] * 60.0
    tod = t_min % DAY_MIN
    wait = 0.0 if start <= tod < end else (start - tod) % DAY_MIN
    return wait + rng.uniform(*human)


def trace(conf: VertexConf, days: float, seed: int) -> list[tuple[int, float, str]]:
    """(job, minute, error kind) of every failure, in time order per job (Poisson arrivals)."""
    rng = random.Random(f"vertex-{seed}")  # noqa: S311 - a seeded simulation, not a secret
    kinds, weights = list(conf["errors"]), [e["weight"] for e in conf["errors"].values()]
    out = []
    for j in range(conf["jobs"]):
        t = 0.0
        while True:
            t += rng.expovariate(conf["failures_per_job_day"] / DAY_MIN)
            if t >= days * DAY_MIN:
                break
            out.append((j, t, rng.choices(kinds, weights)[0]))
    return out


def run(
    who: Who,
    conf: VertexConf,
    days: float,
    seed: int,
    human: list[float],
    detect: float,
    budget: tuple[int, float],
) -> VertexRun:
    """One strategy over the trace of ``seed``: ``human`` the minutes a person takes once looking,
    ``detect`` Pitstop's; ``budget``: (resubmissions per job, within this many seconds)."""
    rng = random.Random(f"vertex-human-{seed}")  # noqa: S311 - a seeded simulation
    work = random.Random(f"vertex-work-{seed}")  # noqa: S311 - the same lost work for both strategies
    done: dict[int, list[float]] = {}
    idle = lost = 0.0
    resubmitted = paged = 0
    resumes: list[float] = []
    for job, t, kind in trace(conf, days, seed):
        verdict = vertex.classify_job(_job(conf["errors"][kind]))
        recent = [x for x in done.get(job, []) if t - x < budget[1] / 60.0]
        if who == "pitstop" and verdict.resubmit and len(recent) < budget[0]:
            wait = detect
            resubmitted += 1
            done.setdefault(job, []).append(t)
        elif who == "pitstop" and (verdict.page or verdict.resubmit):  # past the budget: paged too
            wait = rng.uniform(*human)
            paged += 1
        else:
            wait = _until_seen(t, conf["workday"], rng, human)
        down = wait + conf["resubmit_min"]
        resumes.append(down)
        idle += down
        lost += work.uniform(0.0, conf["checkpoint_interval_min"])
    per_min = conf["gpus_per_job"] / 60.0
    return {
        "strategy": who,
        "failures": len(resumes),
        "resubmitted": resubmitted,
        "paged": paged,
        "idle_gpu_hours": round(idle * per_min, 1),
        "lost_work_gpu_hours": round(lost * per_min, 1),
        "time_to_resume_min": round(sum(resumes) / len(resumes), 1) if resumes else 0.0,
    }
