"""GKE as a scheduler: the Kubernetes API through the official ``kubernetes`` client.

One module per concern: objects (reading API objects through checked accessors, names Pitstop
writes), shapes (the TypedDicts of what it writes and answers), client (the API,
its errors and shared reads), fence (Pitstop's taint for an incident, never a cordon; lifted only as set),
evict (the Eviction API, budgets honoured), kinds (JobSet, batch Job and bare pod as strategies),
restart (a JobSet's restart once, a Kueue Workload's cycle), capacity (can the gang run without
the node), checks, check_jobs, check_peers and check_runs (diagnose and validate Jobs on the fenced
node), doctor, node and zone (what
ingest reads of a Node). reference/gke.md §2-§4.

:class:`GkeCluster` answers in the adapter's own detail (TypedDicts of shapes.py with every
fact a test or an operator may want); :class:`GkeScheduler` is the typed contract of
core/scheduling.py over it, which is what actuate holds. Job ids are ``jobset/<ns>/<name>``,
``job/<ns>/<name>`` or ``pod/<ns>/<name>``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import fence as fencing
from pitstop.adapters.gke.capacity import capacity
from pitstop.adapters.gke.check_runs import GkeChecks
from pitstop.adapters.gke.checks import (
    CHECK_LABEL,
    CHECK_NAMESPACE,
    CHECK_SERVICE,
    DCGM_IMAGE,
    NCCL_IMAGE,
    CheckSettings,
    check_script,
    split_outputs,
)
from pitstop.adapters.gke.client import (
    DEFAULT_TIMEOUT,
    ApiClient,
    Kube,
    KubeApiError,
    control_plane,
    gke_api_client,
    loopback_api_client,
)
from pitstop.adapters.gke.doctor import doctor_findings
from pitstop.adapters.gke.evict import Evictor
from pitstop.adapters.gke.gang import GangStop
from pitstop.adapters.gke.kinds import JobKind, Stoppable, kinds
from pitstop.adapters.gke.objects import (
    FENCE_KEY,
    REQUEUED_FOR,
    WAS_UNSCHEDULABLE,
    JobRef,
    attempt_of,
    labels_of,
    live,
    meta_of,
    name_of,
    node_health,
    owner_ref,
    parse_job_id,
    status_of,
    sub,
    subs,
    valid_object_name,
)
from pitstop.adapters.gke.pin import GangPin
from pitstop.adapters.gke.restart import STUCK_TERMINATING_S, WorkloadCycle
from pitstop.adapters.gke.shapes import (
    CapacityAnswer,
    CheckReport,
    CheckStarted,
    JobAnswer,
    KubeObject,
    NodeAnswer,
    RequeueAnswer,
)
from pitstop.core import topology
from pitstop.core.corroboration import CORROBORATE, NPD_CONDITION
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    FenceAnswer,
    GangCheckStart,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    StepRef,
    UnfenceAnswer,
)
from pitstop.core.topology import Seat
from pitstop.core.trust import XID_CONDITION

__all__ = [
    "CHECK_LABEL",
    "CHECK_NAMESPACE",
    "CHECK_SERVICE",
    "DCGM_IMAGE",
    "FENCE_KEY",
    "NCCL_IMAGE",
    "REQUEUED_FOR",
    "WAS_UNSCHEDULABLE",
    "CheckSettings",
    "GkeCluster",
    "GkeScheduler",
    "JobRef",
    "KubeApiError",
    "check_script",
    "control_plane",
    "doctor_findings",
    "gke_api_client",
    "loopback_api_client",
    "node_health",
    "parse_job_id",
    "split_outputs",
]


class GkeCluster:
    """One GKE cluster's scheduler side, in the adapter's own answers.

    ``evict_deadline_s`` bounds how long one call keeps retrying an eviction a budget blocks;
    ``wait_s`` how long it waits for Kueue to stop a deactivated Workload before answering 503
    (the workflow asks again and the wait resumes); ``stuck_terminating_s`` when a pod of that job
    still Terminating counts as stuck (restart.py), on the ``wall`` clock; ``kueue_replaces``: the
    cluster's Kueue replaces a failed node of a TAS workload itself (kinds.JobSetKind).
    """

    def __init__(
        self,
        api_client: ApiClient = None,
        *,
        connect: Callable[[], ApiClient] | None = None,
        evict_deadline_s: float = 120.0,
        wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        checks: CheckSettings | None = None,
        stuck_terminating_s: float = STUCK_TERMINATING_S,
        wall: Callable[[], float] = time.time,
        kueue_replaces: bool = True,
    ) -> None:
        self.kube = Kube(api_client, connect, timeout)
        self.settings = checks or CheckSettings()
        self.settings.check()
        self.evict_deadline_s, self.wait_s, self.clock, self.sleep = evict_deadline_s, wait_s, clock, sleep
        self.evictor = Evictor(self.kube, evict_deadline_s, lambda: self.clock(), lambda s: self.sleep(s))
        self.cycle = WorkloadCycle(
            self.kube, wait_s, lambda: self.clock(), lambda s: self.sleep(s), stuck_terminating_s, wall
        )
        self.kueue_replaces = kueue_replaces
        self.kinds = kinds(self.kube, self.evictor, self.cycle, kueue_replaces)
        self.checks = GkeChecks(self.kube, self.settings)
        self.gang = GangStop(self.kube, self.kinds, self.cycle, self.checks, self._xid_condition)
        self.pins = GangPin(self.kube, self._jobset_target, self.cycle)

    def _jobset_target(self, ref: JobRef) -> Stoppable:
        target = self.kinds["jobset"].stoppable(ref)
        assert target is not None  # a JobSet is always stoppable
        return target

    @property
    def core(self) -> Any:
        return self.kube.core

    @property
    def custom(self) -> Any:
        return self.kube.custom

    def kind(self, ref: JobRef) -> JobKind:
        return self.kinds[ref.kind]

    # -- the node --------------------------------------------------------------------------

    def fence(self, node: str, ref: StepRef, action: str) -> NodeAnswer:
        return fencing.fence(self.kube, node, ref.incident)

    def unfence(self, node: str, ref: StepRef) -> NodeAnswer:
        return fencing.unfence(self.kube, node, ref.incident)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return fencing.node_healthy(self.kube, node)

    # -- jobs ------------------------------------------------------------------------------

    def jobs_on(self, node: str, ref: StepRef) -> list[JobAnswer]:
        """The jobs with live pods on the node, each with the run that has pods there."""
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        on_node: dict[JobRef, list[KubeObject]] = {}
        for pod in self.kube.pods_on(node):
            if _own_check(pod):
                continue  # another incident's check (a peer on this node): not the node's job to move
            owner = owner_ref(pod) if live(pod) else None
            if owner is not None:
                on_node.setdefault(owner, []).append(pod)
        return [self._on_node(owner, pods) for owner, pods in on_node.items()]

    def _on_node(self, ref: JobRef, pods: list[KubeObject]) -> JobAnswer:
        """The job as the fault on this node hit it: a JobSet's run is its pods' restart attempt.

        Not ``status.restarts``: when another member's incident restarted the gang a moment ago,
        the old pod here still runs, and the fault belongs to that older run (seen under load:
        the new run was taken as the one hit and restarted a second time).
        """
        info = self.kind(ref).info(ref)
        info["pods_on_node"] = sorted(str(name_of(p)) for p in pods)
        known = [a for a in (attempt_of(p) for p in pods) if a is not None]
        if ref.kind == "jobset" and known and info["restarts"] is not None:
            info["restarts"] = min([*known, info["restarts"]])
        return info

    def job_info(self, job: str, ref: StepRef) -> JobAnswer:
        """The job now: ``state``, ``restarts`` (JobSets only) and ``start_time``, asked fresh."""
        jr = parse_job_id(job)
        return self.kind(jr).info(jr)

    def job_running(self, job: str, ref: StepRef) -> bool:
        """Whether the job still has pods on the node fenced for this incident (after a checkpoint).

        A JobSet that restarted elsewhere has left the node: the checkpoint is done. Without a
        node fenced for the incident, whether the job runs at all.
        """
        jr = parse_job_id(job)
        nodes = self.kube.fenced_nodes(ref.incident)
        if not nodes:
            return self.kind(jr).info(jr)["state"] == JobState.RUNNING
        return any(owner_ref(p) == jr and live(p) for n in nodes for p in self.kube.pods_on(n))

    def checkpoint(self, job: str, ref: StepRef) -> list[str]:
        """Evict the job's pods on the fenced node, each with its grace period (SIGTERM, then the wait)."""
        jr = parse_job_id(job)
        evicted = self.evictor.on_fenced(jr, ref.incident)
        log.emit("INFO", "gke checkpoint: pods evicted with their grace period", job=jr.id, pods=evicted)
        return evicted

    def requeue_outcome(self, job: str, ref: StepRef, restarts: int | None = None) -> RequeueAnswer:
        """Restart the gang exactly once; the answer says how, or why nothing was done.

        ``restarts`` is the JobSet run the incident saw: a JobSet already past it is left alone.
        ``owner_action`` is set when nothing restarts the job and its owner must act.
        """
        jr = parse_job_id(job)
        out = self.kind(jr).restart(jr, ref.key, ref.incident, restarts)
        log.emit("WARNING" if out.get("owner_action") else "INFO", "gke requeue", **out)
        return out

    def requeue_onto(
        self, job: str, ref: StepRef, restarts: int | None, nodes: tuple[str, ...]
    ) -> RequeueAnswer:
        """Restart the gang once in the topology domain of ``nodes`` (pin.py); a job Pitstop does not
        pin (module doc there) is restarted as :meth:`requeue_outcome` does."""
        jr = parse_job_id(job)
        out = self.pins.move(jr, ref.key, restarts, nodes) if jr.kind == "jobset" and nodes else None
        if out is None:
            return self.requeue_outcome(job, ref, restarts)
        log.emit("INFO", "gke requeue", **out)
        return out

    def reactivate(self, jobs: list[str], incident: str) -> list[str]:
        """At the incident's close: the jobs a failed step of it left stopped for its checks resumed,
        and the Kueue Workloads Pitstop deactivated for it reactivated (what was done, per job)."""
        done: list[str] = []
        for job in jobs:
            jr = parse_job_id(job)
            resumed = self.gang.release(job, incident) or (
                self.pins.release(jr, incident) if jr.kind == "jobset" else None
            )
            if resumed:
                log.emit("WARNING", "gke job resumed at close", incident=incident, job=jr.id)
                done.append(resumed)
            js = self.kube.jobset(jr) if jr.kind == "jobset" else None
            wl = self.kube.workload(jr.namespace, meta_of(js).get("uid")) if js else None
            said = self.cycle.reactivate(jr, wl, incident) if wl else None
            if said:
                log.emit("WARNING", "gke workload reactivated at close", incident=incident, job=jr.id)
                done.append(said)
        return done

    def capacity(self, job: str, node: str, ref: StepRef) -> CapacityAnswer:
        jr = parse_job_id(job)
        return capacity(self.kube, self.kind(jr), jr, node, self.kueue_replaces)

    # -- checks ----------------------------------------------------------------------------

    def start_check(self, node: str, check: Mapping[str, object], ref: StepRef) -> CheckStarted:
        if check.get("kind") == CORROBORATE:  # read at once from the Node: nothing to start
            return {"started": str(check.get("name")), "peer": None, "note": WHY_NODE_CONDITION}
        return self.checks.start(node, check, ref.key)

    def check_result(self, node: str, check: Mapping[str, object], ref: StepRef) -> CheckReport:
        if check.get("kind") == CORROBORATE:
            return {"done": True, "outputs": {"node_condition": self._xid_condition(node)}}
        return self.checks.result(node, check)

    def _xid_condition(self, node: str) -> str:
        """The Node's bootID, the device plugin's XidCriticalError (from NVML) and Pitstop's NPD
        condition PitstopKernelXid (from /dev/kmsg, infra/gke/npd.yaml): JSON."""
        cur = self.kube.node_or_none(node)
        if cur is None:
            raise ActuatorError(503, f"node {node} does not exist (yet): cannot read its conditions", True)
        status = status_of(cur)
        info = sub(status, "nodeInfo")
        conds = [c for c in subs(status, "conditions") if c.get("type") in (XID_CONDITION, NPD_CONDITION)]
        doc = {"status": {"nodeInfo": {"bootID": info.get("bootID")}, "conditions": conds[:2]}}
        return json.dumps(doc)[:8192]


