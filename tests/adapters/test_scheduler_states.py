"""Each scheduler adapter answers in the contract's types (core/scheduling.py), mapped by a table
of its own system's words; anything else is UNKNOWN, never guessed by case or prefix.

Slurm: the job states squeue(1) documents ("JOB STATE CODES",
https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES), printed in their long form by
``squeue -o %T`` and ``scontrol show job`` (JobState=). Kubernetes: a pod's phase
(kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase), a batch Job's terminal
conditions Complete / Failed (kubernetes.io/docs/concepts/workloads/controllers/job/
#terminal-job-conditions) and a JobSet's Completed / Failed (kubernetes-sigs/jobset@v0.12.0
api/jobset/v1alpha2/jobset_types.go).
"""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.adapters.gke import objects
from pitstop.adapters.slurm import SLURM_JOB_STATES, SlurmScheduler, slurm_job_state
from pitstop.core.scheduling import JobInfo, JobRun, JobState, StepRef

# squeue(1), JOB STATE CODES: every state Slurm documents, in its long form
SQUEUE_STATES = (
    *("BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE", "FAILED"),
    *("NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD", "REQUEUE_FED"),
    *("REQUEUE_HOLD", "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT"),
    *("STOPPED", "SUSPENDED", "TIMEOUT"),
)
REF = StepRef("iaaaaaaaaa", 1)


def test_the_slurm_table_names_every_documented_state_and_nothing_else() -> None:
    assert sorted(SLURM_JOB_STATES) == sorted(SQUEUE_STATES)
    same = {s for s in SQUEUE_STATES if s in set(JobState)}
    assert {s: SLURM_JOB_STATES[s] for s in same} == {s: JobState(s) for s in same}
    assert {SLURM_JOB_STATES[s] for s in set(SQUEUE_STATES) - same} == {JobState.UNKNOWN}


@pytest.mark.parametrize("word", ["running", "Running", "RUNNING ", "REQUEUED", "NEW_IN_SLURM_26", None, 3])
def test_a_slurm_word_outside_the_table_is_unknown(word: object) -> None:
    assert slurm_job_state(word) is JobState.UNKNOWN


class AgentAnswers:
    """What the agent answered (core/slurm_wire shapes), as SlurmAgentClient hands it on."""

    def __init__(self, state: str) -> None:
        self.state = state

    def job_info(self, job: str, ref: StepRef) -> dict[str, Any]:
        return {"job": job, "state": self.state, "restarts": 1, "start_time": "2026-11-22T08:29:20"}

    def jobs_on(self, node: str, ref: StepRef) -> list[dict[str, Any]]:
        return [{"id": "7", "state": self.state, "nodelist": "gpu-[0-1]", "restarts": 0, "start_time": None}]


@pytest.mark.parametrize(
    ("said", "meant"),
    [("RUNNING", JobState.RUNNING), ("COMPLETING", JobState.COMPLETING), ("NODE_FAIL", JobState.UNKNOWN)],
)
def test_the_slurm_scheduler_answers_in_the_contracts_types(said: str, meant: JobState) -> None:
    sched = SlurmScheduler(AgentAnswers(said))  # type: ignore[arg-type]
    info = sched.job_info("5", REF)
    assert info == JobInfo("5", meant, JobRun(1, "2026-11-22T08:29:20")) and type(info.state) is JobState
    (on_node,) = sched.jobs_on("gpu-0", REF)
    assert on_node.state is meant and on_node.nodes == ("gpu-0", "gpu-1")


def test_a_recorded_state_reads_back_exactly_and_nothing_else_is_guessed() -> None:
    assert (
        JobState.of("RUNNING") is JobState.RUNNING and JobState.of(str(JobState.PENDING)) is JobState.PENDING
    )
    assert JobState.of("running") is JobState.UNKNOWN  # no upper-casing: a scheduler's word is its table's
    assert JobState.of(None) is JobState.UNKNOWN and JobState.of("") is JobState.UNKNOWN


def status(phase: str | None = None, **conds: str) -> dict[str, Any]:
    conditions = [{"type": t, "status": s} for t, s in conds.items()]
    return {"status": {"phase": phase, "conditions": conditions}, "spec": {}, "metadata": {"labels": {}}}


def test_a_pods_phase_is_the_contracts_state() -> None:
    assert {
        p: objects.pod_state(status(p)) for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")
    } == {
        "Pending": JobState.PENDING,
        "Running": JobState.RUNNING,
        "Succeeded": JobState.COMPLETED,
        "Failed": JobState.FAILED,
        "Unknown": JobState.UNKNOWN,
    }
    assert (
        objects.pod_state(status("running")) is JobState.UNKNOWN
        and objects.pod_state(status()) is JobState.UNKNOWN
    )


def test_a_jobs_terminal_condition_decides_its_state() -> None:
    assert objects.batch_job_state(status(Complete="True")) is JobState.COMPLETED
    assert objects.batch_job_state(status(Failed="True")) is JobState.FAILED
    assert objects.batch_job_state(status(Complete="False")) is JobState.PENDING  # no active pod yet
    assert objects.jobset_state(status(Completed="True"), []) is JobState.COMPLETED
    assert objects.jobset_state(status(Failed="True", Suspended="True"), []) is JobState.FAILED
    held = {**status(Suspended="True"), "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}
    assert objects.jobset_state(held, []) is JobState.PENDING  # Kueue holds it: waiting to be admitted
    assert objects.jobset_state(status(Suspended="True"), []) is JobState.SUSPENDED
    assert objects.jobset_state(status(), [status("Running")]) is JobState.RUNNING
