"""GKE as a scheduler: the Kubernetes API through the official ``kubernetes`` client.

What each operation does to the cluster (reference/gke.md §2-§4, issue 13):

* **fence** cordons the node and adds the taint ``pitstop.dev/remediation=<incident>:NoSchedule``
  and a label of the same key (so later steps find the node by incident). Whether the node was
  already cordoned is kept in the annotation ``pitstop.dev/was-unschedulable``, written in the
  same patch, so **unfence** lifts only what Pitstop set: its own taint, and the cordon only if
  the node was schedulable before. Every node change is a read-modify-write guarded by
  ``metadata.resourceVersion`` (the taint list is replaced whole) and retried on 409.
* **checkpoint** evicts the job's pods on the fenced node through the Eviction API: each pod
  gets its own termination grace period (SIGTERM is Kubernetes' checkpoint signal) and
  PodDisruptionBudgets are honoured (429 retried with backoff until a deadline, then the error
  names the budget).
* **requeue** restarts a gang once. A JobSet with a failure policy: one pod of the current
  restart attempt is evicted (with a ``uid`` precondition), so the JobSet controller recreates
  every Job once; once ``status.restarts`` moved, every older pod is "previous" and evicting it
  cannot restart the gang again. A Kueue-admitted JobSet without a failure policy: its Workload
  is deactivated, then reactivated once Kueue evicted it. Anything else: its pods on the fenced
  node are evicted, and the answer tells the owner that nothing restarts it.

Job ids are ``jobset/<namespace>/<name>``, ``job/<namespace>/<name>`` or ``pod/<namespace>/<name>``;
every name is checked (DNS-1123) before it reaches a URL or a selector. Job states use the
Slurm words actuate already compares (RUNNING, PENDING, SUSPENDED, COMPLETED, FAILED, UNKNOWN).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError

# -- names Pitstop writes and reads -----------------------------------------------------------
FENCE_KEY = "pitstop.dev/remediation"  # taint key and node label; value: the incident id
WAS_UNSCHEDULABLE = "pitstop.dev/was-unschedulable"  # node annotation: "true" | "false"
REQUEUED_FOR = "pitstop.dev/requeued-for"  # Workload annotation: the ctx of Pitstop's deactivation
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

JOB_KINDS = ("jobset", "job", "pod")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)
_INCIDENT = re.compile(r"i[a-z2-7]{9}", re.ASCII)
_PDB_IN_MESSAGE = re.compile(r"disruption budget ([a-z0-9][-a-z0-9.]{0,252})", re.ASCII)
_TERMINAL_PHASES = ("Succeeded", "Failed")
_CONFLICT_RETRIES = 5
DEFAULT_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds for one API call


class KubeApiError(ActuatorError):
    """A Kubernetes API answer other than 2xx: its status, its Status reason and message."""

    def __init__(self, status: int, what: str, body: Mapping[str, Any]) -> None:
        self.reason = str(body.get("reason") or "")
        self.detail = str(body.get("message") or "")[:300]
        self.body = dict(body)
        retryable = status in (409, 429) or status >= 500
        hint = " (check the actuator's Kubernetes RBAC: infra/gke/clusterrole.yaml)" if status == 403 else ""
        code = status if 400 <= status < 600 else 503
        super().__init__(code, f"{what}: {status} {self.reason} {self.detail}{hint}".strip(), retryable)


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
    return isinstance(s, str) and _DNS_LABEL.fullmatch(s) is not None


def valid_object_name(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 253 and _DNS_SUBDOMAIN.fullmatch(s) is not None


def parse_job_id(job: str) -> JobRef:
    """``kind/namespace/name`` checked part by part; a 400 for anything else (it reaches URLs)."""
    parts = job.split("/") if isinstance(job, str) else []
    if len(parts) != 3 or parts[0] not in JOB_KINDS:
        raise ActuatorError(400, f"not a GKE job id (kind/namespace/name): {str(job)[:100]!r}", False)
    if not valid_namespace(parts[1]) or not valid_object_name(parts[2]):
        raise ActuatorError(400, f"GKE job id has an invalid namespace or name: {job[:300]!r}", False)
    return JobRef(*parts)


def incident_of(ctx: str) -> str | None:
    """The incident a step context (``<incident>-<step>``) belongs to; None if it names none."""
    iid = ctx.rsplit("-", 1)[0] if isinstance(ctx, str) else ""
    return iid if _INCIDENT.fullmatch(iid) else None


# -- pure reading of API objects ----------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    v = _meta(obj).get("labels")
    return v if isinstance(v, dict) else {}


def _annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
    v = _meta(obj).get("annotations")
    return v if isinstance(v, dict) else {}


def _spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    v = obj.get("spec")
    return v if isinstance(v, dict) else {}


def _status(obj: Mapping[str, Any]) -> dict[str, Any]:
    v = obj.get("status")
    return v if isinstance(v, dict) else {}


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    conds = _status(obj).get("conditions")
    return any(
        isinstance(c, dict) and c.get("type") == ctype and c.get("status") == "True"
        for c in (conds if isinstance(conds, list) else [])
    )


def _restarts(js: Mapping[str, Any]) -> int:
    r = _status(js).get("restarts")
    return r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else 0


def _attempt(pod: Mapping[str, Any]) -> int | None:
    """The JobSet restart attempt a pod belongs to (its label), if it says one."""
    raw = _labels(pod).get(RESTART_ATTEMPT_LABEL)
    return int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) < 10 else None


def _live(pod: Mapping[str, Any]) -> bool:
    """A pod that still runs or may run (terminating pods still run their checkpoint)."""
    return _status(pod).get("phase") not in _TERMINAL_PHASES


def owner_ref(pod: Mapping[str, Any]) -> JobRef | None:
    """The job a pod belongs to: its JobSet, else its controlling Job, else the pod itself.

    None for pods that are no job (DaemonSet and static mirror pods: node agents) and for
    names that fail validation (they never reach a URL).
    """
    meta, labels = _meta(pod), _labels(pod)
    ns, name = meta.get("namespace"), meta.get("name")
    if "kubernetes.io/config.mirror" in _annotations(pod):
        return None
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("controller")]
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


def jobset_state(js: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str:
    """A JobSet's state in the words actuate compares, from its conditions, suspend flag and pods."""
    if condition_true(js, "Completed"):
        return "COMPLETED"
    if condition_true(js, "Failed"):
        return "FAILED"
    if _spec(js).get("suspend") or condition_true(js, "Suspended"):
        return "PENDING" if KUEUE_QUEUE_LABEL in _labels(js) else "SUSPENDED"
    phases = [_status(p).get("phase") for p in pods if _live(p)]
    if "Running" in phases or condition_true(js, "RestartingJobSet"):
        return "RUNNING"
    return "PENDING"


def _job_state(job: Mapping[str, Any]) -> str:
    if condition_true(job, "Complete"):
        return "COMPLETED"
    if condition_true(job, "Failed"):
        return "FAILED"
    if _spec(job).get("suspend"):
        return "PENDING" if KUEUE_QUEUE_LABEL in _labels(job) else "SUSPENDED"
    return "RUNNING" if (_status(job).get("active") or 0) > 0 else "PENDING"


_POD_STATES = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "COMPLETED", "Failed": "FAILED"}


def restart_blockers(js: Mapping[str, Any]) -> list[str]:
    """Why this JobSet's template cannot restart its gang after a disruption (empty if it can).

    No failure policy: a failed child Job fails the JobSet. ``Ignore`` on DisruptionTarget: an
    evicted pod is replaced alone and the Job never fails (reference/gke.md §3).
    """
    why: list[str] = []
    policy = _spec(js).get("failurePolicy")
    if not isinstance(policy, dict):
        why.append("no failurePolicy: a failed child Job fails the whole JobSet instead of restarting it")
    else:
        rules = [r for r in policy.get("rules") or [] if isinstance(r, dict)]
        ignores_max = any(str(r.get("action", "")).endswith("IgnoreMaxRestarts") for r in rules)
        if not policy.get("maxRestarts") and not ignores_max:
            why.append("failurePolicy.maxRestarts is 0 and no rule ignores it: the first restart fails it")
    for rj in _spec(js).get("replicatedJobs") or []:
        if not isinstance(rj, dict):
            continue
        job_spec = _spec(rj.get("template") or {})
        rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
        for rule in rules:
            conds = [c.get("type") for c in rule.get("onPodConditions") or [] if isinstance(c, dict)]
            if rule.get("action") == "Ignore" and "DisruptionTarget" in conds:
                why.append(
                    f"replicatedJob {rj.get('name')}: podFailurePolicy Ignore on DisruptionTarget: an "
                    "evicted pod is replaced alone, the gang is never restarted"
                )
    return why


