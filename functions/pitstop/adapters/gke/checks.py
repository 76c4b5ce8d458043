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
busbw figure from here is therefore never the fabric's and a shortfall pages (docs/engine.md).

This module holds what a check is: its settings, its arguments, the script its pods run and how
their log is cut. The parts that act are divided by responsibility and composed by
check_runs.GkeChecks: check_jobs.py (the Job bodies), check_peers.py (a validation's peer) and
check_runs.py (starting a check once and reading its outcome).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube, KubeApiError
from pitstop.adapters.gke.objects import (
    DNS_LABEL,
    meta_of,
    status_of,
    sub,
    subs,
    valid_namespace,
    valid_object_name,
)
from pitstop.adapters.gke.shapes import (
    KubeObject,
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


def check_job(kube: Kube, ns: str, name: str) -> KubeObject | None:
    """A check's Job (or its peer's) in ``ns``; None when there is none (never made, or past its ttl)."""
    try:
        return kube.call(f"get job {ns}/{name}", kube.batch.read_namespaced_job, name, ns)
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
