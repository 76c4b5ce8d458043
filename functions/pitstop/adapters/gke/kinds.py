"""Job kinds as strategies: how a JobSet, a batch Job and a bare pod are described, counted and
restarted. The adapter picks the strategy once from the job id (``kind/namespace/name``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pitstop.adapters.gke.checks import JOB_NAME_LABEL
from pitstop.adapters.gke.client import Kube
from pitstop.adapters.gke.evict import Evictor
from pitstop.adapters.gke.objects import (
    JOBSET_GROUP,
    JOBSET_NAME_LABEL,
    JOBSET_VERSION,
    JOBSETS,
    KUEUE_QUEUE_LABEL,
    MOVED_FOR,
    JobRef,
    annotations_of,
    batch_job_state,
    jobset_state,
    labels_of,
    live,
    meta_of,
    name_of,
    node_name_of,
    pod_state,
    pods_per_job,
    restarts_of,
    spec_of,
    status_of,
    sub,
    subs,
    tas_admitted,
    text,
)
from pitstop.adapters.gke.restart import WorkloadCycle, jobset_once
from pitstop.adapters.gke.shapes import JobAnswer, KubeObject, RequeueAnswer, SuspendPatch
from pitstop.core.localise import HEARTBEAT_LABEL
from pitstop.core.scheduling import JobState

Templates = list[tuple[int, KubeObject]]  # (pod count, pod spec) per template


@dataclass(frozen=True)
class Stoppable:
    """How a job kind is stopped and started again as a whole (a hung gang's stop-time checks).

    ``spec.suspend`` on both kinds: a suspended batch Job's active pods are deleted and resuming
    creates them again (kubernetes.io/docs/concepts/workloads/controllers/job/#suspending-a-job); a
    suspended JobSet suspends its child Jobs the same way and resuming does not count a restart
    (kubernetes-sigs/jobset@v0.12.0 api/jobset/v1alpha2/jobset_types.go ``Suspend``). A job Kueue
    admits is stopped through its Workload instead (Kueue owns its ``suspend``).
    """

    what: str
    read: Callable[[], KubeObject | None]
    patch: Callable[[SuspendPatch], KubeObject]
    pods: str  # the label selector of its pods


class JobKind(Protocol):
    def info(self, ref: JobRef) -> JobAnswer:
        """``state`` (the contract's JobState), ``restarts`` (JobSets only), ``start_time``, ``workload``."""
        ...

    def templates(self, ref: JobRef) -> tuple[Templates | None, str | None]:
        """Its pod templates, and what admits it when Kueue does (None: gone / not Kueue)."""
        ...

    def restart(self, ref: JobRef, key: str, incident: str, seen: int | None) -> RequeueAnswer:
        """Restart the gang once: how, or why nothing restarts it (``owner_action``)."""
        ...

    def stoppable(self, ref: JobRef) -> Stoppable | None:
        """How to stop it and start it again whole (None: it cannot be, a bare pod)."""
        ...


def base_info(ref: JobRef) -> JobAnswer:
    return {
        "id": ref.id,
        "job": ref.id,
        "kind": ref.kind,
        "namespace": ref.namespace,
        "name": ref.name,
        "state": JobState.UNKNOWN,
        "restarts": None,
        "start_time": None,
        "workload": None,
    }


def _nothing_restarts(ev: Evictor, ref: JobRef, incident: str, why: str) -> RequeueAnswer:
    return {
        "job": ref.id,
        "outcome": "evicted from the fenced node; nothing restarts it as a gang",
        "evicted": ev.on_fenced(ref, incident),
        "owner_action": f"{ref.id}: {why}. Check it and resubmit it if needed "
        "(a JobSet restarts once per fault with a failurePolicy; see pitstop doctor).",
    }


def _run_start(js: KubeObject) -> str | None:
    """When this run of the JobSet started, as a name: its creation, and once a move Pitstop placed
    has resumed it, that move (suspend and resume restart every pod without counting a restart:
    pin.py). Not while it is still suspended for the move: a retry of that step is the same run."""
    created = text(meta_of(js), "creationTimestamp")
    mark = text(annotations_of(js), MOVED_FOR)
    if created and mark and not spec_of(js).get("suspend"):
        return f"{created} moved for {mark}"
    return created


class JobSetKind:
    """``kueue_replaces``: Kueue replaces a failed node of a workload it admitted with a topology
    assignment within the same domain (TASFailedNodeReplacement, beta and on by default since
    v0.14; an untolerated NoExecute taint and the pods gone from the node count as a failure:
    kubernetes-sigs/kueue@v0.19.2 site/.../concepts/topology_aware_scheduling.md)."""

    def __init__(self, kube: Kube, ev: Evictor, cycle: WorkloadCycle, kueue_replaces: bool = True) -> None:
        self.kube, self.ev, self.cycle = kube, ev, cycle
        self.kueue_replaces = kueue_replaces

    def info(self, ref: JobRef) -> JobAnswer:
        base = base_info(ref)
        js = self.kube.jobset(ref)
        if js is None:
            return base
        pods = self.kube.items(
            f"list pods of {ref.id}",
            self.kube.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name}",
        )
        wl = self.kube.workload(ref.namespace, meta_of(js).get("uid"))
        return {
            **base,
            "state": jobset_state(js, pods),
            "restarts": restarts_of(js),
            "start_time": _run_start(js),  # with restarts: one run of this JobSet
            "workload": name_of(wl) if wl else None,
            "opted_in": labels_of(js).get(HEARTBEAT_LABEL) == "true",
            "failure_policy": isinstance(spec_of(js).get("failurePolicy"), Mapping),
            # where its live pods run: a degraded node's peers (services/actuate/planned.py)
            "nodes": sorted({n for p in pods if live(p) and (n := node_name_of(p))}),
        }

    def templates(self, ref: JobRef) -> tuple[Templates | None, str | None]:
        js = self.kube.jobset(ref)
        if js is None:
            return None, None
        out: Templates = []
        for rj in subs(spec_of(js), "replicatedJobs"):
            job_spec = spec_of(sub(rj, "template"))
            replicas = rj.get("replicas", 1)
            replicas = replicas if isinstance(replicas, int) else 1
            out.append((replicas * pods_per_job(job_spec), spec_of(sub(job_spec, "template"))))
        wl = self.kube.workload(ref.namespace, meta_of(js).get("uid"))
        queued = labels_of(js).get(KUEUE_QUEUE_LABEL)
        return out, f"Workload {meta_of(wl).get('name')}" if wl else f"queue {queued}" if queued else None

    def restart(self, ref: JobRef, key: str, incident: str, seen: int | None) -> RequeueAnswer:
        js = self.kube.jobset(ref)
        if js is None:
            return {"job": ref.id, "outcome": "jobset no longer exists"}
        if isinstance(spec_of(js).get("failurePolicy"), Mapping):
            return jobset_once(self.ev, ref, incident, seen)
        wl = self.kube.workload(ref.namespace, meta_of(js).get("uid"))
        if wl is not None and self.kueue_replaces and tas_admitted(wl):
            return self._left_to_kueue(ref, incident)
        if wl is not None:
            return self.cycle.run(ref, wl, key)
        why = "it has no failurePolicy and no Kueue Workload: a failed child Job fails the JobSet"
        return _nothing_restarts(self.ev, ref, incident, why)

    def _left_to_kueue(self, ref: JobRef, incident: str) -> RequeueAnswer:
        """Kueue replaces the fenced node within the workload's topology domain once its pods are
        gone from it: only those are evicted (the fence's taint is already there), and the Workload
        is not deactivated (that would restart the whole gang a second time)."""
        evicted = self.ev.on_fenced(ref, incident)
        return {
            "job": ref.id,
            "restarted": True,
            "outcome": "left to Kueue's failed-node replacement (TAS): its pods on the fenced node evicted",
            "evicted": evicted,
            "native": "kueue-tas",
        }

    def stoppable(self, ref: JobRef) -> Stoppable:
        def patch(body: SuspendPatch) -> KubeObject:
            return self.kube.call(
                f"patch {ref.id}", self.kube.custom.patch_namespaced_custom_object,
                JOBSET_GROUP, JOBSET_VERSION, ref.namespace, JOBSETS, ref.name, body,
            )  # fmt: skip

        return Stoppable(ref.id, lambda: self.kube.jobset(ref), patch, f"{JOBSET_NAME_LABEL}={ref.name}")


class BatchJobKind:
    """A plain batch/v1 Job: its own pods restart per its backoffLimit, never as a gang."""

    def __init__(self, kube: Kube, ev: Evictor) -> None:
        self.kube, self.ev = kube, ev

    def _read(self, ref: JobRef) -> KubeObject | None:
        return self.kube.get_or_none(
            f"get {ref.id}", self.kube.batch.read_namespaced_job, ref.name, ref.namespace
        )

    def info(self, ref: JobRef) -> JobAnswer:
        obj = self._read(ref)
        if obj is None:
            return base_info(ref)
        wl = self.kube.workload(ref.namespace, meta_of(obj).get("uid"))
        state, start = batch_job_state(obj), text(status_of(obj), "startTime")
        return {
            **base_info(ref),
            "state": state,
            "start_time": start,
            "workload": name_of(wl) if wl else None,
            "opted_in": labels_of(obj).get(HEARTBEAT_LABEL) == "true",
        }

    def templates(self, ref: JobRef) -> tuple[Templates | None, str | None]:
        obj = self._read(ref)
        if obj is None:
            return None, None
        queued = labels_of(obj).get(KUEUE_QUEUE_LABEL)
        pods = [(pods_per_job(spec_of(obj)), spec_of(sub(spec_of(obj), "template")))]
        return pods, f"queue {queued}" if queued else None

    def restart(self, ref: JobRef, key: str, incident: str, seen: int | None) -> RequeueAnswer:
        why = "a plain Job restarts only its own pods, per its backoffLimit"
        return _nothing_restarts(self.ev, ref, incident, why)

    def stoppable(self, ref: JobRef) -> Stoppable:
        def patch(body: SuspendPatch) -> KubeObject:
            return self.kube.call(
                f"patch {ref.id}", self.kube.batch.patch_namespaced_job, ref.name, ref.namespace, body
            )

        return Stoppable(ref.id, lambda: self._read(ref), patch, f"{JOB_NAME_LABEL}={ref.name}")


class PodKind:
    """A bare pod: no controller brings it back."""

    def __init__(self, kube: Kube, ev: Evictor) -> None:
        self.kube, self.ev = kube, ev

    def _read(self, ref: JobRef) -> KubeObject | None:
        return self.kube.get_or_none(
            f"get {ref.id}", self.kube.core.read_namespaced_pod, ref.name, ref.namespace
        )

    def info(self, ref: JobRef) -> JobAnswer:
        obj = self._read(ref)
        if obj is None:
            return base_info(ref)
        return {**base_info(ref), "state": pod_state(obj), "start_time": text(status_of(obj), "startTime")}

    def templates(self, ref: JobRef) -> tuple[Templates | None, str | None]:
        obj = self._read(ref)
        return ([(1, spec_of(obj))], None) if obj is not None else (None, None)

    def restart(self, ref: JobRef, key: str, incident: str, seen: int | None) -> RequeueAnswer:
        return _nothing_restarts(self.ev, ref, incident, "a bare pod has no controller to bring it back")

    def stoppable(self, ref: JobRef) -> Stoppable | None:
        return None  # deleted, nothing creates it again


def kinds(
    kube: Kube, ev: Evictor, cycle: WorkloadCycle, kueue_replaces: bool = True
) -> Mapping[str, JobKind]:
    """The strategy of each job kind a job id may name (objects.JOB_KINDS)."""
    return {
        "jobset": JobSetKind(kube, ev, cycle, kueue_replaces),
        "job": BatchJobKind(kube, ev),
        "pod": PodKind(kube, ev),
    }