def node_health(node: Mapping[str, Any]) -> tuple[bool, str]:
    """(healthy, why not): Ready, every GPU allocatable, no XidCriticalError from the device plugin,
    and GKE not in the middle of maintaining or terminating it (a Ready node can still be either)."""
    if not condition_true(node, "Ready"):
        return False, "node is not Ready"
    if condition_true(node, XID_CONDITION):
        return False, f"{XID_CONDITION} is True"
    if _labels(node).get(MAINTENANCE_ONGOING_LABEL) == "ONGOING":
        return False, f"GKE reports host maintenance in progress ({MAINTENANCE_ONGOING_LABEL}=ONGOING)"
    taints = _spec(node).get("taints") or []
    if any(isinstance(t, Mapping) and t.get("key") == TERMINATION_TAINT for t in taints):
        return False, f"GKE is about to terminate the node ({TERMINATION_TAINT})"
    st = _status(node)
    cap = (st.get("capacity") or {}).get(GPU_RESOURCE)
    alloc = (st.get("allocatable") or {}).get(GPU_RESOURCE)
    if cap is None:
        if GKE_ACCELERATOR_LABEL in _labels(node):
            return False, f"GPU node reports no {GPU_RESOURCE} capacity yet (device plugin not registered)"
        return True, ""
    if str(alloc) != str(cap):
        return False, f"{GPU_RESOURCE} allocatable {alloc} != capacity {cap}"
    return True, ""


def _other_cordon_reason(node: Mapping[str, Any]) -> str:
    """What a person reads about a cordon Pitstop did not set (Kubernetes keeps no reason)."""
    taints = [
        f"{t.get('key')}{'=' + str(t['value']) if t.get('value') else ''}:{t.get('effect')}"
        for t in _spec(node).get("taints") or []
        if isinstance(t, dict) and t.get("key") != FENCE_KEY
    ]
    return "cordoned (spec.unschedulable) by someone else" + (
        f"; taints: {', '.join(taints)}" if taints else ""
    )


def _refence_answer(
    node: str, cur: Mapping[str, Any], ours: Mapping[str, Any], incident: str
) -> dict[str, Any]:
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
    was = _annotations(cur).get(WAS_UNSCHEDULABLE) != "false"
    return {
        "node": node,
        "previous_state": "cordoned" if was else "schedulable",
        "previous_reason": _other_cordon_reason(cur) if was else None,
        "already_drained_by_other": was,
        "reason": f"{FENCE_KEY}={incident}:NoSchedule",
    }


def pdb_names(body: Mapping[str, Any]) -> list[str]:
    """The budget names a 429 eviction answer gives in its causes or message."""
    texts = [str(body.get("message") or "")]
    causes = (body.get("details") or {}).get("causes") if isinstance(body.get("details"), dict) else None
    texts += [str(c.get("message") or "") for c in causes or [] if isinstance(c, dict)]
    return sorted({m.group(1) for t in texts for m in _PDB_IN_MESSAGE.finditer(t[:2000])})


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """matchLabels and the In/NotIn/Exists/DoesNotExist expressions of a label selector."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op, False)
        if not ok:
            return False
    return True


def _tolerates(tolerations: Iterable[Any], taint: Mapping[str, Any]) -> bool:
    """Whether a pod's tolerations cover one taint (key, operator Equal/Exists, effect)."""
    for tol in tolerations:
        if not isinstance(tol, dict):
            continue
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and str(tol.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def _gpus(pod_spec: Mapping[str, Any]) -> int:
    """The ``nvidia.com/gpu`` a pod spec asks for (its containers' limits, else requests)."""
    total = 0
    for c in pod_spec.get("containers") or []:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        raw = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        total += _count(raw)
    return total


def _count(raw: Any) -> int:
    """A resource quantity that is a plain count ("8", 8); 0 for anything else."""
    text = str(raw if raw is not None else "")
    return int(text) if text.isdigit() and len(text) < 6 else 0


def _allocatable_gpus(node: Mapping[str, Any]) -> int:
    return _count((_status(node).get("allocatable") or {}).get(GPU_RESOURCE))


def _pods_per_job(job_spec: Mapping[str, Any]) -> int:
    par, comp = job_spec.get("parallelism", 1), job_spec.get("completions")
    par = par if isinstance(par, int) and par >= 0 else 1
    return min(par, comp) if isinstance(comp, int) and comp >= 0 else par


def _fenced_by_pitstop(node: Mapping[str, Any]) -> bool:
    return any(isinstance(t, dict) and t.get("key") == FENCE_KEY for t in _spec(node).get("taints") or [])


def _placeable(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """A node the scheduler may place this pod template on: Ready, healthy, schedulable, not fenced
    by Pitstop, every NoSchedule/NoExecute taint tolerated, its nodeSelector matched."""
    if _spec(node).get("unschedulable") or _fenced_by_pitstop(node) or not node_health(node)[0]:
        return False
    tolerations = pod_spec.get("tolerations") or []
    for t in _spec(node).get("taints") or []:
        if (
            isinstance(t, dict)
            and t.get("effect") in ("NoSchedule", "NoExecute")
            and not _tolerates(tolerations, t)
        ):
            return False
    labels = _labels(node)
    return all(labels.get(k) == v for k, v in (pod_spec.get("nodeSelector") or {}).items())


# -- checks on a fenced node: diagnose and validate (issue 14) ---------------------------------------
#
# A check is a batch/v1 Job of one pod in Pitstop's own namespace. The pod on the fenced node is
# pinned by ``spec.nodeName`` (the scheduler, and so the cordon, is bypassed; the kubelet still
# admits it against the node's free GPUs) and tolerates Pitstop's taint. A validation's NCCL peer
# is a second Job placed by the scheduler on one healthy node (``nodeSelector`` on its hostname).
# Each pod runs ``/bin/sh -c`` with a script that prints every tool's stdout after a marker line
# ``==> pitstop:<tool> <==`` (then ``<tool>:stderr`` and ``<tool>:exit N``); the adapter splits the
# log on those lines and never interprets what is between them (core/diagnose.py, core/validation.py
# parse). Finished Jobs are removed by Kubernetes' TTL-after-finished controller
# (``ttlSecondsAfterFinished``), long enough after the run for a retried check_result to read the
# logs again; only the peer, which would otherwise idle until its deadline, is deleted when the
# check is read as done.

CHECK_NAMESPACE = "pitstop-system"
CHECK_SERVICE = "pitstop-checks"  # headless Service (infra/gke/clusterrole.yaml): pods' DNS subdomain
CHECK_LABEL = "pitstop.dev/check"  # Job and pod label: the check's name
CHECK_ROLE_LABEL = "pitstop.dev/check-role"  # node (on the fenced node) | peer (the NCCL peer)
CHECK_NODE_ANNOTATION = "pitstop.dev/check-node"  # the node the Job's pod runs on
CHECK_PEER_ANNOTATION = "pitstop.dev/check-peer"  # launcher: the peer node, "" without one
CHECK_NOTE_ANNOTATION = "pitstop.dev/check-note"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"

# NVIDIA's DCGM image, the GPU Operator's default (NVIDIA/gpu-operator@a22dbf67
# deployments/gpu-operator/values.yaml, dcgm: nvcr.io/nvidia/cloud-native/dcgm 4.6.0-1-ubuntu24.04);
# its entrypoint is nv-hostengine, which a pod command replaces, hence DCGM_SETUP.
DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
DCGM_SETUP = "nv-hostengine"
# Google's nccl-tests image for GKE A4 / A3 Ultra, with the start of its sshd on port 222 and the
# all_gather_perf path, as "Run NCCL on custom GKE clusters that use A4 or A3 Ultra"
# (https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-gke-custom) runs them.
NCCL_IMAGE = "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib-diagnostic:v1.0.6"
NCCL_SETUP = "/scripts/container_entry.sh daemon &"
SSH = "ssh -q -o StrictHostKeyChecking=no -o ConnectTimeout=5 -p 222"
# GKE mounts the node's driver utilities at /usr/local/nvidia in a container that requests GPUs
# (GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo/nccl-test-latest.yaml mounts
# /home/kubernetes/bin/nvidia the same way).
DEFAULT_TOOLS: dict[str, tuple[str, ...]] = {
    "nvidia-smi": ("/usr/local/nvidia/bin/nvidia-smi",),
    "dcgmi": ("dcgmi",),
    "all_gather_perf": ("/third_party/nccl-tests/build/all_gather_perf",),
}
DEFAULT_MPIRUN = ("mpirun", "--allow-run-as-root", "-np", "{ranks}", "-H", "{hosts}", "--bind-to", "none",
                  "--mca", "plm_rsh_agent", SSH)  # fmt: skip
DEFAULT_PEER_WAIT = f"for i in $(seq 120); do {SSH} {{peer}} true && break; sleep 5; done"
CHECK_KINDS = ("diagnose", "validate")
LOG_LIMIT_BYTES = 8 << 20  # a check's log is tens of kB; more is read no further
_MARKER = re.compile(
    r"\n==> pitstop:(?P<key>[a-z][a-z0-9_]{0,30})(?::(?:(?P<err>stderr)|exit (?P<rc>-?[0-9]{1,4})))? <==\n"
)
_SCRIPT_HEAD = """set +e
pitstop_err=$(mktemp)
pitstop_run() {
  pitstop_key=$1; shift
  printf '\\n==> pitstop:%s <==\\n' "$pitstop_key"
  "$@" 2>"$pitstop_err"
  pitstop_rc=$?
  printf '\\n==> pitstop:%s:stderr <==\\n' "$pitstop_key"
  cat "$pitstop_err"
  printf '\\n==> pitstop:%s:exit %d <==\\n' "$pitstop_key" "$pitstop_rc"
}
"""
_IMAGE = re.compile(r"[a-z0-9][-a-z0-9._/:@]{0,254}", re.ASCII)


def _words(v: Any, what: str) -> tuple[str, ...]:
    """A command prefix from the policy: a list of words or one shell-like string."""
    words = shlex.split(v) if isinstance(v, str) else v
    if not isinstance(words, list | tuple) or not all(isinstance(w, str) and "\0" not in w for w in words):
        raise ValueError(f"gke.checks.{what} must be a list of words or a string")
    return tuple(words)


@dataclass(frozen=True)
class CheckSettings:
    """How diagnose and validate run on a GKE node; the policy's ``gke: {checks: {...}}`` sets them.

    ``tools`` maps nvidia-smi, dcgmi and all_gather_perf to the command prefix that runs each in
    the pods (the local stack points them at the stand-ins, pitstop.local.gpu_tools). Shell lines:
    ``dcgm_setup`` runs before dcgmi, ``nccl_setup`` in both NCCL pods (the peer then idles),
    ``peer_wait`` (``{peer}``: the peer's DNS name) before ``mpirun`` (``{ranks}``, ``{hosts}``),
    which prefixes all_gather_perf. Pods end after ``deadline_s``; finished Jobs go ``ttl_s`` later.
    """

    namespace: str = CHECK_NAMESPACE
    service: str = CHECK_SERVICE
    image: str = DCGM_IMAGE
    nccl_image: str = NCCL_IMAGE
    tools: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_TOOLS))
    dcgm_setup: str = DCGM_SETUP
    nccl_setup: str = NCCL_SETUP
    mpirun: tuple[str, ...] = DEFAULT_MPIRUN
    peer_wait: str = DEFAULT_PEER_WAIT
    deadline_s: int = 1800
    ttl_s: int = 3600

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any] | None) -> CheckSettings:
        """From a cluster's ``gke:`` policy block (its ``checks`` entry); defaults for what it leaves out."""
        raw = (conf or {}).get("checks") or {}
        if not isinstance(raw, Mapping):
            raise ValueError("gke.checks must be a mapping")
        base = cls()
        tools = dict(base.tools)
        for tool, prefix in (raw.get("tools") or {}).items():
            if tool not in DEFAULT_TOOLS:
                raise ValueError(f"gke.checks.tools: unknown tool {tool!r} (one of {sorted(DEFAULT_TOOLS)})")
            tools[tool] = _words(prefix, f"tools.{tool}")
            if not tools[tool]:
                raise ValueError(f"gke.checks.tools.{tool} is empty")
        out = cls(
            namespace=str(raw.get("namespace", base.namespace)),
            service=str(raw.get("service", base.service)),
            image=str(raw.get("image", base.image)),
            nccl_image=str(raw.get("nccl_image", base.nccl_image)),
            tools=tools,
            dcgm_setup=str(raw.get("dcgm_setup", base.dcgm_setup)),
            nccl_setup=str(raw.get("nccl_setup", base.nccl_setup)),
            mpirun=_words(raw["mpirun"], "mpirun") if "mpirun" in raw else base.mpirun,
            peer_wait=str(raw.get("peer_wait", base.peer_wait)),
            deadline_s=int(raw.get("deadline_s", base.deadline_s)),
            ttl_s=int(raw.get("ttl_s", base.ttl_s)),
        )
        out.check()
        return out

    def check(self) -> None:
        if not (valid_namespace(self.namespace) and _DNS_LABEL.fullmatch(self.service)):
            raise ValueError("gke.checks: namespace and service must be DNS labels")
        if not (_IMAGE.fullmatch(self.image) and _IMAGE.fullmatch(self.nccl_image)):
            raise ValueError("gke.checks: image and nccl_image must be image references")
        if not (60 <= self.deadline_s <= 86400 and 60 <= self.ttl_s <= 7 * 86400):
            raise ValueError("gke.checks: deadline_s and ttl_s must be 60 s .. a day (ttl_s: a week)")


