"""The whole pipeline on one machine: `pitstop local up|down|status|inject|chaos`, the demo and the e2e tests.

On 127.0.0.1 and free ports: the Pub/Sub and Firestore emulators, the fake Compute Engine
with a simulated cluster, a real Slurm (slurmctld + one slurmd per node, kept in step with
the fake VMs) with the Pitstop Slurm agent (or, for a cluster with ``scheduler="gke"``, a fake
Kubernetes API server whose nodes are the fake VMs: local/gke_stack.py), functions-framework
servers for ingest, actuate and notify fed by real push subscriptions (with dead-letter
topics) and for sweep, called every ``sweep_interval`` seconds by a Cloud Scheduler stand-in,
the Workflows runner, a fake Cloud Monitoring whose alerting publishes the telemetry policies'
notifications to the alerts topic ingest also subscribes to (local/telemetry.py), and a webhook
sink. The log router applies infra/filters/ to injected entries and publishes what a real sink
would. actuate runs from ``local/chaos_main.py`` (main's handler with chaos hooks); the stack's controller
(``local/control.py``) restarts a function process that died and takes chaos requests. State
lives in ``<workdir>/stack.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from pitstop.core import sinks
from pitstop.core.domain import JsonObject
from pitstop.core.localise import HEARTBEAT_OPT_IN
from pitstop.core.policy_types import ClusterDoc
from pitstop.local import gke_stack, gpu_tools
from pitstop.local.chaos import CHAOS_DIR_ENV, clear_flags
from pitstop.local.compute_shapes import GpuStateSet
from pitstop.local.control import Controller
from pitstop.local.lql import compile_filter
from pitstop.local.procs import Proc, free_port, start_emulator, wait_http
from pitstop.local.serve import channel_sinks
from pitstop.local.slurm import SlurmCluster
from pitstop.services.actuate import STEP_CLAIM_S

ROOT = Path(__file__).resolve().parents[3]
PROJECT = "pitstop-local"
ZONE = "us-central1-a"
FUNCTIONS = (("ingest", "cloudevent"), ("actuate", "http"), ("notify", "cloudevent"), ("sweep", "http"))
SWEEP_INTERVAL_S = 60.0  # Cloud Scheduler calls the sweep every minute in production
GKE_POOL = "gke-train-a3-pool-1f2e3d4c"  # GKE names a node pool's VMs gke-<cluster>-<pool>-<hash>-...
GKE_EVICT_DEADLINE_S = 10  # a PodDisruptionBudget that refuses an eviction fails the checkpoint after this
# Per-node GPU outcomes (pitstop.local.gpu_tools): the fake Compute writes <workdir>/gpu-state.json
# and names it in PITSTOP_GPU_STATE; the stand-ins in checks read it from there.
GPU_STATE_ENV = "PITSTOP_GPU_STATE"
# the local PagerDuty endpoint takes any 32-character integration key, as PagerDuty would shape-check it
GPU_STATE_FILE = "gpu-state.json"
NOTIFY_DATABASE = "pitstop-notify"  # notify's ledger database (deploy.defaults.yaml notify_database)
# The telemetry policies' windows on the stack: the heartbeat's 2 min absence is 6 s, a 10 min
# throttle 30 s (production windows: infra/monitoring/telemetry/).
ALERT_SCALE = 0.05
HEARTBEAT_EVERY_S = 1.0  # the training stand-in's step (local/trainer.py)
HEARTBEAT_MIN_POINTS = 3  # points of a job's heartbeat before a hang alert may act on it (policy_for)
REGION = ZONE.rsplit("-", 1)[0]
VERTEX_ACCOUNT = f"llm-trainer@{PROJECT}.iam.gserviceaccount.com"  # what the stack's Vertex jobs run as
VERTEX_STEP_S = 1.0  # a job's seconds queued, then pending, on the stand-in


def gpu_tool_flags() -> list[str]:
    """The Slurm agent's tool flags pointing at the GPU stand-ins (same interpreter as the stack)."""
    flags = []
    for flag, tool in (
        ("--nvidia-smi", "nvidia_smi"),
        ("--dcgmi", "dcgmi"),
        ("--dmesg", "dmesg"),
        ("--clock", "clock"),
        ("--all-gather-perf", "all_gather_perf"),
    ):
        flags += [flag, shlex.join([sys.executable, "-m", f"pitstop.local.gpu_tools.{tool}"])]
    # the fabric's NCCL profiles (schemas/validation.yaml) as stand-ins under this tree
    return [*flags, "--fabric-root", str(Path(gpu_tools.__file__).parent / "fabric")]


