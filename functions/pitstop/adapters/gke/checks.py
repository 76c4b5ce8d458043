"""Checks on a fenced node: diagnose before a replacement, validate before the node returns.

A check is a batch/v1 Job of one pod in Pitstop's own namespace. The pod on the fenced node is
pinned by ``spec.nodeName`` (the scheduler, and so the cordon, is bypassed; the kubelet still
admits it against the node's free GPUs) and tolerates Pitstop's taint. A validation's NCCL peer
is a second Job placed by the scheduler on one healthy node (``nodeSelector`` on its hostname).
Each pod runs ``/bin/sh -c`` with a script that prints every tool's stdout after a marker line
``==> pitstop:<tool> <==`` (then ``<tool>:stderr`` and ``<tool>:exit N``); the adapter splits the
log on those lines and never interprets what is between them (core/diagnose.py, core/validation.py
parse). Finished Jobs are removed by Kubernetes' TTL-after-finished controller
(``ttlSecondsAfterFinished``), long enough after the run for a retried check_result to read the
logs again; only the peer, which would otherwise idle until its deadline, is deleted when the
check is read as done. A ``revalidate`` (corrupt data or a shortfall against one peer, issue 21)
runs the NCCL test alone again, with a peer not in ``exclude_peers``.

The NCCL pods report no fabric setup (``nccl_setup`` output), on purpose: GKE's GPUDirect-TCPXO
needs the cluster's multi-network interfaces, a ``tcpxo-daemon`` sidecar with ``NET_ADMIN`` and
the node's ``/sys``, ``/proc/sys`` and plugin libraries as hostPath volumes
(cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx), all of which Pod
Security ``baseline`` in this namespace forbids (kubernetes.io/docs/concepts/security/
pod-security-standards/#baseline) so that creating a check Job is not root on a GPU node. A
busbw figure from here is therefore never the fabric's and a shortfall pages (README).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import urllib3
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube, KubeApiError, status_body
from pitstop.adapters.gke.objects import (
    DNS_LABEL,
    EMPTY,
    FENCE_KEY,
    GPU_RESOURCE,
    allocatable_gpus,
    annotations_of,
    condition_true,
    labels_of,
    live,
    meta_of,
    name_of,
    node_name_of,
    placeable,
    pod_gpus,
    spec_of,
    status_of,
    sub,
    subs,
    text,
    valid_namespace,
    valid_object_name,
)
from pitstop.adapters.gke.shapes import (
    CheckReport,
    CheckStarted,
    Container,
    JobBody,
    KubeObject,
    PodSpec,
    SecurityContext,
)

CHECK_NAMESPACE = "pitstop-system"
# Every check container's securityContext: Pod Security `baseline` holds in pitstop-system
# (infra/gke/clusterrole.yaml); of `restricted`, all but a non-root user (dcgmi needs root).
CHECK_SECURITY: SecurityContext = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
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
# sweep and link: one node, or one ring pair, of a hung gang's stop-time checks (gang.py)
CHECK_KINDS = ("diagnose", "validate", "revalidate", "sweep", "link")
# validate: DCGM, then NCCL with a peer; revalidate: the NCCL test alone with another peer (core/checks.py)
PEERED = ("validate", "revalidate")
LOG_LIMIT_BYTES = 8 << 20  # a check's log is tens of kB; more is read no further
MARKER = re.compile(
    r"\n==> pitstop:(?P<key>[a-z][a-z0-9_]{0,30})(?::(?:(?P<err>stderr)|exit (?P<rc>-?[0-9]{1,4})))? <==\n"
)
SCRIPT_HEAD = """set +e
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
IMAGE_REF = re.compile(r"[a-z0-9][-a-z0-9._/:@]{0,254}", re.ASCII)


