"""Kubernetes objects as GKE and its controllers write them, read without I/O.

Names Pitstop writes and reads on nodes, pods, JobSets and Kueue Workloads; job ids and their
validation (every name is checked against DNS-1123 before it reaches a URL or a selector); and
the readings the adapter's decisions rest on: a JobSet's or Job's state, a pod's owner and run,
a node's health and fence, whether a pod template fits a node. reference/gke.md §2-§4.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.shapes import KubeObject, NodeAnswer
from pitstop.core.scheduling import JobState

# -- names Pitstop writes and reads -----------------------------------------------------------
FENCE_KEY = "pitstop.dev/remediation"  # taint key and node label; value: the incident id
WAS_UNSCHEDULABLE = "pitstop.dev/was-unschedulable"  # node annotation: "true" | "false"
CORDONED_BY = "pitstop.dev/cordoned-by"  # node annotation: the incident whose fence set the cordon
TAINTS_BEFORE = "pitstop.dev/taints-before"  # node annotation: other taint keys when Pitstop fenced
REQUEUED_FOR = "pitstop.dev/requeued-for"  # Workload annotation: the ctx of Pitstop's deactivation
MOVED_FOR = "pitstop.dev/moved-for"  # JobSet annotation: the step key of the move Pitstop placed (pin.py)
PINNED = "pitstop.dev/pinned"  # JobSet annotation: the topology selector that move added (``k=v,k=v``)
GPU_RESOURCE = "nvidia.com/gpu"
XID_CONDITION = "XidCriticalError"  # set by GKE's GPU device plugin (reference/gke.md §2)
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
# GKE's own word on host maintenance of GPU nodes (GKE >= 1.31.1-gke.2008000; reference/gke.md §5).
MAINTENANCE_ONGOING_LABEL = "cloud.google.com/active-node-maintenance"  # "ONGOING" while it runs
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUEUE_GROUP, KUEUE_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A PodSet asks Kueue for Topology Aware Scheduling with one of these annotations on its pod
# template; the admitted Workload then carries a ``topologyAssignment`` per PodSet
# (kubernetes-sigs/kueue@v0.19.2 site/.../concepts/topology_aware_scheduling.md).
TAS_ANNOTATIONS = ("kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology")

JOB_KINDS = ("jobset", "job", "pod")
DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)
INCIDENT = re.compile(r"i[a-z2-7]{9}", re.ASCII)
PDB_IN_MESSAGE = re.compile(r"disruption budget ([a-z0-9][-a-z0-9.]{0,252})", re.ASCII)
TERMINAL_PHASES = ("Succeeded", "Failed")
CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class JobRef:
    """One job Pitstop tracks on GKE: its kind (jobset | job | pod), namespace and name."""

    kind: str
    namespace: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def valid_namespace(s: object) -> bool:
    return isinstance(s, str) and DNS_LABEL.fullmatch(s) is not None


def valid_object_name(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 253 and DNS_SUBDOMAIN.fullmatch(s) is not None


def parse_job_id(job: str) -> JobRef:
    """``kind/namespace/name`` checked part by part; a 400 for anything else (it reaches URLs)."""
    parts = job.split("/") if isinstance(job, str) else []
    if len(parts) != 3 or parts[0] not in JOB_KINDS:
        raise ActuatorError(400, f"not a GKE job id (kind/namespace/name): {str(job)[:100]!r}", False)
    if not valid_namespace(parts[1]) or not valid_object_name(parts[2]):
        raise ActuatorError(400, f"GKE job id has an invalid namespace or name: {job[:300]!r}", False)
    return JobRef(*parts)


# -- checked accessors: a field of the wrong type reads as absent --------------------------------

EMPTY: KubeObject = {}


def as_object(v: object) -> KubeObject:
    """``v`` if it is a JSON object, else an empty one."""
    return v if isinstance(v, Mapping) else EMPTY


def sub(obj: KubeObject, key: str) -> KubeObject:
    """The object at ``key``; empty when it is absent or not an object."""
    return as_object(obj.get(key))


def subs(obj: KubeObject, key: str) -> list[KubeObject]:
    """The objects in the list at ``key``; entries that are not objects are left out."""
    v = obj.get(key)
    return [i for i in v if isinstance(i, Mapping)] if isinstance(v, list) else []


def text(obj: KubeObject, key: str) -> str | None:
    """The string at ``key``; None when it is absent or not a string."""
    v = obj.get(key)
    return v if isinstance(v, str) else None


def whole(obj: KubeObject, key: str) -> int | None:
    """The integer at ``key`` (not a bool); None when it is absent or not one."""
    v = obj.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# -- pure reading of API objects ----------------------------------------------------------------


def meta_of(obj: KubeObject) -> KubeObject:
    return sub(obj, "metadata")


def name_of(obj: KubeObject) -> str | None:
    return text(meta_of(obj), "name")


def labels_of(obj: KubeObject) -> KubeObject:
    return sub(meta_of(obj), "labels")


def annotations_of(obj: KubeObject) -> KubeObject:
    return sub(meta_of(obj), "annotations")


def spec_of(obj: KubeObject) -> KubeObject:
    return sub(obj, "spec")


def status_of(obj: KubeObject) -> KubeObject:
    return sub(obj, "status")


def condition_true(obj: KubeObject, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in subs(status_of(obj), "conditions")
    )


def restarts_of(js: KubeObject) -> int:
    r = whole(status_of(js), "restarts")
    return r if r is not None and r >= 0 else 0


def attempt_of(pod: KubeObject) -> int | None:
    """The JobSet restart attempt a pod belongs to (its label), if it says one."""
    raw = labels_of(pod).get(RESTART_ATTEMPT_LABEL)
    return int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) < 10 else None


def live(pod: KubeObject) -> bool:
    """A pod that still runs or may run (terminating pods still run their checkpoint)."""
    return status_of(pod).get("phase") not in TERMINAL_PHASES


def node_name_of(pod: KubeObject) -> str | None:
    """The node a pod is bound to (None before the scheduler placed it)."""
    return text(spec_of(pod), "nodeName")


def owner_ref(pod: KubeObject) -> JobRef | None:
    """The job a pod belongs to: its JobSet, else its controlling Job, else the pod itself.

    None for pods that are no job (DaemonSet and static mirror pods: node agents) and for
    names that fail validation (they never reach a URL).
    """
    meta, labels = meta_of(pod), labels_of(pod)
    ns, name = meta.get("namespace"), meta.get("name")
    if "kubernetes.io/config.mirror" in annotations_of(pod):
        return None
    owners = [o for o in subs(meta, "ownerReferences") if o.get("controller")]
    if any(o.get("kind") == "DaemonSet" for o in owners):
        return None
    ref: JobRef | None = None
    if JOBSET_NAME_LABEL in labels:
        ref = JobRef("jobset", str(ns), str(labels[JOBSET_NAME_LABEL]))
    elif any(o.get("kind") == "Job" for o in owners):
        ref = JobRef("job", str(ns), str(next(o for o in owners if o.get("kind") == "Job").get("name")))
    else:
        ref = JobRef("pod", str(ns), str(name))
    return ref if valid_namespace(ref.namespace) and valid_object_name(ref.name) else None


# What Kubernetes says about a job, as the scheduler contract's JobState (core/scheduling.py). A
# terminal condition decides first, in this order (JobSet: kubernetes-sigs/jobset@v0.12.0
# api/jobset/v1alpha2/jobset_types.go JobSetConditionType; batch Job: kubernetes.io/docs/concepts/
# workloads/controllers/job/#terminal-job-conditions, "Complete" / "Failed").
Ended = tuple[tuple[str, JobState], ...]  # (condition type, what it means): the first true one wins
JOBSET_ENDED: Ended = (("Completed", JobState.COMPLETED), ("Failed", JobState.FAILED))
JOB_ENDED: Ended = (("Complete", JobState.COMPLETED), ("Failed", JobState.FAILED))
# A pod's phase (kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase); any other
# word, "Unknown" included, is UNKNOWN.
POD_STATES: Mapping[str, JobState] = {
    "Pending": JobState.PENDING,
    "Running": JobState.RUNNING,
    "Succeeded": JobState.COMPLETED,
    "Failed": JobState.FAILED,
    "Unknown": JobState.UNKNOWN,
}


def _ended(obj: KubeObject, table: Ended) -> JobState | None:
    return next((state for ctype, state in table if condition_true(obj, ctype)), None)


def _held(obj: KubeObject) -> JobState:
    """A suspended job: waiting for Kueue to admit it again (PENDING), or stopped in place by someone."""
    return JobState.PENDING if KUEUE_QUEUE_LABEL in labels_of(obj) else JobState.SUSPENDED


def jobset_state(js: KubeObject, pods: Iterable[KubeObject]) -> JobState:
    """A JobSet's state from its conditions, suspend flag and pods."""
    ended = _ended(js, JOBSET_ENDED)
    if ended is not None:
        return ended
    if spec_of(js).get("suspend") or condition_true(js, "Suspended"):
        return _held(js)
    phases = [status_of(p).get("phase") for p in pods if live(p)]
    if "Running" in phases or condition_true(js, "RestartingJobSet"):
        return JobState.RUNNING
    return JobState.PENDING