def split_outputs(log_text: str) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """A check pod's log cut at its marker lines: (stdout, stderr, exit code) per tool, verbatim."""
    outputs: dict[str, str] = {}
    stderr: dict[str, str] = {}
    codes: dict[str, int] = {}
    marks = list(_MARKER.finditer(log_text))
    for m, nxt in zip(marks, [*marks[1:], None], strict=True):
        body = log_text[m.end() : nxt.start() if nxt is not None else len(log_text)]
        key = m.group("key")
        if m.group("rc") is not None:
            codes[key] = int(m.group("rc"))
        elif m.group("err"):
            stderr[key] = body
        else:
            outputs[key] = body
    return outputs, stderr, codes


def check_script(setup: str, steps: Iterable[tuple[str, Iterable[str]]], then: str = "") -> str:
    """The ``/bin/sh -c`` script of one check container: setup, each tool after its marker, ``then``."""
    lines = [_SCRIPT_HEAD]
    if setup.strip():
        lines.append(setup)
    lines += [f"pitstop_run {key} {shlex.join(list(argv))}" for key, argv in steps]
    if then.strip():
        lines.append(then)
    lines.append('rm -f "$pitstop_err"\nexit 0\n')
    return "\n".join(lines)


def _sweep_start(message_bytes: int, floor: int = 1 << 20) -> int:
    """The smallest size of a factor-2 sweep that ends exactly on ``message_bytes`` (its row exists)."""
    b = message_bytes
    while b % 2 == 0 and b // 2 >= floor:
        b //= 2
    return b