def words_of(v: object, what: str) -> tuple[str, ...]:
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
    def from_conf(cls, conf: Mapping[str, object] | None) -> CheckSettings:
        """From a cluster's ``gke:`` policy block (its ``checks`` entry); defaults for what it leaves out."""
        raw = (conf or {}).get("checks") or {}
        if not isinstance(raw, Mapping):
            raise ValueError("gke.checks must be a mapping")
        base = cls()
        tools = dict(base.tools)
        given = raw.get("tools") or {}
        if not isinstance(given, Mapping):
            raise ValueError("gke.checks.tools must be a mapping")
        for tool, prefix in given.items():
            if tool not in DEFAULT_TOOLS:
                raise ValueError(f"gke.checks.tools: unknown tool {tool!r} (one of {sorted(DEFAULT_TOOLS)})")
            tools[tool] = words_of(prefix, f"tools.{tool}")
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
            mpirun=words_of(raw["mpirun"], "mpirun") if "mpirun" in raw else base.mpirun,
            peer_wait=str(raw.get("peer_wait", base.peer_wait)),
            deadline_s=_seconds(raw, "deadline_s", base.deadline_s),
            ttl_s=_seconds(raw, "ttl_s", base.ttl_s),
        )
        out.check()
        return out

    def check(self) -> None:
        if not (valid_namespace(self.namespace) and DNS_LABEL.fullmatch(self.service)):
            raise ValueError("gke.checks: namespace and service must be DNS labels")
        if not (IMAGE_REF.fullmatch(self.image) and IMAGE_REF.fullmatch(self.nccl_image)):
            raise ValueError("gke.checks: image and nccl_image must be image references")
        if not (60 <= self.deadline_s <= 86400 and 60 <= self.ttl_s <= 7 * 86400):
            raise ValueError("gke.checks: deadline_s and ttl_s must be 60 s .. a day (ttl_s: a week)")


def _seconds(raw: Mapping[str, object], key: str, default: int) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"gke.checks.{key} must be a number of seconds")
    try:
        return int(v)
    except ValueError as exc:
        raise ValueError(f"gke.checks.{key} must be a number of seconds") from exc


def split_outputs(log_text: str) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """A check pod's log cut at its marker lines: (stdout, stderr, exit code) per tool, verbatim."""
    outputs: dict[str, str] = {}
    stderr: dict[str, str] = {}
    codes: dict[str, int] = {}
    marks = list(MARKER.finditer(log_text))
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
    lines = [SCRIPT_HEAD]
    if setup.strip():
        lines.append(setup)
    lines += [f"pitstop_run {key} {shlex.join(list(argv))}" for key, argv in steps]
    if then.strip():
        lines.append(then)
    lines.append('rm -f "$pitstop_err"\nexit 0\n')
    return "\n".join(lines)


def sweep_start(message_bytes: int, floor: int = 1 << 20) -> int:
    """The smallest size of a factor-2 sweep that ends exactly on ``message_bytes`` (its row exists)."""
    b = message_bytes
    while b % 2 == 0 and b // 2 >= floor:
        b //= 2
    return b


