"""The GKE scheduler adapter against the fake Kubernetes API server, through the official client.

Every call goes over HTTP to local/fake_k8s.py (its JobSet, Job, Kueue, scheduler, kubelet and
disruption controllers are stepped by the tests), so what is asserted is what the client sent and
what the cluster then did: cordon and taint, evictions and PDB refusals, one JobSet restart for
two members, a Kueue Workload deactivated and reactivated, node health, doctor's findings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.adapters import gke
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import (
    FENCE_KEY,
    REQUEUED_FOR,
    WAS_UNSCHEDULABLE,
    GkeCluster,
    GkeScheduler,
    doctor_findings,
    parse_job_id,
)
from pitstop.adapters.gke.client import Kube
from pitstop.core.domain import Incident
from pitstop.core.scheduling import JobRun, StepRef
from pitstop.local.fake_k8s import FakeKube

PROJECT, ZONE = "train-prod", "us-central1-a"
INC, INC2 = "iaaaaaaaaa", "ibbbbbbbbb"
CTX, CTX2 = StepRef(INC, 1), StepRef(INC2, 1)
NODES = [f"gke-train-gpu-{i:04d}" for i in range(4)]
JOB = "jobset/default/train"
ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


class Clock:
    """The adapter's clock and sleep: a sleep moves the clock and runs the cluster's controllers."""

    def __init__(self, kube: FakeKube) -> None:
        self.t, self.kube, self.slept = 0.0, kube, 0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.slept += 1
        self.kube.advance(s)  # the cluster's grace periods run on the same seconds
        self.kube.step()


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    for n in NODES:
        k.add_node(n, project=PROJECT, zone=ZONE)
    yield k
    k.stop()


@pytest.fixture
def clock(kube: FakeKube) -> Clock:
    return Clock(kube)


@pytest.fixture
def sched(api: Any, clock: Clock) -> GkeCluster:
    return GkeCluster(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)


def settle(kube: FakeKube, done: Callable[[], bool], timeout: float = 60.0) -> None:
    """Step the controllers until ``done`` (grace periods run on the fake's scaled real clock)."""
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, f"the fake cluster did not get there: {snapshot(kube)}"
        kube.step()
        time.sleep(0.02)


def snapshot(kube: FakeKube) -> list[Any]:
    """What a failed wait shows: each pod and JobSet, briefly."""
    out: list[Any] = [
        (
            p["metadata"]["name"],
            p["spec"].get("nodeName"),
            p["status"].get("phase"),
            p["metadata"].get("deletionTimestamp"),
        )
        for p in kube.list("Pod")
    ]
    return (
        out + [js["status"] for js in kube.list("JobSet")] + [w.get("status") for w in kube.list("Workload")]
    )


def jobset(
    name: str = "train",
    replicas: int = 2,
    policy: str = "restart",
    queue: str | None = None,
    pod_policy_on: bool = True,
) -> dict[str, Any]:
    """A JobSet of ``replicas`` one-pod Jobs of 8 GPUs each.

    ``restart``: the upstream host-maintenance template (FailJob on DisruptionTarget, restart
    ignoring maxRestarts); ``none``: no failurePolicy; ``ignore``: Ignore on DisruptionTarget.
    """
    pod_policy = {"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    if policy == "ignore":
        pod_policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    container = {"name": "train", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
    spec: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": "workers",
                "replicas": replicas,
                "template": {
                    "spec": {
                        "parallelism": 1,
                        "completions": 1,
                        "backoffLimit": 0,
                        "podFailurePolicy": pod_policy,
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {
                                "restartPolicy": "Never",
                                "terminationGracePeriodSeconds": 30,
                                "containers": [container],
                            },
                        },
                    }
                },
            }
        ]
    }
    if not pod_policy_on:  # podReplacementPolicy TerminatingOrFailed: terminating pods are counted
        del spec["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
    if policy in ("restart", "ignore"):
        spec["failurePolicy"] = {
            "maxRestarts": 3,
            "rules": [
                {
                    "name": "infra",
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
        }
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": spec,
    }


def pods(kube: FakeKube, name: str = "train") -> list[dict[str, Any]]:
    return kube.list("Pod", "default", labels=f"jobset.sigs.k8s.io/jobset-name={name}")


def running(kube: FakeKube, name: str = "train", attempt: int = 0, n: int = 2) -> bool:
    live = [
        p
        for p in pods(kube, name)
        if p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["labels"].get(ATTEMPT) == str(attempt)
    ]
    return len(live) == n


def node_of(kube: FakeKube, index: int, name: str = "train") -> str:
    live = [p for p in pods(kube, name) if not p["metadata"].get("deletionTimestamp")]
    return str(sorted(p["spec"]["nodeName"] for p in live)[index])


def restarts(kube: FakeKube, name: str = "train") -> int:
    js = kube.get("JobSet", name, "default")
    assert js is not None
    return int(js["status"].get("restarts", 0))


def node(kube: FakeKube, name: str) -> dict[str, Any]:
    n = kube.get("Node", name)
    assert n is not None
    return n


def our_taints(n: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in n["spec"].get("taints") or [] if t["key"] == FENCE_KEY]


def started(kube: FakeKube, obj: dict[str, Any], attempt: int = 0, n: int = 2) -> None:
    kube.create(obj)
    settle(kube, lambda: running(kube, obj["metadata"]["name"], attempt, n))


# -- fence / unfence ---------------------------------------------------------------------------


def test_fence_taints_once_and_unfence_lifts_only_that(kube: FakeKube, sched: GkeCluster) -> None:
    n = NODES[0]
    answer = sched.fence(n, CTX, "REBOOT_NODE")
    assert answer == {
        "node": n,
        "previous_state": "schedulable",
        "previous_reason": None,
        "already_drained_by_other": False,
        "reason": f"{FENCE_KEY}={INC}:NoSchedule",
    }
    cur = node(kube, n)
    assert not cur["spec"].get("unschedulable")  # Pitstop never cordons: its taint is its fence
    assert our_taints(cur) == [{"key": FENCE_KEY, "value": INC, "effect": "NoSchedule"}]
    assert cur["metadata"]["annotations"][WAS_UNSCHEDULABLE] == "false"
    assert cur["metadata"]["labels"][FENCE_KEY] == INC
    patches = [r for r in kube.requests if r[0] == "PATCH"]
    assert patches == [("PATCH", f"/api/v1/nodes/{n}", "application/strategic-merge-patch+json")]

    assert sched.fence(n, CTX, "REBOOT_NODE") == answer  # a retry: same answer, nothing written
    assert len([r for r in kube.requests if r[0] == "PATCH"]) == 1
    assert len(our_taints(node(kube, n))) == 1

    other = sched.unfence(n, CTX2)  # another incident's unfence leaves this fence alone
    assert other is not None and other["resumed"] is False and INC in other["left_drained"]
    assert len(our_taints(node(kube, n))) == 1

    back = sched.unfence(n, CTX)
    assert back == {"node": n, "state": "schedulable", "resumed": True}
    cur = node(kube, n)
    assert not cur["spec"].get("unschedulable")
    assert our_taints(cur) == []
    assert FENCE_KEY not in (cur["metadata"].get("labels") or {})
    assert WAS_UNSCHEDULABLE not in (cur["metadata"].get("annotations") or {})


def test_someone_elses_cordon_and_taints_are_kept(kube: FakeKube, sched: GkeCluster) -> None:
    n = NODES[1]
    theirs = {"key": "aiinfra.diagrunner/bad-for-all", "value": "true", "effect": "NoSchedule"}
    sched.core.patch_node(n, {"spec": {"unschedulable": True, "taints": [theirs]}})
    answer = sched.fence(n, CTX, "REBOOT_NODE")
    assert answer is not None
    assert answer["already_drained_by_other"] is True
    assert answer["previous_state"] == "cordoned"
    assert "aiinfra.diagrunner/bad-for-all" in str(answer["previous_reason"])
    assert node(kube, n)["metadata"]["annotations"][WAS_UNSCHEDULABLE] == "true"
    assert len(our_taints(node(kube, n))) == 1

    back = sched.unfence(n, CTX)
    assert back is not None and back["resumed"] is False
    assert "cordoned before Pitstop's fence" in back["left_drained"]
    cur = node(kube, n)
    assert cur["spec"]["unschedulable"] is True  # their cordon stays
    assert our_taints(cur) == []  # ours is gone
    assert theirs in cur["spec"]["taints"]
    # a node cordoned by someone else with no Pitstop taint at all: left as it is
    again = sched.unfence(n, CTX)
    assert again is not None and again["resumed"] is False and "someone else" in again["left_drained"]


def _kubectl(kube: FakeKube, tmp_path: Path, *args: str) -> None:
    """The real kubectl against the fake API server, as a person would run it."""
    path = tmp_path / "kubectl-config"
    kube.write_kubeconfig(path)
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(path), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("how", ["kubectl cordon", "taint"])
def test_a_cordon_or_taint_someone_set_while_pitstops_fence_held_is_kept(
    kube: FakeKube, sched: GkeCluster, how: str, tmp_path: Path
) -> None:
    """Issue 35 (10): a person, an autoscaler or an upgrade cordons the node while Pitstop's fence
    holds it. kubectl cordon of a node already cordoned sends nothing (kubectl's cordon helper
    patches only a change), so when Pitstop's fence was a cordon the person's left no trace and
    was lifted at unfence. Pitstop's fence is its taint alone: the person's cordon is a change of
    theirs, and unfence leaves it."""
    n = NODES[2]
    answer = sched.fence(n, CTX, "REBOOT_NODE")
    assert answer is not None and answer["already_drained_by_other"] is False
    if how == "kubectl cordon":
        _kubectl(kube, tmp_path, "cordon", n)
    else:
        theirs = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1732000000", "effect": "NoSchedule"}
        sched.core.patch_node(n, {"spec": {"taints": [*node(kube, n)["spec"]["taints"], theirs]}})
    back = sched.unfence(n, CTX)
    assert back is not None and back["resumed"] is False
    assert (
        "cordoned" in back["left_drained"]
        if how == "kubectl cordon"
        else "new taints" in back["left_drained"]
    )
    after = node(kube, n)
    assert our_taints(after) == []
    if how == "kubectl cordon":
        assert after["spec"]["unschedulable"] is True  # theirs: kept
    sched.core.patch_node(n, {"spec": {"unschedulable": False, "taints": []}})


def test_another_incidents_fence_is_left_alone(kube: FakeKube, sched: GkeCluster) -> None:
    n = NODES[2]
    sched.fence(n, CTX, "REBOOT_NODE")
    answer = sched.fence(n, CTX2, "REPLACE_NODE")
    assert answer is not None
    assert answer["already_drained_by_other"] is True and answer["reason"] is None
    assert our_taints(node(kube, n)) == [{"key": FENCE_KEY, "value": INC, "effect": "NoSchedule"}]


def test_a_concurrent_node_change_is_kept_and_the_fence_retried(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """The taint list is replaced whole: a patch built on a stale read must be refused (409) and redone."""

    class Racing(Kube):
        raced = False

        def node(self, name: str) -> Mapping[str, object]:
            cur = super().node(name)
            if not self.raced:  # another writer changes the node between our read and our write
                self.raced = True
                taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
                kube.mutate("Node", name, lambda n: n["spec"].setdefault("taints", []).append(taint))
            return cur

    sched = GkeCluster(api, clock=clock, sleep=clock.sleep)
    sched.kube = Racing(api)
    gke.fence.fence(sched.kube, NODES[3], INC)
    keys = [t["key"] for t in node(kube, NODES[3])["spec"]["taints"]]
    assert sorted(keys) == ["node.kubernetes.io/unschedulable", FENCE_KEY]
    assert len([r for r in kube.requests if r[0] == "PATCH"]) == 2


def test_a_node_that_is_gone_has_nothing_to_fence(kube: FakeKube, sched: GkeCluster) -> None:
    """A preempted Spot VM's Node may be removed: the step goes on (verify waits for it to return)."""
    gone = "gke-train-gpu-0099"
    assert sched.fence(gone, CTX, "RESCHEDULE_JOB") == {
        "node": gone,
        "state": "absent",
        "previous_state": "absent",
        "resumed": False,
    }
    assert sched.jobs_on(gone, CTX) == []
    assert sched.node_healthy(gone, CTX) is False
    assert (sched.unfence(gone, CTX) or {})["state"] == "absent"
    assert [r for r in kube.requests if r[0] == "PATCH"] == []


# -- node health -------------------------------------------------------------------------------


def test_node_healthy_needs_ready_all_gpus_and_no_xid_condition(kube: FakeKube, sched: GkeCluster) -> None:
    n = NODES[0]
    assert sched.node_healthy(n, CTX) is True
    kube.set_node_condition(n, "XidCriticalError", "True", '{"79":true}', "boot-1")
    assert sched.node_healthy(n, CTX) is False
    kube.set_node_condition(n, "XidCriticalError", "False")
    assert sched.node_healthy(n, CTX) is True
    kube.set_gpu_allocatable(n, 7)
    assert sched.node_healthy(n, CTX) is False
    kube.set_gpu_allocatable(n, 8)
    kube.set_node_condition(n, "Ready", "False", "KubeletNotReady")
    assert sched.node_healthy(n, CTX) is False


def test_a_node_gke_is_maintaining_or_terminating_is_not_healthy(kube: FakeKube, sched: GkeCluster) -> None:
    """GKE labels a GPU node under host maintenance and taints one it will terminate (reference/gke.md
    §5, GKE's handle-disruption-gpu-tpu docs); the node may stay Ready through both."""
    n = NODES[0]
    label = "cloud.google.com/active-node-maintenance"
    kube.mutate("Node", n, lambda o: o["metadata"]["labels"].update({label: "ONGOING"}))
    assert sched.node_healthy(n, CTX) is False
    kube.mutate("Node", n, lambda o: o["metadata"]["labels"].pop(label))
    assert sched.node_healthy(n, CTX) is True
    taint = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    kube.mutate("Node", n, lambda o: o["spec"].setdefault("taints", []).append(taint))
    assert sched.node_healthy(n, CTX) is False
    assert gke.node_health(kube.get("Node", n) or {})[1].startswith("GKE is about to terminate the node")


# -- jobs --------------------------------------------------------------------------------------


def test_jobs_on_reports_the_jobset_and_its_run(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    n = node_of(kube, 0)
    jobs = sched.jobs_on(n, CTX)
    assert len(jobs) == 1
    job = jobs[0]
    js = kube.get("JobSet", "train", "default")
    assert js is not None
    assert (job["id"], job["state"], job["restarts"]) == (JOB, "RUNNING", 0)
    assert job["start_time"] == js["metadata"]["creationTimestamp"]
    assert job["workload"] is None and job["failure_policy"] is True
    assert len(job["pods_on_node"]) == 1
    assert sched.jobs_on(NODES[3], CTX) == []  # nothing runs there
    assert sched.job_info("jobset/default/gone", CTX)["state"] == "UNKNOWN"
    # hang remediation is its owner's choice (issue 35 (2)): the JobSet's own label, read fresh
    assert job["opted_in"] is False
    kube.mutate("JobSet", "train", lambda o: o["metadata"].setdefault("labels", {}).update(
        {"pitstop.dev/heartbeat": "true"}), "default")  # fmt: skip
    assert sched.job_info(JOB, CTX)["opted_in"] is True


def test_a_bare_pod_is_its_own_job(kube: FakeKube, sched: GkeCluster) -> None:
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "notebook", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": NODES[2]},
        }
    )
    settle(kube, lambda: (kube.get("Pod", "notebook", "default") or {})["status"].get("phase") == "Running")
    jobs = sched.jobs_on(NODES[2], CTX)
    assert [(j["id"], j["state"], j["restarts"]) for j in jobs] == [("pod/default/notebook", "RUNNING", None)]
    sched.fence(NODES[2], CTX, "REBOOT_NODE")
    out = sched.requeue_outcome("pod/default/notebook", CTX)
    assert out["evicted"] == ["default/notebook"]
    assert "no controller" in out["owner_action"]
    assert kube.get("Pod", "notebook", "default")["metadata"].get("deletionTimestamp")  # type: ignore[index]


def test_another_incidents_check_pod_on_the_node_is_not_one_of_its_jobs(
    kube: FakeKube, sched: GkeCluster
) -> None:
    """A check of Pitstop's own (its namespace, its label) with its peer on this node is not a job
    of the node's to fence or restart; the same label on a pod elsewhere is the pod's owner's."""
    from pitstop.adapters.gke import CHECK_LABEL, CHECK_NAMESPACE

    kube.create({"kind": "Namespace", "metadata": {"name": CHECK_NAMESPACE}})
    labels = {CHECK_LABEL: "pitstop-iabcdefgh2-1-validate"}
    for ns, name in ((CHECK_NAMESPACE, "pitstop-iabcdefgh2-1-validate-peer"), ("default", "mimic")):
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": NODES[2]},
            }
        )
    assert [j["id"] for j in sched.jobs_on(NODES[2], CTX)] == ["pod/default/mimic"]