WHY_NODE_CONDITION = (
    "the Node's XidCriticalError condition (GKE GPU device plugin, from NVML events) and"
    " PitstopKernelXid (node-problem-detector, from /dev/kmsg)"
)


class GkeScheduler:
    """The typed scheduler contract (core/scheduling.Scheduler) for one GKE cluster."""

    name = "gke"

    def __init__(self, api_client: ApiClient = None, **kwargs: Any) -> None:
        self.cluster = GkeCluster(api_client, **kwargs)

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [_job(j) for j in self.cluster.jobs_on(node, ref)]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        a = self.cluster.fence(node, ref, action)
        return FenceAnswer(
            a.get("previous_state"),
            a.get("previous_reason"),
            bool(a.get("already_drained_by_other")),
            a.get("reason"),
        )

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        a = self.cluster.unfence(node, ref)
        left = a.get("left_drained")
        return UnfenceAnswer(bool(a.get("resumed")), str(left)[:200] if left else None)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        self.cluster.checkpoint(job, ref)
        return "graceful eviction of its pods on the fenced node"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return _job(self.cluster.job_info(job, ref))

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return self.cluster.node_healthy(node, ref)

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        a = self.cluster.requeue_outcome(job, ref, run.restarts)
        owner = a.get("owner_action")
        return RequeueOutcome(job, not owner and a.get("restarted") is True, str(a.get("outcome")), owner)

    def requeue_onto(self, job: str, ref: StepRef, run: JobRun, nodes: tuple[str, ...]) -> RequeueOutcome:
        """core/scheduling.Placer: the gang restarted once in the domain of ``nodes`` (a JobSet Kueue
        does not queue: adapters/gke/pin.py), else as :meth:`requeue` does."""
        a = self.cluster.requeue_onto(job, ref, run.restarts, nodes)
        owner = a.get("owner_action")
        return RequeueOutcome(job, not owner and a.get("restarted") is True, str(a.get("outcome")), owner)

    def release_jobs(self, jobs: list[str], ref: StepRef) -> list[str]:
        """core/scheduling.JobReleaser: undo what a failed step left of Pitstop's own job changes."""
        return self.cluster.reactivate(jobs, ref.incident)

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        a = self.cluster.capacity(job, node, ref)
        labels = a.get("labels") or {}

        def seats(names: list[str]) -> tuple[Seat, ...]:
            return tuple(Seat(n, topology.from_labels(labels.get(n) or {})) for n in names)

        return Capacity(
            a.get("enough") is True,
            str(a.get("why") or ""),
            a.get("need"),
            a.get("free"),
            gang=seats(a.get("nodes") or []),
            spares=seats(a.get("spares") or []),
            native=a.get("native"),
            unusable=tuple(a.get("unusable") or []),
            places=a.get("places") is True,
        )

    def start_gang_check(self, job: str, check: Mapping[str, object], ref: StepRef) -> GangCheckStart:
        """core/scheduling.GangChecks: the gang stopped first (its pods hold the GPUs), then checked."""
        a = self.cluster.gang.start(job, check, ref.key)
        nodes = tuple(str(n) for n in a.get("nodes") or [])
        return GangCheckStart(str(a.get("started")), nodes, bool(a.get("stopped")), str(a.get("note") or ""))

    def gang_check_result(self, job: str, check: Mapping[str, object], ref: StepRef) -> CheckResult:
        a = self.cluster.gang.result(job, check)
        return CheckResult(bool(a.get("done")), dict(a.get("outputs") or {}), None, a.get("error"), None,
                           dict(a.get("exit_codes") or {}))  # fmt: skip

    def resume_gang(self, job: str, ref: StepRef) -> RequeueOutcome:
        """core/scheduling.GangResume: start again what the gang check stopped, once."""
        a = self.cluster.gang.resume(job, ref.key)
        return RequeueOutcome(job, bool(a.get("resumed")), str(a.get("outcome")))

    def start_check(self, node: str, check: Mapping[str, object], ref: StepRef) -> CheckStart:
        a = self.cluster.start_check(node, check, ref)
        return CheckStart(str(a.get("started")), a.get("peer"), a.get("note"))

    def check_result(self, node: str, check: Mapping[str, object], ref: StepRef) -> CheckResult:
        a = self.cluster.check_result(node, check, ref)
        return CheckResult(
            bool(a.get("done")), dict(a.get("outputs") or {}), a.get("peer"), a.get("error"), a.get("note")
        )


def _own_check(pod: KubeObject) -> bool:
    """A check pod of Pitstop's own: in its namespace, with its check label (checks.py)."""
    return meta_of(pod).get("namespace") == CHECK_NAMESPACE and CHECK_LABEL in labels_of(pod)


def _job(doc: JobAnswer) -> JobInfo:
    nodes = tuple(doc.get("nodes", ()))  # a JobSet's: its live pods' nodes
    return JobInfo(doc["id"], doc["state"], JobRun.of(doc), nodes, doc.get("opted_in") is True)