def fill_in(word: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        word = word.replace(key, value)
    return word


def peer_name(name: str) -> str:
    """The peer Job's name (and its pod's hostname): a DNS label derived from the check's name."""
    if len(name) + 5 <= 63:
        return f"{name}-peer"
    return f"{name[:52].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:5]}-peer"


def check_args(check: Mapping[str, object]) -> tuple[str, str, int]:
    """(kind, name, gpus) of a check request, checked before anything reaches a URL or a pod spec."""
    kind, name, gpus = check.get("kind"), check.get("name"), check.get("gpus", 0)
    if kind not in CHECK_KINDS:
        raise ActuatorError(400, f"check kind must be one of {CHECK_KINDS}, not {str(kind)[:40]!r}", False)
    if not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.fullmatch(name):
        raise ActuatorError(400, f"check name must be a DNS label: {str(name)[:80]!r}", False)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 64:
        raise ActuatorError(400, f"check gpus must be an integer 0..64, not {str(gpus)[:20]!r}", False)
    level = check.get("dcgm_level", 1 if kind in ("sweep", "link") else None)
    if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 4:
        raise ActuatorError(400, f"check dcgm_level must be 1..4, not {str(level)[:20]!r}", False)
    limit = check.get("timeout_s", 60)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 3600:
        raise ActuatorError(400, f"check timeout_s must be 1..3600, not {str(limit)[:20]!r}", False)
    size = check.get("message_bytes")
    if _needs_peer(kind, check) and (
        not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= 1 << 40
    ):
        raise ActuatorError(400, f"validate needs message_bytes (1 .. 1 TiB), not {str(size)[:20]!r}", False)
    excluded = check.get("exclude_peers", [])
    if (
        not isinstance(excluded, list)
        or not all(valid_object_name(p) for p in excluded)
        or len(excluded) > 16
    ):
        raise ActuatorError(400, "check exclude_peers must be a list of up to 16 node names", False)
    return kind, name, gpus


def _names(v: object) -> list[str]:
    """The node names of a list check_args checked (nothing for anything else)."""
    return [str(p) for p in v] if isinstance(v, list) else []


def _needs_peer(kind: str | None, check: Mapping[str, object]) -> bool:
    return kind == "link" or (kind in PEERED and bool(check.get("peer")))


def pod_failure(pod: KubeObject) -> str:
    """Why a check pod did not succeed, in a line: its phase and reason, and containers that failed."""
    st = status_of(pod)
    parts = [f"check pod {meta_of(pod).get('name')} {st.get('phase')}"]
    if st.get("reason") or st.get("message"):
        parts.append(f"{st.get('reason') or ''} {st.get('message') or ''}".strip())
    for key in ("initContainerStatuses", "containerStatuses"):
        for c in subs(st, key):
            term = sub(sub(c, "state"), "terminated")
            if term.get("exitCode") not in (0, None):
                parts.append(
                    f"container {c.get('name')} exited {term.get('exitCode')} ({term.get('reason')})"
                )
    return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")


class GkeChecks:
    """The check Jobs of one cluster."""

    def __init__(self, kube: Kube, settings: CheckSettings) -> None:
        self.kube, self.settings = kube, settings

    # -- checks on the fenced node ---------------------------------------------------------------

    def start(self, node: str, check: Mapping[str, object], key: str) -> CheckStarted:
        """Start a diagnose or validate run on the fenced node, once per ``check["name"]``.

        A retry finds the Job it (or an earlier attempt) created (409 AlreadyExists) and answers as
        the first call did. A 503 (retryable) while pods that hold GPUs are still on the node: the
        kubelet would refuse the check's pod, and a diagnostic must see every GPU.
        """
        kind, name, gpus = check_args(check)
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        ns = self.settings.namespace
        existing = self._check_job(name)
        if existing is not None:
            return self._started_answer(existing, node, name)
        cur = self.kube.node_or_none(node)
        if cur is None:
            raise ActuatorError(503, f"node {node} does not exist (yet): cannot run {kind} on it", True)
        holders = [
            f"{meta_of(p).get('namespace')}/{meta_of(p).get('name')}"
            for p in self.kube.pods_on(node)
            if live(p) and pod_gpus(spec_of(p)) > 0 and labels_of(p).get(CHECK_LABEL) != name
            and not str(labels_of(p).get(CHECK_LABEL)).startswith(f"{check.get('group') or name}-")
        ]  # fmt: skip
        if holders:
            raise ActuatorError(
                503, f"{kind} on {node} waits for pods still holding GPUs: {holders[:5]}", True
            )
        have = allocatable_gpus(cur)
        use = min(gpus, have) if gpus > 0 else have
        notes = [] if use >= gpus else [f"{node} offers {have} of {gpus} GPUs: the check gets {use}"]
        peer: str | None = None
        if _needs_peer(kind, check):
            pinned = check.get("peer_node") if kind == "link" else None  # a ring pair's other end
            skip = frozenset(_names(check.get("exclude_peers")))  # peers measured already
            peer, why = self._ensure_peer(node, cur, name, gpus, str(pinned) if pinned else None, skip)
            if why:
                notes.append(why)
        note = "; ".join(notes)
        body = self._launcher(kind, name, node, use, peer, check, note)
        try:
            self.kube.call(f"create job {ns}/{name}", self.kube.batch.create_namespaced_job, ns, body)
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = self._check_job(name)
            if found is None:
                raise ActuatorError(503, f"check job {ns}/{name} exists and is gone again", True) from exc
            return self._started_answer(found, node, name)
        log.emit("INFO", "gke check started", check=name, node=node, kind=kind, peer=peer, note=note, ctx=key)
        return {"started": name, "peer": peer, "note": note}

    def result(self, node: str, check: Mapping[str, object]) -> CheckReport:
        """The run's state; once its pod has ended, each tool's output read from the pod's log.

        ``outputs`` holds stdout per tool, ``stderr`` and ``exit_codes`` what the script recorded
        beside it; ``error`` says why the pod did not succeed (e.g. the kubelet refused it). The
        peer's Job is deleted once the run is done (best effort); the check's own Job is left to
        Kubernetes' TTL (``ttl_s``), so a retry reads the same logs again.
        """
        _, name, _ = check_args(check)
        ns = self.settings.namespace
        job = self._check_job(name)
        if job is None:
            raise ActuatorError(409, f"no check {ns}/{name}: never started, or removed after its ttl", False)
        if annotations_of(job).get(CHECK_NODE_ANNOTATION) != node:
            raise ActuatorError(
                409,
                f"check {name} runs on {annotations_of(job).get(CHECK_NODE_ANNOTATION)}, not {node}",
                False,
            )
        peer = text(annotations_of(job), CHECK_PEER_ANNOTATION) or None
        pods = self.kube.items(
            f"list pods of check {name}",
            self.kube.core.list_namespaced_pod,
            ns,
            label_selector=f"{JOB_NAME_LABEL}={name}",
        )
        pods.sort(key=lambda p: str(meta_of(p).get("creationTimestamp") or ""))
        pod = next((p for p in reversed(pods) if not live(p)), None)
        job_done = condition_true(job, "Complete") or condition_true(job, "Failed")
        base: CheckReport = {"done": False, "outputs": {}, "peer": peer, "error": None}
        if pod is None and not job_done:
            phase = text(status_of(pods[-1]), "phase") if pods else "no pod yet"
            return {**base, "state": phase}
        outputs: dict[str, str] = {}
        stderr: dict[str, str] = {}
        codes: dict[str, int] = {}
        errors: list[str] = []
        if pod is not None:
            for container in self._started_containers(pod):
                out, err, rc = split_outputs(self._pod_log(str(name_of(pod)), container, errors))
                outputs.update(out)
                stderr.update(err)
                codes.update(rc)
            if status_of(pod).get("phase") != "Succeeded":
                errors.insert(0, pod_failure(pod))
        else:
            conds = subs(status_of(job), "conditions")
            failed = next((c for c in conds if c.get("type") == "Failed"), EMPTY)
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
            "state": text(status_of(pod), "phase") if pod is not None else "Failed",
        }

    # -- check helpers ---------------------------------------------------------------------------

    def _check_job(self, name: str) -> KubeObject | None:
        ns = self.settings.namespace
        try:
            return self.kube.call(f"get job {ns}/{name}", self.kube.batch.read_namespaced_job, name, ns)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _started_answer(self, job: KubeObject, node: str, name: str) -> CheckStarted:
        """What start_check answered the first time, read back from the Job it created."""
        ann = annotations_of(job)
        if ann.get(CHECK_NODE_ANNOTATION) != node or labels_of(job).get(CHECK_ROLE_LABEL) != "node":
            raise ActuatorError(
                409, f"check {name} already exists for node {ann.get(CHECK_NODE_ANNOTATION)}", False
            )
        return {
            "started": name,
            "peer": text(ann, CHECK_PEER_ANNOTATION) or None,
            "note": text(ann, CHECK_NOTE_ANNOTATION) or "",
        }

    def _ensure_peer(
        self,
        node: str,
        cur: KubeObject,
        name: str,
        gpus: int,
        pinned: str | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> tuple[str | None, str]:
        """The peer of a validation: the one an earlier attempt chose, else a healthy node with ``gpus``
        free GPUs (same machine type, same node pool first), none in ``skip``, its Job created.
        (peer, why none)."""
        peer_job = peer_name(name)
        found = self._check_job(peer_job)
        if found is not None:
            return text(annotations_of(found), CHECK_NODE_ANNOTATION) or None, ""
        peer = pinned if pinned and valid_object_name(pinned) else self._choose_peer(node, cur, gpus, skip)
        if peer is None:
            kind = text(labels_of(cur), INSTANCE_TYPE_LABEL)
            return None, (
                f"no healthy Ready node{' of type ' + kind if kind else ''} without Pitstop's taint has "
                f"{gpus} free GPUs: NCCL all_gather skipped"
            )
        body = self._peer_job(peer_job, name, peer, gpus)
        try:
            ns = self.settings.namespace
            self.kube.call(f"create job {ns}/{peer_job}", self.kube.batch.create_namespaced_job, ns, body)
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = self._check_job(peer_job)
            return (text(annotations_of(found), CHECK_NODE_ANNOTATION) or None) if found else None, ""
        return peer, ""

    def _choose_peer(
        self, node: str, cur: KubeObject, gpus: int, skip: frozenset[str] = frozenset()
    ) -> str | None:
        spec: PodSpec = {"tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}
        kind, pool = labels_of(cur).get(INSTANCE_TYPE_LABEL), labels_of(cur).get(NODEPOOL_LABEL)
        nodes = [
            n for n in self.kube.items("list nodes", self.kube.core.list_node)
            if meta_of(n).get("name") != node and meta_of(n).get("name") not in skip and placeable(n, spec)
            and (kind is None or labels_of(n).get(INSTANCE_TYPE_LABEL) == kind)
            and valid_object_name(meta_of(n).get("name"))
        ]  # fmt: skip
        free = {str(name_of(n)): allocatable_gpus(n) for n in nodes}
        for pod in self.kube.items("list pods", self.kube.core.list_pod_for_all_namespaces):
            where = node_name_of(pod)
            if where is not None and where in free and live(pod):
                free[where] -= pod_gpus(spec_of(pod))
        ok = [n for n in nodes if free[str(name_of(n))] >= max(gpus, 1)]
        ok.sort(key=lambda n: (labels_of(n).get(NODEPOOL_LABEL) != pool, str(name_of(n))))
        return str(name_of(ok[0])) if ok else None

    def _fqdn(self, pod_hostname: str) -> str:
        return f"{pod_hostname}.{self.settings.service}.{self.settings.namespace}.svc.cluster.local"

    def _job(self, name: str, check_name: str, role: str, node: str, pod_spec: PodSpec,
             annotations: Mapping[str, str] | None = None) -> JobBody:  # fmt: skip
        labels = {"app.kubernetes.io/managed-by": "pitstop", CHECK_LABEL: check_name, CHECK_ROLE_LABEL: role}
        pod_spec = {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": self.settings.service,
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
                "namespace": self.settings.namespace,
                "labels": labels,
                "annotations": {CHECK_NODE_ANNOTATION: node, **(annotations or {})},
            },
            "spec": {
                "backoffLimit": 0,
                "parallelism": 1,
                "completions": 1,
                "activeDeadlineSeconds": self.settings.deadline_s,
                "ttlSecondsAfterFinished": self.settings.ttl_s,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        }

    def _container(self, name: str, image: str, script: str, gpus: int) -> Container:
        c: Container = {
            "name": name,
            "image": image,
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}],
            "securityContext": CHECK_SECURITY.copy(),
        }
        if gpus > 0:
            c["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
        return c

    def _launcher(self, kind: str, name: str, node: str, gpus: int, peer: str | None,
                  check: Mapping[str, object], note: str) -> JobBody:  # fmt: skip
        """The Job of the pod on the fenced node: the tools of ``kind``, pinned by ``spec.nodeName``."""
        cs, tools = self.settings, self.settings.tools
        level = str(check.get("dcgm_level"))
        dcgm = ("dcgm", (*tools["dcgmi"], "diag", "-r", level, "-j"))
        # a validation counts the node's GPUs first: GPUs missing are a finding the NCCL test cannot make
        first = [("nvidia_smi_q", (*tools["nvidia-smi"], "-q"))] if kind == "validate" else []
        if kind == "sweep":  # the node check a hang's localisation asks of every node, bounded in time
            limit = ("timeout", str(check.get("timeout_s", 60)))
            smi = [("nvidia_smi_q", (*limit, *tools["nvidia-smi"], "-q"))]
            spec: PodSpec = {"containers": [self._container("sweep", cs.image, check_script("", smi), gpus)]}
        elif kind == "diagnose":
            steps = [
                ("nvidia_smi_q", (*tools["nvidia-smi"], "-q")),
                ("nvlink", (*tools["nvidia-smi"], "nvlink", "--status")),
                dcgm,
            ]
            spec = {
                "containers": [
                    self._container("diagnose", cs.image, check_script(cs.dcgm_setup, steps), gpus)
                ]
            }
        elif peer is None:
            script = check_script(cs.dcgm_setup, [*first, dcgm])
            spec = {"containers": [self._container("dcgm", cs.image, script, gpus)]}
        else:
            size = check.get("message_bytes")
            size = size if isinstance(size, int) else 0  # check_args checked it
            me, other = self._fqdn(name), self._fqdn(peer_name(name))
            values = {"{ranks}": str(2 * gpus), "{hosts}": f"{me}:{gpus},{other}:{gpus}", "{gpus}": str(gpus)}
            mpirun = [fill_in(w, values) for w in cs.mpirun]
            sweep = ("-b", str(sweep_start(size)), "-e", str(size), "-f", "2", "-g", "1")
            nccl = ("nccl", (*mpirun, *tools["all_gather_perf"], *sweep))
            setup = "\n".join(
                s for s in (cs.nccl_setup, fill_in(cs.peer_wait, {"{peer}": shlex.quote(other)})) if s.strip()
            )
            spec = {
                "initContainers": [
                    self._container("dcgm", cs.image, check_script(cs.dcgm_setup, [*first, dcgm]), gpus)
                ],
                "containers": [self._container("nccl", cs.nccl_image, check_script(setup, [nccl]), gpus)],
            }
            if kind in ("link", "revalidate"):  # NCCL only: DCGM ran already (sweep, validate)
                del spec["initContainers"]
            # the pair's other node, for the record (the local all_gather_perf stand-in reads it)
            spec["containers"][0]["env"].append({"name": "PITSTOP_PEER_NODE", "value": peer})
        spec["nodeName"] = node
        ann = {CHECK_PEER_ANNOTATION: peer or "", CHECK_NOTE_ANNOTATION: note[:1000]}
        return self._job(name, name, "node", node, spec, ann)

    def _peer_job(self, job_name: str, check_name: str, peer: str, gpus: int) -> JobBody:
        """The NCCL peer: the nccl image's setup (its sshd), then idle until deleted or its deadline."""
        cs = self.settings
        script = "\n".join(s for s in (cs.nccl_setup, f"exec sleep {cs.deadline_s}") if s.strip())
        spec: PodSpec = {
            "nodeSelector": {HOSTNAME_LABEL: peer},
            "containers": [self._container("nccl", cs.nccl_image, script, gpus)],
        }
        return self._job(job_name, check_name, "peer", peer, spec)

    def _started_containers(self, pod: KubeObject) -> list[str]:
        """The containers of an ended pod that ran (init containers first), in spec order."""
        st = status_of(pod)
        ran = {
            str(c.get("name"))
            for key in ("initContainerStatuses", "containerStatuses")
            for c in subs(st, key)
            if "terminated" in sub(c, "state")
        }
        spec = spec_of(pod)
        names = [str(c.get("name")) for key in ("initContainers", "containers") for c in subs(spec, key)]
        return [n for n in names if n in ran]

    def _pod_log(self, pod: str, container: str, errors: list[str]) -> str:
        """A container's log as text. Raw bytes (``_preload_content=False``): the client would parse
        a log that is JSON and hand back a Python repr (kubernetes-client/python#811, #1354)."""
        ns = self.settings.namespace
        try:
            resp = self.kube.core.read_namespaced_pod_log(
                pod,
                ns,
                container=container,
                limit_bytes=LOG_LIMIT_BYTES,
                _preload_content=False,
                _request_timeout=self.kube.timeout,
            )
        except ApiException as exc:
            errors.append(
                f"log of {pod}/{container}: {exc.status} {status_body(exc.body).get('message', '')}"[:300]
            )
            return ""
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(
                503, f"log of {ns}/{pod}: Kubernetes API unreachable ({str(exc)[:200]})", True
            ) from exc
        data = resp.data or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def _delete_peer(self, name: str) -> None:
        ns, peer = self.settings.namespace, peer_name(name)
        try:
            self.kube.call(f"delete job {ns}/{peer}", self.kube.batch.delete_namespaced_job, peer, ns,
                       propagation_policy="Background")  # fmt: skip
        except ActuatorError as exc:
            if exc.status != 404:
                log.emit(
                    "WARNING",
                    "gke check: peer job not deleted (its deadline ends it)",
                    job=peer,
                    error=str(exc)[:300],
                )
