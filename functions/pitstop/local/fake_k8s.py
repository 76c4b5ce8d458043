"""A stateful fake Kubernetes API server for the official ``kubernetes`` client and kubectl.

No kube-apiserver can be installed here (reference/gke.md §7), so this serves the subset Pitstop
drives, with the behaviour observed from kubectl 1.32 and the ``kubernetes`` 37.0.2 client:

- discovery: ``/version``, ``/api``, ``/apis`` (plain APIVersions / APIGroupList, which kubectl
  accepts when it asks for aggregated discovery), ``/api/v1`` and ``/apis/<group>/<version>``
  resource lists with subresources (``pods/eviction`` in group policy/v1, ``*/status``).
- CRUD, list and watch for namespaces, nodes, pods, batch/v1 jobs, policy/v1 PDBs,
  jobset.x-k8s.io/v1alpha2 jobsets and kueue.x-k8s.io/v1beta2 workloads; ``labelSelector`` and
  ``fieldSelector`` (``spec.nodeName=N`` as kubectl drain sends it); cluster-wide lists.
- PATCH in the three formats clients send (k8s_patch.py); strategic merge on a custom resource
  is 415 as on a real server; server-side apply (``apply-patch+yaml``) as a merge patch.
- resourceVersion, 409 on a stale one, errors as ``Status`` bodies (k8s_store.py).
- eviction (``POST .../pods/P/eviction``) as ``pkg/registry/core/pod/storage/eviction.go``
  does it: 404, 409 on a ``preconditions.uid`` mismatch, terminal / pending / terminating pods
  bypass PDBs, 500 for more than one matching PDB, 429 while the PDB status is stale or allows
  no disruption, else condition ``DisruptionTarget`` (``EvictionByEvictionAPI``) then a graceful
  delete. A body without Content-Type, apiVersion or kind (the Python client's) is accepted.
- watch: ``?watch=true`` streams newline-delimited events (chunked) until ``timeoutSeconds``;
  a resourceVersion older than the history is a 410 ``ERROR`` event.
- logs: ``GET .../pods/P/log[?container=C]`` answers the container's output as ``text/plain``
  (400 without ``container`` for a pod of several containers, or for one not started yet). With
  ``run_containers`` (opt-in: the server authorizes nothing) the kubelet runs the ``command``
  of pods bound to a node as local processes (k8s_controllers.py ``ContainerRunner``), and their
  output is the log; other pods print nothing.
- authentication: with ``tokens`` (kube-apiserver's ``--token-auth-file``: token -> username) a
  request's ``Authorization: Bearer`` token names its user, an unknown token is 401; a request
  without one is ``system:anonymous``. No authorization (RBAC is not evaluated).
- validating admission: ValidatingAdmissionPolicies and their bindings
  (``admissionregistration.k8s.io/v1``, applied with kubectl or the API) are enforced on every
  create, update, patch and delete that reaches the API (k8s_admission.py), with the request's user.

Not Kubernetes: ``FakeKube.fail(method, kind, code, reason, times, sub)`` makes the next ``times``
requests of that method on that kind (and subresource) answer ``code`` with a ``Status`` of that
reason, before anything is changed: an API server that refused them (a 409 on a guarded write, a
429 from a budget, a 503 from an overloaded server, a 403 from RBAC). ``GET /_admin/admission``
lists each request a policy judged (who, what, allowed);
``GET /_admin/effects`` lists what mutating requests changed on nodes (cordon,
uncordon, a ``pitstop.dev/remediation`` taint added or removed, with its value) and every pod
evicted (with its node), each with the time, so ``pitstop local status`` can say what each GKE
incident did.

Accepted and ignored: ``fieldManager``, ``fieldValidation``, ``limit``/``continue`` (lists are
never paged), ``dryRun`` is not honoured. Answers are always JSON: a protobuf-first or Table
``Accept`` gets plain JSON objects and Lists, which kubectl and the client take. No OpenAPI (kubectl
apply needs ``--validate=false``), no RBAC. Controllers: k8s_controllers.py.
"""

from __future__ import annotations

import builtins
import copy
import json
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NotRequired, TypedDict
from urllib.parse import parse_qs, urlsplit

import yaml

from pitstop.local.k8s_admission import ANONYMOUS, Policies, Request, check_supported
from pitstop.local.k8s_controllers import (
    ContainerRunner,
    Controllers,
    VmStatus,
    cond_true,
    pdb_status,
    set_cond,
)
from pitstop.local.k8s_patch import (
    PatchError,
    fields_match,
    json_patch,
    labels_match,
    merge_patch,
    selector_matches,
    strategic_merge,
)
from pitstop.local.k8s_store import (
    BY_KIND,
    RESOURCES,
    ApiError,
    Obj,
    Resource,
    Store,
    Validate,
    check_preconditions,
    invalid,
    is_terminal,
    not_found,
)

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PDB_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
FENCE_TAINT = "pitstop.dev/remediation"  # what Pitstop's GKE adapter taints a fenced node with


@dataclass
class Fault:
    """The next ``times`` requests of ``method`` on ``kind`` (subresource ``sub``) answer ``code``."""

    method: str
    kind: str
    code: int
    reason: str
    times: int
    sub: str = ""