@pytest.mark.parametrize(
    "job",
    ["jobset/default", "jobset/Default/x", "cronjob/default/x", "pod/default/a/../b", "pod/default/x;y", ""],
)
def test_invalid_job_ids_are_refused_before_any_call(job: str, sched: GkeCluster, kube: FakeKube) -> None:
    with pytest.raises(ActuatorError) as err:
        sched.job_info(job, CTX)
    assert err.value.status == 400
    assert kube.requests == []


# -- checkpoint and PDBs -----------------------------------------------------------------------


def test_checkpoint_evicts_only_the_pods_on_the_fenced_node_with_their_grace(
    kube: FakeKube, sched: GkeCluster
) -> None:
    started(kube, jobset())
    bad, good = node_of(kube, 0), node_of(kube, 1)
    sched.fence(bad, CTX, "DRAIN_NODE")
    sched.checkpoint(JOB, CTX)
    evictions = [r for r in kube.requests if r[0] == "POST" and r[1].endswith("/eviction")]
    assert len(evictions) == 1 and evictions[0][2] == "application/json"
    by_node = {p["spec"]["nodeName"]: p for p in pods(kube)}
    leaving = by_node[bad]
    assert leaving["metadata"]["deletionTimestamp"]
    assert leaving["metadata"]["deletionGracePeriodSeconds"] == 30  # the pod's own grace period
    assert any(c["type"] == "DisruptionTarget" for c in leaving["status"]["conditions"])
    assert not by_node[good]["metadata"].get("deletionTimestamp")
    assert sched.job_running(JOB, CTX) is True  # still terminating on the fenced node
    settle(kube, lambda: not sched.job_running(JOB, CTX))