@dataclass
class ClusterSpec:
    nodes: int = 8
    prefix: str = "a3-node"
    spot: list[str] = field(default_factory=list)
    machine_type: str = "a3-megagpu-8g"
    mig: str = "a3-node"
    name: str = "train"
    # "gke": a fake Kubernetes API server in place of Slurm; "vertex": Vertex AI custom training (the
    # stand-in local/fake_vertex.py; no node of Pitstop's, so none simulated)
    scheduler: Literal["slurm", "gke", "vertex"] = "slurm"
    jobset_nodes: int = 0  # gke: a JobSet with the host-maintenance failure policy on this many nodes
    # Where nodes sit: node -> [block, sub-block] (the fake Compute's physicalHostTopology, GKE's
    # gce-topology labels, Slurm's topology.conf); a Slurm node not named sits in block-1/sub-1, a
    # GKE node not named nowhere, and a stack that names none runs Slurm without a topology plugin.
    places: dict[str, list[str]] = field(default_factory=dict)
    machine_types: dict[str, str] = field(default_factory=dict)  # node -> its own machine type

    @property
    def node_names(self) -> list[str]:
        return [f"{self.prefix}-{i:03d}" for i in range(self.nodes)]

    def partitions(self) -> dict[str, list[str]]:
        """Slurm: the nodes of another machine type in a partition of their family's name (``a4x``)."""
        out: dict[str, list[str]] = {}
        for n in self.node_names:
            if (machine := self.machine_types.get(n, self.machine_type)) != self.machine_type:
                out.setdefault(machine.split("-")[0], []).append(n)
        return out

    @classmethod
    def gke(cls, nodes: int = 8, spot: list[str] | None = None, jobset_nodes: int = 0) -> ClusterSpec:
        """A GKE node pool: VMs named as GKE names them, in the pool's MIG, nodes of cluster ``train``."""
        return cls(
            nodes=nodes,
            prefix=GKE_POOL,
            spot=list(spot or []),
            mig=f"{GKE_POOL}-grp",
            scheduler="gke",
            jobset_nodes=jobset_nodes,
        )

    @classmethod
    def vertex(cls, name: str = "llm") -> ClusterSpec:
        """Vertex AI custom training jobs of the stack's project in REGION: the platform owns the VMs."""
        return cls(nodes=0, prefix="vertex", mig="", name=name, scheduler="vertex")


class ClusterRecord(TypedDict):
    """The cluster a stack runs, as stack.json keeps it: a ClusterSpec and its node names."""

    nodes: int
    prefix: str
    spot: list[str]
    machine_type: str
    mig: str
    name: str
    scheduler: str
    jobset_nodes: int
    node_names: list[str]
    places: NotRequired[dict[str, list[str]]]
    machine_types: NotRequired[dict[str, str]]


