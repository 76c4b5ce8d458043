"""`make demo` / `pitstop demo`: real fault scenarios through the real local pipeline.

The scenarios are data (schemas/demo-scenarios.yaml), run by tools/demo_runner.py: each injects
LogEntries through the sink router (or acts on the fake platform), waits for the pipeline to
finish, checks what happened in Firestore, Slurm or the fake Kubernetes API server, the fake
Compute and the webhook sink, and prints the incident's timeline. The last line is one JSON
object: ``{"scenarios": [...], "latency_ms": {...}}``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from pitstop.core.domain import JsonObject
from pitstop.local.stack import ClusterSpec, Stack, StackState
from pitstop.tools import demo_runner, demo_vertex
from pitstop.tools.demo_stage import Result, Stage
from pitstop.tools.demo_steps import STEPS

# Slurm: eight nodes for the first scenarios, five for the hangs (8-12), twelve for the topology ones
# (13-24), ten for the degraded-node ones, ten for the back-to-training ones.
SLURM_NODES = 45
# Where the topology scenarios' nodes sit (node index -> [block, sub-block]); every other node sits
# in block-1/sub-1. 13 is alone in another block and sorts first among the idle nodes Slurm lists;
# 14-16 share a sub-block (topology_spare: the gang and its spare); 17-18 and 20-21 are a gang each
# whose only spare, 19, sits in another sub-block of their block (short_repair_waited,
# host_report_moved); 22-24 are A4X trays, 22 alone in one rack and 23-24 the gang of another
# (nvl72_domain_waited: a rack is an NVLink domain, the other rack's idle tray no spare).
TOPOLOGY_PLACES = {
    13: ["block-2", "sub-3"],
    **{i: ["block-1", "sub-2"] for i in (14, 15, 16)},
    **{i: ["block-1", "sub-4"] for i in (17, 18)},
    19: ["block-1", "sub-5"],
    **{i: ["block-1", "sub-6"] for i in (20, 21)},
    22: ["block-1", "sub-7"],
    **{i: ["block-1", "sub-8"] for i in (23, 24)},
}
# The nodes whose VMs are not the cluster's a3-megagpu-8g: the NVL72 racks' trays (4 GB200 GPUs each).
MACHINE_TYPES = {i: "a4x-highgpu-4g" for i in (22, 23, 24)}
# The local repairs run at a fraction of their real length: priced from the fleet's measured ones they
# would cost seconds. The demo prices each move from the policy's repair times (moves.repair_s).
# The A4X stand-ins are judged against Google's daily CI bar for A4X (all_gather Avg >= 200 GB/s,
# schemas/validation.yaml), an operator's baseline as validation.expected takes one.
SLURM_POLICY = {
    "moves": {"min_history": 1_000_000},
    "validation": {"expected": {"a4x-highgpu-4g": {"busbw_gbps": 200}}},
}
# GKE: nine nodes that take a fault each (cooldowns outlast the demo; the serial scenario's 7 keeps its
# recorded incident open), two for the degraded-node ones (9, 10), a gang partner and a spare (11, 12:
# demo_runner.GKE_PARTNER, GKE_SPARE), and four for the topology one (13-16)
GKE_NODES = 17
# Where the GKE topology scenario's nodes sit (GKE's gce-topology labels; the other nodes carry none, as
# nodes outside a reservation): 13 alone in another block and first by name, 14-16 one sub-block
# (gke_topology: the JobSet on 14 and 15, its spare 16).
GKE_TOPOLOGY_PLACES = {13: ["block-2", "sub-3"], **{i: ["block-1", "sub-9"] for i in (14, 15, 16)}}
GKE_COMPUTE_SCALE = 0.03  # a reset keeps the VM down ~1 s: time for the gang to restart off a preempted node


def slurm_spec(nodes: int) -> ClusterSpec:
    """The demo's Slurm cluster; its fourth node is a Spot VM (the preemption scenario's: Compute
    confirms a preemption only of a Spot VM, core/corroboration.judge_system), and the topology
    scenarios' nodes sit where TOPOLOGY_PLACES puts them (topology/tree, physicalHostTopology), on
    the machine types MACHINE_TYPES names."""
    spec = ClusterSpec(nodes=nodes)
    spec.spot = [spec.node_names[3]]
    spec.places = {spec.node_names[i]: place for i, place in TOPOLOGY_PLACES.items()}
    spec.machine_types = {spec.node_names[i]: machine for i, machine in MACHINE_TYPES.items()}
    return spec


def gke_spec(nodes: int = GKE_NODES) -> ClusterSpec:
    """The demo's GKE node pool; its fourth node is a Spot VM (the preemption scenario's), and the
    topology scenario's nodes sit where GKE_TOPOLOGY_PLACES puts them."""
    spec = ClusterSpec.gke(nodes)
    spec.spot = [spec.node_names[3]]
    if nodes > max(GKE_TOPOLOGY_PLACES):
        spec.places = {spec.node_names[i]: place for i, place in GKE_TOPOLOGY_PLACES.items()}
    return spec


