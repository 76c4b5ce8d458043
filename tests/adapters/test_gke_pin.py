"""GKE: a move Pitstop places restarts a plain JobSet once inside the topology domain its gang's
choice named (adapters/gke/pin.py), with the official client against the fake API server.

Facts the fake models and these tests lean on:
- JobSet's validating webhook refuses a change of ``spec.replicatedJobs`` except, of a pod template,
  its nodeSelector, tolerations, labels, annotations and schedulingGates while the JobSet is
  suspended or being suspended ("Allow pod template to be mutated for suspended JobSets, or JobSets
  getting suspended": kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go ValidateUpdate).
- On resume, JobSet merges the template's nodeSelector into each child Job (pkg/controllers/
  jobset_controller.go resumeJob, collections.MergeMaps), and suspend/resume does not count a
  restart (``status.restarts``; reference/gke.md §3).
- GKE's topology labels ``cloud.google.com/gce-topology-block|subblock`` (topology-and-vertex.md).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import GkeCluster, GkeScheduler
from pitstop.adapters.gke.objects import MOVED_FOR, PINNED
from pitstop.adapters.gke.pin import OPT_OUT
from pitstop.core import topology
from pitstop.core.scheduling import JobRun, Placer
from pitstop.local.fake_k8s import FakeKube
from tests.adapters import test_gke_adapter as ga
from tests.adapters.test_gke_adapter import Clock
from tests.adapters.test_gke_topology import clock, kube  # noqa: F401  (fixtures)

k8s: Any = client
CTX, JOB, PROJECT, ZONE = ga.CTX, ga.JOB, ga.PROJECT, ga.ZONE
jobset, pdb, pods, restarts, running, settle, started = (
    ga.jobset, ga.pdb, ga.pods, ga.restarts, ga.running, ga.settle, ga.started
)  # fmt: skip
BLOCK, SUB = topology.BLOCK_LABEL, topology.SUBBLOCK_LABEL


def cluster(api: Any, clock: Clock) -> GkeCluster:  # noqa: F811
    """Stuck pods are judged on the cluster's own clock (the fake's), as restart.py documents."""
    return GkeCluster(
        api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep, wall=clock.kube.store.epoch
    )


def where(kube: FakeKube) -> set[str]:  # noqa: F811
    live = [p for p in pods(kube) if not p["metadata"].get("deletionTimestamp")]
    return {str(p["spec"].get("nodeName")) for p in live}


def selectors(kube: FakeKube, kind: str = "JobSet") -> list[dict[str, str]]:  # noqa: F811
    if kind == "JobSet":
        js = kube.get("JobSet", "train", "default")
        assert js is not None
        return [r["template"]["spec"]["template"]["spec"].get("nodeSelector") or {}
                for r in js["spec"]["replicatedJobs"]]  # fmt: skip
    return [j["spec"]["template"]["spec"].get("nodeSelector") or {} for j in kube.list("Job", "default")]


def opt_out(kube: FakeKube) -> None:  # noqa: F811
    """The JobSet's owner annotates it ``pitstop.dev/pin: "off"``."""

    def edit(js: dict[str, Any]) -> None:
        js["metadata"].setdefault("annotations", {})[OPT_OUT] = "off"

    kube.mutate("JobSet", "train", edit, "default")


def jobset_patches(kube: FakeKube) -> int:  # noqa: F811
    return len([r for r in kube.requests if r[0] == "PATCH" and "/jobsets/" in r[1]])


def moved_gang(kube: FakeKube, api: Any, clock: Clock) -> tuple[GkeCluster, str, str]:  # noqa: F811
    """The gang on gke-a and gke-b (sub-block b1/s1), gke-a fenced: the one spare of its block is
    gke-d (b1/s2); gke-c (another block) comes first by name."""
    started(kube, jobset())
    assert where(kube) == {"gke-a", "gke-b"}
    sched = cluster(api, clock)
    sched.fence("gke-a", CTX, "REBOOT_NODE")
    return sched, "gke-b", "gke-d"