@dataclass
class StackState:
    workdir: str
    project: str
    endpoints: dict[str, str]
    pids: dict[str, int]
    cluster: ClusterRecord
    slurm_conf: str  # "" on a GKE stack
    daemon_pid: int | None = None  # the background process that owns the stack (`pitstop local up`)
    kubeconfig: str | None = None  # a GKE stack's fake API server, for kubectl and the kubernetes client

    def save(self) -> None:
        Path(self.workdir, "stack.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, workdir: str | Path) -> StackState:
        return cls(**json.loads(Path(workdir, "stack.json").read_text()))


@contextlib.contextmanager
def emulator_env(endpoints: dict[str, str]) -> Iterator[None]:
    """Point new Google clients at this stack's emulators without changing the process for good.

    Clients read the emulator variables when they are built; other code in the same process
    (tests, another stack) must keep seeing its own values afterwards.
    """
    keys = {"PUBSUB_EMULATOR_HOST": endpoints["pubsub"], "FIRESTORE_EMULATOR_HOST": endpoints["firestore"]}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def default_workdir() -> Path:
    return Path(os.environ.get("PITSTOP_LOCAL_DIR", ROOT / ".local"))


def _cluster_policy(spec: ClusterSpec) -> ClusterDoc | JsonObject:
    """The policy's entry for the simulated cluster; a GKE one is reached at PITSTOP_KUBE_ENDPOINT."""
    if spec.scheduler == "vertex":  # no VMs of Pitstop's: the jobs of the project's region
        block = {"regions": [REGION], "job_service_accounts": [VERTEX_ACCOUNT]}  # its folder's schema
        return {"name": spec.name, "scheduler": "vertex", "vertex": block}
    cluster: ClusterDoc = {
        "name": spec.name,
        "scheduler": spec.scheduler,
        "size": spec.nodes,
        "match": {"name_pattern": f"{spec.prefix}-*"},
        "mig": {"name": spec.mig, "zone": ZONE},
    }
    if spec.scheduler == "gke":
        cluster["gke"] = {
            "location": ZONE,
            "cluster": spec.name,
            "evict_deadline_s": GKE_EVICT_DEADLINE_S,
            "checks": gke_stack.local_checks(),  # the GPU stand-ins run in the check pods
        }
    else:
        cluster["slurm"] = {"checkpoint_signal": "SIGUSR1", "command_topic": f"pitstop-slurm-{spec.name}"}
    return cluster


def policy_for(spec: ClusterSpec, over: JsonObject | None = None) -> JsonObject:
    """The stack's policy file before its schema check (``over``: top-level keys replaced)."""
    doc: JsonObject = {
        "mode": "enforce",
        "clusters": [_cluster_policy(spec)],
        # A short window keeps the demo quick; production defaults are 30 min (policy.defaults.yaml).
        # The fake Compute puts every VM in one reservation block, which each node joins from its
        # claim: the block's cap matches the cluster's so the demo shows the cluster budget.
        "budgets": {
            "window_s": 8,
            "cluster": {"max_nodes": 4, "max_percent": 25},
            "block": {"max_nodes": 4, "max_percent": 100},
        },
        "cooldowns": {"RESCHEDULE_JOB": 5},
        "store": {"flush_interval_s": 0.5},
        # a job beats every HEARTBEAT_EVERY_S here: established after a few seconds (10 min in production)
        "localise": {"heartbeat_min_points": HEARTBEAT_MIN_POINTS, "heartbeat_min_span_s": 1.0},
    }
    for k, v in (over or {}).items():
        doc[k] = v
    return doc


def _endpoints(fs_host: str, ps_host: str, ports: dict[str, int]) -> dict[str, str]:
    """Where each part of the stack answers, in the form its clients take (host:port or URL)."""
    return {
        "firestore": fs_host,
        "pubsub": ps_host,
        "compute": f"http://127.0.0.1:{ports['compute']}",
        "executions": f"127.0.0.1:{ports['executions']}",
        "monitoring": f"127.0.0.1:{ports['monitoring']}",
        "webhook": f"http://127.0.0.1:{ports['webhook']}/hook",
        **{f: f"http://127.0.0.1:{ports[f]}" for f in ("ingest", "actuate", "notify", "sweep", "control")},
        **({"kube": f"http://127.0.0.1:{ports['kube']}"} if "kube" in ports else {}),
        **({"vertex": f"http://127.0.0.1:{ports['vertex']}"} if "vertex" in ports else {}),
        **({"prometheus": f"http://127.0.0.1:{ports['prometheus']}"} if "prometheus" in ports else {}),
    }


def _vertex_env(ep: Mapping[str, str]) -> dict[str, str]:
    """What points the vertex scheduler at the stand-in (its folder's local.py), if the stack runs it."""
    if "vertex" not in ep:
        return {}
    from pitstop.plugins.schedulers.vertex import local  # the stand-in's module: loaded only when it runs

    return local.env(ep["vertex"])


class Stack:
    def __init__(
        self,
        workdir: Path,
        spec: ClusterSpec | None = None,
        compute_scale: float = 0.01,
        workflow_scale: float = 0.1,
        policy_over: JsonObject | None = None,
        sweep_interval: float = SWEEP_INTERVAL_S,
        alert_scale: float = ALERT_SCALE,
    ) -> None:
        self.workdir, self.spec = workdir, spec or ClusterSpec()
        self.alert_scale = alert_scale  # the telemetry policies' windows, scaled (local/telemetry.py)
        self.compute_scale, self.workflow_scale, self.policy_over = compute_scale, workflow_scale, policy_over
        self.sweep_interval = sweep_interval
        self.procs: dict[str, Proc] = {}
        self.slurm: SlurmCluster | None = None
        self.state: StackState | None = None
        self.controller: Controller | None = None
        self._agent_restarts = 0

    @property
    def endpoints(self) -> dict[str, str]:
        assert self.state is not None, "the stack is not up"
        return self.state.endpoints

    @property
    def gke(self) -> bool:
        return self.spec.scheduler == "gke"

    @property
    def has_slurm(self) -> bool:
        return self.spec.scheduler == "slurm"

    @property
    def vertex(self) -> bool:
        """The stack has a Vertex AI cluster: the Vertex AI stand-in runs (local/fake_vertex.py)."""
        return self.spec.scheduler == "vertex"

    @property
    def gpu_state_file(self) -> Path:
        """Per-node GPU outcomes: written by the fake Compute, read by the GPU stand-ins."""
        return self.workdir / GPU_STATE_FILE

    @property
    def chaos_dir(self) -> Path:
        """Where chaos flags for the function processes are armed (see pitstop.local.chaos)."""
        return self.workdir / "chaos"

    # -- up --------------------------------------------------------------------------

    def _py(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        p = Proc(
            name, [sys.executable, "-m", "pitstop.local.serve", *args], self.workdir / f"{name}.log", env
        ).start()
        self.procs[name] = p
        return p

    def up(self) -> StackState:
        """Start every process in dependency order, wait until all answer, record them in stack.json."""
        self._clean_workdir()
        fs_host, ps_host = self._start_emulators()
        env = self._base_env(fs_host, ps_host)
        names = ("compute", "executions", "monitoring", "webhook", *(f for f, _ in FUNCTIONS), "control")
        extra = ("kube", "prometheus") if self.gke else ("vertex",) if self.vertex else ()
        ports = {k: free_port() for k in (*names, *extra)}
        ep = _endpoints(fs_host, ps_host, ports)
        files = self._write_inputs(ep)
        self._start_fakes(ports, files, env)
        tokens = gke_stack.identities(self.workdir, PROJECT) if self.gke else {}
        if self.gke:
            self.procs["kube"] = gke_stack.start(self.workdir, ep, files["cluster"], env)
        self._start_functions(ports, ep, files["policy"], env, tokens)
        self._wire_pubsub(ep, ps_host)
        slurm = self._start_slurm(ep, env) if self.has_slurm else None
        for fn, _ in FUNCTIONS:
            wait_http(ep[fn] + "/", self.procs[fn], timeout=60, accept_errors=True)
        if self.vertex:
            wait_http(ep["vertex"] + "/", self.procs["vertex"], accept_errors=True)
        self._py(
            "scheduler",
            ["scheduler", "--url", ep["sweep"] + "/", "--interval", str(self.sweep_interval)],
            env,
        )
        if slurm is not None:
            slurm.wait_idle(len(self.spec.node_names), timeout=60)
        elif self.gke:
            gke_stack.ready(ep["kube"], self.spec.node_names, self.spec.jobset_nodes)
        state = self._save_state(ep, slurm)
        self.controller = Controller(self, ports["control"]).start()
        return state

    def _clean_workdir(self) -> None:
        """Outputs of an earlier run would be read as this run's webhook posts and metrics."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("webhook.jsonl", "webhook-refused.jsonl", "metrics.jsonl"):
            (self.workdir / stale).unlink(missing_ok=True)
        clear_flags(self.chaos_dir)  # a fault armed for an earlier stack must not fire in this one

    def _start_emulators(self) -> tuple[str, str]:
        """Firestore and Pub/Sub emulators, in parallel (each takes seconds to boot); their hosts."""
        with ThreadPoolExecutor(2) as pool:
            fs = pool.submit(start_emulator, "firestore", self.workdir, PROJECT)
            ps = pool.submit(start_emulator, "pubsub", self.workdir, PROJECT)
            (fs_proc, fs_host), (ps_proc, ps_host) = fs.result(), ps.result()
        self.procs["firestore"], self.procs["pubsub"] = fs_proc, ps_proc
        relay = f"127.0.0.1:{free_port()}"
        self.procs["firestore-relay"] = self._relay(relay, fs_host)
        return relay, ps_host

    def _relay(self, listen: str, target: str) -> Proc:
        """Clients reach Firestore through a relay, so an outage can cut them off (restart_firestore)."""
        argv = [
            sys.executable,
            "-m",
            "pitstop.local.relay",
            "--listen",
            listen.rsplit(":", 1)[1],
            "--to",
            target,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "functions")}
        p = Proc("firestore-relay", argv, self.workdir / "firestore-relay.log", env).start()
        wait_http(f"http://{listen}/", p)
        return p

    @staticmethod
    def _base_env(fs_host: str, ps_host: str) -> dict[str, str]:
        """The caller's environment minus its own Pitstop/emulator settings, pointed at this stack."""
        base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("PITSTOP_", "FIRESTORE_", "PUBSUB_"))
        }
        return {
            **base_env,
            "FIRESTORE_EMULATOR_HOST": fs_host,
            "PUBSUB_EMULATOR_HOST": ps_host,
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "PYTHONPATH": str(ROOT / "functions"),
        }

    def _place(self, node: str) -> dict[str, str]:
        """The node's block and sub-block in cluster.json, when the stack places its nodes (a GKE
        node it does not name carries no topology label, as a node outside a reservation)."""
        if not self.spec.places or (self.spec.scheduler == "gke" and node not in self.spec.places):
            return {}
        block, sub = self.spec.places.get(node, ["block-1", "sub-1"])
        return {"block": block, "subblock": sub}

    def _write_inputs(self, ep: dict[str, str]) -> dict[str, Path]:
        """The files the processes start from: the simulated cluster, the policy, the workflow's env."""
        files = {
            "cluster": self.workdir / "cluster.json",
            "policy": self.workdir / "policy.yaml",
            "workflow_env": self.workdir / "workflow-env.json",
        }
        instances = [
            {
                "name": n,
                "machine_type": self.spec.machine_types.get(n, self.spec.machine_type),
                "mig": self.spec.mig,
                "provisioning": "SPOT" if n in self.spec.spot else "RESERVATION_BOUND",
                **self._place(n),
            }
            for n in self.spec.node_names
        ]
        files["cluster"].write_text(json.dumps({"project": PROJECT, "zone": ZONE, "instances": instances}))
        files["policy"].write_text(json.dumps(policy_for(self.spec, self.policy_over), indent=2))
        files["workflow_env"].write_text(
            json.dumps(
                {
                    "PITSTOP_ACTUATE_URL": ep["actuate"] + "/",
                    "PITSTOP_POLL_S": "2",
                    "PITSTOP_OP_TIMEOUT_S": "1800",
                    "PITSTOP_VERIFY_TIMEOUT_S": "300",
                    "PITSTOP_CHECK_TIMEOUT_S": "600",
                    "PITSTOP_RESUME_WAIT_S": "300",
                }
            )
        )
        return files

    def _start_fakes(self, ports: dict[str, int], files: dict[str, Path], env: dict[str, str]) -> None:
        """The stand-ins for Compute Engine, Workflows executions, Cloud Monitoring and the webhook."""
        compute_args = ["--time-scale", str(self.compute_scale), "--cluster", str(files["cluster"])]
        # per-host GPU outcomes (/_admin/gpu_state), written where the GPU stand-ins read them
        compute_env = {**env, GPU_STATE_ENV: str(self.gpu_state_file)}
        self._py(
            "fake-compute", ["fake-compute", "--port", str(ports["compute"]), *compute_args], compute_env
        )
        workflow = str(ROOT / "workflows" / "remediate.yaml")
        self._py(
            "executions",
            [
                "executions",
                "--port",
                str(ports["executions"]),
                "--workflow",
                workflow,
                "--env",
                str(files["workflow_env"]),
                "--time-scale",
                str(self.workflow_scale),
            ],
            env,
        )
        alerting = ["--compute", f"http://127.0.0.1:{ports['compute']}", "--project", PROJECT, "--zone", ZONE]
        alerting += ["--gpu-state", str(self.gpu_state_file), "--alert-scale", str(self.alert_scale)]
        for name, out in (("monitoring", "metrics.jsonl"), ("webhook", "webhook.jsonl")):
            extra = alerting if name == "monitoring" else []
            self._py(name, [name, "--port", str(ports[name]), "--out", str(self.workdir / out), *extra], env)
        if "vertex" in ports:  # Vertex AI's JobService; its jobs' training loops beat to Monitoring
            vertex = ["--port", str(ports["vertex"]), "--step-s", str(VERTEX_STEP_S)]
            vertex += ["--monitoring", f"127.0.0.1:{ports['monitoring']}", "--beat-s", str(HEARTBEAT_EVERY_S)]
            self._py("vertex", ["vertex", *vertex], env)
        if "prometheus" in ports:  # GKE's DCGM metrics: Managed Service for Prometheus' query API
            prom = ["--port", str(ports["prometheus"]), "--gpu-state", str(self.gpu_state_file)]
            prom += ["--project", PROJECT, "--zone", ZONE, "--cluster", self.spec.name]
            self._py("prometheus", ["prometheus", *prom, "--nodes", ",".join(self.spec.node_names)], env)

    def _start_functions(
        self,
        ports: dict[str, int],
        ep: dict[str, str],
        policy: Path,
        env: dict[str, str],
        kube_tokens: dict[str, str],
    ) -> None:
        """ingest, actuate, notify and sweep under functions-framework, configured as deploy configures them.

        actuate's source is local/chaos_main.py: main's own handler, with the chaos hooks armed
        through files in ``chaos_dir`` (pitstop.local.chaos); the others run main.py as deployed.
        """
        fn_env = {
            **env,
            "PITSTOP_POLICY": str(policy),
            "PITSTOP_WORKFLOWS_ENDPOINT": ep["executions"],
            "PITSTOP_COMPUTE_ENDPOINT": ep["compute"],
            "PITSTOP_MONITORING_ENDPOINT": ep["monitoring"],
            # every channel folder's sink, on the webhook stand-in's port (local/serve.py)
            **{
                k: v
                for sink in channel_sinks().values()
                for k, v in sink.env(ep["webhook"].rsplit("/", 1)[0]).items()
            },
            "PITSTOP_NOTIFICATIONS_TOPIC": "pitstop-notifications",
            "PITSTOP_NOTIFY_KEY": secrets.token_hex(16),  # this stack's, as deploy makes one per project
            # a crashed attempt's claim must lapse within the workflow's (scaled) re-asking budget
            "PITSTOP_STEP_CLAIM_S": str(STEP_CLAIM_S * self.workflow_scale),
            **({"PITSTOP_KUBE_ENDPOINT": ep["kube"]} if "kube" in ep else {}),
            **({"PITSTOP_PROMETHEUS_ENDPOINT": ep["prometheus"]} if "prometheus" in ep else {}),
            **_vertex_env(ep),
        }
        ff = str(Path(sys.executable).parent / "functions-framework")
        main = str(ROOT / "functions" / "main.py")
        wrapper = str(Path(__file__).with_name("chaos_main.py"))
        for fn, sig in FUNCTIONS:
            source, extra = (wrapper, {CHAOS_DIR_ENV: str(self.chaos_dir)}) if fn == "actuate" else (main, {})
            if fn == "notify":  # its ledger in a database of its own, as deployed (infra/iam.yaml)
                extra = {"PITSTOP_NOTIFY_DATABASE": NOTIFY_DATABASE}
            if fn in kube_tokens:  # the fake API server knows it as its own account (gke_stack.identities)
                extra = {**extra, "PITSTOP_KUBE_TOKEN": kube_tokens[fn]}
            argv = [ff, "--target", fn, "--source", source, "--signature-type", sig]
            argv += ["--host", "127.0.0.1", "--port", str(ports[fn])]
            self.procs[fn] = Proc(fn, argv, self.workdir / f"{fn}.log", {**fn_env, **extra}).start()

    def _start_slurm(self, ep: dict[str, str], env: dict[str, str]) -> SlurmCluster:
        """A real slurmctld, vm-sync keeping slurmds in step with the fake VMs, and the Pitstop agent."""
        places = {n: (p[0], p[1]) for n, p in self.spec.places.items()} if self.spec.places else {}
        if places:  # every node sits somewhere in topology.conf
            places = {n: places.get(n, ("block-1", "sub-1")) for n in self.spec.node_names}
        self.slurm = SlurmCluster(
            self.workdir / "slurm",
            self.spec.node_names,
            cluster=self.spec.name,
            places=places,
            partitions=self.spec.partitions(),
        )
        self.slurm.workdir.mkdir(parents=True, exist_ok=True)
        self.slurm.start_controller()
        self._py(
            "vm-sync",
            [
                "vm-sync",
                "--compute",
                ep["compute"],
                "--slurm-conf",
                str(self.slurm.conf),
                "--workdir",
                str(self.slurm.workdir),
                "--nodes",
                ",".join(self.spec.node_names),
            ],
            env,
        )
        # The agent's checks run as Slurm job steps, which inherit its environment: the GPU stand-ins
        # in them read the fake Compute's per-host outcomes from the same file.
        agent_env = {**env, "SLURM_CONF": str(self.slurm.conf), GPU_STATE_ENV: str(self.gpu_state_file)}
        argv = [sys.executable, "-m", "pitstop.agent.slurm", "--project", PROJECT]
        argv += ["--check-dir", str(self.workdir / "slurm-checks"), *gpu_tool_flags()]
        argv += ["--subscription", "slurm-agent-train"]  # requeued jobs start at once (the default)
        # results go to the cluster's results topic (actuate pulls pitstop-slurm-<c>-results-actuate);
        # claims live in the agent's own SQLite ledger, kept across agent restarts (chaos agent-down)
        argv += ["--results-topic", f"pitstop-slurm-{self.spec.name}-results"]
        argv += ["--ledger", str(self.workdir / "slurm-agent-ledger.sqlite")]
        self.procs["slurm-agent"] = Proc(
            "slurm-agent", argv, self.workdir / "slurm-agent.log", agent_env
        ).start()
        return self.slurm

    def _save_state(self, ep: dict[str, str], slurm: SlurmCluster | None) -> StackState:
        """stack.json: how `pitstop local status|down|inject|chaos` in another process finds this stack."""
        self.state = StackState(
            str(self.workdir),
            PROJECT,
            ep,
            self._pids(),
            self._cluster_record(),
            str(slurm.conf) if slurm is not None else "",
            kubeconfig=str(gke_stack.kubeconfig(self.workdir)) if self.gke else None,
        )
        self.state.save()
        return self.state

    def _cluster_record(self) -> ClusterRecord:
        s = self.spec
        return {
            "nodes": s.nodes,
            "prefix": s.prefix,
            "spot": list(s.spot),
            "machine_type": s.machine_type,
            "mig": s.mig,
            "name": s.name,
            "scheduler": s.scheduler,
            "jobset_nodes": s.jobset_nodes,
            "node_names": s.node_names,
            "places": dict(s.places),
            "machine_types": dict(s.machine_types),
        }

    def _pids(self) -> dict[str, int]:
        pids = {name: p.popen.pid for name, p in self.procs.items() if p.popen is not None}
        if self.slurm is not None:
            pids |= {f"slurm-{p.name}": p.popen.pid for p in self.slurm.procs if p.popen is not None}
        return pids

    def refresh_pids(self) -> None:
        """Record processes started again (supervisor, chaos) so `pitstop local down` finds them."""
        if self.state is not None:
            self.state.pids = self._pids()
            self.state.save()

    def set_agent(self, up: bool) -> str:
        """Stop or start the Slurm agent (chaos ``agent-down``/``agent-up``); its state afterwards.

        A stopped agent comes back reading a new subscription to its command topic, created as it
        stops, so that subscription holds every command published while it was away. Not the old
        one: the Pub/Sub emulator never forgets a subscriber stream that was closed (its handler
        for a cancelled stream fails with NoSuchMethodError, see pubsub-emulator.log) and keeps
        sending a share of the messages to that dead stream, each redelivered only after its ack
        deadline, so a restarted agent would answer many commands a minute late. Commands the old
        agent held unanswered are published again by actuate's next try, as with real Pub/Sub.
        """
        agent = self.procs.get("slurm-agent")
        if agent is None:
            raise ValueError("this stack runs no Slurm agent (a GKE stack)")
        if up and not agent.alive():
            agent.start()
        elif not up and agent.alive():
            self._agent_restarts += 1
            name = f"slurm-agent-{self.spec.name}-{self._agent_restarts}"
            self._subscribe(name, f"pitstop-slurm-{self.spec.name}")
            agent.stop()
            at = agent.argv.index("--subscription") + 1
            agent.argv = [*agent.argv[:at], name, *agent.argv[at + 1 :]]
        self.refresh_pids()
        return "up" if agent.alive() else "down"

    def _subscribe(self, name: str, topic: str) -> None:
        from google.cloud import pubsub_v1

        with emulator_env(self.endpoints):
            sub = pubsub_v1.SubscriberClient()
        sub.create_subscription(
            name=sub.subscription_path(PROJECT, name), topic=sub.topic_path(PROJECT, topic)
        )
        sub.close()

    def _wire_pubsub(self, ep: dict[str, str], ps_host: str) -> None:
        from google.cloud import pubsub_v1

        with emulator_env(ep):
            pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        slurm_topic = (
            (f"pitstop-slurm-{self.spec.name}", f"pitstop-slurm-{self.spec.name}-results")
            if self.has_slurm
            else ()
        )
        t = {
            n: pub.topic_path(PROJECT, n)
            for n in (
                "pitstop-events",
                "pitstop-events-dead",
                "pitstop-notifications",
                "pitstop-notifications-dead",
                "pitstop-alerts",
                *slurm_topic,
            )
        }
        for topic in t.values():
            pub.create_topic(name=topic)

        def push(name: str, topic: str, endpoint: str, dlq: str, attempts: int) -> None:
            sub.create_subscription(
                request={
                    "name": sub.subscription_path(PROJECT, name),
                    "topic": t[topic],
                    "ack_deadline_seconds": 60,
                    "push_config": {"push_endpoint": f"{endpoint}/projects/{PROJECT}/topics/{topic}"},
                    "dead_letter_policy": {"dead_letter_topic": t[dlq], "max_delivery_attempts": attempts},
                    "retry_policy": {"minimum_backoff": {"seconds": 1}, "maximum_backoff": {"seconds": 5}},
                }
            )

        push("ingest-push", "pitstop-events", ep["ingest"], "pitstop-events-dead", 5)
        # Monitoring's notifications: pushed to ingest under the alerts topic's own path, so the
        # CloudEvent's source names that topic, as Eventarc's does (core/alerts.py believes only it)
        push("ingest-alerts-push", "pitstop-alerts", ep["ingest"], "pitstop-events-dead", 5)
        push("notify-push", "pitstop-notifications", ep["notify"], "pitstop-notifications-dead", 10)
        pulls = [
            ("slurm-agent-train", f"pitstop-slurm-{self.spec.name}"),
            ("events-dead-inspect", "pitstop-events-dead"),
            ("notifications-dead-inspect", "pitstop-notifications-dead"),
        ]
        for name, topic in pulls if self.has_slurm else pulls[1:]:
            sub.create_subscription(name=sub.subscription_path(PROJECT, name), topic=t[topic])
        if self.has_slurm:  # what actuate reads the agent's results from (close.slurm_results_subscription)
            results = f"pitstop-slurm-{self.spec.name}-results"
            sub.create_subscription(
                request={
                    "name": sub.subscription_path(PROJECT, f"{results}-actuate"),
                    "topic": t[results],
                    "ack_deadline_seconds": 60,
                    "enable_message_ordering": True,
                }
            )

    # -- training jobs and telemetry faults --------------------------------------------

    def submit_training(self, nodes: int, name: str = "train", exclude: list[str] | None = None) -> str:
        """A Slurm job whose batch step writes the job heartbeat each step (local/trainer.py), kept
        off ``exclude``."""
        assert self.slurm is not None, "training jobs run on a Slurm stack"
        argv = [sys.executable, "-m", "pitstop.local.trainer", "--monitoring", self.endpoints["monitoring"]]
        argv += ["--project", PROJECT, "--cluster", self.spec.name, "--chaos-dir", str(self.chaos_dir)]
        argv += ["--every", str(HEARTBEAT_EVERY_S)]
        command = f"env PYTHONPATH={shlex.quote(str(ROOT / 'functions'))} {shlex.join(argv)}"
        # it writes the heartbeat, and says so to Pitstop through Slurm (core/localise.HEARTBEAT_OPT_IN)
        return self.slurm.submit(nodes, name, command=command, exclude=exclude, comment=HEARTBEAT_OPT_IN)

    def set_gpu_state(self, node: str, state: object) -> GpuStateSet:
        """What the GPU stand-ins (and the Monitoring stand-in's node policies) report for ``node``."""
        assert self.state is not None
        result: GpuStateSet = admin(
            self.state,
            "/_admin/gpu_state",
            {"project": PROJECT, "zone": ZONE, "instance": node, "state": state},
        )
        return result

    # -- faults ----------------------------------------------------------------------

    def restart_firestore(self, down_s: float = 2.0) -> None:
        """Firestore unreachable for ``down_s`` (fault injection): every connection to it ends, new ones
        are refused, then it answers again with every write it acknowledged, as Firestore does through
        an outage. A commit in flight when the link drops may or may not have landed: the writer cannot
        tell, which is the case its retries must survive.
        """
        assert self.state is not None
        host = self.state.endpoints["firestore"]
        old = self.procs["firestore-relay"]
        old.stop()
        time.sleep(down_s)
        self.procs["firestore-relay"] = Proc(old.name, old.argv, old.log_path, old.env).start()
        wait_http(f"http://{host}/", self.procs["firestore-relay"])
        self.refresh_pids()

    # -- down ------------------------------------------------------------------------

    def down(self) -> None:
        if self.controller is not None:  # first, or it would start the functions again
            self.controller.stop()
            self.controller = None
        if self.slurm is not None:
            self.slurm.cancel_jobs()  # while vm-sync's slurmds still run
        for p in reversed(list(self.procs.values())):
            p.stop()
        if self.slurm is not None:
            self.slurm.stop()
        self.procs.clear()