def _fill(word: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        word = word.replace(key, value)
    return word


def _peer_name(name: str) -> str:
    """The peer Job's name (and its pod's hostname): a DNS label derived from the check's name."""
    if len(name) + 5 <= 63:
        return f"{name}-peer"
    return f"{name[:52].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:5]}-peer"


def _check_args(check: Mapping[str, Any]) -> tuple[str, str, int]:
    """(kind, name, gpus) of a check request, checked before anything reaches a URL or a pod spec."""
    kind, name, gpus = check.get("kind"), check.get("name"), check.get("gpus", 0)
    if kind not in CHECK_KINDS:
        raise ActuatorError(400, f"check kind must be one of {CHECK_KINDS}, not {str(kind)[:40]!r}", False)
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        raise ActuatorError(400, f"check name must be a DNS label: {str(name)[:80]!r}", False)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 64:
        raise ActuatorError(400, f"check gpus must be an integer 0..64, not {str(gpus)[:20]!r}", False)
    level = check.get("dcgm_level")
    if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 4:
        raise ActuatorError(400, f"check dcgm_level must be 1..4, not {str(level)[:20]!r}", False)
    size = check.get("message_bytes")
    if (
        kind == "validate"
        and check.get("peer")
        and (not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= 1 << 40)
    ):
        raise ActuatorError(400, f"validate needs message_bytes (1 .. 1 TiB), not {str(size)[:20]!r}", False)
    return kind, name, gpus


def _pod_failure(pod: Mapping[str, Any]) -> str:
    """Why a check pod did not succeed, in a line: its phase and reason, and containers that failed."""
    st = _status(pod)
    parts = [f"check pod {_meta(pod).get('name')} {st.get('phase')}"]
    if st.get("reason") or st.get("message"):
        parts.append(f"{st.get('reason') or ''} {st.get('message') or ''}".strip())
    for key in ("initContainerStatuses", "containerStatuses"):
        for c in st.get(key) or []:
            term = (c.get("state") or {}).get("terminated") if isinstance(c, dict) else None
            if isinstance(term, dict) and term.get("exitCode") not in (0, None):
                parts.append(
                    f"container {c.get('name')} exited {term.get('exitCode')} ({term.get('reason')})"
                )
    return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")


# -- the adapter -----------------------------------------------------------------------------


class GkeScheduler:
    """One GKE cluster's scheduler side, through an ``ApiClient`` built for it.

    ``evict_deadline_s`` bounds how long one call keeps retrying an eviction a budget blocks;
    ``wait_s`` how long it waits for Kueue to evict a deactivated Workload before answering 503
    (the workflow asks again and the wait resumes).
    """

    def __init__(
        self,
        api_client: Any = None,
        *,
        connect: Callable[[], Any] | None = None,
        evict_deadline_s: float = 120.0,
        wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        checks: CheckSettings | None = None,
    ) -> None:
        if (api_client is None) == (connect is None):
            raise ValueError("GkeScheduler needs an api_client or a connect() that builds one")
        self._client, self._connect, self._lock = api_client, connect, threading.Lock()
        self.checks = checks or CheckSettings()
        self.checks.check()
        self.evict_deadline_s, self.wait_s = evict_deadline_s, wait_s
        self.clock, self.sleep, self.timeout = clock, sleep, timeout

    @classmethod
    def for_cluster(cls, project: str, location: str, cluster: str, credentials: Any) -> GkeScheduler:
        """The adapter of a GKE cluster, connected on first use: a cold start never waits on
        ``clusters.get``, and a cluster that cannot be reached fails only its own incidents."""
        return cls(connect=lambda: gke_api_client(project, location, cluster, credentials))

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None and self._connect is not None:
                self._client = self._connect()
            return self._client

    @property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.client)

    @property
    def batch(self) -> Any:
        return k8s.BatchV1Api(self.client)

    @property
    def custom(self) -> Any:
        return k8s.CustomObjectsApi(self.client)

    @property
    def policy(self) -> Any:
        return k8s.PolicyV1Api(self.client)

    # -- transport -----------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """One API call, its JSON answer as a dict; errors as KubeApiError / a retryable 503.

        Raw JSON (no model classes): a field the client's models do not know is kept, and a
        read-modify-write never drops it.
        """
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            raise KubeApiError(exc.status or 503, what, _status_body(exc.body)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(503, f"{what}: Kubernetes API unreachable ({str(exc)[:200]})", True) from exc
        try:
            out = json.loads(resp.data) if resp.data else {}
        except ValueError as exc:
            raise ActuatorError(503, f"{what}: the Kubernetes API answered something not JSON", True) from exc
        return out if isinstance(out, dict) else {}

    def _node(self, node: str) -> dict[str, Any]:
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        return self._call(f"get node {node}", self.core.read_node, node)

    def _node_or_none(self, node: str) -> dict[str, Any] | None:
        try:
            return self._node(node)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _get_jobset(self, ref: JobRef) -> dict[str, Any] | None:
        try:
            return self._call(
                f"get jobset {ref.namespace}/{ref.name}",
                self.custom.get_namespaced_custom_object,
                JOBSET_GROUP, JOBSET_VERSION, ref.namespace, JOBSETS, ref.name,
            )  # fmt: skip
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _items(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        items = self._call(what, fn, *args, **kwargs).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        return self._items(
            f"list pods on {node}",
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )

    def _fenced_nodes(self, ctx: str) -> list[str]:
        """The nodes Pitstop fenced for the incident of ``ctx`` (by the label fence sets)."""
        iid = incident_of(ctx)
        if iid is None:
            return []
        nodes = self._items("list fenced nodes", self.core.list_node, label_selector=f"{FENCE_KEY}={iid}")
        return sorted(str(_meta(n).get("name")) for n in nodes if valid_object_name(_meta(n).get("name")))

    def _workload(self, ns: str, uid: Any) -> dict[str, Any] | None:
        """The Kueue Workload of a job (label ``kueue.x-k8s.io/job-uid``); None without one or Kueue."""
        if not isinstance(uid, str) or not re.fullmatch(r"[-a-z0-9]{1,63}", uid):
            return None
        try:
            items = self._items(
                f"list workloads in {ns}",
                self.custom.list_namespaced_custom_object,
                KUEUE_GROUP, KUEUE_VERSION, ns, WORKLOADS,
                label_selector=f"{KUEUE_JOB_UID_LABEL}={uid}",
            )  # fmt: skip
        except KubeApiError as exc:
            if exc.status == 404:  # Kueue is not installed
                return None
            raise
        return items[0] if items else None

    # -- node fence ----------------------------------------------------------------------

    def _update_node(
        self, node: str, decide: Callable[[dict[str, Any]], tuple[dict[str, Any] | None, dict[str, Any]]]
    ) -> dict[str, Any]:
        """Read, decide a patch, write it guarded by resourceVersion; again on 409. The answer decided.

        A node that does not exist (a preempted Spot VM's Node removed) has nothing to change:
        ``state: absent``, and the next step finds it again by name when GKE recreates it.
        """
        for _ in range(_CONFLICT_RETRIES):
            cur = self._node_or_none(node)
            if cur is None:
                return {"node": node, "state": "absent", "previous_state": "absent", "resumed": False}
            patch, answer = decide(cur)
            if patch is None:
                return answer
            patch.setdefault("metadata", {})["resourceVersion"] = _meta(cur).get("resourceVersion")
            try:
                self._call(f"patch node {node}", self.core.patch_node, node, patch)
            except KubeApiError as exc:
                if exc.status in (404, 409):  # changed or gone since the read: read again
                    continue
                raise
            return answer
        raise ActuatorError(503, f"node {node} kept changing under Pitstop's update (409 Conflict)", True)

    def fence(self, node: str, incident: str, action: str, ctx: str) -> dict[str, Any] | None:
        """Cordon and taint the node for this incident; another's cordon is kept and reported.

        The answer mirrors the Slurm agent's drain: ``previous_state`` (schedulable | cordoned),
        ``previous_reason``, ``already_drained_by_other`` and ``reason`` (Pitstop's taint, or None
        when another Pitstop incident's fence already holds the node and was left alone).
        """
        if not _INCIDENT.fullmatch(incident or ""):
            raise ActuatorError(400, f"not an incident id: {str(incident)[:40]!r}", False)
        taint = {"key": FENCE_KEY, "value": incident, "effect": "NoSchedule"}
        reason = f"{FENCE_KEY}={incident}:NoSchedule"

        def decide(cur: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
            taints = [t for t in _spec(cur).get("taints") or [] if isinstance(t, dict)]
            ours = next((t for t in taints if t.get("key") == FENCE_KEY), None)
            cordoned = bool(_spec(cur).get("unschedulable"))
            if ours is not None:  # fenced already: this incident's (a retry) or another's
                return None, _refence_answer(node, cur, ours, incident)
            answer = {
                "node": node,
                "previous_state": "cordoned" if cordoned else "schedulable",
                "previous_reason": _other_cordon_reason(cur) if cordoned else None,
                "already_drained_by_other": cordoned,
                "reason": reason,
            }
            patch = {
                "metadata": {
                    "labels": {FENCE_KEY: incident},
                    "annotations": {WAS_UNSCHEDULABLE: "true" if cordoned else "false"},
                },
                "spec": {"unschedulable": True, "taints": [*taints, taint]},
            }
            return patch, answer

        return self._update_node(node, decide)

    def unfence(self, node: str, ctx: str, incident: str | None = None) -> dict[str, Any] | None:
        """Lift Pitstop's taint for this incident, and its cordon unless the node was cordoned before.

        A cordon or taint someone else set stays; the answer then says ``left_drained: <what>``.
        """
        iid = incident if incident is not None else incident_of(ctx)
        if iid is None or not _INCIDENT.fullmatch(iid):
            raise ActuatorError(400, f"cannot tell which incident's fence to lift from {ctx!r}", False)

        def decide(cur: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
            taints = [t for t in _spec(cur).get("taints") or [] if isinstance(t, dict)]
            ours = next((t for t in taints if t.get("key") == FENCE_KEY), None)
            cordoned = bool(_spec(cur).get("unschedulable"))
            out: dict[str, Any] = {"node": node, "state": "cordoned" if cordoned else "schedulable"}
            if ours is None:
                if cordoned:
                    return None, {**out, "resumed": False, "left_drained": _other_cordon_reason(cur)}
                return None, {**out, "resumed": False}
            if ours.get("value") != iid:
                other = f"{FENCE_KEY}={ours.get('value')} (another Pitstop incident's fence)"
                return None, {**out, "resumed": False, "left_drained": other}
            # A missing annotation is read as "cordoned before": leaving a cordon beats lifting another's.
            was = _annotations(cur).get(WAS_UNSCHEDULABLE) != "false"
            patch: dict[str, Any] = {
                "metadata": {"labels": {FENCE_KEY: None}, "annotations": {WAS_UNSCHEDULABLE: None}},
                "spec": {"taints": [t for t in taints if t.get("key") != FENCE_KEY]},
            }
            if was:
                left = "cordoned before Pitstop's fence (" + _other_cordon_reason(cur) + ")"
                return patch, {**out, "resumed": False, "left_drained": left}
            patch["spec"]["unschedulable"] = False
            return patch, {**out, "state": "schedulable", "resumed": True}

        return self._update_node(node, decide)

    def node_healthy(self, node: str, ctx: str) -> bool:
        cur = self._node_or_none(node)
        ok, why = node_health(cur) if cur is not None else (False, "no such node (yet)")
        if not ok:
            log.emit("INFO", "gke node not healthy yet", node=node, why=why)
        return ok

    # -- jobs ------------------------------------------------------------------------------

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]:
        """The jobs with live pods on the node, each with the run that has pods there."""
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        on_node: dict[JobRef, list[Mapping[str, Any]]] = {}
        for pod in self._pods_on(node):
            ref = owner_ref(pod) if _live(pod) else None
            if ref is not None:
                on_node.setdefault(ref, []).append(pod)
        return [self._on_node(ref, pods) for ref, pods in on_node.items()]

    def _on_node(self, ref: JobRef, pods: list[Mapping[str, Any]]) -> dict[str, Any]:
        """The job as the fault on this node hit it: a JobSet's run is its pods' restart attempt.

        Not ``status.restarts``: when another member's incident restarted the gang a moment ago,
        the old pod here still runs, and the fault belongs to that older run (seen under load:
        the new run was taken as the one hit and restarted a second time).
        """
        info = {**self._info(ref), "pods_on_node": sorted(str(_meta(p).get("name")) for p in pods)}
        attempts = [_attempt(p) for p in pods]
        known = [a for a in attempts if a is not None]
        if ref.kind == "jobset" and known and info["restarts"] is not None:
            info["restarts"] = min([*known, int(info["restarts"])])
        return info

    def job_info(self, job: str, ctx: str) -> dict[str, Any]:
        """The job now: ``state``, ``restarts`` (JobSets only) and ``start_time``, asked fresh."""
        return self._info(parse_job_id(job))

    def job_state(self, job: str, ctx: str) -> str:
        return str(self.job_info(job, ctx)["state"])

    def job_running(self, job: str, ctx: str) -> bool:
        """Whether the job still has pods on the node fenced for this incident (after a checkpoint).

        A JobSet that restarted elsewhere has left the node: the checkpoint is done. Without a
        node fenced for the incident, whether the job runs at all.
        """
        ref = parse_job_id(job)
        nodes = self._fenced_nodes(ctx)
        if not nodes:
            return bool(self._info(ref)["state"] == "RUNNING")
        return any(owner_ref(p) == ref and _live(p) for n in nodes for p in self._pods_on(n))

    def _info(self, ref: JobRef) -> dict[str, Any]:
        base: dict[str, Any] = {"id": ref.id, "job": ref.id, "kind": ref.kind, "namespace": ref.namespace}
        base.update(name=ref.name, state="UNKNOWN", restarts=None, start_time=None, workload=None)
        if ref.kind == "jobset":
            return self._jobset_info(ref, base)
        read = self.batch.read_namespaced_job if ref.kind == "job" else self.core.read_namespaced_pod
        try:
            obj = self._call(f"get {ref.id}", read, ref.name, ref.namespace)
        except KubeApiError as exc:
            if exc.status == 404:
                return base
            raise
        state = (
            _job_state(obj)
            if ref.kind == "job"
            else _POD_STATES.get(str(_status(obj).get("phase")), "UNKNOWN")
        )
        start = _status(obj).get("startTime")
        wl = self._workload(ref.namespace, _meta(obj).get("uid")) if ref.kind == "job" else None
        return {
            **base,
            "state": state,
            "start_time": start,
            "workload": _meta(wl).get("name") if wl else None,
        }

    def _jobset_info(self, ref: JobRef, base: dict[str, Any]) -> dict[str, Any]:
        js = self._get_jobset(ref)
        if js is None:
            return base
        pods = self._items(
            f"list pods of {ref.id}",
            self.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name}",
        )
        wl = self._workload(ref.namespace, _meta(js).get("uid"))
        return {
            **base,
            "state": jobset_state(js, pods),
            "restarts": _restarts(js),
            "start_time": _meta(js).get("creationTimestamp"),  # with restarts: one run of this JobSet
            "workload": _meta(wl).get("name") if wl else None,
            "failure_policy": isinstance(_spec(js).get("failurePolicy"), dict),
        }

    # -- eviction --------------------------------------------------------------------------

    def _evict(self, pod: Mapping[str, Any], deadline: float, uid: str | None = None) -> str:
        """Evict one pod with its own grace period: ``evicted``, ``gone`` (404) or ``replaced`` (409).

        A 429 (a PodDisruptionBudget, or its status not caught up) is retried with backoff until
        ``deadline``; then a final 409 names the budget.
        """
        ns, name = str(_meta(pod).get("namespace")), str(_meta(pod).get("name"))
        opts = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)) if uid else None
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=ns),
            delete_options=opts,
        )
        backoff = 0.5
        while True:
            try:
                self._call(
                    f"evict pod {ns}/{name}", self.core.create_namespaced_pod_eviction, name, ns, body,
                    _headers={"Content-Type": "application/json"},  # the client sends none by itself
                )  # fmt: skip
                return "evicted"
            except KubeApiError as exc:
                if exc.status == 404:
                    return "gone"
                if exc.status == 409 and uid:
                    return "replaced"
                if exc.status == 500 and "DisruptionBudget" in exc.detail + str(exc.body):
                    raise ActuatorError(409, f"cannot evict {ns}/{name}: {exc.detail}", False) from exc
                if exc.status != 429:
                    raise
                left = deadline - self.clock()
                if left <= 0:
                    raise self._blocked(pod, exc) from exc
            self.sleep(min(backoff, left))  # the last try falls on the deadline
            backoff = min(backoff * 2, 8.0)

    def _blocked(self, pod: Mapping[str, Any], exc: KubeApiError) -> ActuatorError:
        """The final error of an eviction a budget kept refusing: which budget, for the incident."""
        ns, name = _meta(pod).get("namespace"), _meta(pod).get("name")
        names = pdb_names(exc.body)
        if not names:
            try:
                pdbs = self._items(
                    f"list pdbs in {ns}", self.policy.list_namespaced_pod_disruption_budget, ns
                )
                pod_labels = _labels(pod)
                names = sorted(
                    str(_meta(b).get("name"))
                    for b in pdbs
                    if _selector_matches(_spec(b).get("selector") or {}, pod_labels)
                )
            except ActuatorError:
                names = []
        by = f"PodDisruptionBudget {', '.join(names)}" if names else "a PodDisruptionBudget"
        return ActuatorError(
            409,
            f"eviction of pod {ns}/{name} blocked by {by} for {self.evict_deadline_s:.0f}s "
            f"(429 {exc.detail}); relax the budget or move the pod, then retry",
            False,
        )

    def _evict_on_fenced(self, ref: JobRef, ctx: str) -> list[str]:
        """Evict the job's live pods on the nodes fenced for this incident; the pods evicted or gone."""
        deadline = self.clock() + self.evict_deadline_s
        done: list[str] = []
        for node in self._fenced_nodes(ctx):
            for pod in self._pods_on(node):
                if owner_ref(pod) == ref and _live(pod) and not _meta(pod).get("deletionTimestamp"):
                    self._evict(pod, deadline)
                    done.append(f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}")
        return done

    def checkpoint(self, job: str, signal: str, ctx: str) -> None:
        """Evict the job's pods on the fenced node, each with its grace period (SIGTERM, then the wait).

        Kubernetes chooses the signal (SIGTERM); ``signal`` (a Slurm setting) cannot change it.
        """
        ref = parse_job_id(job)
        evicted = self._evict_on_fenced(ref, ctx)
        log.emit("INFO", "gke checkpoint: pods evicted with their grace period", job=ref.id, pods=evicted)

    # -- requeue ---------------------------------------------------------------------------

    def requeue(self, job: str, ctx: str, restarts: int | None = None) -> None:
        """Restart the job's gang once (see :meth:`requeue_outcome`); what happened is logged."""
        out = self.requeue_outcome(job, ctx, restarts)
        log.emit("WARNING" if out.get("owner_action") else "INFO", "gke requeue", **out)

    def requeue_outcome(self, job: str, ctx: str, restarts: int | None = None) -> dict[str, Any]:
        """Restart the gang exactly once; the answer says how, or why nothing was done.

        ``restarts`` is the JobSet run the incident saw: a JobSet already past it is left alone.
        ``owner_action`` is set when nothing restarts the job and its owner must act.
        """
        ref = parse_job_id(job)
        if ref.kind == "jobset":
            js = self._get_jobset(ref)
            if js is None:
                return {"job": ref.id, "outcome": "jobset no longer exists"}
            if isinstance(_spec(js).get("failurePolicy"), dict):
                return self._restart_jobset_once(ref, ctx, restarts)
            wl = self._workload(ref.namespace, _meta(js).get("uid"))
            if wl is not None:
                return self._cycle_workload(ref, wl, ctx)
            why = "it has no failurePolicy and no Kueue Workload: a failed child Job fails the JobSet"
        elif ref.kind == "job":
            why = "a plain Job restarts only its own pods, per its backoffLimit"
        else:
            why = "a bare pod has no controller to bring it back"
        evicted = self._evict_on_fenced(ref, ctx)
        return {
            "job": ref.id,
            "outcome": "evicted from the fenced node; nothing restarts it as a gang",
            "evicted": evicted,
            "owner_action": f"{ref.id}: {why}. Check it and resubmit it if needed "
            "(a JobSet restarts once per fault with a failurePolicy; see pitstop doctor).",
        }

    def _restart_jobset_once(self, ref: JobRef, ctx: str, seen: int | None) -> dict[str, Any]:
        """Evict one pod of the current restart attempt (on the fenced node if one is there)."""
        out: dict[str, Any] = {"job": ref.id}
        fenced = set(self._fenced_nodes(ctx))
        deadline = self.clock() + self.evict_deadline_s
        for _ in range(_CONFLICT_RETRIES):
            js = self._get_jobset(ref)
            if js is None:
                return {**out, "outcome": "jobset no longer exists"}
            r = _restarts(js)
            out["restarts"] = r
            if seen is not None and r != seen:
                return {**out, "outcome": f"already restarted (restarts {seen} -> {r})"}
            if condition_true(js, "RestartingJobSet"):
                return {**out, "outcome": "already restarting (RestartingJobSet)"}
            state = jobset_state(js, [])
            if state in ("COMPLETED", "FAILED", "SUSPENDED") or _spec(js).get("suspend"):
                return {**out, "outcome": f"jobset is {state}: not restarted"}
            pod = self._attempt_pod(ref, r, fenced)
            if pod is None:
                return {**out, "outcome": f"no live pod of restart attempt {r} to evict"}
            uid = _meta(pod).get("uid")
            res = self._evict(pod, deadline, uid if isinstance(uid, str) and uid else None)
            if res == "evicted":
                return {
                    **out,
                    "outcome": "restart triggered",
                    "evicted": _meta(pod).get("name"),
                    "attempt": r,
                }
            # gone or replaced since it was listed: look again (the attempt may have moved on)
        raise ActuatorError(503, f"{ref.id}: pods of the current attempt kept disappearing", True)

    def _attempt_pod(self, ref: JobRef, attempt: int, fenced: set[str]) -> dict[str, Any] | None:
        pods = self._items(
            f"list pods of {ref.id} attempt {attempt}",
            self.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name},{RESTART_ATTEMPT_LABEL}={attempt}",
        )
        live = [p for p in pods if _live(p) and not _meta(p).get("deletionTimestamp")]
        live.sort(key=lambda p: (_spec(p).get("nodeName") not in fenced, str(_meta(p).get("name"))))
        return live[0] if live else None

    def _patch_workload(self, ref: JobRef, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            f"patch workload {ref.namespace}/{name}",
            self.custom.patch_namespaced_custom_object,
            KUEUE_GROUP, KUEUE_VERSION, ref.namespace, WORKLOADS, name, body,
        )  # fmt: skip

    def _cycle_workload(self, ref: JobRef, wl: dict[str, Any], ctx: str) -> dict[str, Any]:
        """Deactivate the Workload (Kueue evicts the whole job), then reactivate it (it is requeued).

        The annotation ``pitstop.dev/requeued-for=<ctx>`` makes a retry resume instead of starting
        over, and tells Pitstop's deactivation from someone else's (which stays).
        """
        name = str(_meta(wl).get("name"))
        out: dict[str, Any] = {"job": ref.id, "workload": name}
        active = _spec(wl).get("active", True) is not False
        mark = _annotations(wl).get(REQUEUED_FOR)
        if active and mark == ctx:
            return {**out, "outcome": "workload already requeued for this step"}
        if not active and mark != ctx:
            return {
                **out,
                "outcome": "workload deactivated by someone else: left inactive",
                "owner_action": f"{ref.id}: its Kueue Workload {name} is inactive; reactivate it when ready.",
            }
        if active:
            rv = _meta(wl).get("resourceVersion")
            self._patch_workload(
                ref, name, {"metadata": {"resourceVersion": rv, "annotations": {REQUEUED_FOR: ctx}},
                            "spec": {"active": False}},
            )  # fmt: skip
        deadline = self.clock() + self.wait_s
        while not self._stopped(ref, name):
            if self.clock() >= deadline:
                raise ActuatorError(503, f"waiting for Kueue to stop workload {name} of {ref.id}", True)
            self.sleep(1.0)
        self._patch_workload(ref, name, {"spec": {"active": True}})
        return {**out, "outcome": "workload deactivated and reactivated: Kueue requeues the whole job"}

    def _stopped(self, ref: JobRef, name: str) -> bool:
        """Kueue evicted the Workload, the JobSet is suspended and none of its pods still runs.

        Reactivating earlier races the suspension: pods still terminating when the Jobs resume
        count as failures, and a JobSet without a failure policy then fails instead of requeueing.
        """
        wl = self._call(
            f"get workload {ref.namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            KUEUE_GROUP, KUEUE_VERSION, ref.namespace, WORKLOADS, name,
        )  # fmt: skip
        if not (condition_true(wl, "Evicted") or not condition_true(wl, "QuotaReserved")):
            return False
        js = self._get_jobset(ref)
        if js is not None and not _spec(js).get("suspend"):
            return False
        pods = self._items(
            f"list pods of {ref.id}",
            self.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={ref.name}",
        )
        return not any(_live(p) for p in pods)

    # -- capacity: can the gang run again now, without the node? -----------------------------

    def capacity(self, job: str, node: str, ctx: str) -> dict[str, Any]:
        """Whether the gang can run again now without ``node`` (read-only).

        Kubernetes places the restarted gang, not Pitstop: a JobSet admitted by Kueue is enough by
        itself (Kueue re-admits it when its ClusterQueue has quota); otherwise the gang's pods are
        fitted, first fit, onto Ready, healthy, schedulable nodes other than ``node`` that carry no
        Pitstop fence, whose taints they tolerate and whose labels match their nodeSelector, with
        the GPUs left by pods that are not the gang's own (those go when it restarts). Affinity,
        CPU and memory are not counted.
        """
        ref = parse_job_id(job)
        templates, kueue = self._gang_templates(ref)
        if templates is None:
            return {"enough": False, "need": None, "free": None, "why": f"{ref.id} no longer exists"}
        need = sum(n for n, _ in templates)
        if kueue is not None:
            return {
                "enough": True,
                "need": need,
                "free": None,
                "why": f"Kueue admits {ref.id} ({kueue}): it re-admits the gang when its quota allows",
            }
        nodes = [n for n in self._items("list nodes", self.core.list_node) if _meta(n).get("name") != node]
        free = {str(_meta(n).get("name")): _allocatable_gpus(n) for n in nodes}
        for pod in self._items("list pods", self.core.list_pod_for_all_namespaces):
            where = _spec(pod).get("nodeName")
            if where in free and _live(pod) and owner_ref(pod) != ref:
                free[where] -= _gpus(_spec(pod))
        placed, hosts = 0, set()
        for count, pod_spec in templates:
            fits = [str(_meta(n).get("name")) for n in nodes if _placeable(n, pod_spec)]
            want = _gpus(pod_spec)
            for _ in range(count):
                host = next((h for h in fits if free[h] >= want), None)
                if host is None:
                    break
                free[host] -= want
                placed += 1
                hosts.add(host)
        selectors = sorted(
            {f"{k}={v}" for _, s in templates for k, v in (s.get("nodeSelector") or {}).items()}
        )
        sel = f" matching {', '.join(selectors)}" if selectors else ""
        where = f"healthy schedulable nodes{sel} besides {node}"
        why = (
            f"all {need} pods of {ref.id} fit on {len(hosts)} {where}"
            if placed >= need
            else f"only {placed} of {need} pods of {ref.id} fit on {where}"
        )
        return {"enough": placed >= need, "need": need, "free": placed, "why": why}

    def _gang_templates(self, ref: JobRef) -> tuple[list[tuple[int, dict[str, Any]]] | None, str | None]:
        """(pod count, pod spec) per template of the job, and its Kueue Workload's name (if any)."""
        if ref.kind == "jobset":
            js = self._get_jobset(ref)
            if js is None:
                return None, None
            out = []
            for rj in _spec(js).get("replicatedJobs") or []:
                job_spec = _spec((rj or {}).get("template") or {})
                replicas = rj.get("replicas", 1) if isinstance(rj.get("replicas", 1), int) else 1
                out.append((replicas * _pods_per_job(job_spec), _spec(job_spec.get("template") or {})))
            wl = self._workload(ref.namespace, _meta(js).get("uid"))
            queued = _labels(js).get(KUEUE_QUEUE_LABEL)
            kueue = f"Workload {_meta(wl).get('name')}" if wl else f"queue {queued}" if queued else None
            return out, kueue
        read = self.batch.read_namespaced_job if ref.kind == "job" else self.core.read_namespaced_pod
        try:
            obj = self._call(f"get {ref.id}", read, ref.name, ref.namespace)
        except KubeApiError as exc:
            if exc.status == 404:
                return None, None
            raise
        if ref.kind == "pod":
            return [(1, _spec(obj))], None
        queued = _labels(obj).get(KUEUE_QUEUE_LABEL)
        return [(_pods_per_job(_spec(obj)), _spec(_spec(obj).get("template") or {}))], (
            f"queue {queued}" if queued else None
        )

    # -- checks on the fenced node ---------------------------------------------------------------

    def start_check(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """Start a diagnose or validate run on the fenced node, once per ``check["name"]``.

        A retry finds the Job it (or an earlier attempt) created (409 AlreadyExists) and answers as
        the first call did. A 503 (retryable) while pods that hold GPUs are still on the node: the
        kubelet would refuse the check's pod, and a diagnostic must see every GPU.
        """
        kind, name, gpus = _check_args(check)
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        ns = self.checks.namespace
        existing = self._check_job(name)
        if existing is not None:
            return self._started_answer(existing, node, name)
        cur = self._node_or_none(node)
        if cur is None:
            raise ActuatorError(503, f"node {node} does not exist (yet): cannot run {kind} on it", True)
        holders = [
            f"{_meta(p).get('namespace')}/{_meta(p).get('name')}"
            for p in self._pods_on(node)
            if _live(p) and _gpus(_spec(p)) > 0 and _labels(p).get(CHECK_LABEL) != name
        ]
        if holders:
            raise ActuatorError(
                503, f"{kind} on {node} waits for pods still holding GPUs: {holders[:5]}", True
            )
        have = _allocatable_gpus(cur)
        use = min(gpus, have) if gpus > 0 else have
        notes = [] if use >= gpus else [f"{node} offers {have} of {gpus} GPUs: the check gets {use}"]
        peer: str | None = None
        if kind == "validate" and check.get("peer"):
            peer, why = self._ensure_peer(node, cur, name, gpus)
            if why:
                notes.append(why)
        note = "; ".join(notes)
        body = self._launcher(kind, name, node, use, peer, check, note)
        try:
            self._call(f"create job {ns}/{name}", self.batch.create_namespaced_job, ns, body)
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = self._check_job(name)
            if found is None:
                raise ActuatorError(503, f"check job {ns}/{name} exists and is gone again", True) from exc
            return self._started_answer(found, node, name)
        log.emit("INFO", "gke check started", check=name, node=node, kind=kind, peer=peer, note=note, ctx=ctx)
        return {"started": name, "peer": peer, "note": note}

    def check_result(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """The run's state; once its pod has ended, each tool's output read from the pod's log.

        ``outputs`` holds stdout per tool, ``stderr`` and ``exit_codes`` what the script recorded
        beside it; ``error`` says why the pod did not succeed (e.g. the kubelet refused it). The
        peer's Job is deleted once the run is done (best effort); the check's own Job is left to
        Kubernetes' TTL (``ttl_s``), so a retry reads the same logs again.
        """
        _, name, _ = _check_args(check)
        ns = self.checks.namespace
        job = self._check_job(name)
        if job is None:
            raise ActuatorError(409, f"no check {ns}/{name}: never started, or removed after its ttl", False)
        if _annotations(job).get(CHECK_NODE_ANNOTATION) != node:
            raise ActuatorError(
                409, f"check {name} runs on {_annotations(job).get(CHECK_NODE_ANNOTATION)}, not {node}", False
            )
        peer = _annotations(job).get(CHECK_PEER_ANNOTATION) or None
        pods = self._items(
            f"list pods of check {name}",
            self.core.list_namespaced_pod,
            ns,
            label_selector=f"{JOB_NAME_LABEL}={name}",
        )
        pods.sort(key=lambda p: str(_meta(p).get("creationTimestamp") or ""))
        pod = next((p for p in reversed(pods) if not _live(p)), None)
        job_done = condition_true(job, "Complete") or condition_true(job, "Failed")
        base: dict[str, Any] = {"done": False, "outputs": {}, "peer": peer, "error": None}
        if pod is None and not job_done:
            phase = _status(pods[-1]).get("phase") if pods else "no pod yet"
            return {**base, "state": phase}
        outputs: dict[str, str] = {}
        stderr: dict[str, str] = {}
        codes: dict[str, int] = {}
        errors: list[str] = []
        if pod is not None:
            for container in self._started_containers(pod):
                text = self._pod_log(str(_meta(pod).get("name")), container, errors)
                out, err, rc = split_outputs(text)
                outputs.update(out)
                stderr.update(err)
                codes.update(rc)
            if _status(pod).get("phase") != "Succeeded":
                errors.insert(0, _pod_failure(pod))
        else:
            failed = next(
                (
                    c
                    for c in _status(job).get("conditions") or []
                    if isinstance(c, dict) and c.get("type") == "Failed"
                ),
                {},
            )
            errors.insert(
                0, f"check job {name} failed without a pod: {failed.get('reason')} {failed.get('message')}"
            )
        if peer is not None:
            self._delete_peer(name)
        return {
            **base,
            "done": True,
            "outputs": outputs,
            "stderr": stderr,
            "exit_codes": codes,
            "error": "; ".join(errors) or None,
            "state": _status(pod).get("phase") if pod is not None else "Failed",
        }

    # -- check helpers ---------------------------------------------------------------------------

    def _check_job(self, name: str) -> dict[str, Any] | None:
        ns = self.checks.namespace
        try:
            return self._call(f"get job {ns}/{name}", self.batch.read_namespaced_job, name, ns)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _started_answer(self, job: Mapping[str, Any], node: str, name: str) -> dict[str, Any]:
        """What start_check answered the first time, read back from the Job it created."""
        ann = _annotations(job)
        if ann.get(CHECK_NODE_ANNOTATION) != node or _labels(job).get(CHECK_ROLE_LABEL) != "node":
            raise ActuatorError(
                409, f"check {name} already exists for node {ann.get(CHECK_NODE_ANNOTATION)}", False
            )
        return {
            "started": name,
            "peer": ann.get(CHECK_PEER_ANNOTATION) or None,
            "note": ann.get(CHECK_NOTE_ANNOTATION, ""),
        }

    def _ensure_peer(self, node: str, cur: Mapping[str, Any], name: str, gpus: int) -> tuple[str | None, str]:
        """The peer of a validation: the one an earlier attempt chose, else a healthy node with ``gpus``
        free GPUs (same machine type, same node pool first), its Job created. (peer, why none)."""
        peer_job = _peer_name(name)
        found = self._check_job(peer_job)
        if found is not None:
            return _annotations(found).get(CHECK_NODE_ANNOTATION) or None, ""
        peer = self._choose_peer(node, cur, gpus)
        if peer is None:
            kind = _labels(cur).get(INSTANCE_TYPE_LABEL)
            return None, (
                f"no healthy Ready node{' of type ' + kind if kind else ''} without Pitstop's taint has "
                f"{gpus} free GPUs: NCCL all_gather skipped"
            )
        body = self._peer_job(peer_job, name, peer, gpus)
        try:
            self._call(f"create job {self.checks.namespace}/{peer_job}", self.batch.create_namespaced_job,
                       self.checks.namespace, body)  # fmt: skip
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = self._check_job(peer_job)
            return (_annotations(found).get(CHECK_NODE_ANNOTATION) or None) if found else None, ""
        return peer, ""

    def _choose_peer(self, node: str, cur: Mapping[str, Any], gpus: int) -> str | None:
        spec = {"tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}
        kind, pool = _labels(cur).get(INSTANCE_TYPE_LABEL), _labels(cur).get(NODEPOOL_LABEL)
        nodes = [
            n for n in self._items("list nodes", self.core.list_node)
            if _meta(n).get("name") != node and _placeable(n, spec)
            and (kind is None or _labels(n).get(INSTANCE_TYPE_LABEL) == kind)
            and valid_object_name(_meta(n).get("name"))
        ]  # fmt: skip
        free = {str(_meta(n).get("name")): _allocatable_gpus(n) for n in nodes}
        for pod in self._items("list pods", self.core.list_pod_for_all_namespaces):
            where = _spec(pod).get("nodeName")
            if where in free and _live(pod):
                free[where] -= _gpus(_spec(pod))
        ok = [n for n in nodes if free[str(_meta(n).get("name"))] >= max(gpus, 1)]
        ok.sort(key=lambda n: (_labels(n).get(NODEPOOL_LABEL) != pool, str(_meta(n).get("name"))))
        return str(_meta(ok[0]).get("name")) if ok else None

    def _fqdn(self, pod_hostname: str) -> str:
        return f"{pod_hostname}.{self.checks.service}.{self.checks.namespace}.svc.cluster.local"

    def _job(self, name: str, check_name: str, role: str, node: str, pod_spec: dict[str, Any],
             annotations: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
        labels = {"app.kubernetes.io/managed-by": "pitstop", CHECK_LABEL: check_name, CHECK_ROLE_LABEL: role}
        pod_spec = {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": self.checks.service,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 10,
            "tolerations": [
                {"key": FENCE_KEY, "operator": "Exists", "effect": "NoSchedule"},
                {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            ],
            **pod_spec,
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.checks.namespace,
                "labels": labels,
                "annotations": {CHECK_NODE_ANNOTATION: node, **(annotations or {})},
            },
            "spec": {
                "backoffLimit": 0,
                "parallelism": 1,
                "completions": 1,
                "activeDeadlineSeconds": self.checks.deadline_s,
                "ttlSecondsAfterFinished": self.checks.ttl_s,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        }

    def _container(self, name: str, image: str, script: str, gpus: int) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": name,
            "image": image,
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}],
        }
        if gpus > 0:
            c["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
        return c

    def _launcher(self, kind: str, name: str, node: str, gpus: int, peer: str | None,
                  check: Mapping[str, Any], note: str) -> dict[str, Any]:  # fmt: skip
        """The Job of the pod on the fenced node: the tools of ``kind``, pinned by ``spec.nodeName``."""
        cs, tools = self.checks, self.checks.tools
        level = str(check.get("dcgm_level"))
        dcgm = ("dcgm", (*tools["dcgmi"], "diag", "-r", level, "-j"))
        if kind == "diagnose":
            steps = [
                ("nvidia_smi_q", (*tools["nvidia-smi"], "-q")),
                ("nvlink", (*tools["nvidia-smi"], "nvlink", "--status")),
                dcgm,
            ]
            spec: dict[str, Any] = {
                "containers": [
                    self._container("diagnose", cs.image, check_script(cs.dcgm_setup, steps), gpus)
                ]
            }
        elif peer is None:
            spec = {
                "containers": [self._container("dcgm", cs.image, check_script(cs.dcgm_setup, [dcgm]), gpus)]
            }
        else:
            size = int(check.get("message_bytes") or 0)
            me, other = self._fqdn(name), self._fqdn(_peer_name(name))
            fill = {"{ranks}": str(2 * gpus), "{hosts}": f"{me}:{gpus},{other}:{gpus}", "{gpus}": str(gpus)}
            mpirun = [_fill(w, fill) for w in cs.mpirun]
            sweep = ("-b", str(_sweep_start(size)), "-e", str(size), "-f", "2", "-g", "1")
            nccl = ("nccl", (*mpirun, *tools["all_gather_perf"], *sweep))
            setup = "\n".join(
                s for s in (cs.nccl_setup, _fill(cs.peer_wait, {"{peer}": shlex.quote(other)})) if s.strip()
            )
            spec = {
                "initContainers": [
                    self._container("dcgm", cs.image, check_script(cs.dcgm_setup, [dcgm]), gpus)
                ],
                "containers": [self._container("nccl", cs.nccl_image, check_script(setup, [nccl]), gpus)],
            }
        spec["nodeName"] = node
        ann = {CHECK_PEER_ANNOTATION: peer or "", CHECK_NOTE_ANNOTATION: note[:1000]}
        return self._job(name, name, "node", node, spec, ann)

    def _peer_job(self, job_name: str, check_name: str, peer: str, gpus: int) -> dict[str, Any]:
        """The NCCL peer: the nccl image's setup (its sshd), then idle until deleted or its deadline."""
        cs = self.checks
        script = "\n".join(s for s in (cs.nccl_setup, f"exec sleep {cs.deadline_s}") if s.strip())
        spec = {
            "nodeSelector": {HOSTNAME_LABEL: peer},
            "containers": [self._container("nccl", cs.nccl_image, script, gpus)],
        }
        return self._job(job_name, check_name, "peer", peer, spec)

    def _started_containers(self, pod: Mapping[str, Any]) -> list[str]:
        """The containers of an ended pod that ran (init containers first), in spec order."""
        st = _status(pod)
        ran = {
            str(c.get("name"))
            for key in ("initContainerStatuses", "containerStatuses")
            for c in st.get(key) or []
            if isinstance(c, dict) and "terminated" in (c.get("state") or {})
        }
        spec = _spec(pod)
        names = [
            str(c.get("name"))
            for key in ("initContainers", "containers")
            for c in spec.get(key) or []
            if isinstance(c, dict)
        ]
        return [n for n in names if n in ran]

    def _pod_log(self, pod: str, container: str, errors: list[str]) -> str:
        """A container's log as text. Raw bytes (``_preload_content=False``): the client would parse
        a log that is JSON and hand back a Python repr (kubernetes-client/python#811, #1354)."""
        ns = self.checks.namespace
        try:
            resp = self.core.read_namespaced_pod_log(
                pod,
                ns,
                container=container,
                limit_bytes=LOG_LIMIT_BYTES,
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            errors.append(
                f"log of {pod}/{container}: {exc.status} {_status_body(exc.body).get('message', '')}"[:300]
            )
            return ""
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(
                503, f"log of {ns}/{pod}: Kubernetes API unreachable ({str(exc)[:200]})", True
            ) from exc
        data = resp.data or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def _delete_peer(self, name: str) -> None:
        ns, peer = self.checks.namespace, _peer_name(name)
        try:
            self._call(f"delete job {ns}/{peer}", self.batch.delete_namespaced_job, peer, ns,
                       propagation_policy="Background")  # fmt: skip
        except ActuatorError as exc:
            if exc.status != 404:
                log.emit(
                    "WARNING",
                    "gke check: peer job not deleted (its deadline ends it)",
                    job=peer,
                    error=str(exc)[:300],
                )


def _status_body(body: Any) -> dict[str, Any]:
    """A Status object from an error answer's body (bytes or text); empty if it is not one."""
    if isinstance(body, bytes | bytearray):
        body = body.decode("utf-8", "replace")
    try:
        out = json.loads(body) if isinstance(body, str) and body else {}
    except ValueError:
        return {"message": str(body)[:300]}
    return out if isinstance(out, dict) else {}


# -- pitstop doctor ------------------------------------------------------------------------------


def doctor_findings(api_client: Any) -> list[str]:
    """One line per JobSet whose template cannot restart its gang after a disruption.

    Pitstop's gang restart relies on the JobSet's own failure policy; without one (or with a
    Job that ignores DisruptionTarget) evicting a member fails the JobSet or replaces one pod.
    """
    custom = k8s.CustomObjectsApi(api_client)
    try:
        resp: Any = custom.list_cluster_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, JOBSETS, _preload_content=False, _request_timeout=DEFAULT_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            return []  # JobSet is not installed: nothing to check
        raise KubeApiError(exc.status or 503, "list jobsets", _status_body(exc.body)) from exc
    items = json.loads(resp.data or b"{}").get("items") or []
    out: list[str] = []
    for js in items:
        if not isinstance(js, dict):
            continue
        where = f"jobset/{_meta(js).get('namespace')}/{_meta(js).get('name')}"
        out += [f"{where}: {why}" for why in restart_blockers(js)]
    return out


# -- production access to a GKE control plane ---------------------------------------------------

CONTAINER_API = "https://container.googleapis.com/v1"
_LOCATION = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+(?:-[a-z])?", re.ASCII)
_CLUSTER = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?", re.ASCII)
_PROJECT = re.compile(r"(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)


def control_plane(cluster: Mapping[str, Any]) -> tuple[str, bytes | None]:
    """The endpoint to call and the CA to trust, from ``clusters.get``: the DNS endpoint when the
    cluster has one (it works for private clusters and carries a publicly trusted certificate:
    no cluster CA), else the IP endpoint with the cluster's own CA."""
    dns = ((cluster.get("controlPlaneEndpointsConfig") or {}).get("dnsEndpointConfig") or {}).get("endpoint")
    if isinstance(dns, str) and re.fullmatch(r"[a-z0-9][-a-z0-9.]{1,252}", dns):
        return f"https://{dns}", None
    endpoint = cluster.get("endpoint")
    ca = (cluster.get("masterAuth") or {}).get("clusterCaCertificate")
    if not isinstance(endpoint, str) or not re.fullmatch(r"[0-9a-fA-F.:\[\]]{2,64}", endpoint) or not ca:
        raise ActuatorError(409, "cluster has neither a DNS endpoint nor an IP endpoint with a CA", False)
    return f"https://{endpoint}", base64.b64decode(ca)


def gke_api_client(project: str, location: str, cluster: str, credentials: Any) -> Any:
    """An ``ApiClient`` for a GKE cluster, authenticated as ``credentials`` (Pitstop's own identity).

    ``container.clusters.get`` (REST) gives the endpoint and CA; every request carries a fresh
    Google access token (refreshed before it expires). RBAC: infra/gke/clusterrole.yaml.
    """
    from google.auth.transport.requests import AuthorizedSession, Request

    if not (_PROJECT.fullmatch(project) and _LOCATION.fullmatch(location) and _CLUSTER.fullmatch(cluster)):
        raise ActuatorError(400, "invalid project, location or cluster name", False)
    url = f"{CONTAINER_API}/projects/{project}/locations/{location}/clusters/{cluster}"
    resp = AuthorizedSession(credentials).get(url, timeout=30)  # type: ignore[no-untyped-call]
    if resp.status_code != 200:
        retryable = resp.status_code == 429 or resp.status_code >= 500
        code = resp.status_code if 400 <= resp.status_code < 600 else 503
        raise ActuatorError(code, f"clusters.get {cluster}: {resp.status_code} {resp.text[:200]}", retryable)
    host, ca = control_plane(resp.json())
    cfg: Any = k8s.Configuration()
    cfg.host = host
    if ca is not None:
        with tempfile.NamedTemporaryFile("wb", prefix="pitstop-gke-ca-", suffix=".pem", delete=False) as f:
            f.write(ca)
        cfg.ssl_ca_cert = f.name

    def refresh(conf: Any) -> None:
        if not credentials.valid:
            credentials.refresh(Request())
        conf.api_key = {"BearerToken": f"Bearer {credentials.token}"}

    refresh(cfg)  # the client sends the token only if one is set before its hook runs
    cfg.refresh_api_key_hook = refresh
    return k8s.ApiClient(cfg)