def test_a_move_restarts_the_gang_once_inside_the_block_of_the_nodes_the_choice_named(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    sched, staying, spare = moved_gang(kube, api, clock)
    before = sched.job_info(JOB, CTX)["start_time"]
    out = sched.requeue_onto(JOB, CTX, 0, (staying, spare))
    assert out["restarted"] is True and out["pinned"] == f"{BLOCK}=b1", out
    # a new run of the JobSet (the gang is seen running again; another member's incident finds it moved)
    assert sched.job_info(JOB, CTX)["start_time"] == f"{before} moved for {CTX.key}"
    assert out["restarts"] == 0  # suspend and resume restart the gang without counting a restart
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is False
    assert js["metadata"]["annotations"][MOVED_FOR] == CTX.key
    assert js["metadata"]["annotations"][PINNED] == f"{BLOCK}=b1"
    assert selectors(kube) == [{BLOCK: "b1"}]
    settle(kube, lambda: running(kube))
    assert where(kube) == {staying, spare}  # not gke-c, listed first but in another block
    assert all(s.get(BLOCK) == "b1" for s in selectors(kube, "Job"))  # merged into the child Jobs
    from pitstop.adapters.gke.doctor import native_mechanisms

    said = f"jobset: 1 JobSet(s) pinned to a topology domain by a Pitstop move: default/train ({BLOCK}=b1)"
    assert said in native_mechanisms(api)  # what doctor tells the operator, to lift by hand if need be

    patched = jobset_patches(kube)
    again = sched.requeue_onto(JOB, CTX, 0, (staying, spare))  # the step's retry finds it done
    assert again["restarted"] is True and "resumed already" in again["outcome"]
    assert jobset_patches(kube) == patched and restarts(kube) == 0

    kube.mutate("JobSet", "train", lambda js: js["spec"].update(suspend=True), "default")  # its owner's
    assert sched.reactivate([JOB], CTX.incident) == []  # the close leaves a suspend not Pitstop's
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is True


def test_the_nodes_of_one_sub_block_pin_the_gang_to_it(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    labels = {BLOCK: "b1", SUB: "s1", topology.HOST_LABEL: "h-gke-e"}
    kube.add_node("gke-e", project=PROJECT, zone=ZONE, labels=labels)
    sched, staying, _ = moved_gang(kube, api, clock)
    out = sched.requeue_onto(JOB, CTX, 0, (staying, "gke-e"))
    assert out["pinned"] == f"{BLOCK}=b1,{SUB}=s1"
    settle(kube, lambda: running(kube))
    assert where(kube) == {staying, "gke-e"}


def test_the_scheduler_is_a_placer_and_its_capacity_says_whether_it_places_the_gang(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    sched = GkeScheduler(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)
    assert isinstance(sched, Placer)
    started(kube, jobset())
    sched.fence("gke-a", CTX, "REBOOT_NODE")
    assert sched.capacity(JOB, "gke-a", CTX).places is True
    moved = sched.requeue_onto(JOB, CTX, JobRun(restarts=0), ("gke-b", "gke-d"))
    assert moved.restarted and "b1" in moved.how

    opt_out(kube)
    assert sched.capacity(JOB, "gke-a", CTX).places is False


def test_not_pinned_the_gang_restarts_as_before(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    """Nodes of two blocks, or a JobSet its owner opted out: the failurePolicy restart (one eviction,
    ``status.restarts`` + 1) and no selector; a run that moved on since the fault: left alone."""
    sched, staying, _ = moved_gang(kube, api, clock)
    out = sched.requeue_onto(JOB, CTX, 0, (staying, "gke-c"))  # b1 and b2: no one domain
    assert out["outcome"] == "restart triggered" and "pinned" not in out
    settle(kube, lambda: running(kube, attempt=1))
    assert selectors(kube) == [{}] and restarts(kube) == 1

    late = sched.requeue_onto(JOB, CTX, 0, (staying, "gke-d"))  # the run the fault hit is gone
    assert late["outcome"].startswith("already restarted") and selectors(kube) == [{}]

    opt_out(kube)
    other = sched.requeue_onto(JOB, CTX, 1, (staying, "gke-d"))
    assert "pinned" not in other and selectors(kube) == [{}]


def test_a_jobset_a_disruption_budget_covers_is_restarted_through_evictions(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    """A suspend deletes pods without the Eviction API: with a PodDisruptionBudget over the gang's
    pods (one that allows the eviction), the failurePolicy restart, which honours it."""
    sched, staying, spare = moved_gang(kube, api, clock)
    kube.create(pdb("train-budget", 1))
    out = sched.requeue_onto(JOB, CTX, 0, (staying, spare))
    assert out["outcome"] == "restart triggered" and "pinned" not in out and selectors(kube) == [{}]


def test_an_owner_s_own_topology_selector_is_left_alone(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    js = jobset()
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"] = {BLOCK: "b1"}
    started(kube, js)
    sched = cluster(api, clock)
    sched.fence("gke-a", CTX, "REBOOT_NODE")
    out = sched.requeue_onto(JOB, CTX, 0, ("gke-b", "gke-d"))  # already in b1: nothing to add
    assert "pinned" not in out and selectors(kube) == [{BLOCK: "b1"}]


def test_a_running_jobset_s_template_cannot_change_but_one_being_suspended_can(
    kube: FakeKube,  # noqa: F811
    api: Any,
) -> None:
    """The fake's JobSet webhook, as jobset_webhook.go ValidateUpdate: 403, a webhook's denial."""
    started(kube, jobset())
    custom = k8s.CustomObjectsApi(api)
    js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train")
    rjobs = js["spec"]["replicatedJobs"]
    rjobs[0]["template"]["spec"]["template"]["spec"]["nodeSelector"] = {BLOCK: "b2"}

    def patch(body: dict[str, Any]) -> Any:
        return custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", body
        )

    with pytest.raises(ApiException) as err:
        patch({"spec": {"replicatedJobs": rjobs}})
    said = json.loads(err.value.body or "{}")
    assert (err.value.status, said["reason"]) == (403, "Forbidden")
    assert said["message"] == (
        'admission webhook "vjobset.kb.io" denied the request: '
        'spec.replicatedJobs: Invalid value: "object": field is immutable'
    )
    assert patch({"spec": {"suspend": True, "replicatedJobs": rjobs}})["spec"]["suspend"] is True
    rjobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    with pytest.raises(ApiException) as err:  # only the scheduling fields, even while suspended
        patch({"spec": {"replicatedJobs": rjobs}})
    assert err.value.status == 403


def test_closing_the_incident_resumes_a_jobset_left_suspended_mid_move(
    kube: FakeKube,  # noqa: F811
    api: Any,
    clock: Clock,  # noqa: F811
) -> None:
    """A pod stuck Terminating on a Ready node: each call answers 503 while the wait lasts (the step
    asks again, nothing is suspended twice), then the move fails (409), leaving the JobSet suspended
    with its mark; the incident's close resumes it."""
    sched, staying, spare = moved_gang(kube, api, clock)
    kube.processes_hung("gke-b")
    answers = []
    for _ in range(12):
        with pytest.raises(ActuatorError) as err:
            sched.requeue_onto(JOB, CTX, 0, (staying, spare))
        answers.append(err.value.status)
        if not err.value.retryable:
            break
    assert answers[0] == 503 and answers[-1] == 409 and set(answers[1:-1]) <= {503}
    assert " moved for " not in str(sched.job_info(JOB, CTX)["start_time"])  # still the run the fault hit
    assert "stuck Terminating" in err.value.message
    assert jobset_patches(kube) == 1  # the one suspend, never repeated
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is True
    done = sched.reactivate([JOB], CTX.incident)
    assert done == [f"jobset/default/train: resumed (suspended for {CTX.key}'s move)"]
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is False