def down(workdir: Path) -> list[str]:
    """Stop a stack started by another process (``pitstop local down``); the names of what was running.

    A stack owned by `pitstop local up`'s background process is asked to stop (SIGTERM) and given
    a minute to stop every part itself; whatever is still running after that is killed.
    """
    try:
        state = StackState.load(workdir)
    except FileNotFoundError:
        return []
    if state.daemon_pid is not None and _stop_daemon(state.daemon_pid):
        return list(state.pids)
    stopped = []
    for name, pid in reversed(list(state.pids.items())):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
            stopped.append(name)
    time.sleep(1.0)
    for pid in state.pids.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    if state.slurm_conf:  # a GKE stack has no slurmd (and an empty pattern would match any stack's)
        subprocess.run(["pkill", "-f", f"slurmd -D -f {state.slurm_conf}"], check=False)
    (Path(workdir) / "stack.json").unlink(missing_ok=True)
    return stopped


def daemon_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process nobody has reaped yet (a container's init may not) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _stop_daemon(pid: int, timeout: float = 60.0) -> bool:
    """SIGTERM the stack's owner and wait until it has exited; False if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while daemon_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


class Router:
    """The sink side: apply infra/filters/ and publish each selected LogEntry as one Pub/Sub message."""

    def __init__(self, state: StackState) -> None:
        from google.cloud import pubsub_v1

        # every sink deploy may create: the core ones, and each plugin folder's (a filter selects only
        # its own entries, so one a stack's configuration would not deploy selects nothing there)
        found = {**sinks.sink_filters(), **sinks.plugin_filters()}
        self.filters = [compile_filter(f) for f in found.values()]
        with emulator_env(state.endpoints):
            self.pub = pubsub_v1.PublisherClient()
        self.topic = self.pub.topic_path(state.project, "pitstop-events")

    def matches(self, entry: Mapping[str, object]) -> bool:
        return any(f(entry) for f in self.filters)

    def publish(self, entry: Mapping[str, object]) -> bool:
        if not self.matches(entry):
            return False
        attrs = {"logging.googleapis.com/timestamp": str(entry.get("timestamp", ""))}
        self.pub.publish(self.topic, json.dumps(entry).encode(), **attrs).result(timeout=30)
        return True

    def publish_raw(self, data: bytes) -> None:
        """Bytes no sink would send (for the poison-message scenario)."""
        self.pub.publish(self.topic, data).result(timeout=30)


def admin(state: StackState, path: str, body: Mapping[str, object] | None = None) -> Any:
    """The fake Compute's admin API (loopback http only); its answer as sent (compute_shapes.py)."""
    req = urllib.request.Request(  # noqa: S310 - a loopback URL from stack.json
        state.endpoints["compute"] + path,
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


class WebhookRecord(TypedDict):
    """A delivery the webhook sink kept (local/serve.py): when, where, and the JSON body the channel
    posted (its own payload, open shape: chat's ``text``, a PagerDuty event)."""

    at: float
    path: str
    body: JsonObject


def webhook_records(state: StackState, path: str = "/hook") -> list[WebhookRecord]:
    """What one channel's sink received: the chat webhook (``/hook``) or another channel folder's
    (its ``local.PATH``: PagerDuty's ``/pagerduty/v2/enqueue``, the generic webhook's ``/generic``)."""
    out = Path(state.workdir, "webhook.jsonl")
    records: list[WebhookRecord] = (
        [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    )
    return [r for r in records if r.get("path") == path]
