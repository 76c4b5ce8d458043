"""A hung gang's stop-time checks on GKE, against the fake API server through the real client.

The gang is stopped, its pods leave the nodes, the sweep pods run the stand-in ``nvidia-smi -q``
(pitstop.local.gpu_tools, one state file per node) on every node it ran on, core/localise.py judges
their outputs, and the gang is resumed once. Modelled API behaviour and its sources:

- ``spec.suspend`` on a JobSet "suspends all running child Jobs when set to true"
  (kubernetes-sigs/jobset@v0.12.0 api/jobset/v1alpha2/jobset_types.go, JobSetSpec.Suspend); a
  suspended Job's active pods are deleted and resuming it creates them again
  (https://kubernetes.io/docs/concepts/workloads/controllers/job/#suspending-a-job; KEP-2232:
  "Suspending a Job will delete all active Pods owned by that Job"); neither counts a restart
  (jobset_controller.go: only the failure policy bumps ``status.restarts``);
- a Kueue Workload with ``spec.active=false`` is evicted and its JobSet suspended
  (kubernetes-sigs/kueue@v0.19.2 apis/kueue/v1beta2/workload_types.go);
- the kubelet admits a check pod only against the node's free GPUs (reference/gke.md §2), which is
  why the gang is stopped first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import CHECK_NAMESPACE, CheckSettings, GkeScheduler
from pitstop.adapters.gke.gang import STOPPED_FOR, STOPPED_NODES
from pitstop.core import localise
from pitstop.core.domain import CheckRun, GangCheckSpec, LocaliseConfig
from pitstop.core.scheduling import CheckResult, GangCheckStart, StepRef
from pitstop.local import gke_stack
from pitstop.local.fake_k8s import FakeKube
from tests.helpers import kube_running_checks

PROJECT, ZONE = "train-prod", "us-central1-a"
INC = "iaaaaaaaaa"
REF = StepRef(INC, 1)
NODES = [f"gke-train-gpu-{i:04d}" for i in range(4)]
BAD = NODES[1]
JOB = "jobset/default/train"
JS = "jobset.sigs.k8s.io/jobset-name"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKube]:
    """Four nodes; the gang's second node has a GPU NVML cannot open (the stand-in's ``hung``)."""
    state = tmp_path / "gpu-state.json"
    state.write_text(json.dumps({BAD: {"hung": True}}))
    k = kube_running_checks(state, CHECK_NAMESPACE)
    for n in NODES:
        k.add_node(
            n, project=PROJECT, zone=ZONE, labels={gke_stack.POOL_LABEL: "gang" if n != NODES[3] else "x"}
        )
    yield k
    k.stop()


@pytest.fixture
def sched(api: Any) -> GkeScheduler:
    checks = CheckSettings.from_conf({"checks": gke_stack.local_checks(sys.executable)})
    return GkeScheduler(api, evict_deadline_s=10, wait_s=5, checks=checks)


def wait(cond: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    return gke_stack.wait_for(cond, timeout, what or "the condition")


def gang_pods(kube: FakeKube, live: bool = True) -> list[dict[str, Any]]:
    pods = [p for p in kube.list("Pod", "default") if p["metadata"]["labels"].get(JS) == "train"]
    return [p for p in pods if not live or p["status"].get("phase") in ("Pending", "Running")]


def running_on(kube: FakeKube) -> list[str]:
    return sorted(p["spec"].get("nodeName") for p in gang_pods(kube) if p["status"].get("phase") == "Running")


def start_gang(kube: FakeKube, queue: str | None = None) -> None:
    js = gke_stack.jobset("train", 3, pool="gang", grace_s=1)
    if queue:
        js["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    kube.create(js)
    wait(lambda: len(running_on(kube)) == 3, what="the gang to run")


def sweep(step: int = 1) -> GangCheckSpec:
    return localise.sweep_spec(INC, step, JOB, [], cast(LocaliseConfig, {"tool_timeout_s": 20}))


def start(sched: GkeScheduler, check: GangCheckSpec) -> GangCheckStart:
    """Asked again while the gang's pods are still leaving their nodes (503), as the workflow does."""

    def once() -> GangCheckStart | None:
        try:
            return sched.start_gang_check(JOB, check, REF)
        except ActuatorError as exc:
            assert exc.retryable, exc.message
            return None

    got: GangCheckStart = wait(once, what="the gang to stop")
    return got


def finished(sched: GkeScheduler, check: GangCheckSpec, nodes: tuple[str, ...]) -> CheckResult:
    got: CheckResult = wait(
        lambda: (r := sched.gang_check_result(JOB, {**check, "nodes": list(nodes)}, REF)).done and r,
        what="every node's check",
    )
    return got


