"""``pitstop bench actuate``: remediations through actuate as deployed, C workflow calls at once.

One run per concurrency C: one actuate instance (functions-framework serving functions/main.py's
``actuate`` through tools/bench_calls.py, which only times, with THREADS = C) and the remediation
workflow itself (workflows/remediate.yaml on the local Workflows runner, C executions at a time:
at most C calls in flight, as many as the instance serves at once). Each remediation is a real
one: an Xid 79 line the node's kernel printed (the fake Compute keeps it for corroboration),
decided by ingest in this process on the Firestore emulator, then claim, fence, corroborate, act
(a Compute reset whose operation takes time), operation polls, verify, close, the resolved
notice published to the Pub/Sub emulator. The cluster has no scheduler (``scheduler: none``):
this bench measures actuate, Firestore and Compute; Slurm's and GKE's round trips are their own
processes' (tests/e2e).

Figures per run: calls/s and remediations/s (first call to last answer), each call's latency
(p50, p99, by op), the answers' statuses, remediations resolved, Compute resets (one per
remediation), notices published, and the instance's peak memory (sampled PSS of gunicorn's master
and worker together, as bench ingest measures it, and the worker's own VmHWM).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.core.domain import Incident
from pitstop.local import procs
from pitstop.tools import bench_fleet
from pitstop.tools.bench_calls import STATS_DIR_ENV
from pitstop.tools.bench_types import ActuateRun, CallsReport, LogEntry, Report

if TYPE_CHECKING:
    from pitstop.core.answers import Notification
    from pitstop.local.fake_compute import FakeCompute

CALLS_SOURCE = Path(__file__).with_name("bench_calls.py")
PKG_ROOT = Path(__file__).resolve().parents[2]  # functions/: main.py and pitstop
WORKFLOW = PKG_ROOT.parent / "workflows" / "remediate.yaml"
ZONE = "us-central1-a"
WARM_UP = "?"  # bench_calls' name of a call without an op: the probes before the runs
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@dataclass(frozen=True)
class Shape:
    """One run: how many remediations, C calls at once, time scales of the stand-ins."""

    concurrency: int
    remediations: int
    compute_scale: float = 0.01  # a reset's operation takes 30 s x this
    workflow_scale: float = 0.05  # the workflow's sleeps (its 30 s polls) x this
    deadline_s: float = 600.0


@dataclass
class World:
    """What every run shares: the emulators and the fake Compute."""

    firestore: str
    pubsub: str
    compute: FakeCompute
    compute_endpoint: str


@contextmanager
def world() -> Iterator[World]:
    """Firestore and Pub/Sub emulators (or the ones the environment names) and a fake Compute."""
    from pitstop.local.fake_compute import FakeCompute, serve

    with ExitStack() as stack:
        hosts = {}
        for kind, env in (("firestore", "FIRESTORE_EMULATOR_HOST"), ("pubsub", "PUBSUB_EMULATOR_HOST")):
            host = os.environ.get(env)
            if not host:
                proc, host = procs.start_emulator(kind, Path(tempfile.mkdtemp(prefix="pitstop-bench-")))
                stack.callback(proc.stop)
                os.environ[env] = host  # this process's clients (ingest, the read-back)
                stack.callback(os.environ.pop, env, None)
            hosts[kind] = host
        fake = FakeCompute()
        server, endpoint = serve(fake, port=procs.free_port())
        stack.callback(server.shutdown)
        yield World(hosts["firestore"], hosts["pubsub"], fake, endpoint)


def _policy(nodes: int) -> str:
    """Enforce, one cluster without a scheduler, budgets wide enough for every remediation at once.
    Corroboration and validation ask the node through its scheduler: off here (there is none)."""
    cluster = {"name": "train", "scheduler": "none", "size": nodes, "match": {"name_pattern": "a3-node-*"}}
    wide = {"max_nodes": nodes, "max_percent": 100}
    doc = {
        "mode": "enforce",
        "clusters": [cluster],
        "budgets": {"cluster": wide, "zone": wide, "block": wide},
    }
    doc |= {"corroboration": {"enabled": False}, "validation": {"enabled": False}}
    return json.dumps(doc)  # JSON is YAML


def _entry(project: str, node: str, instance_id: str, n: int) -> LogEntry:
    """The node's kernel line as the Ops Agent's journald receiver ships it (verified evidence)."""
    return {
        "insertId": f"bench-actuate-{n}",
        "logName": f"projects/{project}/logs/pitstop-kernel",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jsonPayload": {"MESSAGE": XID79, "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "_HOSTNAME": node},
        "resource": {
            "type": "gce_instance",
            "labels": {"instance_id": instance_id, "zone": ZONE, "project_id": project},
        },
        "labels": {"compute.googleapis.com/resource_name": node},
    }


def _instance_env(w: World, project: str, policy: Path, workflows: str, stats: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return env | {
        "PYTHONPATH": str(PKG_ROOT),
        "GOOGLE_CLOUD_PROJECT": project,
        "FIRESTORE_EMULATOR_HOST": w.firestore,
        "PUBSUB_EMULATOR_HOST": w.pubsub,
        "PITSTOP_POLICY": str(policy),
        "PITSTOP_COMPUTE_ENDPOINT": w.compute_endpoint,
        "PITSTOP_WORKFLOWS_ENDPOINT": workflows,
        "PITSTOP_NOTIFICATIONS_TOPIC": "pitstop-notifications",
        STATS_DIR_ENV: str(stats),
    }


def _start(shape: Shape, workdir: Path, env: dict[str, str]) -> bench_fleet._Instance:
    inst = bench_fleet.start_instance("actuate", "actuate", workdir, env, shape.concurrency, CALLS_SOURCE)
    port = inst.port
    t0 = time.perf_counter()
    procs.wait_http(f"http://127.0.0.1:{port}/", inst.proc, timeout=120, accept_errors=True)
    # a first call without an op builds the actuator (its clients: the cold start) and is refused
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", b"{}", {"Content-Type": "application/json"})
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(req, timeout=120).close()  # noqa: S310 - loopback
    inst.ready_s = time.perf_counter() - t0
    return inst


def _notes_subscription(project: str) -> tuple[Any, str]:
    """The notifications topic actuate publishes to, and a subscription counting what reached it."""
    from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

    pub, sub = PublisherClient(), SubscriberClient()
    topic = pub.topic_path(project, "pitstop-notifications")
    pub.create_topic(name=topic)
    path = sub.subscription_path(project, "bench-notes")
    sub.create_subscription(name=path, topic=topic)
    return sub, path


def _drain(sub: Any, path: str) -> list[object]:
    """What reached the notifications topic, acknowledged: counted, not read."""
    out: list[object] = []
    while True:
        resp = sub.pull(subscription=path, max_messages=500, timeout=10)
        if not resp.received_messages:
            return out
        sub.acknowledge(subscription=path, ack_ids=[m.ack_id for m in resp.received_messages])
        out += [json.loads(m.message.data) for m in resp.received_messages]


class _NoPages:
    """ingest's notifier: nothing here is held, so nothing pages; a page would be counted."""

    def __init__(self) -> None:
        self.pages = 0

    def publish(self, notification: Notification) -> str:
        self.pages += 1
        return f"bench-page-{self.pages}"


