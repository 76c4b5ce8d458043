"""Restarting a gang once: a JobSet with a failure policy, or a job Kueue admits.

A JobSet with a failure policy: one pod of the current restart attempt is evicted (with a ``uid``
precondition), so the JobSet controller recreates every Job once; once ``status.restarts`` moved,
every older pod is "previous" and evicting it cannot restart the gang again. A Kueue-admitted job
without one: its Workload is deactivated, then reactivated once Kueue stopped it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    restarts_of,
    spec_of,
)


def jobset_once(ev: Evictor, ref: JobRef, incident: str, seen: int | None) -> dict[str, Any]:
    """Evict one pod of the current restart attempt (on the fenced node if one is there)."""
    kube = ev.kube
    out: dict[str, Any] = {"job": ref.id}
    fenced = set(kube.fenced_nodes(incident))
    deadline = ev.clock() + ev.deadline_s
    for _ in range(CONFLICT_RETRIES):
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
        if state in ("COMPLETED", "FAILED", "SUSPENDED") or spec_of(js).get("suspend"):
            return {**out, "outcome": f"jobset is {state}: not restarted"}
        pod = _attempt_pod(kube, ref, r, fenced)
        if pod is None:
            return {**out, "outcome": f"no live pod of restart attempt {r} to evict"}
        uid = meta_of(pod).get("uid")
        if ev.evict(pod, deadline, uid if isinstance(uid, str) and uid else None) == "evicted":
            return {**out, "outcome": "restart triggered", "evicted": meta_of(pod).get("name"), "attempt": r}
        # gone or replaced since it was listed: look again (the attempt may have moved on)
    raise ActuatorError(503, f"{ref.id}: pods of the current attempt kept disappearing", True)


def _attempt_pod(kube: Kube, ref: JobRef, attempt: int, fenced: set[str]) -> dict[str, Any] | None:
    pods = kube.items(
        f"list pods of {ref.id} attempt {attempt}",
        kube.core.list_namespaced_pod,
        ref.namespace,
        label_selector=f"{JOBSET_NAME_LABEL}={ref.name},{RESTART_ATTEMPT_LABEL}={attempt}",
    )
    alive = [p for p in pods if live(p) and not meta_of(p).get("deletionTimestamp")]
    alive.sort(key=lambda p: (spec_of(p).get("nodeName") not in fenced, str(meta_of(p).get("name"))))
    return alive[0] if alive else None


class WorkloadCycle:
    """Deactivate a Kueue Workload (Kueue evicts the whole job), then reactivate it (it is requeued).

    ``wait_s`` bounds how long one call waits for Kueue to stop it before answering 503 (the workflow
    asks again and the wait resumes).
    """

    def __init__(
        self, kube: Kube, wait_s: float, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> None:
        self.kube, self.wait_s, self.clock, self.sleep = kube, wait_s, clock, sleep

    def _patch(self, ref: JobRef, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.kube.call(
            f"patch workload {ref.namespace}/{name}",
            self.kube.custom.patch_namespaced_custom_object,
            KUEUE_GROUP, KUEUE_VERSION, ref.namespace, WORKLOADS, name, body,
        )  # fmt: skip

    def run(self, ref: JobRef, wl: dict[str, Any], key: str) -> dict[str, Any]:
        """The annotation ``pitstop.dev/requeued-for=<step key>`` makes a retry resume instead of
        starting over, and tells Pitstop's deactivation from someone else's (which stays)."""
        name = str(meta_of(wl).get("name"))
        out: dict[str, Any] = {"job": ref.id, "workload": name}
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
            rv = meta_of(wl).get("resourceVersion")
            body = {
                "metadata": {"resourceVersion": rv, "annotations": {REQUEUED_FOR: key}},
                "spec": {"active": False},
            }
            self._patch(ref, name, body)
        deadline = self.clock() + self.wait_s
        while not self._stopped(ref, name):
            if self.clock() >= deadline:
                raise ActuatorError(503, f"waiting for Kueue to stop workload {name} of {ref.id}", True)
            self.sleep(1.0)
        self._patch(ref, name, {"spec": {"active": True}})
        return {**out, "outcome": "workload deactivated and reactivated: Kueue requeues the whole job"}

    def _stopped(self, ref: JobRef, name: str) -> bool:
        """Kueue evicted the Workload, the JobSet is suspended and none of its pods still runs.

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
            return False
        js = kube.jobset(ref)
        if js is not None and not spec_of(js).get("suspend"):
            return False
        pods = kube.items(
            f"list pods of {ref.id}",
            kube.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name}",
        )
        return not any(live(p) for p in pods)
