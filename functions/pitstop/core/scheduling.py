"""What a remediation asks of a cluster's scheduler, in meanings rather than one scheduler's words.

actuate never knows which scheduler runs a cluster: it holds a :class:`Scheduler` for the
incident's cluster (the registry in services/schedulers.py builds one per policy entry) and asks
it these questions. Each adapter (adapters/slurm.py, adapters/gke/, adapters/k8s_job.py)
translates them into its own system's words and back: Slurm's ``RUNNING``/``COMPLETING``, a
JobSet's ``restarts``, a Kueue Workload's admission all become a :class:`JobState` and a
:class:`JobRun` here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, cast, runtime_checkable

from pitstop.core.domain import CheckSpec, FenceDoc, GangCheckSpec, JobDoc, JobRunDoc, JsonObject
from pitstop.core.topology import Seat
from pitstop.core.vertex import Resubmitted

_INCIDENT = re.compile(r"i[a-z2-7]{9}")


class JobState(StrEnum):
    """Where a job is, as far as a remediation cares."""

    PENDING = "PENDING"  # waiting for resources (requeued, or not yet started)
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"  # stopped in place; still holds its nodes
    COMPLETING = "COMPLETING"  # its processes are ending (a requeued Slurm job passes through it)
    COMPLETED = "COMPLETED"  # ended on its own, successfully
    FAILED = "FAILED"  # ended on its own, unsuccessfully
    CANCELLED = "CANCELLED"  # ended by someone
    UNKNOWN = "UNKNOWN"  # gone, or the scheduler cannot say

    @classmethod
    def of(cls, word: object) -> JobState:
        """A state as Pitstop recorded it (its own value, exactly); anything else is UNKNOWN.

        Not for a scheduler's words: each adapter maps its own (adapters/slurm.SLURM_JOB_STATES,
        adapters/gke/objects.POD_STATES and the JobSet and Job conditions)."""
        try:
            return cls(word) if isinstance(word, str) else cls.UNKNOWN
        except ValueError:
            return cls.UNKNOWN

    @property
    def on_nodes(self) -> bool:
        """Whether the job still holds nodes (it has not been requeued or ended)."""
        return self in (JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)

    @property
    def ended(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobRun:
    """Which execution of a job a fault hit: a gang is restarted once per run, whatever the time."""

    restarts: int | None = None  # how often the scheduler restarted or requeued it
    start_time: str | None = None  # when this run started, as the scheduler prints it

    @property
    def known(self) -> bool:
        return self.restarts is not None and self.start_time is not None

    def doc(self) -> JobRunDoc:
        return {"restarts": self.restarts, "start_time": self.start_time}

    @classmethod
    def of(cls, doc: Mapping[str, object] | None) -> JobRun:
        """The run a stored record or an adapter's answer names (None where unknown)."""
        doc = doc or {}
        restarts = doc.get("restarts")
        start = doc.get("start_time")
        return cls(
            restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None,
            start if isinstance(start, str) and start else None,
        )


@dataclass(frozen=True)
class JobInfo:
    job: str
    state: JobState
    run: JobRun = field(default_factory=JobRun)
    nodes: tuple[str, ...] = ()  # the nodes it holds, where the scheduler says (a degraded node's peers)
    opted_in: bool = False  # its owner opted it in to hang remediation (core/localise.HEARTBEAT_OPT_IN)

    def doc(self) -> JobDoc:
        return {"id": self.job, "state": str(self.state), **self.run.doc()}