def vertex_policy() -> JsonObject:
    """The Vertex AI stack's policy beside the stack's own: one resubmission per job line within the
    hour (budgets.job_restarts), so a job whose resubmission fails again shows the budget's page."""
    return {"budgets": {"window_s": 8, "job_restarts": {"max": 1, "window_s": 3600}}}


def scenarios() -> list[demo_runner.Scenario]:
    """The demo's scenarios, in the order they run (schemas/demo-scenarios.yaml)."""
    return demo_runner.load(STEPS)


class LatencySummary(TypedDict, total=False):
    """Detect-to-fence latencies in milliseconds (none seen: ``n`` alone)."""

    detect_to_first_action_p50: int
    detect_to_first_action_p99: int
    n: int
    note: str


def latency_summary(latencies: list[float]) -> LatencySummary:
    xs = sorted(x * 1000 for x in latencies)
    if not xs:
        return {"n": 0}
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return {
        "detect_to_first_action_p50": round(statistics.median(xs)),
        "detect_to_first_action_p99": round(p99),
        "n": len(xs),
        "note": "log timestamp to node fenced; excludes deliberate waits",
    }


def print_result(r: Result) -> None:
    mark = "PASS" if r.passed else "FAIL"
    print(f"\n[{mark}] {r.name}: {r.detail}")
    if r.timeline:
        steps = [f"{k} +{v:.1f}s" for k, v in sorted(_set(r.timeline), key=lambda kv: kv[1])]
        print(f"       incident {r.incident}: detected -> " + " -> ".join(steps))
    if r.resume_s is not None or r.repair_s is not None:
        print(f"       resume_s {r.resume_s}  repair_s {r.repair_s}  (real-time equivalent)")


def _set(timeline: Mapping[str, float | None]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in timeline.items() if v is not None]


def _on_stack(stack: Stack, plan: list[demo_runner.Scenario], keep: bool) -> tuple[list[Result], list[float]]:
    """Bring the stack up, run its scenarios, bring it down unless ``keep``: the results and the
    detect-to-fence latencies seen."""
    t0 = time.time()
    print(f"starting the local stack in {stack.workdir} ...", flush=True)
    try:
        state: StackState = stack.up()
        print(
            f"stack up in {time.time() - t0:.1f}s: "
            + ", ".join(f"{k}={v}" for k, v in state.endpoints.items())
        )
        stage = Stage(stack)
        return demo_runner.Runner(stage, STEPS, {"vertex": demo_vertex.on_vertex}).run_all(
            plan, print_result
        ), stage.latencies
    except Exception:
        for name in ("ingest", "actuate", "notify", "executions", "slurm-agent", "fake-compute", "kube"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log (tail) ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
        raise
    finally:
        if not keep:
            stack.down()


def run(workdir: Path, only: list[str] | None = None, keep: bool = False) -> int:
    """The Slurm scenarios on a Slurm stack in ``workdir``, then the GKE ones on a GKE stack in
    ``workdir/gke``, then the Vertex AI ones on a stack with a Vertex AI cluster in ``workdir/vertex``
    (``only`` picks scenarios; a stack none of them needs is not started)."""
    t0 = time.time()
    picked = [s for s in scenarios() if not only or s["key"] in only]
    runs: list[tuple[list[Result], list[float]]] = []
    slurm, gke, vertex = ([s for s in picked if s["stack"] == kind] for kind in ("slurm", "gke", "vertex"))
    if slurm:
        runs.append(_on_stack(Stack(workdir, slurm_spec(SLURM_NODES), policy_over=SLURM_POLICY), slurm, keep))
    if gke:
        runs.append(_on_stack(Stack(workdir / "gke", gke_spec(), compute_scale=GKE_COMPUTE_SCALE), gke, keep))
    if vertex:
        stack = Stack(workdir / "vertex", ClusterSpec.vertex(), policy_over=vertex_policy())
        runs.append(_on_stack(stack, vertex, keep))
    results = [r for done, _ in runs for r in done]
    summary = {
        "scenarios": [
            {
                "name": r.name,
                "passed": r.passed,
                "detail": r.detail,
                "timeline": r.timeline,
                "resume_s": r.resume_s,
                "repair_s": r.repair_s,
            }
            for r in results
        ],
        "latency_ms": latency_summary([x for _, seen in runs for x in seen]),
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(summary))
    return 0 if results and all(r.passed for r in results) else 1