def batch_job_state(job: KubeObject) -> JobState:
    ended = _ended(job, JOB_ENDED)
    if ended is not None:
        return ended
    if spec_of(job).get("suspend"):
        return _held(job)
    return JobState.RUNNING if (whole(status_of(job), "active") or 0) > 0 else JobState.PENDING


def pod_state(pod: KubeObject) -> JobState:
    return POD_STATES.get(str(status_of(pod).get("phase")), JobState.UNKNOWN)


def restart_blockers(js: KubeObject) -> list[str]:
    """Why this JobSet's template cannot restart its gang after a disruption (empty if it can).

    No failure policy: a failed child Job fails the JobSet. ``Ignore`` on DisruptionTarget: an
    evicted pod is replaced alone and the Job never fails (reference/gke.md §3).
    """
    why: list[str] = []
    policy = spec_of(js).get("failurePolicy")
    if not isinstance(policy, Mapping):
        why.append("no failurePolicy: a failed child Job fails the whole JobSet instead of restarting it")
    else:
        rules = subs(policy, "rules")
        ignores_max = any(str(r.get("action", "")).endswith("IgnoreMaxRestarts") for r in rules)
        if not policy.get("maxRestarts") and not ignores_max:
            why.append("failurePolicy.maxRestarts is 0 and no rule ignores it: the first restart fails it")
    for rj in subs(spec_of(js), "replicatedJobs"):
        job_spec = spec_of(sub(rj, "template"))
        for rule in subs(sub(job_spec, "podFailurePolicy"), "rules"):
            conds = [c.get("type") for c in subs(rule, "onPodConditions")]
            if rule.get("action") == "Ignore" and "DisruptionTarget" in conds:
                why.append(
                    f"replicatedJob {rj.get('name')}: podFailurePolicy Ignore on DisruptionTarget: an "
                    "evicted pod is replaced alone, the gang is never restarted"
                )
    return why