@dataclass(frozen=True)
class FenceAnswer:
    """What the scheduler said about the node when Pitstop fenced it."""

    previous_state: str | None = None
    previous_reason: str | None = None
    # someone else had already taken the node out of service: Pitstop left it (and never lifts it)
    fenced_by_other: bool = False
    reason: str | None = None  # the reason Pitstop's own fence carries

    def doc(self) -> FenceDoc:
        out: dict[str, str | bool | None] = {
            "previous_state": self.previous_state,
            "previous_reason": self.previous_reason,
            "already_drained_by_other": self.fenced_by_other,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return cast(FenceDoc, {k: v for k, v in out.items() if v is not None})  # FenceDoc's keys, set


@dataclass(frozen=True)
class UnfenceAnswer:
    resumed: bool
    left_fenced: str | None = None  # a fence that is not Pitstop's for this incident, left in place


@dataclass(frozen=True)
class RequeueOutcome:
    """How the gang was restarted once, or why nothing was done (and what its owner must do)."""

    job: str
    restarted: bool
    how: str
    owner_action: str | None = None


@dataclass(frozen=True)
class Capacity:
    """Whether the job's gang can run again now without the fenced node (early requeue).

    Where the scheduler says it: ``gang`` (the job's nodes, the fenced one among them) and
    ``spares`` (the idle healthy nodes it could take, in the scheduler's order), each with its place
    (core/topology.py picks among them); ``native``: the restart the scheduler itself gives the job
    on a node failure (``slurm-expedite``, ``kueue-tas``: Pitstop does not restart it a second time);
    ``elastic``: the job says it can run on fewer nodes; ``unusable``: members other than the
    fenced node that cannot run it again (drained by another incident or a person, down);
    ``places``: a Placer can put this job's gang where the choice says (GKE: not a JobSet Kueue
    queues, nor one its owner opted out of pinning).
    """

    enough: bool
    why: str
    need: int | None = None
    free: int | None = None
    gang: tuple[Seat, ...] = ()
    spares: tuple[Seat, ...] = ()
    native: str | None = None
    elastic: bool = False
    unusable: tuple[str, ...] = ()  # members of the gang that do not come back with it (another fence)
    places: bool = True


@dataclass(frozen=True)
class CheckStart:
    started: str
    peer: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class CheckResult:
    """A check run's state; ``outputs`` holds each tool's raw output, interpreted in core/checks."""

    done: bool
    outputs: Mapping[str, str] = field(default_factory=dict)
    peer: str | None = None
    error: str | None = None
    note: str | None = None
    exit_codes: Mapping[str, int] = field(default_factory=dict)  # per tool (124: it ran out of time)


@dataclass(frozen=True)
class GangCheckStart:
    """A check started on every node of a running job: the nodes the scheduler says it holds.

    ``stopped``: the scheduler stopped the gang to run it (GKE: the hung pods hold the GPUs a
    check pod needs), so the conclusion resumes it once (:class:`GangResume`). No ``nodes``: the
    check did not run, ``note`` says why.
    """

    started: str
    nodes: tuple[str, ...]
    stopped: bool = False
    note: str = ""


_LABEL = re.compile(r"[a-z]{1,16}")


@dataclass(frozen=True)
class StepRef:
    """Which incident step asks: it keys every command a scheduler sends for it (retries find them).

    ``label`` names a request made outside a workflow step (``closed``: a person's close).
    """

    incident: str
    step: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        if _INCIDENT.fullmatch(self.incident) is None or self.step < 0:
            raise ValueError(f"not an incident step: {self.incident!r} {self.step!r}")
        if self.label and _LABEL.fullmatch(self.label) is None:
            raise ValueError(f"not a request label: {self.label!r}")

    @property
    def key(self) -> str:
        """``<incident>-<step>`` (or ``-<label>``): a DNS-label-safe prefix for command ids and names."""
        return f"{self.incident}-{self.label or self.step}"


class NoNodes:
    """The node-level answers of a scheduler that holds no node Pitstop may touch (none at all, or a
    platform that owns its VMs): no jobs on it, nothing to fence or lift, healthy when the VM is."""

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return []

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        return FenceAnswer()

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        return UnfenceAnswer(resumed=False)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return True


class Scheduler(Protocol):
    """What a remediation asks of a cluster's scheduler."""

    name: str

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        """The jobs on the node, each with the run the fault hit."""
        ...

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        """Keep new work off the node; leave a fence someone else set alone and say so."""
        ...

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        """Lift Pitstop's own fence for this incident only."""
        ...

    def checkpoint(self, job: str, ref: StepRef) -> str:
        """Ask the job to save its state before a planned disruption; how it was asked (Slurm: the
        cluster's checkpoint signal; Kubernetes: graceful eviction of its pods on the fenced node)."""
        ...

    def job_info(self, job: str, ref: StepRef) -> JobInfo: ...
    def node_healthy(self, node: str, ref: StepRef) -> bool: ...

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        """Restart the gang once, if it is still the run the fault hit."""
        ...

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity: ...
    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart: ...
    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult: ...


@runtime_checkable
class Placer(Protocol):
    """A scheduler that can put a requeued gang on named nodes (Slurm: the pending job's required
    nodes; GKE: a nodeSelector for the narrowest topology domain holding them all, on a JobSet's
    pod templates). Optional: without it the scheduler places the gang itself, and the choice is
    only weighed and told."""

    def requeue_onto(self, job: str, ref: StepRef, run: JobRun, nodes: tuple[str, ...]) -> RequeueOutcome:
        """Restart the gang once onto ``nodes`` (its own healthy ones and the spares; Slurm: exactly
        those, GKE: their domain)."""
        ...


@runtime_checkable
class JobReleaser(Protocol):
    """A scheduler on which a step can leave a job change of Pitstop's own half done (GKE: a Kueue
    Workload deactivated while a pod stayed stuck Terminating): a person's close undoes it."""

    def release_jobs(self, jobs: list[str], ref: StepRef) -> list[str]:
        """Undo, for this incident, what is still Pitstop's on these jobs; what was done."""
        ...


@runtime_checkable
class GangChecks(Protocol):
    """Checks on every node of a running job at once, beside it (a hung job's localisation).

    Optional: a scheduler without it cannot localise, and a hung job is then restarted in place
    once and a person paged (services/actuate/localise.py).
    """

    def start_gang_check(self, job: str, check: GangCheckSpec, ref: StepRef) -> GangCheckStart: ...
    def gang_check_result(self, job: str, check: GangCheckSpec, ref: StepRef) -> CheckResult: ...


@runtime_checkable
class GangResume(Protocol):
    """A scheduler whose gang check stops the gang first (ByteRobust's stop-time diagnostics): the
    conclusion resumes it once, onto spares where the culprits are fenced, else in place."""

    def resume_gang(self, job: str, ref: StepRef) -> RequeueOutcome:
        """Undo this step's stop of the job, once (a retry finds it resumed)."""
        ...


@runtime_checkable
class JobResubmission(Protocol):
    """A platform that owns its VMs (Vertex AI custom training): nothing of a node is Pitstop's; a
    job is read back whole from the platform's API (the evidence), cancelled, and resubmitted as a
    new job from its checkpoint (services/actuate/resubmit.py)."""

    def job_service_accounts(self) -> frozenset[str]:
        """The accounts a resubmitted job may run as (Pitstop may act as these only)."""
        ...

    def read_job(self, job: str) -> JsonObject | None:
        """The job as the API has it now (REST form), by its id or resource name; None: no such job
        in the cluster's project and regions."""
        ...

    def cancel_job(self, job: str) -> None:
        """Cancel the job (its resource name); one already ended is left as it is."""
        ...

    def resubmit_job(self, job: JsonObject, ref: StepRef) -> Resubmitted:
        """Create the job's resubmission for this incident, or find the one already created."""
        ...