def run(shape: Shape, w: World) -> ActuateRun:
    """One run: C executions at a time remediate ``shape.remediations`` nodes through one instance."""
    from google.cloud import firestore

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.adapters.workflows import WorkflowStarter
    from pitstop.core import policy as policy_mod
    from pitstop.local.executions_server import ExecutionsService, serve
    from pitstop.local.workflows_runner import runner_for
    from pitstop.services.ingest import Ingest

    project, workdir, stats = bench_fleet.scratch("pitstop-bench-actuate-")
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(_policy(shape.remediations))
    nodes = [f"a3-node-{i:03d}" for i in range(shape.remediations)]
    w.compute.scale = shape.compute_scale
    ids = {n: w.compute.add_instance(project, ZONE, n, mig="a3-node").id for n in nodes}
    sub, notes = _notes_subscription(project)
    grpc_port = procs.free_port()
    wf_env = {"PITSTOP_POLL_S": "2", "PITSTOP_OP_TIMEOUT_S": "1800", "PITSTOP_VERIFY_TIMEOUT_S": "2700"}
    wf_env |= {"PITSTOP_CHECK_TIMEOUT_S": "1800", "PITSTOP_RESUME_WAIT_S": "600"}
    inst = None
    with ExitStack() as stack:
        env = _instance_env(w, project, policy_file, f"127.0.0.1:{grpc_port}", stats)
        inst = _start(shape, workdir, env)
        stack.callback(inst.proc.stop, 60)
        wf_env["PITSTOP_ACTUATE_URL"] = f"http://127.0.0.1:{inst.port}/"
        runner = runner_for(str(WORKFLOW), wf_env, shape.workflow_scale)
        executions = ExecutionsService(runner, workers=shape.concurrency)
        server, _ = serve(executions, port=grpc_port)
        stack.callback(server.stop, 0)
        pol = policy_mod.load(policy_file)
        store = IncidentStore(firestore.Client(project=project))
        wf = pol.doc["workflow"]
        starter = WorkflowStarter(project, wf["location"], wf["name"], f"127.0.0.1:{grpc_port}")
        ingest = Ingest(pol, store, starter, _NoPages())
        with bench_fleet._MemorySampler([inst]):
            t0 = time.perf_counter()
            for i, node in enumerate(nodes):
                w.compute.kernel_line(project, ZONE, node, XID79, 0)
                ingest.handle_payload(_entry(project, node, ids[node], i))
            finished = executions.wait_all(shape.deadline_s)
            elapsed = time.perf_counter() - t0
        inst.proc.signal(15)
        inst.proc.stop(timeout=60)
    reports: list[CallsReport] = [json.loads(p.read_text()) for p in sorted(stats.glob("*.json"))]
    incidents = store.query()
    resets = [c for c in w.compute.calls if c["method"] == "reset" and f"projects/{project}/" in c["path"]]
    return _figures(shape, elapsed, finished, reports, inst, incidents, len(resets), _drain(sub, notes))


