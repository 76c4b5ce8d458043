"""The GKE adapter's capacity, diagnose and validate, against the fake API server through the real client.

The fake's kubelet runs the check pods' ``/bin/sh -c`` scripts as processes (``run_containers``),
with the stand-in GPU tools (pitstop.local.gpu_tools, through ``gke_stack.local_checks``) reading a
per-node state file, so what is asserted is what a run on a real node returns: that node's
nvidia-smi, dcgmi and all_gather_perf output, read back from the pod's log.

Modelled API behaviour and its sources:
- a pod with ``spec.nodeName`` is not scheduled: the scheduler, and so the cordon, is bypassed,
  and NoSchedule taints are not checked (https://kubernetes.io/docs/concepts/scheduling-eviction/
  assign-pod-node/#nodename; taint-and-toleration: NoSchedule binds the scheduler only);
- the kubelet still admits it against the node's free extended resources, else the pod fails with
  reason ``OutOf<resource>`` (kubernetes ``pkg/kubelet/lifecycle/predicate.go``);
- ``GET /api/v1/namespaces/NS/pods/P/log`` answers ``text/plain``; ``container`` is required for a
  pod of several containers (``pkg/registry/core/pod/strategy.go`` LogLocation); the Python client
  parses a JSON-looking log unless ``_preload_content=False`` (kubernetes-client/python#811, #1354);
- a finished Job with ``ttlSecondsAfterFinished`` is deleted that long after it finished
  (https://kubernetes.io/docs/concepts/workloads/controllers/ttlafterfinished/);
- a Job whose pod fails with ``backoffLimit: 0`` is Failed (``BackoffLimitExceeded``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import (
    CHECK_LABEL,
    CHECK_NAMESPACE,
    CHECK_SERVICE,
    DCGM_IMAGE,
    FENCE_KEY,
    NCCL_IMAGE,
    CheckSettings,
    GkeCluster,
    check_script,
    split_outputs,
)
from pitstop.core.diagnose import parse_nvidia_smi_q
from pitstop.core.scheduling import StepRef
from pitstop.core.validation import parse_all_gather, parse_dcgm_diag
from pitstop.local import gke_stack
from pitstop.local.fake_k8s import FakeKube
from tests.helpers import kube_running_checks

ROOT = Path(__file__).resolve().parents[2]
PROJECT, ZONE = "train-prod", "us-central1-a"
INC = "iaaaaaaaaa"
NODES = [f"gke-train-gpu-{i:04d}" for i in range(4)]
BAD = NODES[0]
EIGHT_GIB = 8 << 30


def diagnose(step: int = 3, gpus: int = 8) -> dict[str, Any]:
    name = f"pitstop-{INC}-{step}-diagnose"
    return {"kind": "diagnose", "name": name, "incident": INC, "dcgm_level": 1, "gpus": gpus}


def validate(step: int = 5, peer: bool = True) -> dict[str, Any]:
    name = f"pitstop-{INC}-{step}-validate"
    return {
        "kind": "validate",
        "name": name,
        "incident": INC,
        "dcgm_level": 2,
        "gpus": 8,
        "message_bytes": EIGHT_GIB,
        "peer": peer,
    }


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The stand-ins' per-node outcomes: the fenced node lost a GPU and its NCCL is degraded."""
    path = tmp_path / "gpu-state.json"
    path.write_text(json.dumps({BAD: {"gpus": 7, "busbw": 120.0}}))
    return path


@pytest.fixture
def kube(state: Path) -> Iterator[FakeKube]:
    k = kube_running_checks(state, CHECK_NAMESPACE)
    for n in NODES:
        k.add_node(
            n, project=PROJECT, zone=ZONE, labels={"node.kubernetes.io/instance-type": "a3-megagpu-8g"}
        )
    yield k
    k.stop()


@pytest.fixture
def sched(api: Any) -> GkeCluster:
    checks = CheckSettings.from_conf({"checks": gke_stack.local_checks(sys.executable)})
    s = GkeCluster(api, evict_deadline_s=10, wait_s=10, checks=checks)
    s.fence(BAD, StepRef(INC, 1), "REBOOT_NODE")
    return s


