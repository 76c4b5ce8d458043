"""The controllers of the fake Kubernetes cluster: just what Pitstop relies on, each with its source.

Sources are those of ``reference/gke.md`` (§ numbers below); constants were checked in the tagged
upstream trees where the brief names a tag.

- kubelet (gke.md §2, §5): a node whose VM (``vm_status``) is not RUNNING goes ``Ready=False``
  (``KubeletNotReady``) with the ``node.kubernetes.io/not-ready:NoSchedule`` taint the node
  lifecycle controller adds, and its running pods end as graceful node shutdown ends them:
  ``Failed``, reason ``Terminated`` and condition ``DisruptionTarget`` reason
  ``TerminationByKubelet``. RUNNING again: Ready, a new ``status.nodeInfo.bootID``, all GPUs
  allocatable again (the device plugin re-registers), and the GPU device plugin removes a
  ``XidCriticalError=True`` condition whose message (the bootID it was raised under) is not the new
  bootID (``GoogleCloudPlatform/container-engine-accelerators:pkg/gpu/nvidia/health_check/
  health_checker.go`` resetXIDCondition). Pods bound to a Ready node are admitted against the GPUs
  its started pods leave (else Failed ``OutOfnvidia.com/gpu``, as ``pkg/kubelet/lifecycle/
  predicate.go`` rejects them) and start (Running, Ready); with a ``ContainerRunner`` a pod whose
  containers name a command runs them as processes and ends with their exit codes; a
  deleted pod ends when its grace period is over (Failed, then removed once finalizers are gone);
  on a node that is down it stays Terminating, as with a real unreachable kubelet. Two ways a pod
  stays Terminating while its VM runs (``Controllers.stuck``): the kubelet stops posting status
  (``unreachable``: the node lifecycle controller sets ``Ready=Unknown`` / ``NodeStatusUnknown``
  and the ``node.kubernetes.io/unreachable:NoExecute`` taint; nothing on the node ends a pod), or
  a container process the kubelet cannot kill (``hung``: uninterruptible sleep, e.g. after Xid 79;
  the node stays Ready). "Kubernetes (versions 1.5 or newer) will not delete Pods just because a
  Node is unreachable ... The only ways in which a Pod in such a state can be removed from the
  apiserver are: the Node object is deleted, the kubelet on the unresponsive Node starts
  responding ..., force deletion of the Pod by the user" (kubernetes.io/docs/tasks/run-application/
  force-delete-stateful-set-pod/). A reboot of the VM (not RUNNING, then RUNNING) ends either.
- TTL-after-finished controller: a finished Job with ``ttlSecondsAfterFinished`` is deleted
  (Foreground) that many seconds after it finished. Job ``activeDeadlineSeconds`` is not modelled.
- garbage collector: dependents of a removed owner are deleted (Background); a
  ``foregroundDeletion`` owner deletes its dependents and goes once they are gone. PodGC: a pod
  bound to a Node that was deleted fails with ``DisruptionTarget`` reason ``DeletionByPodGC``
  (gke.md §2) and is removed at once (no 40 s quarantine).
- Job controller (batch/v1, gke.md §2): pods from the template (Indexed or NonIndexed,
  ``parallelism``/``completions``), the ``batch.kubernetes.io/job-tracking`` finalizer as the
  "counted" marker, ``podFailurePolicy`` (first matching rule: ``FailJob`` fails the Job with
  reason ``PodFailurePolicy``, ``Ignore`` replaces the pod without counting it, ``Count`` counts),
  ``backoffLimit`` (``failed > backoffLimit`` → ``BackoffLimitExceeded``), ``FailureTarget`` first
  and ``Failed`` only once no pod is left running (Kubernetes ≥ 1.31), ``suspend`` deletes the
  active pods without counting them. A force-deleted pod (grace 0, still not terminal) of a Job
  without a ``podFailurePolicy`` is accounted and its tracking finalizer dropped, so the API
  server removes it: the default ``podReplacementPolicy: TerminatingOrFailed`` counts terminating
  pods, while a Job with a pod failure policy waits for a terminal phase (KEP-3939,
  ``kubernetes/enhancements:keps/sig-apps/3939-allow-recreation-when-fully-terminated``).
  No backoff delay between pod re-creations.
- JobSet controller (``kubernetes-sigs/jobset@v0.12.0 pkg/controllers/jobset_controller.go`` and
  ``failure_policy.go``, gke.md §3): child Jobs ``<jobset>-<rjob>-<i>`` labelled and annotated
  with the jobset-name, jobset-uid, replicatedjob-name, job-index, job-global-index, job-key and
  restart-attempt keys (``labelAndAnnotateObject``); Jobs whose restart-attempt is below
  ``status.restarts`` are "previous" and deleted with Foreground propagation, and a Job name
  still in use is not re-created (``shouldCreateJob``); on a failed current Job: nil
  failurePolicy → Failed ``FailedJobs``; rules first-match on onJobFailureReasons,
  onJobFailureMessagePatterns and targetReplicatedJobs, no match → ``RestartJobSet``;
  ``RestartJobSet`` fails with ``ReachedMaxRestarts`` once ``restartsCountTowardsMax >=
  maxRestarts`` else bumps restarts and restartsCountTowardsMax; ``...AndIgnoreMaxRestarts``
  bumps restarts only; both set ``RestartingJobSet=True`` (reason ``FailurePolicy_<rule>`` or
  ``DefaultFailurePolicy``), cleared with ``JobsReady``; ``spec.suspend`` suspends active Jobs
  (``Suspended`` / ``SuspendedJobs``) and resume clears it (``ResumeJobs``) without a restart;
  all Jobs complete → ``Completed`` / ``AllJobsCompleted``. Not modelled: RestartJob actions,
  BlockingRecreate, startup policy, exclusive placement, success policy other than All.
- gang scheduler: a gang (the current restart attempt of a JobSet, else a Job, else a pod) is
  placed only when all its pods exist, all at once, on Ready, schedulable nodes whose
  NoSchedule/NoExecute taints the pod tolerates, matching ``nodeSelector``, with enough free
  ``nvidia.com/gpu`` allocatable (first fit by node name).
- disruption controller: PDB status (``currentHealthy``, ``desiredHealthy``,
  ``disruptionsAllowed``, ``expectedPods`` = the matching pods, ``observedGeneration``).
- Kueue (``kubernetes-sigs/kueue@v0.19.2``, gke.md §4): a JobSet with ``kueue.x-k8s.io/queue-name``
  is created suspended (the webhook), gets a Workload ``jobset-<name>-<hash5>`` (the hash of
  ``jobframework/workload_names.go``) labelled ``kueue.x-k8s.io/job-uid`` and owned by it, and is
  admitted (QuotaReserved, Admitted, then ``suspend=false``) when the GPUs of Ready, schedulable
  nodes cover it and every other admitted workload (one implicit ClusterQueue ``cluster-queue``).
  ``spec.active=false`` evicts (``Evicted`` / ``Deactivated``, JobSet suspended, quota released);
  ``true`` again requeues (``Requeued`` / ``Reactivated``) and readmits. ``PodsReady`` follows the
  JobSet's ready pods. Not modelled: queues, flavors, priorities, preemption, TAS, waitForPodsReady.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pitstop.local.k8s_patch import selector_matches
from pitstop.local.k8s_store import ApiError, Obj, Store, is_terminal

VmStatus = Callable[[str], str | None]

GPU = "nvidia.com/gpu"
JS = "jobset.sigs.k8s.io/"
RESTART_KEY = JS + "restart-attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
TRACKING = "batch.kubernetes.io/job-tracking"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
SHUTDOWN_MSG = "Pod was terminated in response to imminent node shutdown."
CLUSTER_QUEUE = "cluster-queue"


# --- small helpers ------------------------------------------------------------------------------
def meta(obj: Obj) -> Obj:
    m: Obj = obj.setdefault("metadata", {})
    return m


def find_cond(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def cond_true(obj: Obj, kind: str) -> bool:
    c = find_cond(obj, kind)
    return c is not None and c.get("status") == "True"


def set_cond(obj: Obj, kind: str, status: str, reason: str, message: str, now: str) -> None:
    """Upsert a condition by type; lastTransitionTime moves only when the status changes."""
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    new = {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
    for i, cur in enumerate(conds):
        if cur.get("type") == kind:
            if cur.get("status") == status:
                new["lastTransitionTime"] = cur.get("lastTransitionTime", now)
            conds[i] = {**cur, **new}
            return
    conds.append(new)


def controller_uid(obj: Obj) -> str | None:
    refs = meta(obj).get("ownerReferences") or []
    return next((r["uid"] for r in refs if r.get("controller")), None)


def owner_ref(obj: Obj) -> Obj:
    m = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": m["name"],
        "uid": m["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def gpu_request(pod: Obj) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += int((res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0)
    return total


def active_pod(pod: Obj) -> bool:
    """Neither terminal nor being deleted: what a Job counts as ``active``."""
    return not is_terminal(pod) and not meta(pod).get("deletionTimestamp")


def rand5() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def node_ready(node: Obj) -> bool:
    return cond_true(node, "Ready")


def pods_per_job(job_spec: Obj) -> int:
    par = int(job_spec.get("parallelism", 1))
    comp = job_spec.get("completions")
    return min(par, int(comp)) if comp is not None else par


class Controllers:
    """Every controller of the fake cluster; ``step()`` runs each once, in dependency order.

    ``runner`` (when given) runs the containers of pods that name a ``command`` as local processes
    (``ContainerRunner``); without it, or for a container without a command, a started pod simply
    runs until something ends it.
    """

    def __init__(
        self, store: Store, vm_status: VmStatus | None = None, runner: ContainerRunner | None = None
    ) -> None:
        self.store = store
        self.vm_status = vm_status
        self.runner = runner
        self.down: set[str] = set()
        self.stuck: dict[str, str] = {}  # node -> "unreachable" | "hung": its pods never end (module doc)
        self._finished_at: dict[str, float] = {}  # Job uid -> store clock when it finished (TTL)
        store.admission.append(kueue_webhook)

    def step(self) -> None:
        for run in (
            self.kubelet_nodes,
            self.kubelet_terminate,
            self.kubelet_processes,
            self.garbage_collector,
            self.ttl_after_finished,
            self.job_controller,
            self.jobset_controller,
            self.kueue_controller,
            self.scheduler,
            self.kubelet_start,
            self.disruption_controller,
        ):
            with self.store.lock:
                run()

    # --- kubelet --------------------------------------------------------------------------------
    def kubelet_nodes(self) -> None:
        """Tie node readiness to the VM: not RUNNING → NotReady and pods failed; RUNNING → new boot."""
        for node in self.store.list("Node"):
            name = meta(node)["name"]
            vm = self.vm_status(name) if self.vm_status else "RUNNING"
            if vm is None:
                continue
            if vm != "RUNNING" and name not in self.down:
                self.down.add(name)
                self.stuck.pop(name, None)  # the reboot ends what the kubelet could not
                self._node_down(name, vm)
            elif vm == "RUNNING" and name in self.down:
                self.down.discard(name)
                self._node_up(name)

    def _node_down(self, name: str, vm: str) -> None:
        now = self.store.wall()

        def edit(node: Obj) -> None:
            set_cond(node, "Ready", "False", "KubeletNotReady", f"node is shutting down (VM {vm})", now)
            taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != NOT_READY_TAINT]
            node["spec"]["taints"] = [
                *taints,
                {"key": NOT_READY_TAINT, "effect": "NoSchedule", "timeAdded": now},
            ]

        self.store.mutate("Node", name, None, edit)
        for pod in self.store.list("Pod", fields=f"spec.nodeName={name}"):
            if not is_terminal(pod):
                self.store.mutate(
                    "Pod", meta(pod)["name"], meta(pod)["namespace"], lambda p: shutdown_pod(p, now)
                )

    def _node_up(self, name: str) -> None:
        now, boot = self.store.wall(), str(uuid.uuid4())

        def edit(node: Obj) -> None:
            status = node["status"]
            status["nodeInfo"]["bootID"] = boot
            status["allocatable"][GPU] = status["capacity"].get(GPU, "0")
            set_cond(node, "Ready", "True", "KubeletReady", "kubelet is posting ready status", now)
            status["conditions"] = [
                c
                for c in status["conditions"]
                if not (
                    c.get("type") == "XidCriticalError" and c.get("status") == "True" and c.get("message")
                )
                or c.get("message") == boot
            ]
            node["spec"]["taints"] = [
                t
                for t in node["spec"].get("taints") or []
                if t.get("key") not in (NOT_READY_TAINT, UNREACHABLE_TAINT)
            ]

        self.store.mutate("Node", name, None, edit)

    def kubelet_unreachable(self, name: str) -> None:
        """The kubelet stops posting status while the VM runs: what the node lifecycle controller
        then sets (``Ready=Unknown``, the ``unreachable:NoExecute`` taint). Its pods never end."""
        now = self.store.wall()

        def edit(node: Obj) -> None:
            set_cond(
                node, "Ready", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.", now
            )
            taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
            node["spec"]["taints"] = [
                *taints,
                {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": now},
            ]

        self.stuck[name] = "unreachable"
        self.store.mutate("Node", name, None, edit)

    def processes_hung(self, name: str) -> None:
        """The node's container processes cannot be killed (uninterruptible sleep): deleted pods
        stay Terminating past their grace period while the node stays Ready."""
        self.stuck[name] = "hung"

    def kubelet_terminate(self) -> None:
        """End deleted pods whose grace period is over, on nodes whose kubelet is up."""
        for pod in self.store.list("Pod"):
            m = meta(pod)
            if not m.get("deletionTimestamp") or not m.get("deletionGracePeriodSeconds"):
                continue
            node = pod["spec"].get("nodeName")
            # A pod no node runs has nothing to wait for (the API server deletes an unscheduled pod
            # at once); one bound while its deletion was pending must not be stranded Terminating.
            if node and (node in self.down or node in self.stuck or not self.store.grace_over(pod)):
                continue

            def end(p: Obj) -> None:
                if not is_terminal(p):
                    p["status"]["phase"] = "Failed"
                    terminate_containers(p, 143, "Error")
                    set_cond(p, "Ready", "False", "PodCompleted", "", self.store.wall())
                meta(p)["deletionGracePeriodSeconds"] = 0

            self.store.mutate("Pod", m["name"], m["namespace"], end)

    def kubelet_start(self) -> None:
        """Admit and run pods bound to a Ready node: phase Running, containers started, Ready.

        Admission (``pkg/kubelet/lifecycle/predicate.go``): a pod whose ``nvidia.com/gpu`` request
        exceeds what the node's admitted pods leave of its allocatable fails at once, reason
        ``OutOfnvidia.com/gpu`` (a pod bound by ``spec.nodeName`` skips the scheduler's check,
        not the kubelet's). A pod whose containers name a ``command`` runs them as processes when
        the cluster has a ``runner`` (it goes Running when its main containers start).
        """
        nodes = {meta(n)["name"]: n for n in self.store.list("Node")}
        ready = {name for name, n in nodes.items() if node_ready(n)} - self.down
        now = self.store.wall()
        used = self._admitted_gpus()
        for pod in self.store.list("Pod", fields="status.phase=Pending"):
            node, m = pod["spec"].get("nodeName"), meta(pod)
            if node not in ready or m.get("deletionTimestamp") or pod["status"].get("startTime"):
                continue
            want, have = gpu_request(pod), int(nodes[node]["status"].get("allocatable", {}).get(GPU, 0))
            if want > have - used.get(node, 0):
                self.store.mutate(
                    "Pod", m["name"], m["namespace"], reject(want, used.get(node, 0), have, now)
                )
                continue
            used[node] = used.get(node, 0) + want
            if self.runner is not None and self.runner.runnable(pod):
                self.store.mutate(
                    "Pod", m["name"], m["namespace"], lambda p: p["status"].update(startTime=now)
                )
                self.runner.start(pod, node)
            else:
                self.store.mutate("Pod", m["name"], m["namespace"], lambda p: start_pod(p, now))

    def _admitted_gpus(self) -> dict[str, int]:
        """GPUs held on each node by the pods its kubelet admitted (started) and that have not ended."""
        used: dict[str, int] = {}
        for pod in self.store.list("Pod"):
            node = pod["spec"].get("nodeName")
            if node and pod["status"].get("startTime") and not is_terminal(pod):
                used[node] = used.get(node, 0) + gpu_request(pod)
        return used

    def kubelet_processes(self) -> None:
        """Stop the processes of pods that were deleted, ended by the node, or are gone."""
        if self.runner is not None:
            self.runner.reap()

    # --- TTL-after-finished controller ------------------------------------------------------------
    def ttl_after_finished(self) -> None:
        """A finished Job with ``ttlSecondsAfterFinished`` is deleted (Foreground) that long after it
        finished (``pkg/controller/ttlafterfinished``; "Automatic Cleanup for Finished Jobs")."""
        now = self.store.now()
        for job in self.store.list("Job"):
            m = meta(job)
            ttl = job["spec"].get("ttlSecondsAfterFinished")
            if ttl is None or m.get("deletionTimestamp"):
                continue
            if not (cond_true(job, "Complete") or cond_true(job, "Failed")):
                continue
            done = self._finished_at.setdefault(m["uid"], now)
            if now >= done + int(ttl):
                self._delete("Job", job, "Foreground")
                self._finished_at.pop(m["uid"], None)

    # --- garbage collector --------------------------------------------------------------------
    def garbage_collector(self) -> None:
        """Delete dependents of removed owners; finish Foreground deletions; PodGC orphaned pods."""
        uids = self.store.uids()
        for kind in ("Workload", "JobSet", "Job", "Pod"):
            for obj in self.store.list(kind):
                m = meta(obj)
                refs = m.get("ownerReferences") or []
                if refs and not m.get("deletionTimestamp") and not any(r["uid"] in uids for r in refs):
                    self._delete(kind, obj, "Background")
        for kind in ("JobSet", "Job", "Workload"):
            for obj in self.store.list(kind):
                m = meta(obj)
                if not m.get("deletionTimestamp") or "foregroundDeletion" not in (m.get("finalizers") or []):
                    continue
                deps = self.store.owned(m["uid"])
                for dep_kind, dep in deps:
                    if not meta(dep).get("deletionTimestamp"):
                        self._delete(dep_kind, dep, "Foreground" if dep_kind != "Pod" else "Background")
                if not deps:
                    self.store.mutate(
                        kind, m["name"], m.get("namespace"), drop_finalizer("foregroundDeletion")
                    )
        self._pod_gc()

    def _pod_gc(self) -> None:
        """PodGC (``pkg/controller/podgc/gc_controller.go``): a pod bound to a Node that no longer
        exists (``gcOrphaned``), or a terminating pod bound to no node (``gcUnscheduledTerminating``:
        no kubelet will ever end it), fails (``DeletionByPodGC``) and is removed. A finalizer (the Job
        controller's tracking one) keeps it until its owner lets the failed pod go."""
        nodes = {meta(n)["name"] for n in self.store.list("Node")}
        now = self.store.wall()
        for pod in self.store.list("Pod"):
            node = pod["spec"].get("nodeName")
            m = meta(pod)
            unscheduled_terminating = not node and m.get("deletionTimestamp")
            if not unscheduled_terminating and (not node or node in nodes):
                continue
            if not is_terminal(pod):
                self.store.mutate("Pod", m["name"], m["namespace"], lambda p: pod_gc_failed(p, now))
            with contextlib.suppress(ApiError):
                self.store.delete("Pod", m["name"], m["namespace"], options={"gracePeriodSeconds": 0})

    def _delete(self, kind: str, obj: Obj, policy: str) -> None:
        with contextlib.suppress(ApiError):  # already gone
            self.store.delete(
                kind, meta(obj)["name"], meta(obj).get("namespace"), options={"propagationPolicy": policy}
            )

    # --- Job controller -----------------------------------------------------------------------
    def job_controller(self) -> None:
        uids = self.store.uids()
        for job in self.store.list("Job"):
            pods = [
                p
                for _, p in self.store.owned(meta(job)["uid"], "Pod")
                if controller_uid(p) == meta(job)["uid"]
            ]
            if not meta(job).get("deletionTimestamp"):
                self._sync_job(job, pods)
                continue
            for pod in pods:  # a Job being deleted still lets its ended pods go
                if is_terminal(pod) and TRACKING in (meta(pod).get("finalizers") or []):
                    self.store.mutate(
                        "Pod", meta(pod)["name"], meta(pod)["namespace"], drop_finalizer(TRACKING)
                    )
        for pod in self.store.list("Pod"):
            if TRACKING in (meta(pod).get("finalizers") or []) and (
                not controller_uid(pod) or (controller_uid(pod) or "") not in uids
            ):
                self.store.mutate("Pod", meta(pod)["name"], meta(pod)["namespace"], drop_finalizer(TRACKING))

    def _sync_job(self, job: Obj, pods: list[Obj]) -> None:
        spec, status, now = job["spec"], job.setdefault("status", {}), self.store.wall()
        finished = cond_true(job, "Complete") or cond_true(job, "Failed")
        failure = find_cond(job, "FailureTarget") if cond_true(job, "FailureTarget") else None
        for pod in pods:
            if (is_terminal(pod) or _force_deleted(job, pod)) and TRACKING in (
                meta(pod).get("finalizers") or []
            ):
                if not finished and failure is None:
                    failure = self._account(job, pod) or failure
                self.store.mutate("Pod", meta(pod)["name"], meta(pod)["namespace"], drop_finalizer(TRACKING))
        if (
            failure is None
            and not finished
            and int(status.get("failed", 0)) > int(spec.get("backoffLimit", 6))
        ):
            failure = {
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        live = [
            p
            for p in self.store.list("Pod", meta(job)["namespace"])
            if _owned_by(p, job) and not is_terminal(p)
        ]
        if failure is not None or finished:
            self._delete_pods([p for p in live if active_pod(p)])
            if failure is not None and not finished:
                set_cond(job, "FailureTarget", "True", failure["reason"], failure["message"], now)
                if not live:
                    set_cond(job, "Failed", "True", failure["reason"], failure["message"], now)
        elif spec.get("suspend"):
            self._delete_pods([p for p in live if active_pod(p)])
            set_cond(job, "Suspended", "True", "JobSuspended", "Job suspended", now)
            status.pop("startTime", None)
        else:
            if cond_true(job, "Suspended"):
                set_cond(job, "Suspended", "False", "JobResumed", "Job resumed", now)
            status.setdefault("startTime", now)
            self._create_pods(job, [p for p in live if active_pod(p)])
            if int(status.get("succeeded", 0)) >= int(spec.get("completions") or 1):
                set_cond(
                    job,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                )
                set_cond(
                    job,
                    "Complete",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                )
        self._job_status(job)

    def _account(self, job: Obj, pod: Obj) -> Obj | None:
        """Count one terminal pod; a FailJob rule returns the failure (reason, message)."""
        status = job["status"]
        if pod["status"]["phase"] == "Succeeded":
            status["succeeded"] = int(status.get("succeeded", 0)) + 1
            idx = (meta(pod).get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
            if idx is not None:
                done = {int(i) for i in str(status.get("completedIndexes") or "").split(",") if i}
                status["completedIndexes"] = ",".join(str(i) for i in sorted(done | {int(idx)}))
            return None
        if job["spec"].get("suspend"):
            return None  # pods ended by suspension are not failures
        action, message = pod_failure_policy(job, pod)
        if action == "FailJob":
            status["failed"] = int(status.get("failed", 0)) + 1
            return {"reason": "PodFailurePolicy", "message": message}
        if action != "Ignore":
            status["failed"] = int(status.get("failed", 0)) + 1
        return None

    def _delete_pods(self, pods: list[Obj]) -> None:
        for pod in pods:
            self._delete("Pod", pod, "Background")

    def _create_pods(self, job: Obj, live: list[Obj]) -> None:
        spec, status = job["spec"], job["status"]
        want = pods_per_job(spec)
        if spec.get("completionMode") == "Indexed":
            done = {int(i) for i in str(status.get("completedIndexes") or "").split(",") if i}
            running = {
                int((meta(p).get("annotations") or {}).get("batch.kubernetes.io/job-completion-index", -1))
                for p in live
            }
            todo = [
                i for i in range(int(spec.get("completions") or want)) if i not in done and i not in running
            ]
            indexes: list[int | None] = list(todo[: max(0, want - len(live))])
        else:
            remaining = int(spec.get("completions") or want) - int(status.get("succeeded", 0))
            indexes = [None] * max(0, min(want, remaining) - len(live))
        for idx in indexes:
            self.store.create("Pod", pod_from_template(job, idx))

    def _job_status(self, job: Obj) -> None:
        pods = [p for p in self.store.list("Pod", meta(job)["namespace"]) if _owned_by(p, job)]
        status = job["status"]
        status["active"] = sum(1 for p in pods if active_pod(p))
        status["ready"] = sum(1 for p in pods if active_pod(p) and cond_true(p, "Ready"))
        status["terminating"] = sum(
            1 for p in pods if meta(p).get("deletionTimestamp") and not is_terminal(p)
        )
        status.setdefault("succeeded", 0)
        status.setdefault("failed", 0)
        self.store.mutate("Job", meta(job)["name"], meta(job)["namespace"], lambda j: j.update(status=status))

    # --- JobSet controller --------------------------------------------------------------------
    def jobset_controller(self) -> None:
        for js in self.store.list("JobSet"):
            if not meta(js).get("deletionTimestamp"):
                self._sync_jobset(js)
                self.store.mutate(
                    "JobSet",
                    meta(js)["name"],
                    meta(js)["namespace"],
                    replace_status(js["status"]),
                )

    def _sync_jobset(self, js: Obj) -> None:
        """One reconcile of ``jobset_controller.go`` (v0.12.0), in its order."""
        status = js.setdefault("status", {})
        status.setdefault("restarts", 0)
        status.setdefault("restartsCountTowardsMax", 0)
        jobs = self._child_jobs(js)
        status["replicatedJobsStatus"] = replicated_job_statuses(js, jobs)
        if cond_true(js, "Completed") or cond_true(js, "Failed"):
            self._delete_jobs(jobs["active"])
            return
        self._delete_jobs(jobs["previous"])
        if not js["spec"].get("suspend") and all_jobs_ready(js):
            set_restarting_false(js, "JobsReady", "all jobs are ready", self.store.wall())
        if jobs["failed"]:
            execute_failure_policy(js, jobs["failed"], self.store.wall())
            return
        if jobs["successful"] and len(jobs["successful"]) >= sum(
            int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"]
        ):
            set_cond(
                js,
                "Completed",
                "True",
                "AllJobsCompleted",
                "jobset completed successfully",
                self.store.wall(),
            )
            set_restarting_false(js, "JobSetCompleted", "jobset completed successfully", self.store.wall())
            status["terminalState"] = "Completed"
            return
        self._create_jobs(js, jobs)
        self._suspend_or_resume(js, jobs["active"])

    def _child_jobs(self, js: Obj) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {"active": [], "failed": [], "successful": [], "previous": []}
        restarts = int(js["status"]["restarts"])
        for _, job in self.store.owned(meta(js)["uid"], "Job"):
            if int((meta(job).get("labels") or {}).get(RESTART_KEY, "0")) < restarts:
                out["previous"].append(job)
            elif cond_true(job, "Failed"):
                out["failed"].append(job)
            elif cond_true(job, "Complete"):
                out["successful"].append(job)
            else:
                out["active"].append(job)
        return out

    def _delete_jobs(self, jobs: list[Obj]) -> None:
        for job in jobs:
            if not meta(job).get("deletionTimestamp"):
                self._delete("Job", job, "Foreground")

    def _create_jobs(self, js: Obj, jobs: dict[str, list[Obj]]) -> None:
        taken = {meta(j)["name"] for group in jobs.values() for j in group}
        for rjob in js["spec"]["replicatedJobs"]:
            for idx in range(int(rjob.get("replicas", 1))):
                job = construct_job(js, rjob, idx)
                if meta(job)["name"] in taken:
                    continue
                try:
                    self.store.create("Job", job)
                except ApiError as err:
                    if err.code != 409:
                        set_cond(js, "Failed", "True", "JobCreationFailed", err.message, self.store.wall())
                        js["status"]["terminalState"] = "Failed"
                        return

    def _suspend_or_resume(self, js: Obj, active: list[Obj]) -> None:
        now = self.store.wall()
        if js["spec"].get("suspend"):
            for job in active:
                if not job["spec"].get("suspend"):
                    self.store.mutate(
                        "Job",
                        meta(job)["name"],
                        meta(job)["namespace"],
                        lambda j: j["spec"].update(suspend=True),
                    )
            set_cond(js, "Suspended", "True", "SuspendedJobs", "jobset is suspended", now)
            set_restarting_false(js, "JobSetSuspended", "jobset is suspended", now)
            return
        templates = {r["name"]: r["template"]["spec"]["template"] for r in js["spec"]["replicatedJobs"]}
        for job in active:
            if job["spec"].get("suspend"):
                tmpl = templates.get((meta(job).get("labels") or {}).get(JS + "replicatedjob-name", ""), {})
                self.store.mutate("Job", meta(job)["name"], meta(job)["namespace"], resume_with(tmpl))
        if find_cond(js, "Suspended") is not None:
            set_cond(js, "Suspended", "False", "ResumeJobs", "jobset is resumed", now)

    # --- Kueue --------------------------------------------------------------------------------
    def kueue_controller(self) -> None:
        for js in self.store.list("JobSet"):
            if QUEUE_LABEL not in (meta(js).get("labels") or {}) or meta(js).get("deletionTimestamp"):
                continue
            found = self.store.list(
                "Workload", meta(js)["namespace"], labels=f"{JOB_UID_LABEL}={meta(js)['uid']}"
            )
            wl = found[0] if found else self.store.create("Workload", workload_for(js))
            self._sync_workload(js, wl)

    def _sync_workload(self, js: Obj, wl: Obj) -> None:
        now, status = self.store.wall(), wl.setdefault("status", {})
        active = wl["spec"].get("active", True)
        requeued = find_cond(wl, "Requeued")
        if not active and status.get("admission"):
            set_cond(wl, "Evicted", "True", "Deactivated", "The workload is deactivated", now)
            set_cond(wl, "Requeued", "False", "Deactivated", "The workload is deactivated", now)
            set_cond(wl, "QuotaReserved", "False", "Pending", "The workload is deactivated", now)
            set_cond(wl, "Admitted", "False", "NoReservation", "The workload has no reservation", now)
            status.pop("admission", None)
        elif active and requeued and requeued["status"] == "False" and requeued["reason"] == "Deactivated":
            set_cond(wl, "Requeued", "True", "Reactivated", "The workload was reactivated", now)
            status.pop("requeueState", None)
        if active and not status.get("admission") and not self._finished(js) and self._fits(wl):
            admit(wl, now, self.store.list("Node"))
        admitted = bool(status.get("admission"))
        if js["spec"].get("suspend") == admitted:
            self.store.mutate(
                "JobSet",
                meta(js)["name"],
                meta(js)["namespace"],
                lambda j: j["spec"].update(suspend=not admitted),
            )
        self._pods_ready(js, wl, now)
        self.store.mutate(
            "Workload", meta(wl)["name"], meta(wl)["namespace"], lambda w: w.update(status=status)
        )

    def _finished(self, js: Obj) -> bool:
        return cond_true(js, "Completed") or cond_true(js, "Failed")

    def _fits(self, wl: Obj) -> bool:
        """Quota = the GPUs of Ready, schedulable nodes whose NoSchedule/NoExecute taints the
        workload's pods tolerate (a cordon and a fence's taint alike keep them off); usage = every
        other admitted workload."""
        pods = [{"spec": ps["template"].get("spec", {})} for ps in wl["spec"].get("podSets") or []]
        quota = sum(
            int(n["status"]["allocatable"].get(GPU, 0))
            for n in self.store.list("Node")
            if node_ready(n)
            and not n["spec"].get("unschedulable")
            and all(tolerates(p, t) for p in pods for t in blocking_taints(n))
        )
        used = sum(
            workload_gpus(w) for w in self.store.list("Workload") if (w.get("status") or {}).get("admission")
        )
        return used + workload_gpus(wl) <= quota

    def _pods_ready(self, js: Obj, wl: Obj, now: str) -> None:
        want = sum(int(ps.get("count", 1)) for ps in wl["spec"].get("podSets") or [])
        attempt = str((js.get("status") or {}).get("restarts", 0))
        selector = f"{JS}jobset-name={meta(js)['name']},{RESTART_KEY}={attempt}"
        ready = [
            p
            for p in self.store.list("Pod", meta(js)["namespace"], labels=selector)
            if active_pod(p) and cond_true(p, "Ready")
        ]
        if wl["status"].get("admission") and len(ready) >= want:
            set_cond(
                wl,
                "PodsReady",
                "True",
                "PodsReady",
                "All pods reached readiness and the workload is running",
                now,
            )
        elif wl["status"].get("admission"):
            set_cond(wl, "PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded", now)

    # --- gang scheduler -----------------------------------------------------------------------
    def scheduler(self) -> None:
        """Place each complete gang all at once, or none of it."""
        pods = [p for p in self.store.list("Pod") if active_pod(p)]
        gangs: dict[tuple[str, ...], list[Obj]] = {}
        for pod in pods:
            gangs.setdefault(gang_key(pod), []).append(pod)
        free = self._free_gpus()
        for key, members in sorted(gangs.items()):
            pending = [p for p in members if not p["spec"].get("nodeName")]
            if not pending or len(members) < self._gang_size(key, members):
                continue
            placement = place(pending, free, self._schedulable_nodes())
            now = self.store.wall()
            for pod in pending:
                node = placement.get(meta(pod)["name"])
                self.store.mutate("Pod", meta(pod)["name"], meta(pod)["namespace"], bind_to(node, now))

    def _gang_size(self, key: tuple[str, ...], members: list[Obj]) -> int:
        if key[1] == "jobset":
            js = self.store.get("JobSet", key[2], key[0])
            if js is not None:
                return sum(
                    int(r.get("replicas", 1)) * pods_per_job(r["template"]["spec"])
                    for r in js["spec"]["replicatedJobs"]
                )
        if key[1] == "job":
            job = next((j for j in self.store.list("Job", key[0]) if meta(j)["uid"] == key[2]), None)
            if job is not None:
                return pods_per_job(job["spec"])
        return len(members)

    def _schedulable_nodes(self) -> list[Obj]:
        return [n for n in self.store.list("Node") if node_ready(n) and not n["spec"].get("unschedulable")]

    def _free_gpus(self) -> dict[str, int]:
        free = {meta(n)["name"]: int(n["status"]["allocatable"].get(GPU, 0)) for n in self.store.list("Node")}
        for pod in self.store.list("Pod"):
            node = pod["spec"].get("nodeName")
            if node in free and not is_terminal(pod):
                free[node] -= gpu_request(pod)
        return free

    # --- disruption controller ----------------------------------------------------------------
    def disruption_controller(self) -> None:
        for pdb in self.store.list("PodDisruptionBudget"):
            status = pdb_status(self.store, pdb)
            self.store.mutate(
                "PodDisruptionBudget",
                meta(pdb)["name"],
                meta(pdb)["namespace"],
                replace_status(status),
            )


# --- pure helpers the controllers share -----------------------------------------------------------
def _force_deleted(job: Obj, pod: Obj) -> bool:
    """A pod deleted with grace 0 that never reached a terminal phase, counted by a Job that replaces
    terminating pods (no ``podFailurePolicy``: ``podReplacementPolicy: TerminatingOrFailed``)."""
    m = meta(pod)
    forced = bool(m.get("deletionTimestamp")) and m.get("deletionGracePeriodSeconds") == 0
    return forced and not is_terminal(pod) and not job["spec"].get("podFailurePolicy")


def _owned_by(pod: Obj, job: Obj) -> bool:
    return bool(controller_uid(pod) == meta(job)["uid"])


def replace_status(status: Obj) -> Callable[[Obj], None]:
    def edit(obj: Obj) -> None:
        obj["status"] = status

    return edit


def resume_with(template: Obj) -> Callable[[Obj], None]:
    return lambda job: resume_job(job, template)


def bind_to(node: str | None, now: str) -> Callable[[Obj], None]:
    return lambda pod: bind(pod, node, now)


def drop_finalizer(name: str) -> Callable[[Obj], None]:
    def edit(obj: Obj) -> None:
        meta(obj)["finalizers"] = [f for f in meta(obj).get("finalizers") or [] if f != name]

    return edit


def terminate_containers(pod: Obj, code: int, reason: str) -> None:
    statuses = pod["status"].get("containerStatuses") or []
    for cs in statuses:
        started = (cs.get("state") or {}).get("running", {}).get("startedAt")
        cs["state"] = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started}}
        cs["ready"] = False
        cs["started"] = False


def shutdown_pod(pod: Obj, now: str) -> None:
    """Graceful node shutdown, as the kubelet ends a pod on a node going down."""
    pod["status"].update(phase="Failed", reason="Terminated", message=SHUTDOWN_MSG)
    set_cond(pod, "DisruptionTarget", "True", "TerminationByKubelet", SHUTDOWN_MSG, now)
    set_cond(pod, "Ready", "False", "PodFailed", "", now)
    terminate_containers(pod, 137, "Error")


def pod_gc_failed(pod: Obj, now: str) -> None:
    pod["status"]["phase"] = "Failed"
    set_cond(pod, "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists", now)
    terminate_containers(pod, 137, "Error")


def start_pod(pod: Obj, now: str) -> None:
    status = pod["status"]
    status.update(
        phase="Running",
        startTime=now,
        hostIP="10.0.0.1",
        podIP=f"10.4.{random.randint(0, 255)}.{random.randint(1, 254)}",
    )
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": f"containerd://{uuid.uuid4().hex}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in pod["spec"].get("containers") or []
    ]
    for kind in ("Initialized", "ContainersReady", "Ready"):
        set_cond(pod, kind, "True", "", "", now)


def reject(want: int, used: int, have: int, now: str) -> Callable[[Obj], None]:
    """The kubelet refusing a pod it has no room for (``OutOf<resource>``); the pod fails at once."""

    def edit(pod: Obj) -> None:
        msg = (
            f"Pod was rejected: Node didn't have enough resource: {GPU}, requested: {want}, "
            f"used: {used}, capacity: {have}"
        )
        pod["status"].update(phase="Failed", reason=f"OutOf{GPU}", message=msg, startTime=now)

    return edit


def bind(pod: Obj, node: str | None, now: str) -> None:
    if node is None:
        set_cond(pod, "PodScheduled", "False", "Unschedulable", "0 nodes can hold the whole gang", now)
    else:
        pod["spec"]["nodeName"] = node
        set_cond(pod, "PodScheduled", "True", "", "", now)


def gang_key(pod: Obj) -> tuple[str, ...]:
    labels, ns = meta(pod).get("labels") or {}, meta(pod)["namespace"]
    if JS + "jobset-name" in labels:
        return (ns, "jobset", labels[JS + "jobset-name"], labels.get(RESTART_KEY, "0"))
    uid = controller_uid(pod)
    return (ns, "job", uid) if uid else (ns, "pod", meta(pod)["name"])


def tolerates(pod: Obj, taint: Obj) -> bool:
    for tol in pod["spec"].get("tolerations") or []:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def blocking_taints(node: Obj) -> list[Obj]:
    """Taints that keep a pod that does not tolerate them off the node (NoSchedule, NoExecute)."""
    return [t for t in node["spec"].get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]


def fits(pod: Obj, node: Obj, free: int) -> bool:
    labels = meta(node).get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
        return False
    return all(tolerates(pod, t) for t in blocking_taints(node)) and free >= gpu_request(pod)


def place(pending: list[Obj], free: dict[str, int], nodes: list[Obj]) -> dict[str, str | None]:
    """First fit by node name for every pod; all None if any pod does not fit (all or nothing)."""
    left = dict(free)
    placement: dict[str, str | None] = {}
    for pod in sorted(pending, key=lambda p: meta(p)["name"]):
        node = next((n for n in nodes if fits(pod, n, left.get(meta(n)["name"], 0))), None)
        if node is None:
            return {meta(p)["name"]: None for p in pending}
        left[meta(node)["name"]] -= gpu_request(pod)
        placement[meta(pod)["name"]] = meta(node)["name"]
    free.update(left)
    return placement


def pod_failure_policy(job: Obj, pod: Obj) -> tuple[str | None, str]:
    """The action of the first ``podFailurePolicy`` rule matching a failed pod, and the Job's message."""
    name = f"{meta(pod)['namespace']}/{meta(pod)['name']}"
    rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
    for i, rule in enumerate(rules):
        for pattern in rule.get("onPodConditions") or []:
            c = find_cond(pod, pattern.get("type", ""))
            if c is not None and c.get("status") == pattern.get("status", "True"):
                return rule[
                    "action"
                ], f"Pod {name} has condition {pattern['type']} matching {rule['action']} rule at index {i}"
        codes = rule.get("onExitCodes")
        for cs in pod["status"].get("containerStatuses") or [] if codes else []:
            code = (cs.get("state") or {}).get("terminated", {}).get("exitCode")
            if code in (None, 0) or (codes.get("containerName") and codes["containerName"] != cs.get("name")):
                continue
            if (code in codes.get("values", [])) == (codes.get("operator", "In") == "In"):
                msg = (
                    f"Container {cs['name']} for pod {name} failed with exit code {code} "
                    f"matching {rule['action']} rule at index {i}"
                )
                return rule["action"], msg
    return None, ""


def pod_from_template(job: Obj, index: int | None) -> Obj:
    tmpl = json.loads(json.dumps(job["spec"]["template"]))
    m = tmpl.setdefault("metadata", {})
    name = meta(job)["name"]
    labels = m.setdefault("labels", {})
    annotations = m.setdefault("annotations", {})
    labels.update(
        {"batch.kubernetes.io/controller-uid": meta(job)["uid"], "batch.kubernetes.io/job-name": name}
    )
    labels.update({"controller-uid": meta(job)["uid"], "job-name": name})
    if index is not None:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    m.update(
        name=f"{name}-{index}-{rand5()}" if index is not None else f"{name}-{rand5()}",
        namespace=meta(job)["namespace"],
        ownerReferences=[owner_ref(job)],
        finalizers=[TRACKING],
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": tmpl.get("spec", {})}


def resume_job(job: Obj, template: Obj) -> None:
    """``resumeJob``: the pod template may have changed while suspended (Kueue injects placement);
    the template's nodeSelector is merged into the Job's and its tolerations added, so a key removed
    from the template stays (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go resumeJob:
    collections.MergeMaps, MergeSlices)."""
    spec = job["spec"]["template"].setdefault("spec", {})
    given = template.get("spec") or {}
    if given.get("nodeSelector"):
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **given["nodeSelector"]}
    have = spec.get("tolerations") or []
    more = [t for t in given.get("tolerations") or [] if t not in have]
    if more:
        spec["tolerations"] = [*have, *more]
    job["spec"]["suspend"] = False


def construct_job(js: Obj, rjob: Obj, idx: int) -> Obj:
    """``constructJob`` + ``labelAndAnnotateObject`` (jobset v0.12.0)."""
    name = f"{meta(js)['name']}-{rjob['name']}-{idx}"
    ns = meta(js)["namespace"]
    tmpl = json.loads(json.dumps(rjob["template"]))
    rjobs = js["spec"]["replicatedJobs"]
    offset = sum(int(r.get("replicas", 1)) for r in rjobs[: rjobs.index(rjob)])
    keys = {
        JS + "jobset-name": meta(js)["name"],
        JS + "jobset-uid": meta(js)["uid"],
        JS + "replicatedjob-name": rjob["name"],
        RESTART_KEY: str(js["status"]["restarts"]),
        JS + "replicatedjob-replicas": str(rjob.get("replicas", 1)),
        JS + "global-replicas": str(sum(int(r.get("replicas", 1)) for r in rjobs)),
        JS + "job-index": str(idx),
        JS + "job-key": hashlib.sha1(f"{ns}/{name}".encode()).hexdigest(),  # noqa: S324 (a name, as upstream)
        JS + "job-global-index": str(offset + idx),
    }
    job_meta = tmpl.setdefault("metadata", {})
    pod_meta = tmpl["spec"]["template"].setdefault("metadata", {})
    for m in (job_meta, pod_meta):
        m["labels"] = {**(m.get("labels") or {}), **keys}
        m["annotations"] = {**(m.get("annotations") or {}), **keys}
    job_meta.update(name=name, namespace=ns, ownerReferences=[owner_ref(js)])
    tmpl["spec"]["suspend"] = bool(js["spec"].get("suspend"))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": tmpl["spec"]}


def replicated_job_statuses(js: Obj, jobs: dict[str, list[Obj]]) -> list[Obj]:
    """``calculateReplicatedJobStatuses``: per replicatedJob counts of ready, active ... Jobs."""
    out = []
    for rjob in js["spec"]["replicatedJobs"]:
        mine = {
            k: [j for j in v if (meta(j).get("labels") or {}).get(JS + "replicatedjob-name") == rjob["name"]]
            for k, v in jobs.items()
        }
        ready = sum(
            1
            for j in mine["active"]
            if int(j["status"].get("succeeded", 0)) + int(j["status"].get("ready", 0))
            >= pods_per_job(j["spec"])
        )
        out.append(
            {
                "name": rjob["name"],
                "ready": ready,
                "succeeded": len(mine["successful"]),
                "failed": len(mine["failed"]),
                "active": sum(1 for j in mine["active"] if int(j["status"].get("active", 0)) > 0),
                "suspended": sum(1 for j in mine["active"] if j["spec"].get("suspend")),
            }
        )
    return out


def all_jobs_ready(js: Obj) -> bool:
    total = sum(int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"])
    return total == sum(int(s["ready"]) + int(s["succeeded"]) for s in js["status"]["replicatedJobsStatus"])


def set_restarting_false(js: Obj, reason: str, message: str, now: str) -> None:
    if find_cond(js, "RestartingJobSet") is not None:
        set_cond(js, "RestartingJobSet", "False", reason, message, now)


def execute_failure_policy(js: Obj, failed: list[Obj], now: str) -> None:
    """``executeFailurePolicy`` (failure_policy.go, jobset v0.12.0)."""
    policy, status = js["spec"].get("failurePolicy"), js["status"]

    def fail(reason: str, message: str, job: Obj) -> None:
        set_cond(js, "Failed", "True", reason, f"{message} (first failed job: {meta(job)['name']})", now)
        set_restarting_false(js, "JobSetFailed", "jobset failed", now)
        status["terminalState"] = "Failed"

    if policy is None:
        fail("FailedJobs", "jobset failed due to one or more job failures", first_failed(failed))
        return
    rule, job = match_rule(policy.get("rules") or [], failed)
    action = rule["action"] if rule else "RestartJobSet"
    job = job or first_failed(failed)
    reason = f"FailurePolicy_{rule.get('name', '')}" if rule else "DefaultFailurePolicy"
    if action == "FailJobSet":
        fail("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action", job)
        return
    if action == "RestartJobSet" and int(status["restartsCountTowardsMax"]) >= int(
        policy.get("maxRestarts", 0)
    ):
        fail("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts", job)
        return
    status["restarts"] = int(status["restarts"]) + 1
    if action == "RestartJobSet":
        status["restartsCountTowardsMax"] = int(status["restartsCountTowardsMax"]) + 1
    msg = f"applying {action} failure policy action (first failed job: {meta(job)['name']})"
    set_cond(js, "RestartingJobSet", "True", reason, msg, now)


def first_failed(jobs: list[Obj]) -> Obj:
    return min(jobs, key=lambda j: (find_cond(j, "Failed") or {}).get("lastTransitionTime", ""))


def match_rule(rules: list[Obj], failed: list[Obj]) -> tuple[Obj | None, Obj | None]:
    """``findFirstFailedPolicyRuleAndJob``: rules in order, the earliest failed Job the rule applies to."""
    for rule in rules:
        matching = []
        for job in failed:
            c = find_cond(job, "Failed") or {}
            rjob = (meta(job).get("labels") or {}).get(JS + "replicatedjob-name")
            reasons, patterns, targets = (
                rule.get(k) or []
                for k in ("onJobFailureReasons", "onJobFailureMessagePatterns", "targetReplicatedJobs")
            )
            if (
                (not reasons or c.get("reason") in reasons)
                and (not patterns or any(re.search(p, c.get("message", "")) for p in patterns))
                and rjob
                and (not targets or rjob in targets)
            ):
                matching.append(job)
        if matching:
            return rule, first_failed(matching)
    return None, None


def kueue_webhook(kind: str, obj: Obj) -> None:
    """Kueue's JobSet webhook: a JobSet bound to a queue starts suspended until admitted."""
    if kind == "JobSet" and QUEUE_LABEL in (meta(obj).get("labels") or {}):
        obj.setdefault("spec", {})["suspend"] = True


def workload_name(js: Obj) -> str:
    """``GetWorkloadNameForOwnerWithGVK`` (kueue v0.19.2 jobframework/workload_names.go)."""
    parts = ["JobSet", "jobset.x-k8s.io", meta(js)["name"], meta(js)["uid"]]
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()  # noqa: S324 (a name, as upstream)
    return f"jobset-{meta(js)['name']}"[:247] + "-" + digest[:5]


def workload_for(js: Obj) -> Obj:
    pod_sets = [
        {
            "name": r["name"],
            "count": int(r.get("replicas", 1)) * pods_per_job(r["template"]["spec"]),
            "template": r["template"]["spec"]["template"],
        }
        for r in js["spec"]["replicatedJobs"]
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(js),
            "namespace": meta(js)["namespace"],
            "labels": {JOB_UID_LABEL: meta(js)["uid"]},
            "ownerReferences": [owner_ref(js)],
        },
        "spec": {
            "queueName": meta(js)["labels"][QUEUE_LABEL],
            "podSets": pod_sets,
            "active": True,
            "priority": 0,
        },
    }


def workload_gpus(wl: Obj) -> int:
    return sum(
        int(ps.get("count", 1)) * gpu_request({"spec": ps["template"].get("spec", {})})
        for ps in wl["spec"].get("podSets") or []
    )


# A PodSet asks for Topology Aware Scheduling with one of these annotations on its pod template
# (kubernetes-sigs/kueue@v0.19.2 site/.../concepts/topology_aware_scheduling.md).
TAS_ANNOTATIONS = ("kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology")


def assignment(ps: Obj, nodes: list[Obj]) -> Obj:
    """A PodSet's admission: its flavor, and for a TAS PodSet a ``topologyAssignment`` at the level it
    asked for (one domain: the first node's value of that label; the stand-in does not pack pods)."""
    out: Obj = {"name": ps["name"], "count": ps["count"], "flavors": {GPU: "default-flavor"}}
    annotations = ((ps.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    level = next((annotations[a] for a in TAS_ANNOTATIONS if annotations.get(a)), None)
    if level:
        values = sorted(v for n in nodes if (v := (meta(n).get("labels") or {}).get(level)))
        out["topologyAssignment"] = {
            "levels": [level],
            "domains": [{"values": values[:1], "count": ps["count"]}],
        }
    return out


def admit(wl: Obj, now: str, nodes: list[Obj] | None = None) -> None:
    """``SetQuotaReservation`` + Admitted; a previous Evicted condition is reset (workload.go)."""
    status = wl["status"]
    status["admission"] = {
        "clusterQueue": CLUSTER_QUEUE,
        "podSetAssignments": [assignment(ps, nodes or []) for ps in wl["spec"]["podSets"]],
    }
    set_cond(
        wl, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}", now
    )
    set_cond(wl, "Admitted", "True", "Admitted", "The workload is admitted", now)
    evicted = find_cond(wl, "Evicted")
    if evicted is not None and evicted["status"] == "True":
        set_cond(wl, "Evicted", "False", "QuotaReserved", "Previously: " + evicted["message"], now)


def pdb_status(store: Store, pdb: Obj) -> Obj:
    """What the disruption controller computes for a PDB (pods matching its selector in its namespace)."""
    spec = pdb.get("spec") or {}
    pods = [
        p
        for p in store.list("Pod", meta(pdb)["namespace"])
        if spec.get("selector") is not None
        and selector_matches(spec["selector"], meta(p).get("labels"))
        and not is_terminal(p)
    ]
    expected = len(pods)
    healthy = sum(1 for p in pods if not meta(p).get("deletionTimestamp") and cond_true(p, "Ready"))
    if "minAvailable" in spec:
        desired = scaled(spec["minAvailable"], expected)
    elif "maxUnavailable" in spec:
        desired = max(0, expected - scaled(spec["maxUnavailable"], expected))
    else:
        desired = expected
    allowed = max(0, healthy - desired)
    cond_ok = ("True", "SufficientPods", "") if allowed else ("False", "InsufficientPods", "")
    status: Obj = {
        "observedGeneration": meta(pdb).get("generation", 1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": allowed,
        "conditions": (pdb.get("status") or {}).get("conditions") or [],
    }
    holder = {"status": status}
    set_cond(holder, "DisruptionAllowed", *cond_ok, store.wall())
    return status


def scaled(value: Any, total: int) -> int:
    """An int, or a percentage of ``total`` rounded up (``intstr.GetScaledValueFromIntOrPercent``)."""
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * total // 100)
    return int(value)


# --- the kubelet's container runtime, for pods that name a command ----------------------------------
def exit_code(returncode: int) -> int:
    """A process status as a container runtime reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class ContainerRunner:
    """Runs the containers of pods bound to a node as local processes, in place of a container runtime.

    The rule: a container whose ``command`` names a program found on this machine runs it with its
    ``args``; the image is not pulled, not looked at. Init containers run one after the other, each to
    exit 0 (restartPolicy Never: one that fails fails the pod); then the main containers run side by
    side and the pod goes Running; when they have all exited it is Succeeded (all 0) or Failed, each
    container ``terminated`` with its exit code. A program that cannot be found ends its container
    with exit code 128, reason ``StartError``, as containerd does. A pod deleted, or ended by its node
    going down, has its processes stopped (SIGTERM to the process group, then SIGKILL after
    ``kill_after_s``).

    Each process gets the container's ``env`` values plus ``env`` given here (what the fake's kubelet
    passes to every process, e.g. PATH, PYTHONPATH and PITSTOP_GPU_STATE), ``PITSTOP_NODE`` = the node's
    name and ``HOSTNAME`` = the pod's hostname. stdout and stderr together are the container's log,
    readable while it runs (``log``), gone with the pod.
    """

    def __init__(self, store: Store, env: Mapping[str, str] | None = None, kill_after_s: float = 2.0) -> None:
        self.store, self.env, self.kill_after_s = store, dict(env or {}), kill_after_s
        self._logs: dict[tuple[str, str], bytearray] = {}  # (pod uid, container) -> output so far
        self._procs: dict[str, list[subprocess.Popen[bytes]]] = {}  # pod uid -> its live processes
        self._threads: dict[str, threading.Thread] = {}
        self._stopping: dict[str, float] = {}  # pod uid -> when SIGTERM was sent
        self._lock = threading.Lock()

    @staticmethod
    def runnable(pod: Obj) -> bool:
        """Whether every container of the pod names a command (else the pod is left to "run" forever)."""
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        return bool(containers) and all(
            isinstance(c.get("command"), list)
            and c["command"]
            and all(isinstance(w, str) for w in c["command"])
            for c in containers
        )

    def start(self, pod: Obj, node: str) -> None:
        uid = meta(pod)["uid"]
        with self._lock:
            if uid in self._threads:
                return
            t = threading.Thread(
                target=self._run, args=(copy.deepcopy(pod), node), name=f"kubelet {uid}", daemon=True
            )
            self._threads[uid] = t
        t.start()

    def log(self, uid: str, container: str) -> bytes | None:
        """What the container printed so far; None if it never started."""
        with self._lock:
            buf = self._logs.get((uid, container))
            return bytes(buf) if buf is not None else None

    def reap(self) -> None:
        """Signal the processes of pods that are deleted, ended by someone else, or gone (never waits)."""
        with self._lock:
            uids = list(self._procs)
        live = {meta(p)["uid"]: p for p in self.store.list("Pod")}
        for uid in uids:
            pod = live.get(uid)
            if pod is None or meta(pod).get("deletionTimestamp") or is_terminal(pod):
                self._stop(uid)
        with self._lock:  # logs of pods that are gone go with them
            for key in [k for k in self._logs if k[0] not in live]:
                del self._logs[key]

    def close(self) -> None:
        with self._lock:
            uids, threads = list(self._procs), list(self._threads.values())
        for uid in uids:
            self._stop(uid, force=True)
        for t in threads:
            t.join(timeout=5)

    def _stop(self, uid: str, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            procs = list(self._procs.get(uid, []))
            first = self._stopping.setdefault(uid, now)
        sig = signal.SIGKILL if force or now - first >= self.kill_after_s else signal.SIGTERM
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    # --- one pod ---------------------------------------------------------------------------------
    def _env(self, pod: Obj, node: str, container: Obj) -> dict[str, str]:
        env = dict(self.env)
        state = env.get("PITSTOP_GPU_STATE", "")
        if state and not state.lstrip().startswith("{") and not os.path.exists(state):
            env.pop("PITSTOP_GPU_STATE")  # no state file yet: every node is healthy
        for e in container.get("env") or []:
            if isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("value"), str):
                env[e["name"]] = e["value"]
        env["PITSTOP_NODE"] = node
        env["HOSTNAME"] = str(pod["spec"].get("hostname") or meta(pod)["name"])
        return env

    def _exec(self, pod: Obj, node: str, container: Obj, workdir: str) -> int:
        """Run one container to its end; its exit code (128 when the program cannot be started)."""
        uid, name = meta(pod)["uid"], str(container.get("name"))
        argv = [*container["command"], *[str(a) for a in container.get("args") or []]]
        buf = bytearray()
        with self._lock:
            self._logs[(uid, name)] = buf
            if uid in self._stopping:
                return 137
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(pod, node, container),
                cwd=workdir,
                start_new_session=True,
            )
        except OSError as exc:
            with self._lock:
                buf += f"exec {argv[0]!r}: {exc.strerror}\n".encode()
            return 128
        with self._lock:
            self._procs.setdefault(uid, []).append(proc)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            with self._lock:
                buf += chunk
        proc.stdout.close()
        return exit_code(proc.wait())

    def _run(self, pod: Obj, node: str) -> None:
        m, spec = meta(pod), pod["spec"]
        uid, ns, name = m["uid"], m["namespace"], m["name"]
        workdir = tempfile.mkdtemp(prefix="pitstop-kubelet-")
        try:
            for c in spec.get("initContainers") or []:
                self._update(ns, name, uid, container_running(c, self.store.wall(), init=True))
                code = self._exec(pod, node, c, workdir)
                self._update(ns, name, uid, container_ended(c, code, init=True))
                if code != 0:
                    self._update(ns, name, uid, pod_ended({}, self.store.wall(), str(c.get("name"))))
                    return
            mains = spec.get("containers") or []
            self._update(ns, name, uid, lambda p: start_pod(p, self.store.wall()))
            codes: dict[str, int] = {}

            def one(c: Obj) -> None:
                codes[str(c.get("name"))] = self._exec(pod, node, c, workdir)

            threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in mains]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self._update(ns, name, uid, pod_ended(codes, self.store.wall()))
        finally:
            with self._lock:
                self._procs.pop(uid, None)
                self._stopping.pop(uid, None)
                self._threads.pop(uid, None)
            shutil.rmtree(workdir, ignore_errors=True)

    def _update(self, ns: str, name: str, uid: str, fn: Callable[[Obj], None]) -> None:
        """Change the pod's status unless it was replaced or has already ended (node down, deletion)."""

        def guarded(p: Obj) -> None:
            if meta(p).get("uid") == uid and not is_terminal(p):
                fn(p)

        with contextlib.suppress(ApiError):
            self.store.mutate("Pod", name, ns, guarded)


def container_running(c: Obj, now: str, *, init: bool) -> Callable[[Obj], None]:
    key = "initContainerStatuses" if init else "containerStatuses"

    def edit(pod: Obj) -> None:
        statuses = [s for s in pod["status"].get(key) or [] if s.get("name") != c.get("name")]
        statuses.append(
            {
                "name": c.get("name"),
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
        )
        pod["status"][key] = statuses

    return edit


def container_ended(c: Obj, code: int, *, init: bool) -> Callable[[Obj], None]:
    key = "initContainerStatuses" if init else "containerStatuses"

    def edit(pod: Obj) -> None:
        for s in pod["status"].get(key) or []:
            if s.get("name") == c.get("name"):
                started = (s.get("state") or {}).get("running", {}).get("startedAt")
                reason = "Completed" if code == 0 else "StartError" if code == 128 else "Error"
                s.update(ready=init and code == 0, started=False)
                s["state"] = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started}}

    return edit


def pod_ended(codes: Mapping[str, int], now: str, failed_init: str | None = None) -> Callable[[Obj], None]:
    """Every main container exited (``codes``), or an init container failed: the pod's final phase."""

    def edit(pod: Obj) -> None:
        for name, code in codes.items():
            container_ended({"name": name}, code, init=False)(pod)
        ok = failed_init is None and all(code == 0 for code in codes.values())
        pod["status"]["phase"] = "Succeeded" if ok else "Failed"
        set_cond(pod, "Ready", "False", "PodCompleted", "", now)
        if failed_init is not None:
            msg = f"containers with incomplete status: [{failed_init}]"
            set_cond(pod, "Initialized", "False", "ContainersNotInitialized", msg, now)

    return edit