def pdb(name: str, min_available: int, app: str = "train") -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }


def test_a_pdb_that_keeps_refusing_is_named_after_the_deadline(
    kube: FakeKube, sched: GkeCluster, clock: Clock
) -> None:
    started(kube, jobset())
    kube.create(pdb("train-all-up", 2))
    kube.settle()
    bad = node_of(kube, 0)
    sched.fence(bad, CTX, "DRAIN_NODE")
    with pytest.raises(ActuatorError) as err:
        sched.checkpoint(JOB, CTX)
    assert err.value.status == 409 and err.value.retryable is False
    assert "PodDisruptionBudget train-all-up" in err.value.message
    evictions = [r for r in kube.requests if r[1].endswith("/eviction")]
    assert len(evictions) >= 3  # retried with backoff before giving up
    assert 8 <= clock.t <= 12
    assert all(not p["metadata"].get("deletionTimestamp") for p in pods(kube))


def test_a_pdb_that_allows_it_later_lets_the_eviction_through(
    kube: FakeKube, sched: GkeCluster, clock: Clock
) -> None:
    started(kube, jobset())
    kube.create(pdb("train-budget", 2))
    kube.settle()
    bad = node_of(kube, 0)
    sched.fence(bad, CTX, "DRAIN_NODE")
    original = clock.sleep

    def relax(s: float) -> None:  # the owner lowers the budget while Pitstop waits
        kube.mutate(
            "PodDisruptionBudget", "train-budget", lambda p: p["spec"].update(minAvailable=1), "default"
        )
        original(s)

    sched.sleep = relax
    sched.checkpoint(JOB, CTX)
    assert [p["spec"]["nodeName"] for p in pods(kube) if p["metadata"].get("deletionTimestamp")] == [bad]