def wait(cond: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or cond}")


def result(sched: GkeCluster, node: str, check: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = wait(
        lambda: (r := sched.check_result(node, check, StepRef(INC, 9)))["done"] and r, what="the check to end"
    )
    return out


def check_pods(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return [p for p in kube.list("Pod", CHECK_NAMESPACE) if p["metadata"]["labels"].get(CHECK_LABEL) == name]


def jobset(name: str, replicas: int, *, pool: str | None = None, queue: str | None = None) -> dict[str, Any]:
    js = gke_stack.jobset(name, replicas, pool=pool)
    if queue:
        js["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return js


def running(kube: FakeKube, name: str, n: int) -> bool:
    pods = [
        p
        for p in kube.list("Pod", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
        and p["status"].get("phase") == "Running"
    ]
    return len(pods) == n


def occupy(kube: FakeKube, node: str, name: str) -> None:
    """Another team's pod holding all 8 GPUs of ``node``."""
    pod = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    kube.create(pod)
    wait(lambda: (kube.get("Pod", name, "default") or {}).get("status", {}).get("phase") == "Running")


# -- capacity ------------------------------------------------------------------------------------


def test_capacity_counts_the_gang_onto_healthy_schedulable_nodes(kube: FakeKube, sched: GkeCluster) -> None:
    kube.create(jobset("train", 2))
    wait(lambda: running(kube, "train", 2), what="the JobSet to run")
    # NODES[0] is fenced: the gang runs on 1 and 2, node 3 is the spare; the gang's own GPUs count free
    got = sched.capacity("jobset/default/train", NODES[1], StepRef(INC, 2))
    assert got["enough"] is True and (got["need"], got["free"]) == (2, 2)
    assert "all 2 pods of jobset/default/train fit on 2 healthy schedulable nodes" in got["why"]
    occupy(kube, NODES[3], "other-team")
    short = sched.capacity("jobset/default/train", NODES[1], StepRef(INC, 2))
    assert (short["enough"], short["need"], short["free"]) == (False, 2, 1)
    assert short["why"].startswith("only 1 of 2 pods")


def test_capacity_honours_the_gangs_node_selector(kube: FakeKube, sched: GkeCluster) -> None:
    kube.mutate("Node", NODES[3], lambda n: n["metadata"]["labels"].update({gke_stack.POOL_LABEL: "a"}))
    kube.create(jobset("pooled", 1, pool="a"))
    wait(lambda: running(kube, "pooled", 1), what="the JobSet to run")
    got = sched.capacity("jobset/default/pooled", NODES[3], StepRef(INC, 2))
    assert got["enough"] is False and got["free"] == 0  # the only node of pool a is the one lost
    assert f"{gke_stack.POOL_LABEL}=a" in got["why"]


def test_capacity_leaves_a_kueue_workload_to_kueue(kube: FakeKube, sched: GkeCluster) -> None:
    for n in NODES[1:]:
        occupy(kube, n, f"hog-{n[-1]}")  # nothing is free now, and yet Kueue will place it
    # created after the hogs hold every GPU: created first, Kueue could admit it and its pods take
    # the nodes before a hog is bound (the hog then never runs)
    kube.create(jobset("queued", 2, queue="team-a"))
    wait(lambda: kube.list("Workload", "default"), what="Kueue's Workload")
    got = sched.capacity("jobset/default/queued", NODES[1], StepRef(INC, 2))
    assert got["enough"] is True and got["need"] == 2 and "Kueue" in got["why"]


def test_capacity_of_a_job_that_is_gone(sched: GkeCluster) -> None:
    got = sched.capacity("jobset/default/nothing", NODES[1], StepRef(INC, 2))
    assert got["enough"] is False and "no longer exists" in got["why"]


# -- diagnose ------------------------------------------------------------------------------------


def test_diagnose_runs_on_the_fenced_node_and_returns_its_three_outputs(
    kube: FakeKube, sched: GkeCluster
) -> None:
    node = kube.get("Node", BAD)
    assert node is not None
    assert any(t["key"] == FENCE_KEY for t in node["spec"]["taints"])
    watch = gke_stack.Watch(kube.url, f"/api/v1/namespaces/{CHECK_NAMESPACE}/pods")
    check = diagnose()
    started = sched.start_check(BAD, check, StepRef(INC, 3))
    assert started == {"started": check["name"], "peer": None, "note": ""}
    got = result(sched, BAD, check)
    phases = [e["object"]["status"].get("phase") for e in watch.stop()]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == [
        "Pending",
        "Running",
        "Succeeded",
    ]

    [pod] = check_pods(kube, check["name"])
    spec = pod["spec"]
    assert spec["nodeName"] == BAD and spec["restartPolicy"] == "Never"
    assert {"key": FENCE_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert (spec["hostname"], spec["subdomain"]) == (check["name"], CHECK_SERVICE)
    assert got["error"] is None and got["exit_codes"] == {"nvidia_smi_q": 0, "nvlink": 0, "dcgm": 0}
    assert set(got["outputs"]) == {"nvidia_smi_q", "nvlink", "dcgm"}
    smi = parse_nvidia_smi_q(got["outputs"]["nvidia_smi_q"])
    assert smi.ok and smi.attached == 8 and smi.visible == 7  # THAT node's state: one GPU lost
    assert "GPU is lost" in got["outputs"]["nvidia_smi_q"]
    assert got["outputs"]["nvlink"].count("Link 0:") == 7
    assert parse_dcgm_diag(got["outputs"]["dcgm"]).verdict == "pass"


def test_a_healthy_node_diagnoses_healthy(kube: FakeKube, sched: GkeCluster) -> None:
    sched.fence(NODES[2], StepRef("ibbbbbbbbb", 1), "REBOOT_NODE")
    check = {**diagnose(), "name": "pitstop-ibbbbbbbbb-3-diagnose", "incident": "ibbbbbbbbb"}
    sched.start_check(NODES[2], check, StepRef("ibbbbbbbbb", 3))
    smi = parse_nvidia_smi_q(result(sched, NODES[2], check)["outputs"]["nvidia_smi_q"])
    assert smi.visible == 8 and not smi.lost


def test_a_retried_start_check_creates_no_second_pod(kube: FakeKube, sched: GkeCluster) -> None:
    check = diagnose()
    first = sched.start_check(BAD, check, StepRef(INC, 3))
    again = sched.start_check(BAD, check, StepRef(INC, 3))
    assert again == first
    got = result(sched, BAD, check)
    assert sched.start_check(BAD, check, StepRef(INC, 3)) == first  # after the run, too
    assert len(check_pods(kube, check["name"])) == 1 and len(kube.list("Job", CHECK_NAMESPACE)) == 1
    assert sched.check_result(BAD, check, StepRef(INC, 9)) == got  # a retried result reads the same log
    with pytest.raises(ActuatorError) as err:
        sched.start_check(NODES[1], check, StepRef(INC, 3))  # the same name for another node is refused
    assert err.value.status == 409


def test_an_ordinary_pod_is_still_kept_off_the_fenced_node(kube: FakeKube, sched: GkeCluster) -> None:
    for n in NODES[1:]:
        occupy(kube, n, f"hog-{n[-1]}")  # the fenced node is the only one with free GPUs
    ordinary = {
        "kind": "Pod",
        "metadata": {"name": "ordinary", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    kube.create(ordinary)
    check = diagnose(gpus=7)
    sched.start_check(BAD, check, StepRef(INC, 3))
    assert result(sched, BAD, check)["error"] is None  # the check ran there
    pod = kube.get("Pod", "ordinary", "default")
    assert pod is not None and not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"


def test_a_check_waits_for_pods_still_holding_the_nodes_gpus(kube: FakeKube, sched: GkeCluster) -> None:
    occupy(kube, BAD, "checkpointing")
    with pytest.raises(ActuatorError) as err:
        sched.start_check(BAD, diagnose(), StepRef(INC, 3))
    assert err.value.status == 503 and err.value.retryable and "default/checkpointing" in err.value.message
    assert not kube.list("Job", CHECK_NAMESPACE)
    kube.delete("Pod", "checkpointing", "default", gracePeriodSeconds=0)
    wait(lambda: kube.get("Pod", "checkpointing", "default") is None)
    assert sched.start_check(BAD, diagnose(), StepRef(INC, 3))["started"] == diagnose()["name"]


# -- validate ------------------------------------------------------------------------------------


def test_validate_runs_dcgm_and_nccl_with_one_healthy_peer(kube: FakeKube, sched: GkeCluster) -> None:
    sched.fence(NODES[1], StepRef("ibbbbbbbbb", 1), "REBOOT_NODE")  # another fence: never a peer
    occupy(kube, NODES[2], "busy")  # no free GPUs: never a peer
    check = validate()
    started = sched.start_check(BAD, check, StepRef(INC, 5))
    assert started == {"started": check["name"], "peer": NODES[3], "note": ""}
    wait(lambda: len(check_pods(kube, check["name"])) == 2, what="the two check pods")
    by_role = {p["metadata"]["labels"]["pitstop.dev/check-role"]: p for p in check_pods(kube, check["name"])}
    assert by_role["node"]["spec"]["nodeName"] == BAD
    wait(
        lambda: (kube.get("Pod", by_role["peer"]["metadata"]["name"], CHECK_NAMESPACE) or {})["spec"].get(
            "nodeName"
        )
    )
    peer_pod = kube.get("Pod", by_role["peer"]["metadata"]["name"], CHECK_NAMESPACE)
    assert peer_pod is not None and peer_pod["spec"]["nodeName"] == NODES[3]  # placed by the scheduler
    got = result(sched, BAD, check)
    assert got["error"] is None and got["peer"] == NODES[3]
    assert set(got["outputs"]) == {"nvidia_smi_q", "dcgm", "nccl"}  # the GPU count first (issue 35)
    assert parse_dcgm_diag(got["outputs"]["dcgm"]).verdict == "pass"
    nccl = parse_all_gather(got["outputs"]["nccl"])
    row = nccl.row_at(EIGHT_GIB)
    assert (
        nccl.ok and row is not None and row.busbw == pytest.approx(120.0)
    )  # the fenced node's degraded NCCL
    assert f"on {BAD} " in got["outputs"]["nccl"] and f"on {NODES[3]} " in got["outputs"]["nccl"]
    wait(lambda: len(check_pods(kube, check["name"])) == 1, what="the peer to be deleted")
    assert sched.start_check(BAD, check, StepRef(INC, 5)) == started  # a retry keeps the same peer


def test_revalidate_runs_nccl_alone_with_a_peer_not_measured_before(
    kube: FakeKube, sched: GkeCluster, state: Path
) -> None:
    """Issue 21: corrupt data (or a shortfall) against one peer is measured again with another; the
    ring's wrong data shows whichever end it comes from (here the second peer's)."""
    state.write_text(json.dumps({NODES[2]: {"wrong": 4}}))
    check = {
        **validate(),
        "kind": "revalidate",
        "name": f"pitstop-{INC}-5-revalidate",
        "exclude_peers": [NODES[1]],
    }
    started = sched.start_check(BAD, check, StepRef(INC, 5))
    assert started == {"started": check["name"], "peer": NODES[2], "note": ""}
    got = result(sched, BAD, check)
    assert got["error"] is None and got["peer"] == NODES[2] and set(got["outputs"]) == {"nccl"}
    nccl = parse_all_gather(got["outputs"]["nccl"])
    assert nccl.ok and nccl.wrong > 0 and f"on {NODES[2]} " in got["outputs"]["nccl"]


def test_validate_without_a_healthy_peer_runs_dcgm_alone_and_says_why(
    kube: FakeKube, sched: GkeCluster
) -> None:
    for n in NODES[1:]:
        occupy(kube, n, f"hog-{n[-1]}")
    check = validate()
    started = sched.start_check(BAD, check, StepRef(INC, 5))
    assert started["peer"] is None and "no healthy Ready node of type a3-megagpu-8g" in started["note"]
    got = result(sched, BAD, check)
    assert got["peer"] is None and set(got["outputs"]) == {"nvidia_smi_q", "dcgm"} and got["error"] is None
    assert len(check_pods(kube, check["name"])) == 1


def test_the_kubelet_refuses_a_pinned_pod_the_node_has_no_gpus_for(kube: FakeKube, sched: GkeCluster) -> None:
    occupy(kube, BAD, "squatter")
    with pytest.raises(ActuatorError):
        sched.start_check(BAD, diagnose(), StepRef(INC, 3))  # the adapter waits instead of being refused
    pinned = {
        "kind": "Pod",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {
            "nodeName": BAD,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    kube.create(pinned)
    pod = wait(
        lambda: (p := kube.get("Pod", "pinned", "default")) and p["status"]["phase"] != "Pending" and p
    )
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert "requested: 1, used: 8, capacity: 8" in pod["status"]["message"]


def test_a_check_pod_the_kubelet_refused_is_done_with_its_reason(tmp_path: Path) -> None:
    kube = FakeKube(
        vm_status=None, auto=False, run_containers=True, container_env={"PATH": os.environ["PATH"]}
    )
    kube.start()
    try:
        kube.add_node(BAD, project=PROJECT, zone=ZONE)
        kube.create({"kind": "Namespace", "metadata": {"name": CHECK_NAMESPACE}})
        kube.write_kubeconfig(tmp_path / "kc")
        api = config.new_client_from_config(config_file=str(tmp_path / "kc"))  # type: ignore[no-untyped-call]
        sched = GkeCluster(api, checks=CheckSettings.from_conf({"checks": gke_stack.local_checks()}))
        check = diagnose()
        sched.start_check(BAD, check, StepRef(INC, 3))
        pinned = {
            "kind": "Pod",
            "metadata": {"name": "pinned", "namespace": "default"},
            "spec": {
                "nodeName": BAD,
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            },
        }
        kube.create(pinned)  # bound between the adapter's look and the kubelet's admission
        kube.settle()
        got = sched.check_result(BAD, check, StepRef(INC, 9))
        assert got["done"] is True and got["outputs"] == {}
        assert "Failed: OutOfnvidia.com/gpu Pod was rejected" in str(got["error"])
        job = kube.get("Job", check["name"], CHECK_NAMESPACE)
        assert job is not None and any(c["type"] == "Failed" for c in job["status"]["conditions"])
    finally:
        kube.stop()


# -- the fake's kubelet, logs and TTL ----------------------------------------------------------------


def shell_pod(name: str, script: str, *, node: str = NODES[1], init: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["/bin/sh", "-c", script]}],
    }
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "command": ["/bin/sh", "-c", init]}]
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def ended(kube: FakeKube, name: str) -> dict[str, Any]:
    got: dict[str, Any] = wait(
        lambda: (
            (p := kube.get("Pod", name, "default")) and p["status"]["phase"] in ("Succeeded", "Failed") and p
        )
    )
    return got


def test_the_kubelet_runs_the_command_and_serves_its_log_as_text(kube: FakeKube, api: Any) -> None:
    kube.create(shell_pod("p", 'echo "{\\"a\\": 1}"; echo "node=$PITSTOP_NODE" >&2; exit 3'))
    pod = ended(kube, "p")
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (3, "Error")
    with urllib.request.urlopen(f"{kube.url}/api/v1/namespaces/default/pods/p/log") as resp:
        assert resp.headers["Content-Type"] == "text/plain"
        assert resp.read() == f'{{"a": 1}}\nnode={NODES[1]}\n'.encode()
    # A log that is one JSON document (dcgmi's) comes back verbatim because it is text/plain; the
    # client would json.loads an application/json answer (kubernetes-client/python#811, #1354).
    kube.create(shell_pod("j", "echo '{\"a\": 1}'"))
    ended(kube, "j")
    core: Any = __import__("kubernetes").client.CoreV1Api(api)
    assert core.read_namespaced_pod_log("j", "default") == '{"a": 1}\n'
    assert core.read_namespaced_pod_log("j", "default", _preload_content=False).data == b'{"a": 1}\n'


def test_logs_need_a_container_name_when_a_pod_has_several(kube: FakeKube) -> None:
    pod = shell_pod("two", "echo main", init="echo init")
    pod["spec"]["containers"].append({"name": "side", "image": "busybox", "command": ["/bin/true"]})
    kube.create(pod)
    assert ended(kube, "two")["status"]["phase"] == "Succeeded"
    url = f"{kube.url}/api/v1/namespaces/default/pods/two/log"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url)
    body = json.loads(err.value.read())
    assert err.value.code == 400 and body["message"] == (
        "a container name must be specified for pod two, choose one of: [main side] or one of the init "
        "containers: [init]"
    )
    with urllib.request.urlopen(url + "?container=init") as resp:
        assert resp.read() == b"init\n"


def test_a_failed_init_container_fails_the_pod_and_the_main_one_never_runs(kube: FakeKube) -> None:
    kube.create(shell_pod("initfail", "echo never", init="exit 7"))
    pod = ended(kube, "initfail")
    assert pod["status"]["phase"] == "Failed" and not pod["status"].get("containerStatuses")
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 7


def test_a_deleted_pods_process_is_stopped(kube: FakeKube, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    kube.create(shell_pod("sleeper", f"echo $$ > {pidfile}; exec sleep 600"))
    wait(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the process to start")
    pid = int(pidfile.read_text())
    os.kill(pid, 0)  # it runs
    kube.delete("Pod", "sleeper", "default", gracePeriodSeconds=1)
    wait(lambda: kube.get("Pod", "sleeper", "default") is None, what="the pod to go")

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait(gone, timeout=10, what="the process to end")


def test_finished_check_jobs_go_after_their_ttl(kube: FakeKube, sched: GkeCluster) -> None:
    check = diagnose()
    sched.start_check(BAD, check, StepRef(INC, 3))
    result(sched, BAD, check)
    job = kube.get("Job", check["name"], CHECK_NAMESPACE)
    assert job is not None and job["spec"]["ttlSecondsAfterFinished"] == sched.settings.ttl_s
    kube.advance(sched.settings.ttl_s + 1)
    wait(lambda: kube.get("Job", check["name"], CHECK_NAMESPACE) is None, what="the TTL controller")
    wait(lambda: not check_pods(kube, check["name"]), what="its pod")
    with pytest.raises(ActuatorError) as err:
        sched.check_result(BAD, check, StepRef(INC, 9))
    assert err.value.status == 409 and "ttl" in err.value.message


# -- the script and its markers --------------------------------------------------------------------


def test_outputs_are_cut_at_the_markers_verbatim() -> None:
    script = check_script(
        "echo setup noise",
        [
            ("one", ["printf", "no newline at the end"]),
            ("two", ["sh", "-c", "printf 'a\\n==> not a marker\\n\\n'; echo oops >&2; exit 4"]),
            ("three", ["true"]),
        ],
    )
    log = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    out, err, codes = split_outputs(log)
    assert out == {"one": "no newline at the end", "two": "a\n==> not a marker\n\n", "three": ""}
    assert err == {"one": "", "two": "oops\n", "three": ""}
    assert codes == {"one": 0, "two": 4, "three": 0}


def test_check_settings_from_the_policy_and_their_defaults() -> None:
    default = CheckSettings()
    assert (default.namespace, default.image, default.nccl_image) == (CHECK_NAMESPACE, DCGM_IMAGE, NCCL_IMAGE)
    local = CheckSettings.from_conf({"location": ZONE, "checks": gke_stack.local_checks("/usr/bin/python3")})
    assert local.tools["dcgmi"] == ("/usr/bin/python3", "-m", "pitstop.local.gpu_tools.dcgmi")
    assert local.mpirun == () and local.image == DCGM_IMAGE
    assert CheckSettings.from_conf({"checks": {"tools": {"nvidia-smi": "/opt/nv/nvidia-smi --id=0"}}}).tools[
        "nvidia-smi"
    ] == ("/opt/nv/nvidia-smi", "--id=0")
    for bad in (
        {"namespace": "Not_A_Label"},
        {"tools": {"bash": ["x"]}},
        {"image": "a b"},
        {"deadline_s": 5},
    ):
        with pytest.raises(ValueError):
            CheckSettings.from_conf({"checks": bad})


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "repair"},
        {"name": "Has_Capitals"},
        {"name": "x" * 64},
        {"gpus": True},
        {"dcgm_level": 9},
        {"kind": "validate", "peer": True, "message_bytes": 0},
        {"kind": "revalidate", "peer": True, "message_bytes": 1, "exclude_peers": ["Not A Node"]},
    ],
)
def test_bad_check_requests_are_refused_before_any_call(
    kube: FakeKube, sched: GkeCluster, bad: dict[str, Any]
) -> None:
    before = len(kube.requests)
    with pytest.raises(ActuatorError) as err:
        sched.start_check(BAD, {**diagnose(), **bad}, StepRef(INC, 3))
    assert err.value.status == 400 and len(kube.requests) == before


# -- RBAC: what the adapter sends is what infra/gke grants ----------------------------------------------


def _rules(docs: list[dict[str, Any]], kind: str) -> list[tuple[str | None, dict[str, Any]]]:
    return [(d["metadata"].get("namespace"), r) for d in docs if d["kind"] == kind for r in d["rules"]]


def _request(method: str, path: str) -> tuple[str, str, str, str | None]:
    """(verb, API group, resource[/subresource], namespace) of one request, as RBAC names them."""
    url = path.split("?")[0]
    m = re.fullmatch(
        r"/(?:api/v1|apis/(?P<g>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?",
        url,
    )
    assert m is not None, url
    res = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(method)
    verb = verb or ("get" if m["name"] else "list")
    return verb, m["g"] or "", res, m["ns"]


def test_every_call_of_a_check_is_granted_by_the_shipped_rbac(kube: FakeKube, sched: GkeCluster) -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "infra/gke/clusterrole.yaml").read_text()) if d]
    actuator = [d for d in docs if d["kind"] != "ClusterRole" or d["metadata"]["name"] == "pitstop-actuator"]
    cluster, ns_rules = _rules(actuator, "ClusterRole"), _rules(docs, "Role")  # not ingest's reader
    kinds = {d["kind"]: d for d in docs}
    assert kinds["Namespace"]["metadata"]["name"] == CHECK_NAMESPACE
    assert (kinds["Service"]["metadata"]["name"], kinds["Service"]["spec"]["clusterIP"]) == (
        CHECK_SERVICE,
        "None",
    )
    assert kinds["RoleBinding"]["subjects"][0]["name"] == "${ACTUATOR_SA}"
    # cluster-wide, actuate creates only evictions and deletes only pods (a stuck pod's force
    # deletion, adapters/gke/restart.py): never Jobs or pods of its own outside its namespace
    assert not any("create" in r["verbs"] for _, r in cluster if r["resources"] != ["pods/eviction"])
    assert not any("delete" in r["verbs"] for _, r in cluster if r["resources"] != ["pods"])

    kube.create(jobset("train", 2))
    wait(lambda: running(kube, "train", 2), what="the JobSet to run")
    before = len(kube.requests)
    sched.capacity("jobset/default/train", NODES[1], StepRef(INC, 2))
    sched.start_check(BAD, validate(), StepRef(INC, 5))
    result(sched, BAD, validate())
    sent = {_request(m, p) for m, p, _ in kube.requests[before:]}
    assert ("create", "batch", "jobs", CHECK_NAMESPACE) in sent and (
        "get",
        "",
        "pods/log",
        CHECK_NAMESPACE,
    ) in sent

    def granted(verb: str, group: str, res: str, ns: str | None) -> bool:
        def ok(r: dict[str, Any]) -> bool:
            return group in r["apiGroups"] and res in r["resources"] and verb in r["verbs"]

        return any(ok(r) for _, r in cluster) or any(ok(r) and where == ns for where, r in ns_rules)

    assert [s for s in sorted(sent, key=str) if not granted(*s)] == []
    needed = {(v, g, r) for v, g, r, ns in sent if ns == CHECK_NAMESPACE}
    role = {(v, r["apiGroups"][0], res) for _, r in ns_rules for v in r["verbs"] for res in r["resources"]}
    assert role <= needed  # the Role grants nothing the checks do not use