@dataclass(frozen=True)
class Route:
    """A resource request: which resource, namespace, object and subresource the path names."""

    res: Resource
    namespace: str | None
    name: str | None
    sub: str


def route(path: str) -> Route | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    served = {r.plural: r for r in RESOURCES if (r.group, r.version) == (group, version)}
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in served and served[rest[2]].namespaced:
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in served or len(rest) > 3:
        return None
    res = served[rest[0]]
    if res.namespaced and namespace is None and len(rest) > 1:
        return None
    return Route(res, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else "")


# --- discovery ----------------------------------------------------------------------------------
def resource_list(group: str, version: str) -> Obj | None:
    """The APIResourceList of one group/version, subresources included."""
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not served:
        return None
    items: list[Obj] = []
    for r in served:
        items.append(
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
                **({"categories": ["all"]} if r.kind in ("Pod", "Job", "JobSet") else {}),
            }
        )
        for sub in r.subresources:
            entry: Obj = {"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced}
            if sub == "eviction":
                entry.update(group="policy", version="v1", kind="Eviction", verbs=["create"])
            elif sub == "log":
                entry.update(kind=r.kind, verbs=["get"])
            else:
                entry.update(kind=r.kind, verbs=["get", "patch", "update"])
            items.append(entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}


def api_groups() -> Obj:
    groups: list[Obj] = []
    for r in RESOURCES:
        if r.group and all(g["name"] != r.group for g in groups):
            gv = {"groupVersion": r.api_version, "version": r.version}
            groups.append({"name": r.group, "versions": [gv], "preferredVersion": gv})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def discovery(path: str, host: str) -> Obj | None:
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.4-pitstop-fake",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.23.6",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    if parts == ["api"]:
        cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr}
    if parts == ["apis"]:
        return api_groups()
    if len(parts) == 2 and parts[0] == "apis":
        return next((g for g in api_groups()["groups"] if g["name"] == parts[1]), None)
    if parts == ["api", "v1"]:
        return resource_list("", "v1")
    if len(parts) == 3 and parts[0] == "apis":
        return resource_list(parts[1], parts[2])
    return None