def test_a_hung_jobset_is_stopped_checked_on_every_node_and_resumed_past_its_culprit(
    kube: FakeKube, sched: GkeScheduler
) -> None:
    start_gang(kube)
    held = running_on(kube)
    check = sweep()
    started = start(sched, check)
    js = kube.get("JobSet", "train", "default")
    assert started.stopped and started.nodes == tuple(held) and BAD in held
    assert js is not None and js["spec"]["suspend"] is True
    assert js["metadata"]["annotations"][STOPPED_FOR] == REF.key
    assert gang_pods(kube) == []  # the check pods got the GPUs the gang held
    assert js["status"]["restarts"] == 0  # a suspend is not a restart
    res = finished(sched, check, started.nodes)
    verdict = localise.judge_sweep(list(started.nodes), cast(CheckRun, asdict(res)), 34, [79])
    assert verdict.culprits == (BAD,), verdict.why
    assert all(f"node_condition@{n}" in res.outputs for n in held)
    # a retry of the start finds its own stop and the checks it started: nothing is done twice
    assert start(sched, check) == started
    sched.fence(BAD, StepRef("ibbbbbbbbb"), "REBOOT_NODE")  # the culprit's own incident's fence
    kube.mutate("Node", NODES[3], lambda n: n["metadata"]["labels"].update({gke_stack.POOL_LABEL: "gang"}))
    out = sched.resume_gang(JOB, REF)
    assert out.restarted, out.how
    wait(lambda: len(running_on(kube)) == 3, what="the gang to run again")
    after = kube.get("JobSet", "train", "default")
    assert after is not None and STOPPED_FOR not in after["metadata"].get("annotations", {})
    assert BAD not in running_on(kube) and NODES[3] in running_on(kube)  # onto the spare
    assert after["status"]["restarts"] == 0
    again = sched.resume_gang(JOB, REF)  # a retried conclusion resumes nothing twice
    assert again.restarted and "it runs (resumed already)" in again.how
    assert len(gang_pods(kube)) == 3


def test_a_kueue_jobset_is_stopped_through_its_workload_and_reactivated(
    kube: FakeKube, sched: GkeScheduler
) -> None:
    start_gang(kube, queue="train-queue")
    (wl,) = kube.list("Workload", "default")
    started = start(sched, sweep())
    wl = kube.get("Workload", wl["metadata"]["name"], "default") or {}
    assert started.stopped and wl["spec"]["active"] is False
    assert wl["metadata"]["annotations"]["pitstop.dev/requeued-for"] == REF.key
    js = kube.get("JobSet", "train", "default") or {}
    assert js["spec"]["suspend"] is True and js["metadata"]["annotations"][STOPPED_NODES]
    assert sched.resume_gang(JOB, REF).restarted
    wl = kube.get("Workload", wl["metadata"]["name"], "default") or {}
    assert wl["spec"]["active"] is True
    wait(lambda: len(running_on(kube)) == 3, what="Kueue to admit it again")


def test_a_failed_step_leaves_the_gang_stopped_and_the_close_resumes_it(
    kube: FakeKube, sched: GkeScheduler
) -> None:
    start_gang(kube)
    start(sched, sweep())
    assert sched.release_jobs([JOB], StepRef(INC, 0, "closed")) == [
        f"{JOB}: resumed (stopped for {REF.key}'s checks)"
    ]
    wait(lambda: len(running_on(kube)) == 3, what="the gang to run again")
    assert sched.release_jobs([JOB], StepRef(INC, 0, "closed")) == []


def test_when_no_node_shows_a_fault_the_ring_pairs_find_the_slow_link(
    kube: FakeKube, sched: GkeScheduler, tmp_path: Path
) -> None:
    """An NVLink down on BAD: nvidia-smi -q is clean everywhere, and every ring pair runs at once
    (half of each node's GPUs per pod: each node is in two pairs); BAD's two pairs are slow."""
    (tmp_path / "gpu-state.json").write_text(json.dumps({BAD: {"busbw": 38.0, "nvlink_down": [3]}}))
    start_gang(kube)
    started = start(sched, sweep())
    swept = finished(sched, sweep(), started.nodes)
    nodes = list(started.nodes)
    assert localise.judge_sweep(nodes, cast(CheckRun, asdict(swept)), 34, [79]).culprits == ()
    links = localise.links_spec(
        INC, 1, JOB, nodes, cast(LocaliseConfig, {"link_bytes": 64 << 20, "link_timeout_s": 60})
    )
    ring = sched.start_gang_check(JOB, links, REF)
    assert ring.stopped and ring.nodes == started.nodes
    pods = [
        p for p in kube.list("Pod", CHECK_NAMESPACE) if p["metadata"]["labels"].get("pitstop.dev/check-role")
    ]
    gpus = {
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods if "link" in str(p)
    }
    assert gpus == {"4"}  # every pair at once: a node's launcher and its neighbour's peer side by side
    res = finished(sched, links, started.nodes)
    pairs = [localise.split_pair(p) for p in links["pairs"]]
    verdict = localise.judge_links(pairs, cast(CheckRun, asdict(res)), 0.7, 34)
    assert verdict.culprits == (BAD,), verdict.why
    assert sched.resume_gang(JOB, REF).restarted


def test_a_bare_pod_is_not_stopped(kube: FakeKube, sched: GkeScheduler) -> None:
    pod = {"kind": "Pod", "metadata": {"name": "solo", "namespace": "default"},
           "spec": {"nodeName": NODES[3], "containers": [{"name": "c", "image": "x"}]}}  # fmt: skip
    kube.create(pod)
    bare = sched.start_gang_check("pod/default/solo", sweep(2), REF)
    assert bare.nodes == () and not bare.stopped and "bare pod" in bare.note
    assert (kube.get("Pod", "solo", "default") or {}).get("metadata", {}).get("deletionTimestamp") is None


def test_a_jobset_someone_else_suspended_is_left_alone(kube: FakeKube, sched: GkeScheduler) -> None:
    start_gang(kube)
    kube.mutate("JobSet", "train", lambda js: js["spec"].update(suspend=True), "default")
    got = sched.start_gang_check(JOB, sweep(), REF)
    assert got.nodes == () and "not by Pitstop" in got.note
    js = kube.get("JobSet", "train", "default") or {}
    assert STOPPED_FOR not in (js["metadata"].get("annotations") or {})
