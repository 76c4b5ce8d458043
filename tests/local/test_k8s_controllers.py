"""The fake cluster's controllers: each semantic with its source (reference/gke.md).

Deterministic: ``auto=False`` and a frozen clock; ``cycle`` advances the clock past a grace
period and steps until nothing changes, as often as a scenario needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from pitstop.local.fake_k8s import FakeKube
from pitstop.local.k8s_controllers import workload_name


def got(kube: FakeKube, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """An object that must exist."""
    obj = kube.get(kind, name, namespace)
    assert obj is not None, f"{kind} {name} is gone"
    return obj


new_client: Any = config.new_client_from_config  # the client is typed loosely: use it as Any
k8s: Any = client


NS = "default"
JSN = "jobset.sigs.k8s.io/"
GPU_LIMITS = {"limits": {"nvidia.com/gpu": "8"}}
DISRUPTION_FAIL = {"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
# kubernetes-sigs/jobset@v0.12.0 site/static/examples/failure-policy/host-maintenance-event-model.yaml
HOST_MAINTENANCE = {
    "maxRestarts": 0,
    "rules": [
        {
            "name": "infra",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }
    ],
}


def pod_template(restart: str = "Never", tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "containers": [{"name": "w", "image": "trainer:1", "resources": GPU_LIMITS}],
    }
    if tolerations:
        spec["tolerations"] = tolerations
    return {"spec": spec}


def make_jobset(
    name: str = "train",
    *,
    replicas: int = 2,
    pods: int = 2,
    failure_policy: dict[str, Any] | None = None,
    pod_failure_policy: dict[str, Any] | None = DISRUPTION_FAIL,
    labels: dict[str, str] | None = None,
    extra_rjobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "parallelism": pods,
        "completions": pods,
        "template": pod_template(),
    }
    if pod_failure_policy is not None:
        job_spec["podFailurePolicy"] = pod_failure_policy
    spec: dict[str, Any] = {
        "replicatedJobs": [
            {"name": "workers", "replicas": replicas, "template": {"spec": job_spec}},
            *(extra_rjobs or []),
        ]
    }
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": spec,
    }


def make_job(
    name: str, *, pods: int = 1, policy: dict[str, Any] | None = None, backoff: int = 6
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": pods,
        "completions": pods,
        "backoffLimit": backoff,
        "template": pod_template(),
    }
    if policy is not None:
        spec["podFailurePolicy"] = policy
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


class VMs:
    """A stand-in for the fake Compute VMs: node name -> status."""

    def __init__(self) -> None:
        self.status: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        return self.status.get(name, "RUNNING")


@pytest.fixture
def vms() -> VMs:
    return VMs()


@pytest.fixture
def kube(vms: VMs, tmp_path: Path) -> Iterator[FakeKube]:
    k = FakeKube(vm_status=vms, auto=False, time_scale=0)
    k.start()
    for i in range(6):
        k.add_node(f"gke-n{i}", project="proj", zone="us-central1-a")
    k.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def v1(kube: FakeKube, tmp_path: Path) -> Any:
    return k8s.CoreV1Api(new_client(config_file=str(tmp_path / "kubeconfig")))


def cycle(kube: FakeKube, rounds: int = 1, seconds: float = 30) -> None:
    kube.settle()
    for _ in range(rounds):
        kube.advance(seconds)
        kube.settle()


def pods(kube: FakeKube, **labels: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in labels.items()) or None
    return kube.list("Pod", NS, labels=selector)


def live_pods(kube: FakeKube) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(kube)
        if not p["metadata"].get("deletionTimestamp") and p["status"]["phase"] in ("Pending", "Running")
    ]


def cond(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    assert obj is not None
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == kind), None)


def cstatus(obj: dict[str, Any] | None, kind: str) -> str | None:
    c = cond(obj, kind)
    return None if c is None else str(c["status"])


def evict(v1: Any, pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    v1.create_namespaced_pod_eviction(name, NS, {"metadata": {"name": name}})


# --- JobSet -------------------------------------------------------------------------------------------
def test_jobset_creates_labelled_jobs_and_pods(kube: FakeKube) -> None:
    """jobset@v0.12.0 jobset_controller.go constructJob / labelAndAnnotateObject, placement.GenJobName."""
    js = kube.create(make_jobset(failure_policy=HOST_MAINTENANCE))
    kube.settle()
    jobs = {j["metadata"]["name"]: j for j in kube.list("Job", NS)}
    assert sorted(jobs) == ["train-workers-0", "train-workers-1"]
    labels = jobs["train-workers-1"]["metadata"]["labels"]
    assert {
        k: labels[JSN + k]
        for k in ("jobset-name", "replicatedjob-name", "job-index", "job-global-index", "restart-attempt")
    } == {
        "jobset-name": "train",
        "replicatedjob-name": "workers",
        "job-index": "1",
        "job-global-index": "1",
        "restart-attempt": "0",
    }
    assert jobs["train-workers-1"]["metadata"]["annotations"][JSN + "restart-attempt"] == "0"
    assert jobs["train-workers-1"]["metadata"]["ownerReferences"][0]["uid"] == js["metadata"]["uid"]
    all_pods = pods(kube, **{JSN + "jobset-name": "train", JSN + "restart-attempt": "0"})
    assert len(all_pods) == 4 and all(p["status"]["phase"] == "Running" for p in all_pods)
    assert len({p["spec"]["nodeName"] for p in all_pods}) == 4  # 8 GPUs each: one pod per node
    indexes = sorted(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in all_pods
    )
    assert indexes == ["0", "0", "1", "1"]  # Indexed completion mode, defaulted by the JobSet webhook


def test_jobset_restarts_exactly_once_for_evictions_of_one_attempt(kube: FakeKube, v1: Any) -> None:
    """gke.md §3 "Clean way ... to force exactly one gang restart": jobset@v0.12.0 failure_policy.go
    (RestartJobSetAndIgnoreMaxRestarts bumps restarts only) and getChildJobs (attempt < restarts is
    "previous", only deleted). Evicting a second attempt-R pod afterwards must not restart again."""
    kube.create(make_jobset(failure_policy=HOST_MAINTENANCE))
    kube.settle()
    first, second = sorted(pods(kube), key=lambda p: p["metadata"]["labels"][JSN + "job-index"])[::2][:2]
    bad = first["spec"]["nodeName"]
    v1.patch_node(bad, {"spec": {"unschedulable": True}})
    evict(v1, first)
    cycle(kube, rounds=2)
    js = got(kube, "JobSet", "train", NS)
    assert js is not None
    assert (js["status"]["restarts"], js["status"]["restartsCountTowardsMax"]) == (1, 0)
    restarting = cond(js, "RestartingJobSet")
    assert restarting is not None and (restarting["status"], restarting["reason"]) == (
        "True",
        "FailurePolicy_infra",
    )
    evict(v1, second)  # a member of the old attempt, still terminating: bypasses any PDB, must not count
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and js["status"]["restarts"] == 1
    new = live_pods(kube)
    assert len(new) == 4 and {p["metadata"]["labels"][JSN + "restart-attempt"] for p in new} == {"1"}
    assert all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] != bad for p in new)
    done = cond(js, "RestartingJobSet")
    assert done is not None and (done["status"], done["reason"]) == ("False", "JobsReady")
    jobs = kube.list("Job", NS)
    assert {j["metadata"]["labels"][JSN + "restart-attempt"] for j in jobs} == {"1"}


def test_two_members_failing_together_restart_once(kube: FakeKube, v1: Any) -> None:
    """Two failed current-attempt Jobs in one reconcile: one failure-policy run, one bump
    (jobset@v0.12.0 failure_policy.go)."""
    kube.create(make_jobset(failure_policy=HOST_MAINTENANCE))
    kube.settle()
    members = {p["metadata"]["labels"][JSN + "job-index"]: p for p in pods(kube)}
    evict(v1, members["0"])
    evict(v1, members["1"])
    cycle(kube, rounds=4)
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and js["status"]["restarts"] == 1
    assert {p["metadata"]["labels"][JSN + "restart-attempt"] for p in live_pods(kube)} == {"1"}


def test_no_failure_policy_fails_the_jobset(kube: FakeKube, v1: Any) -> None:
    """jobset@v0.12.0 failure_policy.go executeFailurePolicy: nil failurePolicy → Failed, reason
    FailedJobs; the active Jobs are deleted."""
    kube.create(make_jobset())
    kube.settle()
    evict(v1, pods(kube)[0])
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    failed = cond(js, "Failed")
    assert failed is not None and failed["reason"] == "FailedJobs"
    assert failed["message"].startswith(
        "jobset failed due to one or more job failures (first failed job: train-workers-"
    )
    assert js is not None and js["status"]["restarts"] == 0 and js["status"]["terminalState"] == "Failed"
    assert live_pods(kube) == []


def test_restart_jobset_counts_toward_max_restarts(kube: FakeKube, v1: Any) -> None:
    """backoffLimit 0 without a pod failure policy → BackoffLimitExceeded → no rule matches → RestartJobSet,
    which counts toward maxRestarts and fails the JobSet with ReachedMaxRestarts once they are used up."""
    policy = {
        "maxRestarts": 1,
        "rules": [
            {
                "name": "infra",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    kube.create(make_jobset(failure_policy=policy, pod_failure_policy=None))
    kube.settle()
    evict(v1, pods(kube)[0])
    cycle(kube, rounds=2)  # the pod ends, then its Job fails once the other pod has ended too
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and (js["status"]["restarts"], js["status"]["restartsCountTowardsMax"]) == (1, 1)
    restarting = cond(js, "RestartingJobSet")
    assert restarting is not None and (restarting["status"], restarting["reason"]) == (
        "True",
        "DefaultFailurePolicy",
    )
    cycle(kube)
    evict(v1, live_pods(kube)[0])
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    failed = cond(js, "Failed")
    assert failed is not None and failed["reason"] == "ReachedMaxRestarts"
    assert js is not None and js["status"]["restarts"] == 1


def test_failure_rules_first_match_with_target_replicated_jobs(kube: FakeKube, v1: Any) -> None:
    """Rules are evaluated in order; targetReplicatedJobs narrows a rule
    (jobset@v0.12.0 failure_policy.go ruleIsApplicable)."""
    leader = {
        "name": "leader",
        "replicas": 1,
        "template": {
            "spec": {"backoffLimit": 0, "podFailurePolicy": DISRUPTION_FAIL, "template": pod_template()}
        },
    }
    policy = {
        "maxRestarts": 5,
        "rules": [
            {"name": "leader-dies", "action": "FailJobSet", "targetReplicatedJobs": ["leader"]},
            {
                "name": "infra",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
            },
        ],
    }
    kube.create(make_jobset(replicas=1, pods=1, failure_policy=policy, extra_rjobs=[leader]))
    kube.settle()
    by_rjob = {p["metadata"]["labels"][JSN + "replicatedjob-name"]: p for p in pods(kube)}
    evict(v1, by_rjob["workers"])
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and js["status"]["restarts"] == 1 and cond(js, "Failed") is None
    leader_pod = next(
        p for p in live_pods(kube) if p["metadata"]["labels"][JSN + "replicatedjob-name"] == "leader"
    )
    evict(v1, leader_pod)
    cycle(kube, rounds=3)
    failed = cond(got(kube, "JobSet", "train", NS), "Failed")
    assert failed is not None and failed["reason"] == "FailJobSetFailurePolicyAction"


def test_suspend_and_resume_do_not_restart(kube: FakeKube) -> None:
    """jobset@v0.12.0 jobset_controller.go suspendJobs / resumeJobsIfNecessary: condition Suspended
    (SuspendedJobs / ResumeJobs); restarts unchanged."""
    kube.create(make_jobset(failure_policy=HOST_MAINTENANCE))
    kube.settle()
    kube.mutate("JobSet", "train", lambda js: js["spec"].update(suspend=True), NS)
    cycle(kube, rounds=2)
    js = got(kube, "JobSet", "train", NS)
    suspended = cond(js, "Suspended")
    assert suspended is not None and (suspended["status"], suspended["reason"]) == ("True", "SuspendedJobs")
    assert pods(kube) == [] and all(j["spec"]["suspend"] for j in kube.list("Job", NS))
    kube.mutate("JobSet", "train", lambda js: js["spec"].update(suspend=False), NS)
    cycle(kube)
    js = got(kube, "JobSet", "train", NS)
    resumed = cond(js, "Suspended")
    assert resumed is not None and (resumed["status"], resumed["reason"]) == ("False", "ResumeJobs")
    assert js is not None and js["status"]["restarts"] == 0
    assert len([p for p in pods(kube) if p["status"]["phase"] == "Running"]) == 4


def test_jobset_completes_when_all_jobs_complete(kube: FakeKube) -> None:
    """executeSuccessPolicy (operator All): Completed / AllJobsCompleted; Jobs reach Complete first."""
    kube.create(make_jobset(replicas=1, pods=2))
    kube.settle()
    for p in pods(kube):
        kube.finish_pod(p["metadata"]["name"], NS, exit_code=0)
    kube.settle()
    assert cond(kube.get("Job", "train-workers-0", NS), "Complete") is not None
    completed = cond(got(kube, "JobSet", "train", NS), "Completed")
    assert completed is not None and completed["reason"] == "AllJobsCompleted"


def test_deleting_a_jobset_collects_its_jobs_and_pods(kube: FakeKube) -> None:
    kube.create(make_jobset())
    kube.settle()
    kube.delete("JobSet", "train", NS)
    cycle(kube, rounds=2)
    assert kube.list("Job", NS) == [] and pods(kube) == []


# --- Job controller ------------------------------------------------------------------------------------
def test_pod_failure_policy_fail_job_waits_for_pods_to_end(kube: FakeKube, v1: Any) -> None:
    """podFailurePolicy FailJob on DisruptionTarget (gke.md §2): FailureTarget at once, Failed (reason
    PodFailurePolicy) only when the other pods have terminated, as Kubernetes >= 1.31 does."""
    kube.create(make_job("j", pods=2, policy=DISRUPTION_FAIL, backoff=6))
    kube.settle()
    victim = pods(kube)[0]
    evict(v1, victim)
    cycle(kube)
    job = got(kube, "Job", "j", NS)
    target = cond(job, "FailureTarget")
    assert target is not None and target["reason"] == "PodFailurePolicy"
    pod_name = f"{NS}/{victim['metadata']['name']}"
    assert (
        target["message"] == f"Pod {pod_name} has condition DisruptionTarget matching FailJob rule at index 0"
    )
    assert cond(job, "Failed") is None and any(p["metadata"].get("deletionTimestamp") for p in pods(kube))
    cycle(kube)
    failed = cond(got(kube, "Job", "j", NS), "Failed")
    assert failed is not None and failed["reason"] == "PodFailurePolicy"
    assert pods(kube) == []  # the job-tracking finalizers were released


def test_pod_failure_policy_ignore_replaces_the_pod(kube: FakeKube, v1: Any) -> None:
    """Ignore on DisruptionTarget: the pod is replaced and not counted (gke.md §2: no gang restart)."""
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    kube.create(make_job("j", pods=2, policy=policy, backoff=0))
    kube.settle()
    old = pods(kube)[0]
    evict(v1, old)
    cycle(kube)
    job = got(kube, "Job", "j", NS)
    assert job is not None and job["status"]["failed"] == 0 and cond(job, "Failed") is None
    names = {p["metadata"]["name"] for p in live_pods(kube)}
    assert len(names) == 2 and old["metadata"]["name"] not in names


def test_count_and_backoff_limit(kube: FakeKube, v1: Any) -> None:
    """Count counts the failure; failed > backoffLimit → Failed, reason BackoffLimitExceeded."""
    policy = {"rules": [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    kube.create(make_job("j", pods=1, policy=policy, backoff=1))
    kube.settle()
    evict(v1, pods(kube)[0])
    cycle(kube)
    job = got(kube, "Job", "j", NS)
    assert job is not None and job["status"]["failed"] == 1 and cond(job, "Failed") is None
    evict(v1, live_pods(kube)[0])
    cycle(kube, rounds=2)
    failed = cond(got(kube, "Job", "j", NS), "Failed")
    assert failed is not None and failed["reason"] == "BackoffLimitExceeded"


def test_exit_code_rule(kube: FakeKube) -> None:
    policy = {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "w", "operator": "In", "values": [42]}}
        ]
    }
    kube.create(make_job("j", pods=1, policy=policy))
    kube.settle()
    kube.finish_pod(pods(kube)[0]["metadata"]["name"], NS, exit_code=42)
    cycle(kube)
    failed = cond(got(kube, "Job", "j", NS), "Failed")
    assert (
        failed is not None and failed["reason"] == "PodFailurePolicy" and "exit code 42" in failed["message"]
    )


def test_job_suspend_deletes_pods_without_counting_them(kube: FakeKube) -> None:
    kube.create(make_job("j", pods=2, backoff=0))
    kube.settle()
    kube.mutate("Job", "j", lambda j: j["spec"].update(suspend=True), NS)
    cycle(kube, rounds=2)
    job = got(kube, "Job", "j", NS)
    assert (
        job is not None
        and pods(kube) == []
        and job["status"]["failed"] == 0
        and cond(job, "Suspended") is not None
    )
    kube.mutate("Job", "j", lambda j: j["spec"].update(suspend=False), NS)
    kube.settle()
    assert len([p for p in pods(kube) if p["status"]["phase"] == "Running"]) == 2


def test_job_validation(kube: FakeKube) -> None:
    bad = make_job("j", policy=DISRUPTION_FAIL)
    bad["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(Exception, match="supported values"):
        kube.create(bad)


# --- gang scheduler -----------------------------------------------------------------------------------
def test_gang_is_placed_all_or_nothing(kube: FakeKube) -> None:
    kube.create(make_jobset(replicas=4, pods=2))  # 8 pods of 8 GPUs, 6 nodes
    kube.settle()
    assert len(pods(kube)) == 8 and all(not p["spec"].get("nodeName") for p in pods(kube))
    scheduled = cond(pods(kube)[0], "PodScheduled")
    assert scheduled is not None and scheduled["reason"] == "Unschedulable"
    kube.add_node("gke-n6", project="proj", zone="us-central1-a")
    kube.add_node("gke-n7", project="proj", zone="us-central1-a")
    kube.settle()
    assert len({p["spec"].get("nodeName") for p in pods(kube)}) == 8


def test_scheduler_avoids_cordoned_tainted_not_ready_and_full_nodes(kube: FakeKube) -> None:
    kube.mutate("Node", "gke-n0", lambda n: n["spec"].update(unschedulable=True))
    kube.mutate(
        "Node",
        "gke-n1",
        lambda n: n["spec"].update(
            taints=[{"key": "pitstop.dev/remediation", "value": "i", "effect": "NoSchedule"}]
        ),
    )
    kube.set_node_condition("gke-n2", "Ready", "False", "KubeletNotReady")
    kube.set_gpu_allocatable("gke-n3", 7)
    kube.create(make_jobset(replicas=1, pods=2))
    kube.settle()
    assert sorted(p["spec"]["nodeName"] for p in pods(kube)) == ["gke-n4", "gke-n5"]


def test_scheduler_honours_tolerations_and_node_selector(kube: FakeKube) -> None:
    for name in ("gke-n0", "gke-n1", "gke-n2", "gke-n3"):
        kube.mutate(
            "Node",
            name,
            lambda n: n["spec"].update(
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            ),
        )
    kube.mutate("Node", "gke-n5", lambda n: n["metadata"]["labels"].update(pool="b"))
    job = make_job("j", pods=1)
    job["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gke-n2"}
    kube.create(job)
    other = make_job("k", pods=1)
    other["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "b"}
    kube.create(other)
    kube.settle()
    placed = {p["metadata"]["labels"]["job-name"]: p["spec"]["nodeName"] for p in pods(kube)}
    assert placed == {"j": "gke-n2", "k": "gke-n5"}


# --- kubelet --------------------------------------------------------------------------------------------
def test_vm_down_makes_node_not_ready_and_fails_its_pods(kube: FakeKube, vms: VMs) -> None:
    """gke.md §2 pod disruption conditions: TerminationByKubelet (graceful node shutdown)."""
    kube.create(make_jobset(replicas=1, pods=2, failure_policy=HOST_MAINTENANCE))
    kube.settle()
    node = pods(kube)[0]["spec"]["nodeName"]
    boot = got(kube, "Node", node)["status"]["nodeInfo"]["bootID"]
    vms.status[node] = "TERMINATED"
    kube.step()
    ready = cond(got(kube, "Node", node), "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    victim = next(p for p in kube.list("Pod", NS) if p["spec"].get("nodeName") == node)
    target = cond(victim, "DisruptionTarget")
    assert (
        victim["status"]["phase"] == "Failed"
        and target is not None
        and target["reason"] == "TerminationByKubelet"
    )
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and js["status"]["restarts"] == 1  # the JobSet restarts off the dead node
    assert all(p["spec"]["nodeName"] != node for p in live_pods(kube)) and len(live_pods(kube)) == 2
    vms.status[node] = "RUNNING"
    kube.step()
    back = got(kube, "Node", node)
    assert back is not None and cstatus(back, "Ready") == "True"
    assert back["status"]["nodeInfo"]["bootID"] != boot
    assert not any(t["key"] == "node.kubernetes.io/not-ready" for t in back["spec"].get("taints") or [])


def test_reboot_clears_xid_condition_raised_under_the_old_boot(kube: FakeKube, vms: VMs) -> None:
    """container-engine-accelerators health_checker.go resetXIDCondition: removed when bootID changed."""
    boot = got(kube, "Node", "gke-n0")["status"]["nodeInfo"]["bootID"]
    kube.set_node_condition("gke-n0", "XidCriticalError", "True", '{"79":true}', boot)
    kube.set_node_condition("gke-n1", "XidCriticalError", "True", '{"79":true}', "")
    kube.set_gpu_allocatable("gke-n0", 0)
    kube.step()
    assert cond(kube.get("Node", "gke-n0"), "XidCriticalError") is not None  # no reboot, no change
    for name in ("gke-n0", "gke-n1"):
        vms.status[name] = "STOPPING"
    kube.step()
    for name in ("gke-n0", "gke-n1"):
        vms.status[name] = "RUNNING"
    kube.step()
    node = got(kube, "Node", "gke-n0")
    assert node is not None and cond(node, "XidCriticalError") is None
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert cond(kube.get("Node", "gke-n1"), "XidCriticalError") is not None  # no bootID in it: kept


def test_unknown_vm_status_changes_nothing(kube: FakeKube, vms: VMs) -> None:
    vms.status["gke-n0"] = None
    kube.step()
    assert cstatus(got(kube, "Node", "gke-n0"), "Ready") == "True"


# --- Kueue ----------------------------------------------------------------------------------------------
def test_kueue_creates_a_workload_and_admits_with_capacity(kube: FakeKube) -> None:
    """kueue@v0.19.2: webhook suspends, Workload labelled job-uid and owned by the JobSet, named
    jobset-<name>-<hash>; admission sets QuotaReserved/Admitted and unsuspends the JobSet."""
    js = kube.create(make_jobset(labels={"kueue.x-k8s.io/queue-name": "lq"}))
    assert js["spec"]["suspend"] is True
    kube.settle()
    [wl] = kube.list("Workload", NS, labels=f"kueue.x-k8s.io/job-uid={js['metadata']['uid']}")
    assert wl["metadata"]["name"] == workload_name(js) and wl["metadata"]["name"].startswith("jobset-train-")
    assert len(wl["metadata"]["name"]) == len("jobset-train-") + 5
    assert wl["metadata"]["ownerReferences"][0]["uid"] == js["metadata"]["uid"]
    assert cstatus(wl, "Admitted") == "True"
    assert got(kube, "JobSet", "train", NS)["spec"]["suspend"] is False
    assert len([p for p in pods(kube) if p["status"]["phase"] == "Running"]) == 4
    assert cstatus(got(kube, "Workload", wl["metadata"]["name"], NS), "PodsReady") == "True"


def test_kueue_holds_a_workload_without_capacity(kube: FakeKube) -> None:
    kube.create(make_jobset(replicas=4, pods=2, labels={"kueue.x-k8s.io/queue-name": "lq"}))  # 64 GPUs > 48
    kube.settle()
    [wl] = kube.list("Workload", NS)
    assert cond(wl, "Admitted") is None and got(kube, "JobSet", "train", NS)["spec"]["suspend"] is True
    assert kube.list("Job", NS) and pods(kube) == []


def test_kueue_deactivate_evicts_and_reactivate_requeues(kube: FakeKube) -> None:
    """Workload spec.active (kueue@v0.19.2 workload_controller.go): Evicted / Deactivated, then
    Requeued / Reactivated and admitted again."""
    kube.create(make_jobset(labels={"kueue.x-k8s.io/queue-name": "lq"}, failure_policy=HOST_MAINTENANCE))
    kube.settle()
    [wl] = kube.list("Workload", NS)
    name = wl["metadata"]["name"]
    kube.mutate("Workload", name, lambda w: w["spec"].update(active=False), NS)
    cycle(kube, rounds=2)
    wl = got(kube, "Workload", name, NS)
    evicted = cond(wl, "Evicted")
    assert evicted is not None and (evicted["status"], evicted["reason"]) == ("True", "Deactivated")
    assert cstatus(wl, "Admitted") == "False"
    assert got(kube, "JobSet", "train", NS)["spec"]["suspend"] is True and pods(kube) == []
    kube.mutate("Workload", name, lambda w: w["spec"].update(active=True), NS)
    cycle(kube)
    wl = got(kube, "Workload", name, NS)
    requeued = cond(wl, "Requeued")
    assert requeued is not None and (requeued["status"], requeued["reason"]) == ("True", "Reactivated")
    assert cstatus(wl, "Admitted") == "True" and cstatus(wl, "Evicted") == "False"
    js = got(kube, "JobSet", "train", NS)
    assert js is not None and js["spec"]["suspend"] is False and js["status"]["restarts"] == 0
    assert len([p for p in pods(kube) if p["status"]["phase"] == "Running"]) == 4


def test_pod_gc_ends_an_unscheduled_pod_being_deleted_so_its_job_can_go(kube: FakeKube) -> None:
    """PodGC's gcUnscheduledTerminating (kubernetes pkg/controller/podgc/gc_controller.go): no kubelet
    ends a terminating pod bound to no node, and the Job controller's tracking finalizer holds it, so
    PodGC fails it (DeletionByPodGC). Without that, a Job deleted in the foreground (a JobSet restart)
    never goes, the JobSet cannot recreate it, and the gang waits forever (seen in the GKE e2e)."""
    for n in kube.list("Node"):
        kube.mutate("Node", n["metadata"]["name"], lambda o: o["spec"].update(unschedulable=True))
    kube.create(make_jobset(replicas=1, pods=2))
    cycle(kube)
    waiting = pods(kube)
    assert len(waiting) == 2 and not any(p["spec"].get("nodeName") for p in waiting)
    kube.delete("JobSet", "train", NS, propagationPolicy="Foreground")
    cycle(kube, rounds=3)
    assert pods(kube) == [] and kube.list("Job", NS) == [] and kube.get("JobSet", "train", NS) is None


def test_pod_gc_fails_pods_of_a_deleted_node(kube: FakeKube) -> None:
    """PodGC (gke.md §2 DisruptionTarget reasons): DeletionByPodGC, so a FailJob policy restarts the gang."""
    kube.create(make_jobset(replicas=1, pods=2, failure_policy=HOST_MAINTENANCE))
    kube.settle()
    node = pods(kube)[0]["spec"]["nodeName"]
    kube.delete("Node", node)
    cycle(kube, rounds=3)
    js = got(kube, "JobSet", "train", NS)
    assert js["status"]["restarts"] == 1
    assert len(live_pods(kube)) == 2 and all(p["spec"]["nodeName"] != node for p in live_pods(kube))