def node_health(node: KubeObject) -> tuple[bool, str]:
    """(healthy, why not): Ready, every GPU allocatable, no XidCriticalError from the device plugin,
    and GKE not in the middle of maintaining or terminating it (a Ready node can still be either)."""
    if not condition_true(node, "Ready"):
        return False, "node is not Ready"
    if condition_true(node, XID_CONDITION):
        return False, f"{XID_CONDITION} is True"
    if labels_of(node).get(MAINTENANCE_ONGOING_LABEL) == "ONGOING":
        return False, f"GKE reports host maintenance in progress ({MAINTENANCE_ONGOING_LABEL}=ONGOING)"
    if any(t.get("key") == TERMINATION_TAINT for t in subs(spec_of(node), "taints")):
        return False, f"GKE is about to terminate the node ({TERMINATION_TAINT})"
    st = status_of(node)
    cap = sub(st, "capacity").get(GPU_RESOURCE)
    alloc = sub(st, "allocatable").get(GPU_RESOURCE)
    if cap is None:
        if GKE_ACCELERATOR_LABEL in labels_of(node):
            return False, f"GPU node reports no {GPU_RESOURCE} capacity yet (device plugin not registered)"
        return True, ""
    if str(alloc) != str(cap):
        return False, f"{GPU_RESOURCE} allocatable {alloc} != capacity {cap}"
    return True, ""


def other_cordon_reason(node: KubeObject) -> str:
    """What a person reads about a cordon Pitstop did not set (Kubernetes keeps no reason)."""
    taints = [
        f"{t.get('key')}{'=' + str(t['value']) if t.get('value') else ''}:{t.get('effect')}"
        for t in subs(spec_of(node), "taints")
        if t.get("key") != FENCE_KEY
    ]
    return "cordoned (spec.unschedulable) by someone else" + (
        f"; taints: {', '.join(taints)}" if taints else ""
    )