# --- API-server defaulting and validation ---------------------------------------------------------
def _pod_spec_defaults(spec: Obj, restart_policy: str | None) -> None:
    if restart_policy:
        spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in spec.get("containers") or []:
        c.setdefault("imagePullPolicy", "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("resources", {})


def _pod_defaults(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    _pod_spec_defaults(spec, "Always")
    keys = {t.get("key") for t in spec.get("tolerations") or []}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if key not in keys:  # the DefaultTolerationSeconds admission plugin (gke.md §2)
            tol = {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            spec["tolerations"] = [*(spec.get("tolerations") or []), tol]
    pod.setdefault("status", {}).setdefault("phase", "Pending")
    pod["status"].setdefault("qosClass", "BestEffort")


def _job_defaults(job: Obj) -> None:
    spec, meta = job.setdefault("spec", {}), job["metadata"]
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
        for pattern in rule.get("onPodConditions") or []:
            pattern.setdefault("status", "True")
    uid_labels = {"batch.kubernetes.io/controller-uid": meta["uid"]}
    spec.setdefault("selector", {"matchLabels": dict(uid_labels)})
    tmpl = spec.setdefault("template", {})
    labels = tmpl.setdefault("metadata", {}).setdefault("labels", {})
    labels.update({**uid_labels, "batch.kubernetes.io/job-name": meta["name"]})
    labels.update({"controller-uid": meta["uid"], "job-name": meta["name"]})
    pod_spec = tmpl.setdefault("spec", {})
    _pod_spec_defaults(pod_spec, None)
    res = BY_KIND["Job"]
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        msg = 'Required value: valid values: "OnFailure", "Never"'
        raise invalid(res, meta["name"], "spec.template.spec.restartPolicy", msg)
    if spec.get("podFailurePolicy") and pod_spec["restartPolicy"] != "Never":
        msg = f'Unsupported value: "{pod_spec["restartPolicy"]}": supported values: "Never"'
        raise invalid(res, meta["name"], "spec.template.spec.restartPolicy", msg)
    job.setdefault("status", {})


def _jobset_defaults(js: Obj) -> None:
    """The JobSet webhook's defaults (jobset v0.12.0 ``jobset_webhook.go`` Default)."""
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All", "targetReplicatedJobs": []})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    spec.setdefault("network", {}).setdefault("enableDNSHostnames", True)
    spec["network"].setdefault("publishNotReadyAddresses", True)
    if spec.get("failurePolicy") is not None:
        spec["failurePolicy"].setdefault("restartStrategy", "Recreate")
    for rjob in spec.setdefault("replicatedJobs", []):
        rjob.setdefault("replicas", 1)
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        pod_spec.setdefault("restartPolicy", "OnFailure")


def api_defaults(kind: str, obj: Obj) -> None:
    """Fields the API server (or a built-in webhook) fills in on create."""
    if kind == "Pod":
        _pod_defaults(obj)
    elif kind == "Job":
        _job_defaults(obj)
    elif kind == "JobSet":
        _jobset_defaults(obj)
    elif kind == "Workload":
        obj.setdefault("spec", {}).setdefault("active", True)
    elif kind == "PodDisruptionBudget":
        status = obj.setdefault("status", {})
        for key in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods"):
            status.setdefault(key, 0)
    elif kind == "Namespace":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
    elif kind == "Node":
        obj.setdefault("spec", {})
        obj.setdefault("status", {})


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")


# What JobSet's validating webhook lets change in a pod template while the JobSet is suspended or
# being suspended, for Kueue (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go ValidateUpdate).
_JOBSET_TEMPLATE_MUTABLE = (("metadata", "annotations"), ("metadata", "labels"), ("spec", "nodeSelector"),
                            ("spec", "tolerations"), ("spec", "schedulingGates"))  # fmt: skip


def jobset_webhook(old: Obj, new: Obj) -> None:
    """JobSet's webhook: ``spec.replicatedJobs`` and ``spec.managedBy`` are immutable, but for the
    pod templates' scheduling fields when the old or the new JobSet is suspended. Its refusal is a
    controller-runtime ``Denied`` (403 Forbidden) the API server words as a webhook's denial."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}

    def comparable(spec: Obj) -> Obj:
        rjobs = copy.deepcopy(spec.get("replicatedJobs"))
        if old_spec.get("suspend") or new_spec.get("suspend"):
            for rj in rjobs or []:
                pod = ((rj.get("template") or {}).get("spec") or {}).get("template") or {}
                for part, key in _JOBSET_TEMPLATE_MUTABLE:
                    (pod.get(part) or {}).pop(key, None)
        return {"replicatedJobs": rjobs, "managedBy": spec.get("managedBy")}

    if comparable(old_spec) != comparable(new_spec):
        field = (
            "replicatedJobs"
            if old_spec.get("replicatedJobs") != new_spec.get("replicatedJobs")
            else "managedBy"
        )
        msg = (
            'admission webhook "vjobset.kb.io" denied the request: '
            f'spec.{field}: Invalid value: "object": field is immutable'
        )
        raise ApiError(403, "Forbidden", msg)


def validate_update(res: Resource, old: Obj, new: Obj, sub: str) -> None:
    """Pod spec updates may change little (``ValidatePodUpdate``); nodeName only through binding."""
    if res.kind != "Pod" or sub == "status":
        return

    def comparable(spec: Obj) -> Obj:
        out = {k: v for k, v in copy.deepcopy(spec).items() if k not in _POD_MUTABLE}
        for key in ("containers", "initContainers"):
            for c in out.get(key) or []:
                c.pop("image", None)
        return out

    if comparable(old.get("spec") or {}) != comparable(new.get("spec") or {}):
        msg = (
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
            "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
            "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it "
            "was previously negative)"
        )
        raise invalid(res, old["metadata"]["name"], "spec", msg)


def unsupported_patch(res: Resource) -> ApiError:
    types = [JSON_PATCH, MERGE, APPLY] if res.custom else [JSON_PATCH, MERGE, APPLY, SMP]
    msg = (
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(types)}"
    )
    return ApiError(415, "UnsupportedMediaType", msg)


def _load(body: bytes) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"the object provided is unrecognized: {err}") from err


def _pdb_cause(name: str, message: str) -> Obj:
    return {"causes": [{"reason": "DisruptionBudget", "message": message}], "name": name}


# --- the handler --------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    kube: FakeKube


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _handle(self) -> None:
        self.server.kube.handle(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle  # noqa: N815 (http.server names)

    def log_message(self, *args: Any) -> None:
        pass


def _send(h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _send_text(h: BaseHTTPRequestHandler, code: int, data: bytes) -> None:
    """A log as the API server sends it: the bytes the container wrote, ``text/plain``."""
    h.send_response(code)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _chunk(h: BaseHTTPRequestHandler, event: Obj) -> None:
    data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()


class KubeEffect(TypedDict):
    """A change a mutating request made that a remediation makes (cordon, taint, evict...)."""

    method: str
    node: str | None  # evict: the node the pod was on (None: not yet scheduled)
    at: float
    value: NotRequired[str | None]  # cordon/uncordon: None; taint/untaint: the incident it names
    pod: NotRequired[str]  # evict: ``namespace/name``


def _spec(n: Mapping[str, object]) -> Mapping[str, object]:
    spec = n.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def node_changes(before: Mapping[str, object], after: Mapping[str, object]) -> list[tuple[str, str | None]]:
    """What a node write changed that a remediation does: the cordon, and Pitstop's taint."""

    def cordoned(n: Mapping[str, object]) -> bool:
        return bool(_spec(n).get("unschedulable"))

    def fences(n: Mapping[str, object]) -> set[str]:
        taints = _spec(n).get("taints") or []
        listed = taints if isinstance(taints, list) else []
        return {str(t.get("value")) for t in listed if isinstance(t, dict) and t.get("key") == FENCE_TAINT}

    out: list[tuple[str, str | None]] = []
    if cordoned(before) != cordoned(after):
        out.append(("cordon" if cordoned(after) else "uncordon", None))
    out += [("taint", v) for v in sorted(fences(after) - fences(before))]
    out += [("untaint", v) for v in sorted(fences(before) - fences(after))]
    return out


class FakeKube:
    """The fake API server, its object store and its controllers (see the module docstrings)."""

    def __init__(
        self,
        vm_status: VmStatus | None = None,
        *,
        auto: bool = True,
        time_scale: float = 0.01,
        history: int = 10_000,
        interval: float = 0.1,
        run_containers: bool = False,
        container_env: Mapping[str, str] | None = None,
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.store = Store(time_scale=time_scale, history=history)
        self.store.admission.append(api_defaults)
        # Bearer token -> username (kube-apiserver's --token-auth-file). Without tokens every request
        # is anonymous; with them a request naming an unknown token is 401, one naming none anonymous.
        self.tokens = dict(tokens or {})
        self.policies = Policies(self.store)  # ValidatingAdmissionPolicies applied (k8s_admission.py)
        # Opt-in: a pod whose containers name a command runs it on this machine (k8s_controllers.py
        # ContainerRunner). Off unless asked for: the server has no authentication.
        self.runner = ContainerRunner(self.store, container_env) if run_containers else None
        self.controllers = Controllers(self.store, vm_status, self.runner)
        self.auto, self.interval = auto, interval
        self.requests: list[tuple[str, str, str]] = []  # (method, path with query, content type)
        self.effects: list[KubeEffect] = []  # what mutating requests changed (GET /_admin/effects)
        self.errors: list[str] = []  # controller exceptions from the background loop
        self.faults: list[Fault] = []  # answers to give instead (fail())
        self._server: _Server | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for ns in DEFAULT_NAMESPACES:
            self.store.create("Namespace", {"metadata": {"name": ns}})

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.kube = self
        self._stop.clear()
        serve = threading.Thread(target=self._server.serve_forever, name="fake-k8s", daemon=True)
        self._threads = [serve]
        if self.auto:
            self._threads.append(
                threading.Thread(target=self._loop, name="fake-k8s-controllers", daemon=True)
            )
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        with self.store.lock:
            self.store.closed = True
            self.store.changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        if self.runner is not None:
            self.runner.close()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: str | Path) -> None:
        """A kubeconfig for kubectl and ``kubernetes.config.load_kube_config`` (plain http, no auth)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "pitstop-fake", "cluster": {"server": self.url}}],
            "users": [{"name": "pitstop-fake", "user": {}}],
            "contexts": [
                {
                    "name": "pitstop-fake",
                    "context": {"cluster": "pitstop-fake", "user": "pitstop-fake", "namespace": "default"},
                }
            ],
            "current-context": "pitstop-fake",
            "preferences": {},
        }
        Path(path).write_text(yaml.safe_dump(config))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:
                self.errors.append(traceback.format_exc())
                print(self.errors[-1], file=sys.stderr)

    # --- Python interface -----------------------------------------------------------------------
    def fail(self, method: str, kind: str, code: int, reason: str, times: int = 1, sub: str = "") -> None:
        """The next ``times`` ``method`` requests on ``kind`` (``sub``: e.g. ``eviction``) answer ``code``."""
        with self.store.lock:
            self.faults.append(Fault(method, kind, code, reason, times, sub))

    def _fault(self, method: str, r: Route) -> ApiError | None:
        with self.store.lock:
            for f in self.faults:
                if f.times > 0 and (f.method, f.kind, f.sub) == (method, r.res.kind, r.sub):
                    f.times -= 1
                    return ApiError(f.code, f.reason, f"injected: {f.reason}")
        return None

    def step(self) -> None:
        """Run every controller once (kubelet, GC, Job, JobSet, Kueue, scheduler, disruption)."""
        self.controllers.step()

    def settle(self, max_steps: int = 50) -> int:
        """Step until a step changes nothing (or ``max_steps``); returns the steps taken."""
        for n in range(1, max_steps + 1):
            before = self.store.resource_version
            self.step()
            if self.store.resource_version == before:
                return n
        return max_steps

    def advance(self, seconds: float) -> None:
        """Move the clock grace periods run on by ``seconds`` (Kubernetes seconds)."""
        self.store.advance(seconds)

    def compact(self) -> None:
        """Drop the watch history: watches from an older resourceVersion get 410 Gone."""
        self.store.compact()

    def create(self, obj: Obj) -> Obj:
        return self.store.create(obj["kind"], obj)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self.store.get(kind, name, namespace)

    def list(
        self, kind: str, namespace: str | None = None, *, labels: str | None = None
    ) -> builtins.list[Obj]:
        return self.store.list(kind, namespace, labels=labels)

    def delete(self, kind: str, name: str, namespace: str | None = None, **options: Any) -> Obj:
        return self.store.delete(kind, name, namespace, options=options)

    def mutate(
        self, kind: str, name: str, fn: Callable[[Obj], object], namespace: str | None = None
    ) -> Obj | None:
        """Read-modify-write any part of an object, status included, as a controller would."""
        return self.store.mutate(kind, name, namespace, fn)

    def add_node(
        self, name: str, *, project: str, zone: str, gpus: int = 8, labels: dict[str, str] | None = None
    ) -> Obj:
        """A Ready GKE GPU node: providerID ``gce://project/zone/name``, zone labels, ``nvidia.com/gpu``."""
        now = self.store.wall()
        resources = {
            "cpu": "208",
            "memory": "1929736Mi",
            "pods": "110",
            "ephemeral-storage": "500Gi",
            "nvidia.com/gpu": str(gpus),
        }
        node_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/zone": zone,
            "topology.kubernetes.io/region": zone.rsplit("-", 1)[0],
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
            "cloud.google.com/gke-nodepool": "gpu-pool",
            "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
            **(labels or {}),
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": node_labels},
            "spec": {"providerID": f"gce://{project}/{zone}/{name}"},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": _node_conditions(now),
                "addresses": [
                    {"type": "InternalIP", "address": "10.128.0.2"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": _node_info(),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }
        return self.store.create("Node", node)

    def set_node_condition(
        self, name: str, type: str, status: str, reason: str = "", message: str = ""
    ) -> None:
        """Set a node condition as an agent would through ``nodes/status`` (e.g. XidCriticalError)."""
        now = self.store.wall()

        def edit(node: Obj) -> None:
            set_cond(node, type, status, reason, message, now)
            for c in node["status"]["conditions"]:
                if c["type"] == type:
                    c["lastHeartbeatTime"] = now

        if self.store.mutate("Node", name, None, edit) is None:
            raise KeyError(name)

    def set_gpu_allocatable(self, name: str, n: int) -> None:
        """What the GPU device plugin reports when it marks GPUs unhealthy (or healthy again)."""
        if (
            self.store.mutate(
                "Node",
                name,
                None,
                lambda node: node["status"]["allocatable"].update({"nvidia.com/gpu": str(n)}),
            )
            is None
        ):
            raise KeyError(name)

    def kubelet_unreachable(self, node: str) -> None:
        """The node's kubelet stops answering while its VM runs: its pods never end by themselves."""
        with self.store.lock:
            self.controllers.kubelet_unreachable(node)

    def processes_hung(self, node: str) -> None:
        """The node's containers cannot be killed (a process in D state): deleted pods stay Terminating."""
        with self.store.lock:
            self.controllers.processes_hung(node)

    def finish_pod(self, name: str, namespace: str = "default", exit_code: int = 0) -> None:
        """The pod's containers exit: Succeeded on 0, else Failed (restartPolicy Never semantics)."""

        def edit(pod: Obj) -> None:
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for cs in pod["status"].get("containerStatuses") or []:
                started = (cs.get("state") or {}).get("running", {}).get("startedAt")
                cs.update(ready=False, started=False)
                cs["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                        "startedAt": started,
                    }
                }
            set_cond(pod, "Ready", "False", "PodCompleted", "", self.store.wall())

        if self.store.mutate("Pod", name, namespace, edit) is None:
            raise KeyError(name)

    # --- HTTP ---------------------------------------------------------------------------------
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        parsed = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parsed.query, keep_blank_values=True).items()}
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        self.requests.append((h.command, h.path, ctype))
        try:
            host = h.headers.get("Host") or ""
            static = discovery(parsed.path, host) if h.command == "GET" else None
            if static is not None:
                return _send(h, 200, static)
            if parsed.path in ("/healthz", "/readyz", "/livez"):
                return _send(h, 200, "ok")
            if h.command == "GET" and parsed.path == "/_admin/effects":
                return _send(h, 200, {"effects": list(self.effects)})
            if h.command == "GET" and parsed.path == "/_admin/admission":
                return _send(h, 200, {"decisions": list(self.policies.decisions)})
            user = self._caller(h.headers.get("Authorization"))
            r = route(parsed.path)
            if r is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            fault = self._fault(h.command, r)
            if fault is not None:
                raise fault
            if h.command == "GET" and r.name is None and query.get("watch") in ("true", "1"):
                return self._watch(h, r, query)
            if h.command == "GET" and r.res.kind == "Pod" and r.name and r.sub == "log":
                return _send_text(h, 200, self._log(r.namespace or "default", r.name, query))
            before = self._effect_subject(h.command, r)
            code, resp = self._dispatch(h.command, r, query, body, ctype, user)
            self._note_effects(r, before, resp)
        except ApiError as err:
            code, resp = err.code, err.status()
        except Exception as err:  # a bug in the fake: answer as the API server would, and show it
            traceback.print_exc()
            code, resp = 500, ApiError(500, "InternalError", f"fake API server error: {err!r}").status()
        return _send(h, code, resp)

    def _caller(self, authorization: str | None) -> str:
        """The request's username: its bearer token's (401 for a token not in the table)."""
        if not self.tokens or not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        user = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _admit(self, user: str, operation: str, r: Route) -> Validate:
        """The validating admission of one write: the applied policies, with the request's user."""

        def validate(old: Obj | None, new: Obj) -> None:
            check_supported(r.res.kind, new)
            self.policies.review(_request(user, operation, r, new.get("metadata") or {}), old, new)
            if r.res.kind == "JobSet" and r.sub == "" and old is not None:
                # validating webhooks run after the policies (kube-apiserver's plugin order: k8s.io/
                # kubernetes pkg/kubeapiserver/options/plugins.go AllOrderedPlugins)
                jobset_webhook(old, new)

        return validate

    def _effect_subject(self, method: str, r: Route) -> Obj | None:
        """The node a write may change, or the pod an eviction takes, as it is before the request."""
        node_write = r.res.kind == "Node" and method in ("PATCH", "PUT") and r.sub == ""
        eviction = r.res.kind == "Pod" and method == "POST" and r.sub == "eviction"
        if not (node_write or eviction) or not r.name:
            return None
        return self.store.get(r.res.kind, r.name, r.namespace)

    def _note_effects(self, r: Route, before: Obj | None, after: Any) -> None:
        if before is None:
            return
        at = time.time()
        if r.res.kind == "Pod":
            node = (before.get("spec") or {}).get("nodeName")
            pod = f"{before['metadata'].get('namespace')}/{before['metadata']['name']}"
            self.effects.append({"method": "evict", "node": node, "pod": pod, "at": at})
            return
        if isinstance(after, dict):
            for method, value in node_changes(before, after):
                self.effects.append({"method": method, "node": r.name, "value": value, "at": at})

    def _dispatch(
        self, method: str, r: Route, query: dict[str, str], body: bytes, ctype: str, user: str = ANONYMOUS
    ) -> tuple[int, Any]:
        kind, ns = r.res.kind, r.namespace
        if method == "GET" and r.name is None:
            return 200, self._list(r, query)
        if method == "GET":
            obj = self.store.get(kind, r.name or "", ns)
            if obj is None or r.sub not in ("", "status"):
                raise not_found(r.res, r.name or "")
            return 200, obj
        if method == "POST" and r.name is None:
            return 201, self._create(r, _load(body), user)
        if method == "POST" and r.sub == "eviction":
            return 201, self._evict(ns or "default", r.name or "", body)
        if method == "PUT" and r.name and r.sub in ("", "status"):
            return 200, self._replace(r, _load(body), user)
        if method == "PATCH" and r.name and r.sub in ("", "status"):
            return 200, self._patch(r, body, ctype, user)
        if method == "DELETE" and r.name and not r.sub:
            options = {**(_load(body) if body else {}), **_delete_query(query)}
            with self.store.lock:
                cur = self.store.get(kind, r.name, ns)
                if cur is not None:
                    self.policies.review(_request(user, "DELETE", r, cur["metadata"]), cur, None)
                return 200, self.store.delete(kind, r.name, ns, options=options)
        if method == "DELETE" and r.name is None:
            return 200, self._delete_collection(r, query)
        raise ApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )

    def _list(self, r: Route, query: dict[str, str]) -> Obj:
        with self.store.lock:
            items = self.store.list(
                r.res.kind, r.namespace, labels=query.get("labelSelector"), fields=query.get("fieldSelector")
            )
            rv = str(self.store.resource_version)
        return {
            "kind": f"{r.res.kind}List",
            "apiVersion": r.res.api_version,
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    def _create(self, r: Route, obj: Any, user: str) -> Obj:
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized")
        meta = obj.setdefault("metadata", {})
        if r.res.namespaced:
            if meta.get("namespace") and r.namespace and meta["namespace"] != r.namespace:
                msg = "the namespace of the provided object does not match the namespace sent on the request"
                raise ApiError(400, "BadRequest", msg)
            meta["namespace"] = r.namespace or meta.get("namespace") or "default"
        return self.store.create(r.res.kind, obj, validate=self._admit(user, "CREATE", r))

    def _replace(self, r: Route, obj: Any, user: str) -> Obj:
        if not isinstance(obj, dict) or (obj.get("metadata") or {}).get("name") != r.name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        obj["metadata"]["namespace"] = r.namespace
        with self.store.lock:
            old = self.store.get(r.res.kind, r.name or "", r.namespace)
            if old is None:
                raise not_found(r.res, r.name or "")
            validate_update(r.res, old, obj, r.sub)
            return self.store.update(
                r.res.kind, obj, subresource=r.sub, validate=self._admit(user, "UPDATE", r)
            )

    def _patch(self, r: Route, body: bytes, ctype: str, user: str) -> Obj:
        name = r.name or ""
        with self.store.lock:
            cur = self.store.get(r.res.kind, name, r.namespace)
            if ctype == APPLY:
                return self._apply(r, cur, yaml.safe_load(body or b"{}") or {}, user)
            if cur is None:
                raise not_found(r.res, name)
            patch = _load(body)
            try:
                if ctype == SMP and not r.res.custom:
                    new = strategic_merge(cur, patch)
                elif ctype == MERGE:
                    new = merge_patch(cur, patch)
                elif ctype == JSON_PATCH:
                    new = json_patch(cur, patch)
                else:
                    raise unsupported_patch(r.res)
            except PatchError as err:
                raise invalid(r.res, name, "patch", str(err)) from err
            if not isinstance(new, dict):
                raise invalid(r.res, name, "patch", "the patch does not yield an object")
            new.setdefault("metadata", {})["name"] = name
            validate_update(r.res, cur, new, r.sub)
            return self.store.update(
                r.res.kind, new, subresource=r.sub, validate=self._admit(user, "UPDATE", r)
            )

    def _apply(self, r: Route, cur: Obj | None, patch: Obj, user: str) -> Obj:
        """Server-side apply, approximated as a merge patch (no field ownership, no conflicts)."""
        patch.setdefault("metadata", {})["name"] = r.name
        if cur is None:
            return self._create(r, patch, user)
        new = merge_patch(cur, patch)
        validate_update(r.res, cur, new, r.sub)
        admit = self._admit(user, "UPDATE", r)
        return self.store.update(r.res.kind, new, subresource=r.sub, check_rv=False, validate=admit)

    def _delete_collection(self, r: Route, query: dict[str, str]) -> Obj:
        items = []
        for obj in self.store.list(
            r.res.kind, r.namespace, labels=query.get("labelSelector"), fields=query.get("fieldSelector")
        ):
            m = obj["metadata"]
            items.append(
                self.store.delete(r.res.kind, m["name"], m.get("namespace"), options=_delete_query(query))
            )
        return {"kind": f"{r.res.kind}List", "apiVersion": r.res.api_version, "metadata": {}, "items": items}

    # --- logs ---------------------------------------------------------------------------------
    def _log(self, namespace: str, name: str, query: dict[str, str]) -> bytes:
        """``GET .../pods/P/log`` (``pkg/registry/core/pod/strategy.go`` LogLocation, then the kubelet).

        ``container`` may be left out only when the pod has one container; a container that has not
        started is 400 "waiting to start". ``tailLines`` and ``limitBytes`` are honoured; ``follow``,
        ``previous``, ``timestamps`` and ``sinceSeconds`` are accepted and ignored.
        """
        pod = self.store.get("Pod", name, namespace)
        if pod is None:
            raise not_found(BY_KIND["Pod"], name)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        mains = [str(c.get("name")) for c in spec.get("containers") or []]
        inits = [str(c.get("name")) for c in spec.get("initContainers") or []]
        container = query.get("container") or ""
        if not container:
            if len(mains) != 1:
                msg = f"a container name must be specified for pod {name}, choose one of: [{' '.join(mains)}]"
                if inits:
                    msg += f" or one of the init containers: [{' '.join(inits)}]"
                raise ApiError(400, "BadRequest", msg)
            container = mains[0]
        if container not in mains + inits:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        key = "initContainerStatuses" if container in inits else "containerStatuses"
        cs = next((c for c in status.get(key) or [] if c.get("name") == container), None)
        data = self.runner.log(pod["metadata"]["uid"], container) if self.runner is not None else None
        if cs is None or ("waiting" in (cs.get("state") or {}) and data is None):
            why = "PodInitializing" if container in mains and inits else "ContainerCreating"
            msg = f'container "{container}" in pod "{name}" is waiting to start: {why}'
            raise ApiError(400, "BadRequest", msg)
        data = data or b""
        if (query.get("tailLines") or "").isdigit():
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
        if (query.get("limitBytes") or "").isdigit() and int(query["limitBytes"]) > 0:
            data = data[: int(query["limitBytes"])]
        return data

    # --- eviction -----------------------------------------------------------------------------
    def _evict(self, namespace: str, name: str, body: bytes) -> Obj:
        eviction = _load(body) if body else {}
        eviction.setdefault("apiVersion", "policy/v1")
        eviction.setdefault("kind", "Eviction")
        if eviction["kind"] != "Eviction":
            raise ApiError(400, "BadRequest", f"unexpected kind {eviction['kind']!r}, expected Eviction")
        if (eviction.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        options = eviction.get("deleteOptions") or {}
        pods = BY_KIND["Pod"]
        with self.store.lock:
            pod = self.store.get("Pod", name, namespace)
            if pod is None:
                raise not_found(pods, name)
            check_preconditions(pods, pod, options.get("preconditions") or {})
            phase = pod["status"].get("phase")
            if not (is_terminal(pod) or phase == "Pending" or pod["metadata"].get("deletionTimestamp")):
                self._check_pdbs(pod)
            now = self.store.wall()
            reason, message = "EvictionByEvictionAPI", "Eviction API: evicting"
            self.store.mutate(
                "Pod",
                name,
                namespace,
                lambda p: set_cond(p, "DisruptionTarget", "True", reason, message, now),
            )
            self.store.delete("Pod", name, namespace, options=options)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _check_pdbs(self, pod: Obj) -> None:
        """``checkAndDecrement`` of eviction.go: one PDB at most, current status, a disruption left."""
        ns = pod["metadata"]["namespace"]
        pdbs = [
            p
            for p in self.store.list("PodDisruptionBudget", ns)
            if p["spec"].get("selector") is not None
            and selector_matches(p["spec"]["selector"], pod["metadata"].get("labels"))
        ]
        if len(pdbs) > 1:
            msg = "This pod has more than one PodDisruptionBudget, "
            msg += "which the eviction subresource does not support."
            raise ApiError(500, "InternalError", msg)
        if not pdbs:
            return
        pdb = pdbs[0]
        name, status = pdb["metadata"]["name"], pdb.get("status") or {}
        if int(status.get("observedGeneration", 0)) < int(pdb["metadata"].get("generation", 1)):
            cause = _pdb_cause(name, f"The disruption budget {name} is still being processed by the server.")
            raise ApiError(429, "TooManyRequests", PDB_VIOLATION, cause)
        fresh = pdb_status(self.store, pdb)
        healthy_pod = cond_true(pod, "Ready")
        policy = pdb["spec"].get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if not healthy_pod and (
            policy == "AlwaysAllow" or fresh["currentHealthy"] >= fresh["desiredHealthy"]
        ):
            return
        if int(status.get("disruptionsAllowed", 0)) <= 0:
            need, have = status.get("desiredHealthy", 0), status.get("currentHealthy", 0)
            msg = f"The disruption budget {name} needs {need} healthy pods and has {have} currently"
            raise ApiError(429, "TooManyRequests", PDB_VIOLATION, _pdb_cause(name, msg))

        def take(p: Obj) -> None:
            p["status"]["disruptionsAllowed"] = int(p["status"]["disruptionsAllowed"]) - 1
            p["status"].setdefault("disruptedPods", {})[pod["metadata"]["name"]] = self.store.wall()

        self.store.mutate("PodDisruptionBudget", name, ns, take)

    # --- watch --------------------------------------------------------------------------------
    def _watch(self, h: BaseHTTPRequestHandler, r: Route, query: dict[str, str]) -> None:
        """Stream events as chunked JSON lines until ``timeoutSeconds`` or the server stops."""
        timeout = float(query.get("timeoutSeconds") or 1800)
        select = _WatchFilter(r, query.get("labelSelector"), query.get("fieldSelector"))
        rv = query.get("resourceVersion") or "0"
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.close_connection = True
        try:
            for event in self._events(r, select, rv, time.monotonic() + timeout):
                _chunk(h, event)
            h.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _events(self, r: Route, select: _WatchFilter, rv: str, deadline: float) -> Iterator[Obj]:
        with self.store.lock:
            if rv == "0":
                since = self.store.resource_version
                initial = [
                    {"type": "ADDED", "object": o}
                    for o in self.store.list(r.res.kind, r.namespace)
                    if select.match(o)
                ]
            else:
                since, initial = int(rv), []
        yield from initial
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self.store.lock:
                try:
                    events = self.store.events_after(r.res.kind, since)
                except ApiError as err:
                    yield {"type": "ERROR", "object": err.status()}
                    return
                if not events:
                    self.store.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                    continue
            since = events[-1]["rv"]
            for e in events:
                out = select.translate(e)
                if out is not None:
                    yield out


class _WatchFilter:
    """Which events a watch with a namespace and selectors sees, and as what type."""

    def __init__(self, r: Route, labels: str | None, fields: str | None) -> None:
        self.r = r
        self._match: Callable[[Obj], bool] = lambda o: (
            (r.namespace is None or o["metadata"].get("namespace") == r.namespace)
            and labels_match(labels, o["metadata"].get("labels"))
            and fields_match(fields, o)
        )

    def match(self, obj: Obj) -> bool:
        return self._match(obj)

    def translate(self, event: Obj) -> Obj | None:
        """An object entering the selection is ADDED, one leaving it DELETED (as a real watch cache)."""
        now = self._match(event["object"])
        before = event["old"] is not None and self._match(event["old"])
        if event["type"] == "DELETED":
            return {"type": "DELETED", "object": event["object"]} if before or now else None
        if now and before:
            return {"type": "MODIFIED", "object": event["object"]}
        if now:
            return {"type": "ADDED", "object": event["object"]}
        if before:
            return {"type": "DELETED", "object": event["object"]}
        return None


def _request(user: str, operation: str, r: Route, meta: Obj) -> Request:
    """The admission request of a write by ``user`` to the object ``meta`` describes."""
    groups = ("system:unauthenticated",) if user == ANONYMOUS else ("system:authenticated",)
    ns = (meta.get("namespace") or r.namespace) if r.res.namespaced else None
    name = str(meta.get("name") or r.name or "")
    return Request(user, groups, operation, r.res, r.sub, name, ns)


def _delete_query(query: dict[str, str]) -> Obj:
    out: Obj = {}
    if "gracePeriodSeconds" in query:
        out["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
    if "propagationPolicy" in query:
        out["propagationPolicy"] = query["propagationPolicy"]
    if query.get("orphanDependents") in ("true", "false"):
        out["orphanDependents"] = query["orphanDependents"] == "true"
    return out


def _node_conditions(now: str) -> list[Obj]:
    def cond(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return [
        cond(
            "MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"
        ),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


def _node_info() -> Obj:
    return {
        "architecture": "amd64",
        "bootID": str(uuid.uuid4()),
        "containerRuntimeVersion": "containerd://1.7.24",
        "kernelVersion": "6.6.72+",
        "kubeProxyVersion": "v1.32.4-gke.1000",
        "kubeletVersion": "v1.32.4-gke.1000",
        "machineID": uuid.uuid4().hex,
        "operatingSystem": "linux",
        "osImage": "Container-Optimized OS from Google",
        "systemUUID": str(uuid.uuid4()),
    }
