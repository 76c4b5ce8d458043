"""Restarting a gang once: a JobSet with a failure policy, or a job Kueue admits.

A JobSet with a failure policy: one pod of the current restart attempt is evicted (with a ``uid``
precondition), so the JobSet controller recreates every Job once; once ``status.restarts`` moved,
every older pod is "previous" and evicting it cannot restart the gang again. A Kueue-admitted job
without one: its Workload is deactivated, then reactivated once Kueue stopped it.

A pod of that job may stay Terminating (its kubelet unreachable, or a process it cannot kill after
an Xid 79): Kubernetes never removes such a pod by itself ("Kubernetes (versions 1.5 or newer) will
not delete Pods just because a Node is unreachable"; the ways out are the Node object deleted, the
kubelet answering again, or force deletion by the user: kubernetes.io/docs/tasks/run-application/
force-delete-stateful-set-pod/). A pod still Terminating ``stuck_s`` past its deletionTimestamp
(policy ``gke.stuck_terminating_s``) on a node that is not Ready is force-deleted (grace period 0:
"the API server does not wait for confirmation from the kubelet", kubernetes.io/docs/concepts/
workloads/pods/pod-lifecycle/#pod-termination-forced) as an operator would; on a Ready node (its
kubelet lives but cannot end it) it is not forced, the step fails naming the pod and the Workload,
and closing the incident reactivates the Workload (:meth:`WorkloadCycle.reactivate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from pitstop.adapters import retry
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube
from pitstop.adapters.gke.evict import Evictor
from pitstop.adapters.gke.objects import (
    CONFLICT_RETRIES,
    JOBSET_NAME_LABEL,
    KUEUE_GROUP,
    KUEUE_VERSION,
    REQUEUED_FOR,
    RESTART_ATTEMPT_LABEL,
    WORKLOADS,
    JobRef,
    annotations_of,
    condition_true,
    jobset_state,
    live,
    meta_of,
    name_of,
    node_name_of,
    restarts_of,
    spec_of,
    status_of,
    text,
)
from pitstop.adapters.gke.shapes import KubeObject, RequeueAnswer, WorkloadPatch
from pitstop.core.scheduling import JobState

# How long past its deletionTimestamp a pod may stay Terminating before it counts as stuck (the
# default of policy gke.stuck_terminating_s; Kueue's own failure recovery forces such pods after 60 s:
# kubernetes-sigs/kueue@v0.19.2 site/.../tasks/manage/setup_failure_recovery.md).
STUCK_TERMINATING_S = 60.0


def jobset_once(ev: Evictor, ref: JobRef, incident: str, seen: int | None) -> RequeueAnswer:
    """Evict one pod of the current restart attempt (on the fenced node if one is there). A pod gone
    or replaced since it was listed reads the JobSet again (the attempt may have moved on)."""
    kube = ev.kube
    out: RequeueAnswer = {"job": ref.id}
    fenced = set(kube.fenced_nodes(incident))
    deadline = ev.clock() + ev.deadline_s

    def attempt() -> RequeueAnswer:
        js = kube.jobset(ref)
        if js is None:
            return {**out, "outcome": "jobset no longer exists"}
        r = restarts_of(js)
        out["restarts"] = r
        if seen is not None and r != seen:
            return {**out, "outcome": f"already restarted (restarts {seen} -> {r})"}
        if condition_true(js, "RestartingJobSet"):
            return {**out, "outcome": "already restarting (RestartingJobSet)"}
        state = jobset_state(js, [])
        if state in (JobState.COMPLETED, JobState.FAILED, JobState.SUSPENDED) or spec_of(js).get("suspend"):
            return {**out, "outcome": f"jobset is {state}: not restarted"}
        pod = _attempt_pod(kube, ref, r, fenced)
        if pod is None:
            return {**out, "outcome": f"no live pod of restart attempt {r} to evict"}
        uid = text(meta_of(pod), "uid")
        said = ev.evict(pod, deadline, uid or None)
        if said != "evicted":
            raise retry.StaleReadError(f"pod {name_of(pod)} {said} since it was listed")
        return {
            **out,
            "restarted": True,
            "outcome": "restart triggered",
            "evicted": str(name_of(pod)),
            "attempt": r,
        }

    why = f"{ref.id}: pods of the current attempt kept disappearing"
    return retry.call(attempt, retry.conflicts(CONFLICT_RETRIES, lambda _: ActuatorError(503, why, True)))


def _attempt_pod(kube: Kube, ref: JobRef, attempt: int, fenced: set[str]) -> KubeObject | None:
    pods = kube.items(
        f"list pods of {ref.id} attempt {attempt}",
        kube.core.list_namespaced_pod,
        ref.namespace,
        label_selector=f"{JOBSET_NAME_LABEL}={ref.name},{RESTART_ATTEMPT_LABEL}={attempt}",
    )
    alive = [p for p in pods if live(p) and not meta_of(p).get("deletionTimestamp")]
    alive.sort(key=lambda p: (node_name_of(p) not in fenced, str(meta_of(p).get("name"))))
    return alive[0] if alive else None


class WorkloadCycle:
    """Deactivate a Kueue Workload (Kueue evicts the whole job), then reactivate it (it is requeued).

    ``wait_s`` bounds how long one call waits for Kueue to stop it before answering 503 (the workflow
    asks again and the wait resumes); ``stuck_s`` when a Terminating pod counts as stuck (module doc),
    judged on ``wall`` (the clock deletionTimestamps are written on).
    """

    def __init__(
        self,
        kube: Kube,
        wait_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        stuck_s: float = STUCK_TERMINATING_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.wait_s, self.clock, self.sleep = kube, wait_s, clock, sleep
        self.stuck_s, self.wall = stuck_s, wall

    def _patch(self, ref: JobRef, name: str, body: WorkloadPatch) -> KubeObject:
        return self.kube.call(
            f"patch workload {ref.namespace}/{name}",
            self.kube.custom.patch_namespaced_custom_object,
            KUEUE_GROUP, KUEUE_VERSION, ref.namespace, WORKLOADS, name, body,
        )  # fmt: skip

    def run(self, ref: JobRef, wl: KubeObject, key: str) -> RequeueAnswer:
        """The annotation ``pitstop.dev/requeued-for=<step key>`` makes a retry resume instead of
        starting over, and tells Pitstop's deactivation from someone else's (which stays)."""
        name = str(meta_of(wl).get("name"))
        out: RequeueAnswer = {"job": ref.id, "workload": name}
        active = spec_of(wl).get("active", True) is not False
        mark = annotations_of(wl).get(REQUEUED_FOR)
        if active and mark == key:
            return {**out, "outcome": "workload already requeued for this step"}
        if not active and mark != key:
            return {
                **out,
                "outcome": "workload deactivated by someone else: left inactive",
                "owner_action": f"{ref.id}: its Kueue Workload {name} is inactive; reactivate it when ready.",
            }
        if active:
            self._patch(ref, name, _deactivation(wl, key))
        forced = self._wait_stopped(ref, name)
        self._patch(ref, name, {"spec": {"active": True}})
        out["restarted"] = True
        out["outcome"] = "workload deactivated and reactivated: Kueue requeues the whole job"
        return {**out, "forced": forced} if forced else out

    def _wait_stopped(self, ref: JobRef, name: str) -> list[str]:
        """Wait (bounded) until Kueue stopped the Workload. The pods forced (``pod@node``)."""
        return self.wait_gone(
            lambda: self._left(ref, name),
            f"waiting for Kueue to stop workload {name} of {ref.id}",
            lambda held: _stuck_message(ref, name, held),
        )

    def wait_gone(
        self,
        left: Callable[[], list[KubeObject] | None],
        waiting: str,
        held_message: Callable[[list[KubeObject]], str],
    ) -> list[str]:
        """Wait (bounded by ``wait_s``, then 503) until ``left`` answers no pod; force a pod stuck on
        a node that is not Ready, fail (409, ``held_message``) on one stuck on a Ready node. The pods
        forced (``pod@node``). ``left`` answers None while the job is not stopped yet."""
        deadline = self.clock() + self.wait_s
        forced: dict[str, None] = {}  # in order, once each
        while (pods := left()) != []:
            stuck = [p for p in pods or [] if self._stuck(p)]
            held = [p for p in stuck if self._node_ready(p)]
            if held:
                raise ActuatorError(409, held_message(held), False)
            forced.update((self._force(p), None) for p in stuck)
            if self.clock() >= deadline:
                why = waiting
                if forced:  # a finalizer keeps it: a Job with a podFailurePolicy waits for a terminal phase
                    why += f" (force-deleted, still there: {', '.join(forced)})"
                raise ActuatorError(503, why, True)
            self.sleep(1.0)
        return list(forced)

    def _left(self, ref: JobRef, name: str) -> list[KubeObject] | None:
        """The job's pods still running or terminating once Kueue evicted the Workload and the JobSet
        is suspended; None before that.

        Reactivating earlier races the suspension: pods still terminating when the Jobs resume
        count as failures, and a JobSet without a failure policy then fails instead of requeueing.
        """
        kube = self.kube
        wl = kube.call(
            f"get workload {ref.namespace}/{name}",
            kube.custom.get_namespaced_custom_object,
            KUEUE_GROUP, KUEUE_VERSION, ref.namespace, WORKLOADS, name,
        )  # fmt: skip
        if not (condition_true(wl, "Evicted") or not condition_true(wl, "QuotaReserved")):
            return None
        js = kube.jobset(ref)
        if js is not None and not spec_of(js).get("suspend"):
            return None
        pods = kube.items(
            f"list pods of {ref.id}",
            kube.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name}",
        )
        return [p for p in pods if live(p)]

    def _stuck(self, pod: KubeObject) -> bool:
        """Terminating ``stuck_s`` past its deletionTimestamp (the end of its grace period)."""
        ends = _epoch(meta_of(pod).get("deletionTimestamp"))
        return ends is not None and self.wall() >= ends + self.stuck_s

    def _node_ready(self, pod: KubeObject) -> bool:
        node = self.kube.node_or_none(node_name_of(pod) or "")
        return node is not None and condition_true(node, "Ready")

    def _force(self, pod: KubeObject) -> str:
        """Delete the pod with grace period 0, as ``kubectl delete pod --grace-period=0 --force``."""
        m = meta_of(pod)
        node = spec_of(pod).get("nodeName")
        if m.get("deletionGracePeriodSeconds") != 0:
            self.kube.call(
                f"force-delete pod {m.get('namespace')}/{m.get('name')}",
                self.kube.core.delete_namespaced_pod,
                str(m.get("name")), str(m.get("namespace")), grace_period_seconds=0,
            )  # fmt: skip
        return f"{m.get('name')}@{node}"

    def deactivate(self, ref: JobRef, wl: KubeObject, key: str) -> str | None:
        """Deactivate the Workload for this step (Kueue evicts and suspends the whole job); None when
        it is (now or already) Pitstop's for ``key``, else why it is left alone (someone else's)."""
        name = str(meta_of(wl).get("name"))
        mark = annotations_of(wl).get(REQUEUED_FOR)
        if spec_of(wl).get("active", True) is False:
            return (
                None if mark == key else f"its Kueue Workload {name} is inactive (not Pitstop's): left alone"
            )
        self._patch(ref, name, _deactivation(wl, key))
        return None

    def activate(self, ref: JobRef, wl: KubeObject, key: str) -> bool:
        """Reactivate the Workload Pitstop deactivated for ``key`` (Kueue requeues it); whether done."""
        name = str(meta_of(wl).get("name"))
        if spec_of(wl).get("active", True) is not False or annotations_of(wl).get(REQUEUED_FOR) != key:
            return False
        rv = text(meta_of(wl), "resourceVersion")
        self._patch(ref, name, {"metadata": {"resourceVersion": rv}, "spec": {"active": True}})
        return True

    def reactivate(self, ref: JobRef, wl: KubeObject, incident: str) -> str | None:
        """At the incident's close: reactivate the Workload if Pitstop's deactivation for this
        incident left it inactive (a step that failed while a pod was stuck). What was done."""
        name = str(meta_of(wl).get("name"))
        mark = str(annotations_of(wl).get(REQUEUED_FOR) or "")
        if spec_of(wl).get("active", True) is not False or not mark.startswith(f"{incident}-"):
            return None
        rv = text(meta_of(wl), "resourceVersion")
        self._patch(ref, name, {"metadata": {"resourceVersion": rv}, "spec": {"active": True}})
        return f"{ref.id}: Kueue Workload {name} reactivated"


def _deactivation(wl: KubeObject, key: str) -> WorkloadPatch:
    """Deactivate the Workload as it was read, marked as Pitstop's for this step."""
    rv = text(meta_of(wl), "resourceVersion")
    return {
        "metadata": {"resourceVersion": rv, "annotations": {REQUEUED_FOR: key}},
        "spec": {"active": False},
    }


def pods_where(pods: list[KubeObject]) -> str:
    """The first pods held up, as a message names them (``pod on node``)."""
    return ", ".join(f"{meta_of(p).get('name')} on {spec_of(p).get('nodeName')}" for p in pods[:4])


def _stuck_message(ref: JobRef, name: str, pods: list[KubeObject]) -> str:
    where = pods_where(pods)
    phase = status_of(pods[0]).get("phase")
    return (
        f"{ref.id}: pod {where} stuck Terminating ({phase}) past its grace period on a Ready node: its "
        f"kubelet cannot end it (a process in uninterruptible sleep), so it is not force-deleted. Kueue "
        f"Workload {name} stays deactivated; closing the incident reactivates it (or: kubectl patch "
        f"workloads.kueue.x-k8s.io {name} -n {ref.namespace} --type=merge "
        """-p '{"spec":{"active":true}}')"""
    )


def _epoch(stamp: object) -> float | None:
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