def _figures(
    shape: Shape,
    elapsed: float,
    finished: bool,
    reports: list[CallsReport],
    inst: bench_fleet._Instance,
    incidents: Sequence[Incident],
    resets: int,
    notes: list[object],
) -> ActuateRun:
    calls = [c for r in reports for c in r["calls"] if c[0] != WARM_UP]
    took = sorted(c[2] for c in calls)
    by_op: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    for op, status, s in calls:
        by_op.setdefault(op, []).append(s)
        statuses[status] = statuses.get(status, 0) + 1
    states: dict[str, int] = {}
    for i in incidents:
        states[str(i.get("state"))] = states.get(str(i.get("state")), 0) + 1
    return {
        "concurrency": shape.concurrency,
        "remediations": shape.remediations,
        "finished": finished,
        "seconds": round(elapsed, 1),
        "calls": len(calls),
        "calls_per_s": round(len(calls) / elapsed, 1),
        "remediations_per_s": round(shape.remediations / elapsed, 2),
        "latency_ms": {
            "p50": bench_fleet.percentile_ms(took, 0.5),
            "p99": bench_fleet.percentile_ms(took, 0.99),
            "max": bench_fleet.percentile_ms(took, 1.0),
        },
        "latency_ms_by_op": {
            op: {
                "calls": len(v),
                "p50": bench_fleet.percentile_ms(sorted(v), 0.5),
                "p99": bench_fleet.percentile_ms(sorted(v), 0.99),
            }
            for op, v in sorted(by_op.items())
        },
        "answers": dict(sorted(statuses.items())),
        "incidents": dict(sorted(states.items())),
        "resolved": states.get("RESOLVED", 0),
        "compute_resets": resets,
        "notices_published": len(notes),
        "peak_mib": round(inst.peak_pss_mib, 1),
        "worker_hwm_mib": max((r["peak_mib"] for r in reports), default=0.0),
        "ready_s": round(inst.ready_s, 1),
    }


def bench_actuate(
    concurrency: list[int], remediations: int | None = None, **shape: Any
) -> Report[ActuateRun]:
    """Every concurrency, ``remediations`` each (default 2 x C), on one set of stand-ins."""
    runs = []
    with world() as w:
        for k, c in enumerate(concurrency, 1):
            shaped = Shape(c, remediations or 2 * c, **shape)
            print(
                f"pitstop bench: actuate run {k} of {len(concurrency)}: {shaped}", file=sys.stderr, flush=True
            )
            runs.append(run(shaped, w))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # progress
    return {"benchmark": "actuate", "cpus": os.cpu_count(), "runs": runs}