def test_two_budgets_on_one_pod_are_a_final_refusal(kube: FakeKube, sched: GkeCluster) -> None:
    """The Eviction API answers 500 when more than one PDB matches: no retry can fix that."""
    started(kube, jobset())
    kube.create(pdb("budget-a", 1))
    kube.create(pdb("budget-b", 1))
    kube.settle()
    sched.fence(node_of(kube, 0), CTX, "DRAIN_NODE")
    with pytest.raises(ActuatorError) as err:
        sched.checkpoint(JOB, CTX)
    assert err.value.status == 409 and err.value.retryable is False
    assert "more than one PodDisruptionBudget" in err.value.message
    assert len([r for r in kube.requests if r[1].endswith("/eviction")]) == 1


def test_a_pod_already_gone_counts_as_evicted(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    victim = pods(kube)[0]
    kube.delete("Pod", victim["metadata"]["name"], "default", gracePeriodSeconds=0)
    assert sched.evictor.evict(victim, deadline=5.0) in ("gone", "evicted")


# -- requeue: the gang restarts once ---------------------------------------------------------------


def test_two_members_failing_restart_the_jobset_exactly_once(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    a, b = node_of(kube, 0), node_of(kube, 1)
    sched.fence(a, CTX, "REBOOT_NODE")
    sched.fence(b, CTX2, "REBOOT_NODE")
    seen = sched.jobs_on(a, CTX)[0]["restarts"]
    assert seen == 0
    first = sched.requeue_outcome(JOB, CTX, seen)
    second = sched.requeue_outcome(JOB, CTX2, seen)  # before the controller saw the first
    assert first["outcome"] == second["outcome"] == "restart triggered"
    assert first["attempt"] == second["attempt"] == 0
    evicted = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(kube)}
    assert evicted[first["evicted"]] == a and evicted[second["evicted"]] == b  # each on its fenced node
    settle(kube, lambda: running(kube, attempt=1))
    kube.settle()
    assert restarts(kube) == 1
    # the new gang runs on the two healthy nodes, not on the fenced ones
    new = {p["spec"]["nodeName"] for p in pods(kube) if p["metadata"]["labels"][ATTEMPT] == "1"}
    assert new == set(NODES) - {a, b}
    # a member's requeue that comes after the restart is a no-op
    late = sched.requeue_outcome(JOB, CTX2, seen)
    assert late["outcome"] == "already restarted (restarts 0 -> 1)"
    kube.settle()
    assert restarts(kube) == 1


def test_a_restart_in_progress_is_not_restarted_again(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    a = node_of(kube, 0)
    sched.fence(a, CTX, "REBOOT_NODE")
    assert sched.requeue_outcome(JOB, CTX, 0)["outcome"] == "restart triggered"
    settle(kube, lambda: restarts(kube) == 1)
    js = kube.get("JobSet", "train", "default")
    assert js is not None and any(
        c["type"] == "RestartingJobSet" and c["status"] == "True" for c in js["status"]["conditions"]
    )
    before = len([r for r in kube.requests if r[1].endswith("/eviction")])
    out = sched.requeue_outcome(JOB, CTX2)  # no run given: the condition alone must stop it
    assert out["outcome"] == "already restarting (RestartingJobSet)"
    assert len([r for r in kube.requests if r[1].endswith("/eviction")]) == before


def test_the_typed_requeue_restarts_once_and_says_so(kube: FakeKube, api: Any, clock: Clock) -> None:
    started(kube, jobset())
    typed = GkeScheduler(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)
    out = typed.requeue(JOB, CTX, JobRun(0, None))
    assert out.restarted and out.how == "restart triggered" and out.owner_action is None
    settle(kube, lambda: restarts(kube) == 1)


# -- capacity: the gang's members out of service ------------------------------------------------


def test_capacity_lists_the_members_another_fence_or_notready_keeps_out(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """As on Slurm (a member drained by another incident or down), a gang member that another
    incident's fence holds, that is NotReady (its Ready condition not True:
    https://kubernetes.io/docs/reference/node/node-status/#condition) or that someone cordoned
    (spec.unschedulable) does not come back with the gang: capacity names it so the Placer does not
    pin a pod there. A healthy member and the incident's own fenced node are not listed."""
    started(kube, jobset(replicas=4), n=4)
    a, b, c, d = (node_of(kube, i) for i in range(4))
    typed = GkeScheduler(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)
    typed.fence(a, CTX, "REBOOT_NODE")
    typed.fence(b, CTX2, "REPLACE_NODE")  # another incident's fence
    kube.set_node_condition(c, "Ready", "False", "KubeletNotReady", "PLEG is not healthy")
    cap = typed.capacity(JOB, a, CTX)
    assert {s.node for s in cap.gang} == {a, b, c, d}
    assert cap.unusable == (b, c)
    typed.cluster.core.patch_node(d, {"spec": {"unschedulable": True}})  # a person's cordon
    assert typed.capacity(JOB, a, CTX).unusable == (b, c, d)


# -- requeue: Kueue ---------------------------------------------------------------------------


def workload(kube: FakeKube) -> dict[str, Any]:
    found = kube.list("Workload", "default")
    assert len(found) == 1
    return found[0]


def cond(obj: dict[str, Any], kind: str) -> tuple[str, str] | None:
    c = next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), None)
    return (c["status"], c["reason"]) if c else None


def test_kueue_workload_without_failure_policy_is_deactivated_then_reactivated(
    kube: FakeKube, sched: GkeCluster
) -> None:
    started(kube, jobset(policy="none", queue="team-a"))
    first = {p["metadata"]["name"] for p in pods(kube)}
    assert sched.job_info(JOB, CTX)["workload"] == workload(kube)["metadata"]["name"]
    out = sched.requeue_outcome(JOB, CTX)
    assert out["outcome"].startswith("workload deactivated and reactivated") and out["restarted"] is True
    wl_patches = [r for r in kube.requests if r[0] == "PATCH" and "/workloads/" in r[1]]
    assert [r[2] for r in wl_patches] == ["application/merge-patch+json"] * 2
    wl = workload(kube)
    assert wl["spec"]["active"] is True
    assert wl["metadata"]["annotations"][REQUEUED_FOR] == CTX.key
    assert cond(wl, "Evicted") == ("True", "Deactivated")
    settle(kube, lambda: running(kube) and not first & {p["metadata"]["name"] for p in pods(kube)})
    assert cond(workload(kube), "Requeued") == ("True", "Reactivated")
    # the same step asked again (a lost answer): nothing is done twice
    assert sched.requeue_outcome(JOB, CTX)["outcome"] == "workload already requeued for this step"
    assert len([r for r in kube.requests if r[0] == "PATCH" and "/workloads/" in r[1]]) == 2


def _stuck_setup(
    kube: FakeKube, api: Any, clock: Clock, pod_policy_on: bool = False, wait_s: float = 600
) -> tuple[GkeScheduler, str, str]:
    """A Kueue JobSet without a failure policy running on two nodes; the adapter waits up to 10 min
    for Kueue, and counts a pod stuck 60 s past its deletionTimestamp on the cluster's own clock."""
    started(kube, jobset(policy="none", queue="team-a", pod_policy_on=pod_policy_on))
    bad = node_of(kube, 0)
    (pod,) = [p["metadata"]["name"] for p in pods(kube) if p["spec"]["nodeName"] == bad]
    sched = GkeScheduler(
        api, wait_s=wait_s, clock=clock, sleep=clock.sleep, stuck_terminating_s=60, wall=kube.store.epoch
    )
    return sched, bad, pod


def _forced(kube: FakeKube, pod: str) -> list[str]:
    return [r[1] for r in kube.requests if r[0] == "DELETE" and f"/pods/{pod}" in r[1]]


def test_a_pod_stuck_terminating_on_an_unreachable_node_is_forced_and_the_workload_reactivated(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """Issue 21 (10): the kubelet of the faulted node stops answering; Kueue's eviction leaves its pod
    Terminating for good ("Kubernetes (versions 1.5 or newer) will not delete Pods just because a Node
    is unreachable", kubernetes.io/docs/tasks/run-application/force-delete-stateful-set-pod/). The
    deactivation used to wait for it until the incident failed, leaving the Workload inactive. Now a
    pod stuck past the policy's bound on a node that is not Ready is force-deleted (grace period 0,
    the documented force deletion) and the Workload reactivated."""
    sched, bad, pod = _stuck_setup(kube, api, clock)
    kube.kubelet_unreachable(bad)
    out = sched.cluster.requeue_outcome(JOB, CTX)
    assert out["outcome"].startswith("workload deactivated and reactivated"), out
    assert out["forced"] == [f"{pod}@{bad}"]
    assert [p for p in _forced(kube, pod) if "gracePeriodSeconds=0" in p]  # what the client sent
    assert kube.get("Pod", pod, "default") is None  # the Job controller let it go: the API server removed it
    assert workload(kube)["spec"]["active"] is True
    settle(kube, lambda: running(kube) and bad not in {p["spec"]["nodeName"] for p in pods(kube)})


def test_a_forced_pod_a_pod_failure_policy_keeps_is_named_while_the_step_waits(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """A Job with a podFailurePolicy replaces a pod only once it is terminal (podReplacementPolicy
    Failed, KEP-3939), so its tracking finalizer keeps a force-deleted pod: the step keeps asking
    (503) and says which pod it forced and still sees."""
    sched, bad, pod = _stuck_setup(kube, api, clock, pod_policy_on=True, wait_s=150)
    kube.kubelet_unreachable(bad)
    with pytest.raises(ActuatorError) as err:
        sched.cluster.requeue_outcome(JOB, CTX)
    assert err.value.status == 503 and err.value.retryable
    assert f"force-deleted, still there: {pod}@{bad}" in err.value.message
    assert kube.get("Pod", pod, "default") is not None and workload(kube)["spec"]["active"] is False


def test_a_pod_stuck_on_a_ready_node_is_not_forced_the_step_fails_and_the_close_reactivates(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """Issue 21 (10): a process the kubelet cannot kill (uninterruptible sleep after an Xid 79) keeps
    the pod Terminating on a node that is still Ready. Forcing it would leave the process running
    beside a new pod, so the step fails at once, naming the pod and the Workload (not a silent wait
    until the watchdog), and a person's close reactivates the Workload Pitstop deactivated."""
    from pitstop.services.close import release_jobs

    sched, bad, pod = _stuck_setup(kube, api, clock)
    kube.processes_hung(bad)
    with pytest.raises(ActuatorError) as err:
        sched.cluster.requeue_outcome(JOB, CTX)
    name = workload(kube)["metadata"]["name"]
    assert err.value.status == 409 and not err.value.retryable
    assert f"{pod} on {bad} stuck Terminating" in err.value.message and name in err.value.message
    assert clock.t < 600 and _forced(kube, pod) == []  # failed at the bound, not at the deadline
    assert workload(kube)["spec"]["active"] is False
    inc = cast(Incident, {"id": INC, "jobs": [{"id": JOB}]})  # what release_jobs reads
    assert release_jobs(inc, sched) == [f"{JOB}: Kueue Workload {name} reactivated"]
    assert workload(kube)["spec"]["active"] is True
    assert (
        release_jobs(cast(Incident, {"id": INC2, "jobs": [{"id": JOB}]}), sched) == []
    )  # not another incident's


def test_a_workload_someone_else_deactivated_stays_inactive(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset(policy="none", queue="team-a"))
    name = workload(kube)["metadata"]["name"]
    sched.custom.patch_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "default", "workloads", name, {"spec": {"active": False}}
    )
    out = sched.requeue_outcome(JOB, CTX)
    assert "someone else" in out["outcome"] and out["owner_action"] and "restarted" not in out
    assert workload(kube)["spec"]["active"] is False


def test_a_jobset_without_any_restart_path_is_evicted_and_its_owner_told(
    kube: FakeKube, sched: GkeCluster
) -> None:
    started(kube, jobset(policy="none"))
    bad = node_of(kube, 0)
    sched.fence(bad, CTX, "REBOOT_NODE")
    out = sched.requeue_outcome(JOB, CTX)
    assert len(out["evicted"]) == 1
    assert "no failurePolicy" in out["owner_action"] and JOB in out["owner_action"]


# -- doctor -----------------------------------------------------------------------------------


def test_doctor_flags_jobsets_that_cannot_restart(kube: FakeKube, api: Any) -> None:
    capped = jobset("capped")
    capped["spec"]["failurePolicy"] = {"maxRestarts": 0}
    for js in (jobset("good"), jobset("nopolicy", policy="none"), jobset("ignores", policy="ignore"), capped):
        js["spec"]["suspend"] = True  # templates only: nothing needs to run
        kube.create(js)
    findings = doctor_findings(api)
    assert sorted(f.split(":")[0] for f in findings) == [
        "jobset/default/capped",
        "jobset/default/ignores",
        "jobset/default/nopolicy",
    ]
    text = "\n".join(findings)
    assert "Ignore on DisruptionTarget" in text
    assert "no failurePolicy" in text
    assert "maxRestarts is 0" in text


def test_pitstop_doctor_reads_the_cluster_from_a_kubeconfig(kube: FakeKube, tmp_path: Path) -> None:
    """The operator's command: kubeconfig in, one line per JobSet that cannot restart, exit 1."""
    config = tmp_path / "kubeconfig"
    kube.write_kubeconfig(config)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "functions")}
    argv = [sys.executable, "-m", "pitstop.tools.cli", "doctor", "--kubeconfig", str(config)]
    clean = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert clean.returncode == 0, clean.stderr
    bad = jobset("nopolicy", policy="none")
    bad["spec"]["suspend"] = True
    kube.create(bad)
    found = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert found.returncode == 1, found.stderr
    assert found.stdout.startswith("jobset/default/nopolicy: ") and "no failurePolicy" in found.stdout


# -- access to a real control plane (no network: the REST call is stubbed) -------------------------


def test_control_plane_prefers_the_dns_endpoint() -> None:
    dns = {"dnsEndpointConfig": {"endpoint": "gke-0123abcd-train.us-central1.gke.goog"}}
    cluster = {"endpoint": "34.1.2.3", "masterAuth": {"clusterCaCertificate": "Q0E="}}
    assert gke.control_plane({**cluster, "controlPlaneEndpointsConfig": dns}) == (
        "https://gke-0123abcd-train.us-central1.gke.goog",
        None,
    )
    assert gke.control_plane(cluster) == ("https://34.1.2.3", b"CA")
    with pytest.raises(ActuatorError):
        gke.control_plane({"endpoint": "34.1.2.3"})
    with pytest.raises(ActuatorError):
        gke.control_plane({"endpoint": "evil.example/path", "masterAuth": {"clusterCaCertificate": "Q0E="}})


def test_gke_api_client_carries_a_fresh_google_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth.transport.requests as gtr

    seen: list[str] = []

    class Resp:
        status_code = 200
        text = ""

        def json(self) -> dict[str, Any]:
            return {"endpoint": "34.1.2.3", "masterAuth": {"clusterCaCertificate": "Q0E="}}

    class Session:
        def __init__(self, creds: Any) -> None:
            pass

        def get(self, url: str, timeout: float) -> Resp:
            seen.append(url)
            return Resp()

    class Creds:
        valid, token, refreshed = False, None, 0

        def refresh(self, request: Any) -> None:
            self.refreshed += 1
            self.token, self.valid = f"tok-{self.refreshed}", True

    monkeypatch.setattr(gtr, "AuthorizedSession", Session)
    creds = Creds()
    api = gke.gke_api_client(PROJECT, "us-central1", "train", creds)
    assert seen == [
        f"https://container.googleapis.com/v1/projects/{PROJECT}/locations/us-central1/clusters/train"
    ]
    cfg = api.configuration
    assert cfg.host == "https://34.1.2.3"
    assert Path(cfg.ssl_ca_cert).read_bytes() == b"CA"
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer tok-1"
    creds.valid = False  # expired: the next request refreshes it
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer tok-2"
    with pytest.raises(ActuatorError):
        gke.gke_api_client(PROJECT, "us-central1", "train/../x", creds)


def test_parse_job_id_round_trips() -> None:
    ref = parse_job_id(JOB)
    assert (ref.kind, ref.namespace, ref.name, ref.id) == ("jobset", "default", "train", JOB)


def test_a_scheduler_connects_lazily(kube: FakeKube, api: Any) -> None:
    calls: list[int] = []

    def connect() -> Any:
        calls.append(1)
        return api

    sched = GkeScheduler(connect=connect)
    assert calls == []
    assert sched.node_healthy(NODES[0], CTX) is True
    assert sched.node_healthy(NODES[0], CTX) is True
    assert calls == [1]
    with pytest.raises(ValueError):
        GkeScheduler()


def test_a_member_seen_after_the_gang_restarted_belongs_to_the_old_run(
    kube: FakeKube, sched: GkeCluster
) -> None:
    """The JobSet controller counts the restart before the old Jobs' pods are gone
    (jobset_controller.go: ``status.restarts`` is bumped, then the previous attempt's Jobs are
    deleted in the foreground, and their pods run out their grace period). A second member's
    incident that looks at its node in that window sees the old pod: the fault hit the old
    run, and the gang must not be restarted again for it (seen under load in the GKE e2e)."""
    started(kube, jobset())
    a, b = node_of(kube, 0), node_of(kube, 1)
    sched.fence(a, CTX, "REBOOT_NODE")
    assert sched.requeue_outcome(JOB, CTX, 0)["outcome"] == "restart triggered"
    kube.mutate("JobSet", "train", lambda o: o["status"].update(restarts=1), "default")
    sched.fence(b, CTX2, "REBOOT_NODE")
    (job,) = sched.jobs_on(b, CTX2)
    assert job["restarts"] == 0  # the attempt of the pod on b, not status.restarts
    before = len([r for r in kube.requests if r[1].endswith("/eviction")])
    assert (
        sched.requeue_outcome(JOB, CTX2, job["restarts"])["outcome"] == "already restarted (restarts 0 -> 1)"
    )
    assert len([r for r in kube.requests if r[1].endswith("/eviction")]) == before
