"""`pitstop simulate`'s Vertex AI jobs: Pitstop's resubmission against a person in the morning.

The verdict on each failure is the real classifier's (core/vertex.py on schemas/vertex-errors.yaml),
so a user's error is never resubmitted in the simulation either; the job-restart budget is the
policy's (budgets.job_restarts).
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

from pitstop.tools import cli, simulate
from pitstop.tools.sim import vertex as vertex_sim
from pitstop.tools.sim.scenario import Scenario

INTERNAL = {"weight": 1, "state": "JOB_STATE_FAILED", "code": 13, "message": "Internal error occurred."}
USER_EXIT = {
    "weight": 1,
    "state": "JOB_STATE_FAILED",
    "code": 3,
    "message": "The replica workerpool0-0 exited with a non-zero status of 1.",
}


def _scn(errors: dict[str, Any], **vertex: Any) -> Scenario:
    scn = copy.deepcopy(simulate.load_scenario(None, {"days": 20, "nodes": 64}))
    scn["vertex"] = {**scn["vertex"], "errors": errors, **vertex}  # type: ignore[typeddict-item]
    return scn


def _runs(scn: Scenario) -> dict[str, vertex_sim.VertexRun]:
    return {r["strategy"]: r for r in simulate.vertex_jobs(scn)}


def test_an_infrastructure_failure_is_resubmitted_at_once_instead_of_waiting_for_the_morning() -> None:
    runs = _runs(_scn({"internal": INTERNAL}))
    morning, pitstop = runs["morning"], runs["pitstop"]
    assert morning["failures"] == pitstop["failures"] > 0
    assert (
        morning["resubmitted"] == 0
        and pitstop["resubmitted"] == pitstop["failures"]
        and pitstop["paged"] == 0
    )
    assert pitstop["idle_gpu_hours"] < morning["idle_gpu_hours"] / 5
    assert pitstop["lost_work_gpu_hours"] == morning["lost_work_gpu_hours"]  # a checkpoint is a checkpoint


def test_a_users_failure_is_paged_never_resubmitted() -> None:
    pitstop = _runs(_scn({"user_exit": USER_EXIT}))["pitstop"]
    assert pitstop["resubmitted"] == 0 and pitstop["paged"] == pitstop["failures"] > 0


def test_past_the_job_restart_budget_a_person_is_paged() -> None:
    scn = _scn({"internal": INTERNAL}, failures_per_job_day=48.0, jobs=1)
    scn["policy"] = {"budgets": {"job_restarts": {"max": 1, "window_s": 86_400}}}
    pitstop = _runs(scn)["pitstop"]
    assert pitstop["paged"] > 0 and pitstop["resubmitted"] <= 21  # one a day over 20 days (and a bit)


def test_the_cli_prints_both() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["simulate", "--days", "5", "--nodes", "64"]) == 0
    text = out.getvalue()
    assert "Vertex AI jobs" in text and "\nmorning " in text and "\npitstop " in text
