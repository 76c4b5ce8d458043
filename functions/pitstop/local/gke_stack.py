"""The GKE half of the local stack: a fake Kubernetes API server in place of Slurm.

``python -m pitstop.local.gke_stack --port P --compute URL --cluster cluster.json --kubeconfig K``
runs ``FakeKube`` (local/fake_k8s.py) as one of the stack's supervised processes, as the fake
Compute runs. Its nodes are the fake Compute's VMs (same names, ``providerID
gce://PROJECT/ZONE/NAME``), and its kubelet follows their status: a VM that is not RUNNING makes
its Node NotReady and fails its pods, a VM back up boots the Node anew (new bootID, the GPU
device plugin's XidCriticalError cleared). The kubelet reads the VMs through the fake Compute's
admin API, polled; a VM seen down stays down for the kubelet until it has read it once, so a reset
that the time-scaled fake finishes within a poll still reboots the Node, as a real reset would.
Its kubelet also runs the GKE adapter's check pods (diagnose, validate) as local processes, the
stand-in GPU tools reading ``<workdir>/gpu-state.json`` (``--run-containers``, ``local_checks``).

The rest is what the stack, the demo, the e2e tests and ``pitstop local status`` need to look at
and drive the cluster through its HTTP API (never through the server's memory): a JobSet with the
upstream host-maintenance failure policy, node and JobSet summaries, a watch recorder.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import secrets
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import yaml

from pitstop.core.domain import JsonObject
from pitstop.core.localise import HEARTBEAT_LABEL
from pitstop.core.policy_types import ChecksConfig
from pitstop.core.topology import BLOCK_LABEL as TOPOLOGY_BLOCK
from pitstop.core.topology import SUBBLOCK_LABEL as TOPOLOGY_SUBBLOCK
from pitstop.local.procs import Proc, wait_http

NAMESPACE = "default"
GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
POOL_LABEL = "pitstop.dev/demo-pool"  # which nodes a demo JobSet may use (its nodeSelector)
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2"
FENCE_KEY = "pitstop.dev/remediation"  # the taint and label Pitstop's GKE adapter sets
CHECK_NAMESPACE = "pitstop-system"  # where the adapter runs its check Jobs (infra/gke/clusterrole.yaml)
RBAC_MANIFEST = Path(__file__).resolve().parents[3] / "infra" / "gke" / "clusterrole.yaml"
ADMISSION_GROUP = "admissionregistration.k8s.io"
TOKENS_FILE = "kube-tokens.csv"  # the fake API server's --token-auth-file
KUBE_CALLERS = ("ingest", "actuate")  # the functions that call the cluster, each as its own account

# kubernetes-sigs/jobset@v0.12.0 site/static/examples/failure-policy/host-maintenance-event-model.yaml:
# an evicted or disrupted pod fails its Job (podFailurePolicy FailJob on DisruptionTarget) and that
# failure restarts the whole JobSet without spending its restart budget.
HOST_MAINTENANCE_POLICY: JsonObject = {
    "maxRestarts": 0,
    "rules": [
        {
            "name": "host-maintenance",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }
    ],
}
DISRUPTION_FAILS_JOB: JsonObject = {
    "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]
}


def jobset(name: str, nodes: int, *, pool: str | None = None, grace_s: int = 30) -> JsonObject:
    """A training JobSet of ``nodes`` single-pod workers, each taking a whole node's GPUs.

    ``pool`` limits it to nodes labelled ``pitstop.dev/demo-pool=<pool>``; ``grace_s`` is the
    pods' termination grace period (the time a checkpoint gets after SIGTERM).
    """
    pod_spec: JsonObject = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_s,
        "containers": [
            {
                "name": "trainer",
                "image": "us-docker.pkg.dev/pitstop-local/train/trainer:1",
                "resources": {"limits": {GPU: str(GPUS_PER_NODE)}},
            }
        ],
    }
    if pool is not None:
        pod_spec["nodeSelector"] = {POOL_LABEL: pool}
    job_spec = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "podFailurePolicy": DISRUPTION_FAILS_JOB,
        "template": {"spec": pod_spec},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        # its trainer writes the heartbeat, and its owner says so (core/localise.HEARTBEAT_LABEL)
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {HEARTBEAT_LABEL: "true"}},
        "spec": {
            "failurePolicy": HOST_MAINTENANCE_POLICY,
            "replicatedJobs": [{"name": "workers", "replicas": nodes, "template": {"spec": job_spec}}],
        },
    }


# -- the API, over HTTP ------------------------------------------------------------------------


class Kube:
    """The fake API server as any client sees it (loopback JSON over HTTP).

    Objects come back whole, as ``JsonObject``: the demo and the tests walk Kubernetes objects of
    every kind to assert on them (the product reads them checked, adapters/gke/objects.py)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(  # noqa: S310 - a loopback URL from stack.json
            self.url + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            out: JsonObject = json.loads(resp.read() or b"{}")
            return out

    def get(self, path: str) -> JsonObject | None:
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def items(self, path: str, labels: str | None = None) -> list[JsonObject]:
        query = f"?labelSelector={urllib.parse.quote(labels)}" if labels else ""
        found = self.call("GET", path + query).get("items") or []
        return [i for i in found if isinstance(i, dict)]

    def patch(self, path: str, body: object, kind: str = "merge") -> JsonObject:
        return self.call("PATCH", path, body, f"application/{kind}-patch+json")

    # -- objects the demo and the tests use --------------------------------------------

    def node(self, name: str) -> JsonObject:
        node = self.get(f"/api/v1/nodes/{name}")
        if node is None:
            raise KeyError(f"no node {name}")
        return node

    def nodes(self) -> list[JsonObject]:
        return self.items("/api/v1/nodes")

    def effects(self) -> list[JsonObject]:
        """What mutating requests changed (the fake server's own record, not a Kubernetes API)."""
        found = (self.get("/_admin/effects") or {}).get("effects") or []
        return [e for e in found if isinstance(e, dict)]

    def admission(self) -> list[JsonObject]:
        """Each request an applied admission policy judged: who, what, allowed or the refusal
        (the fake server's own record, local/k8s_admission.py)."""
        found = (self.get("/_admin/admission") or {}).get("decisions") or []
        return [d for d in found if isinstance(d, dict)]

    def jobset(self, name: str) -> JsonObject | None:
        return self.get(f"{JOBSETS}/namespaces/{NAMESPACE}/jobsets/{name}")

    def jobsets(self) -> list[JsonObject]:
        return self.items(f"{JOBSETS}/jobsets")

    def create_jobset(self, js: JsonObject) -> JsonObject:
        return self.call("POST", f"{JOBSETS}/namespaces/{NAMESPACE}/jobsets", js)

    def delete_jobset(self, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self.call("DELETE", f"{JOBSETS}/namespaces/{NAMESPACE}/jobsets/{name}")

    def pods(self, labels: str | None = None) -> list[JsonObject]:
        return self.items(f"/api/v1/namespaces/{NAMESPACE}/pods", labels)

    def label_node(self, name: str, key: str, value: str | None) -> None:
        self.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {key: value}}})

    def set_node_status(self, name: str, status: JsonObject) -> None:
        """What a node agent writes through ``nodes/status`` (strategic merge, conditions by type)."""
        self.patch(f"/api/v1/nodes/{name}/status", {"status": status}, "strategic-merge")

    def create_pdb(self, name: str, selector: dict[str, str], min_available: int) -> None:
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
        }
        self.call("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", pdb)

    def delete_pdb(self, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self.call("DELETE", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{name}")


# -- summaries (`pitstop local status`, the demo's lines, the tests' assertions) ---------------


def _cond(obj: JsonObject, kind: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def live(pod: JsonObject) -> bool:
    """A pod that runs or will run: not terminating, not ended."""
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") in (
        "Pending",
        "Running",
    )


class NodeSummary(TypedDict):
    """A Node in a line: what ``pitstop local status`` and the demo show."""

    name: str
    ready: bool
    unschedulable: bool
    fenced: bool  # Pitstop's taint (pitstop.dev/remediation) is on it: its fence, never a cordon
    taints: list[str]
    gpu_allocatable: int
    xid_critical: bool


class JobSetSummary(TypedDict):
    name: str
    restarts: int
    nodes: list[str]
    running: int
    conditions: list[str]


class KubeStatus(TypedDict):
    k8s_nodes: list[NodeSummary]
    jobsets: list[JobSetSummary]


def node_summary(node: JsonObject) -> NodeSummary:
    taints = node.get("spec", {}).get("taints") or []
    return {
        "name": node["metadata"]["name"],
        "ready": _cond(node, "Ready") == "True",
        "unschedulable": bool(node.get("spec", {}).get("unschedulable")),
        "fenced": any(t.get("key") == FENCE_KEY for t in taints),
        "taints": [f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}" for t in taints],
        "gpu_allocatable": int((node.get("status", {}).get("allocatable") or {}).get(GPU, 0)),
        "xid_critical": _cond(node, "XidCriticalError") == "True",
    }


def jobset_summary(js: JsonObject, pods: list[JsonObject]) -> JobSetSummary:
    """Name, restarts and the nodes its current attempt's live pods run on (or are bound to)."""
    name, restarts = js["metadata"]["name"], int((js.get("status") or {}).get("restarts") or 0)
    mine = [
        p
        for p in pods
        if p["metadata"].get("labels", {}).get(JOBSET_LABEL) == name
        and p["metadata"]["labels"].get(ATTEMPT_LABEL) == str(restarts)
        and live(p)
    ]
    return {
        "name": name,
        "restarts": restarts,
        "nodes": sorted(str(p["spec"].get("nodeName")) for p in mine if p["spec"].get("nodeName")),
        "running": sum(1 for p in mine if p["status"].get("phase") == "Running"),
        "conditions": [
            c["type"] for c in (js.get("status") or {}).get("conditions") or [] if c["status"] == "True"
        ],
    }


def status(url: str) -> KubeStatus:
    """``k8s_nodes`` and ``jobsets`` for ``pitstop local status``."""
    kube = Kube(url)
    pods = kube.items("/api/v1/pods")
    return {
        "k8s_nodes": [node_summary(n) for n in kube.nodes()],
        "jobsets": [jobset_summary(js, pods) for js in kube.jobsets()],
    }


class Watch:
    """Every event of one watched collection from now on (re-watching from the last version seen).

    A pod evicted and deleted within a fraction of a second (grace periods are time-scaled) can
    be missed by polling; its watch events cannot.
    """

    def __init__(self, url: str, path: str) -> None:
        self.url, self.path = url.rstrip("/"), path
        self.events: list[JsonObject] = []  # watch events as received, each with its ``at``
        self.gaps = 0  # times the history was gone and events may have been missed
        self._stop = threading.Event()
        listing = Kube(url).call("GET", path)
        self._rv = str(listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            query = urllib.parse.urlencode(
                {"watch": "true", "resourceVersion": self._rv, "timeoutSeconds": 2}
            )
            try:
                with urllib.request.urlopen(f"{self.url}{self.path}?{query}", timeout=10) as resp:  # noqa: S310
                    for raw in resp:
                        ev = json.loads(raw)
                        if ev.get("type") == "ERROR":  # 410 Gone: history compacted; go on from now
                            self.gaps += 1
                            self._rv = str(
                                Kube(self.url).call("GET", self.path)["metadata"]["resourceVersion"]
                            )
                            break
                        self._rv = str(ev["object"]["metadata"]["resourceVersion"])
                        self.events.append({"at": time.time(), **ev})
            except (OSError, ValueError):
                self._stop.wait(0.2)

    def stop(self) -> list[JsonObject]:
        self._stop.set()
        self._thread.join(timeout=15)
        return self.events


# -- in the stack -------------------------------------------------------------------------------


def kubeconfig(workdir: Path) -> Path:
    """Where the stack writes the kubeconfig kubectl and the kubernetes client use against it."""
    return workdir / "kubeconfig"


def gpu_state(workdir: Path) -> Path:
    """The per-node GPU outcomes the stand-in tools print (written by the fake Compute's admin API)."""
    return workdir / "gpu-state.json"


def local_checks(python: str = sys.executable) -> ChecksConfig:
    """The policy's ``gke: {checks: ...}`` for the local stack: the stand-in GPU tools in place of
    nvidia-smi, dcgmi and all_gather_perf, and no DCGM host engine, sshd or mpirun to start (the
    stand-in all_gather_perf prints the two-node table by itself). The fake kubelet runs the check
    pods' ``/bin/sh -c`` scripts as processes on this machine (fake_k8s.py ``run_containers``)."""
    module = "pitstop.local.gpu_tools."
    return {
        "namespace": CHECK_NAMESPACE,
        "tools": {
            "nvidia-smi": [python, "-m", module + "nvidia_smi"],
            "dcgmi": [python, "-m", module + "dcgmi"],
            "all_gather_perf": [python, "-m", module + "all_gather_perf"],
        },
        "dcgm_setup": "",
        "nccl_setup": "",
        "mpirun": [],
        "peer_wait": "",
    }


def service_account(fn: str, project: str) -> str:
    """A function's Google service account, as deploy names it (tools/deploy.py ``sa_email``); GKE
    maps that identity to the Kubernetes user of the same name."""
    return f"pitstop-{fn}@{project}.iam.gserviceaccount.com"


def admission_manifest(actuate: str) -> str:
    """The ValidatingAdmissionPolicy and its binding from the manifest deploy applies to each GKE
    cluster, with actuate's account where it says ${ACTUATOR_SA}, as deploy substitutes it."""
    text = RBAC_MANIFEST.read_text().replace("${ACTUATOR_SA}", actuate)
    docs = [d for d in yaml.safe_load_all(text) if d and str(d.get("apiVersion")).startswith(ADMISSION_GROUP)]
    return yaml.safe_dump_all(docs, sort_keys=False)


def identities(workdir: Path, project: str) -> dict[str, str]:
    """A bearer token per function that calls the cluster, written as kube-apiserver's token file
    (``token,user,uid``) for the fake; each function sends its own (PITSTOP_KUBE_TOKEN), so the
    fake sees actuate's requests as actuate's account, as GKE does."""
    tokens = {fn: secrets.token_hex(16) for fn in KUBE_CALLERS}
    out = io.StringIO()
    csv.writer(out).writerows([tok, service_account(fn, project), fn] for fn, tok in tokens.items())
    path = workdir / TOKENS_FILE
    path.write_text(out.getvalue())
    path.chmod(0o600)
    return tokens


def read_tokens(path: Path) -> dict[str, str]:
    """token -> username from a token file (further columns, uid and groups, are not used)."""
    return {row[0]: row[1] for row in csv.reader(path.read_text().splitlines()) if len(row) >= 2}


def apply_admission(url: str, project: str) -> None:
    """Create the deployed admission policy and binding, as ``kubectl apply`` creates new objects."""
    kube = Kube(url)
    for doc in yaml.safe_load_all(admission_manifest(service_account("actuate", project))):
        plural = (
            "validatingadmissionpolicies"
            if doc["kind"].endswith("Policy")
            else "validatingadmissionpolicybindings"
        )
        kube.call("POST", f"/apis/{doc['apiVersion']}/{plural}", doc)


def start(workdir: Path, ep: dict[str, str], cluster: Path, env: dict[str, str]) -> Proc:
    """Start the fake API server (nodes = the VMs in ``cluster``), wait until it answers and apply
    Pitstop's admission policy to it (so every GKE path runs under the deployed policy).

    Its kubelet runs check pods as processes that read ``<workdir>/gpu-state.json``
    (PITSTOP_GPU_STATE, the same file the fake Compute keeps for the Slurm stack). Requests carry
    the tokens of ``identities`` (written before).
    """
    port = urllib.parse.urlsplit(ep["kube"]).port
    argv = [sys.executable, "-m", "pitstop.local.gke_stack", "--port", str(port), "--compute", ep["compute"]]
    argv += ["--cluster", str(cluster), "--kubeconfig", str(kubeconfig(workdir)), "--run-containers"]
    argv += ["--token-auth-file", str(workdir / TOKENS_FILE)]
    env = {**env, "PITSTOP_GPU_STATE": str(gpu_state(workdir))}
    proc = Proc("kube", argv, workdir / "kube.log", env).start()
    wait_http(ep["kube"] + "/version", proc, timeout=60)
    apply_admission(ep["kube"], json.loads(cluster.read_text())["project"])
    return proc


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """``cond()``'s first truthy value, asked every ``every`` seconds; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def ready(url: str, names: list[str], jobset_nodes: int = 0, timeout: float = 60.0) -> None:
    """Every node Ready; with ``jobset_nodes``, JobSet ``train`` created and running on that many."""
    kube = Kube(url)

    def all_ready() -> bool:
        up = {n["metadata"]["name"] for n in kube.nodes() if _cond(n, "Ready") == "True"}
        return up >= set(names)

    wait_for(all_ready, timeout, "every Kubernetes node to be Ready")
    if jobset_nodes:
        kube.create_jobset(jobset("train", jobset_nodes))
        wait_for(lambda: running(kube, "train") == jobset_nodes, timeout, "JobSet train to run")


def running(kube: Kube, name: str) -> int:
    """How many pods of the JobSet's current attempt run."""
    js = kube.jobset(name)
    return 0 if js is None else int(jobset_summary(js, kube.pods(f"{JOBSET_LABEL}={name}"))["running"])


# -- the process --------------------------------------------------------------------------------


class ComputeVms:
    """The kubelet's view of the fake Compute's VMs: name -> status, polled in the background.

    A status other than RUNNING is latched until the kubelet read it once, so no down period is
    shorter than the kubelet's loop. None (unknown) while the fake Compute cannot be reached.
    """

    def __init__(self, compute_url: str, interval: float = 0.05) -> None:
        self.url, self.interval = compute_url.rstrip("/"), interval
        self._now: dict[str, str] = {}
        self._kmsg: dict[str, list[str]] = {}  # RUNNING VMs' ring buffers, for the NPD stand-in
        self._latched: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compute-vms", daemon=True)

    def start(self) -> ComputeVms:
        self.poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def fetch(self) -> dict[str, str]:
        """Every VM's status now (each RUNNING VM's kernel lines kept for ``kmsg``); empty when the
        fake Compute does not answer."""
        req = urllib.request.Request(self.url + "/_admin/state", data=b"{}", method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
                insts = json.loads(resp.read())["instances"]
            status = {i["name"]: str(i["status"]) for i in insts}
            kmsg = {
                i["name"]: [str(k["msg"]) for k in i.get("kmsg") or []]
                for i in insts
                if i["status"] == "RUNNING"
            }
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        with self._lock:
            self._kmsg = kmsg
        return status

    def poll(self) -> None:
        now = self.fetch()
        with self._lock:
            self._now = now
            self._latched.update({n: s for n, s in now.items() if s != "RUNNING"})

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def kmsg(self) -> dict[str, list[str]]:
        """Each RUNNING VM's kernel ring buffer (this boot), as the node's NPD reads /dev/kmsg."""
        with self._lock:
            return dict(self._kmsg)

    def __call__(self, name: str) -> str | None:
        with self._lock:
            return self._latched.pop(name, None) or self._now.get(name)


def serve(args: argparse.Namespace) -> None:
    """Run the fake API server until SIGTERM, its nodes the cluster's VMs."""
    from pitstop.local.fake_k8s import FakeKube
    from pitstop.local.npd import Npd

    cluster = json.loads(Path(args.cluster).read_text())
    vms = ComputeVms(args.compute).start()
    passed = ("PATH", "PYTHONPATH", "LANG", "PITSTOP_GPU_STATE")  # what a check pod's process sees
    kube = FakeKube(
        vms,
        time_scale=args.time_scale,
        run_containers=args.run_containers,
        container_env={k: os.environ[k] for k in passed if k in os.environ},
        tokens=read_tokens(Path(args.token_auth_file)) if args.token_auth_file else None,
    )
    kube.create({"kind": "Namespace", "metadata": {"name": CHECK_NAMESPACE}})  # deploy creates it
    for inst in cluster["instances"]:
        labels = {
            "node.kubernetes.io/instance-type": inst.get("machine_type", "a3-megagpu-8g"),
            "cloud.google.com/gke-nodepool": args.pool,
        }
        if inst.get("provisioning") == "SPOT":
            labels["cloud.google.com/gke-spot"] = "true"
        # GKE's placement labels on A3 Ultra/A4/A4X nodes in a reservation, from the VM's physical
        # host topology (cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas)
        for key, label in (("block", TOPOLOGY_BLOCK), ("subblock", TOPOLOGY_SUBBLOCK)):
            if inst.get(key):
                labels[label] = str(inst[key])
        kube.add_node(
            inst["name"], project=cluster["project"], zone=cluster["zone"], gpus=GPUS_PER_NODE, labels=labels
        )
    kube.start(port=args.port)
    kube.write_kubeconfig(args.kubeconfig)
    stop = threading.Event()
    Npd(vms.kmsg, kube.set_node_condition).run(stop)  # infra/gke/npd.yaml's DaemonSet, deploy applies it
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    stop.wait()
    kube.stop()
    vms.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pitstop.local.gke_stack")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--compute", required=True, help="the fake Compute's URL (its /_admin/state)")
    p.add_argument("--cluster", required=True, help="cluster.json: the VMs that are this cluster's nodes")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--pool", default="a3-pool")
    p.add_argument("--token-auth-file", default=None, help="token,user[,uid] lines: who each bearer token is")
    p.add_argument("--time-scale", type=float, default=0.01, help="real seconds per Kubernetes second")
    p.add_argument(
        "--run-containers",
        action="store_true",
        help="run the commands of pods bound to a node as local processes (check pods)",
    )
    serve(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