def refence_answer(node: str, cur: KubeObject, ours: KubeObject, incident: str) -> NodeAnswer:
    """Fence's answer for a node that already carries Pitstop's taint: the same answer a retry of
    this incident's fence gave the first time, or another incident's fence, left alone."""
    if ours.get("value") != incident:
        return {
            "node": node,
            "previous_state": "cordoned",
            "previous_reason": f"{FENCE_KEY}={ours.get('value')} (another Pitstop incident's fence)",
            "already_drained_by_other": True,
            "reason": None,
        }
    was = annotations_of(cur).get(WAS_UNSCHEDULABLE) != "false"
    return {
        "node": node,
        "previous_state": "cordoned" if was else "schedulable",
        "previous_reason": other_cordon_reason(cur) if was else None,
        "already_drained_by_other": was,
        "reason": f"{FENCE_KEY}={incident}:NoSchedule",
    }


def pdb_names(body: KubeObject) -> list[str]:
    """The budget names a 429 eviction answer gives in its causes or message."""
    texts = [str(body.get("message") or "")]
    texts += [str(c.get("message") or "") for c in subs(sub(body, "details"), "causes")]
    return sorted({m.group(1) for t in texts for m in PDB_IN_MESSAGE.finditer(t[:2000])})


def selector_matches(selector: KubeObject, labels: KubeObject) -> bool:
    """matchLabels and the In/NotIn/Exists/DoesNotExist expressions of a label selector."""
    if any(labels.get(k) != v for k, v in sub(selector, "matchLabels").items()):
        return False
    for e in subs(selector, "matchExpressions"):
        key, op, raw = e.get("key"), e.get("operator"), e.get("values")
        values = raw if isinstance(raw, list) else []
        if not isinstance(key, str):
            return False  # a selector without a key matches nothing
        present = key in labels
        ok = (
            (op == "In" and present and labels[key] in values)
            or (op == "NotIn" and (not present or labels[key] not in values))
            or (op == "Exists" and present)
            or (op == "DoesNotExist" and not present)
        )
        if not ok:
            return False
    return True


def tolerates(tolerations: Iterable[KubeObject], taint: KubeObject) -> bool:
    """Whether a pod's tolerations cover one taint (key, operator Equal/Exists, effect)."""
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and str(tol.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def pod_gpus(pod_spec: KubeObject) -> int:
    """The ``nvidia.com/gpu`` a pod spec asks for (its containers' limits, else requests)."""
    total = 0
    for c in subs(pod_spec, "containers"):
        res = sub(c, "resources")
        raw = sub(res, "limits").get(GPU_RESOURCE) or sub(res, "requests").get(GPU_RESOURCE)
        total += count_of(raw)
    return total


def count_of(raw: object) -> int:
    """A resource quantity that is a plain count ("8", 8); 0 for anything else."""
    text = str(raw if raw is not None else "")
    return int(text) if text.isdigit() and len(text) < 6 else 0


def allocatable_gpus(node: KubeObject) -> int:
    return count_of(sub(status_of(node), "allocatable").get(GPU_RESOURCE))


def pods_per_job(job_spec: KubeObject) -> int:
    par, comp = job_spec.get("parallelism", 1), job_spec.get("completions")
    par = par if isinstance(par, int) and par >= 0 else 1
    return min(par, comp) if isinstance(comp, int) and comp >= 0 else par


def fenced_by_pitstop(node: KubeObject) -> bool:
    return any(t.get("key") == FENCE_KEY for t in subs(spec_of(node), "taints"))


def out_of_service(node: KubeObject) -> str | None:
    """Why a node cannot run its pods again when the gang restarts (cordoned, any Pitstop fence,
    unhealthy, NotReady), else None: the Slurm agent's drained/down members, read from the Node."""
    if fenced_by_pitstop(node):
        return "fenced by Pitstop"
    if spec_of(node).get("unschedulable"):
        return "cordoned"
    healthy, why = node_health(node)
    return None if healthy else why


def placeable(node: KubeObject, pod_spec: KubeObject) -> bool:
    """A node the scheduler may place this pod template on: Ready, healthy, schedulable, not fenced
    by Pitstop, every NoSchedule/NoExecute taint tolerated, its nodeSelector matched."""
    if out_of_service(node) is not None:
        return False
    tolerations = subs(pod_spec, "tolerations")
    for t in subs(spec_of(node), "taints"):
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t):
            return False
    labels = labels_of(node)
    return all(labels.get(k) == v for k, v in sub(pod_spec, "nodeSelector").items())


def tas_admitted(wl: KubeObject | None) -> bool:
    """Whether Kueue admitted the Workload with a topology assignment (Topology Aware Scheduling)."""
    admission = sub(status_of(wl or {}), "admission")
    return any(isinstance(a.get("topologyAssignment"), dict) for a in subs(admission, "podSetAssignments"))
