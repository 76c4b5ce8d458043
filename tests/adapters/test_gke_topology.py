"""GKE: where nodes sit (their ``cloud.google.com/gce-topology-*`` labels) and Kueue's own failed-node
replacement, with the official client against the fake API server.

Facts: GKE labels A3 Ultra/A4/A4X nodes ``cloud.google.com/gce-topology-block``, ``-subblock`` and
``-host`` (https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas). A
PodSet asks Kueue for Topology Aware Scheduling with ``kueue.x-k8s.io/podset-required-topology`` (or
``-preferred-topology``) on its pod template, and Kueue replaces one failed node of such a workload
within its topology domain when the feature gate TASFailedNodeReplacement is on (beta, default on since
v0.14); an untolerated NoExecute taint with the pods gone counts as a failure
(kubernetes-sigs/kueue@v0.19.2 site/.../concepts/topology_aware_scheduling.md; reference/gke.md §4).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pitstop.adapters.gke import GkeCluster, GkeScheduler
from pitstop.core import topology
from pitstop.local.fake_k8s import FakeKube
from tests.adapters.test_gke_adapter import (
    CTX,
    JOB,
    PROJECT,
    ZONE,
    Clock,
    jobset,
    node_of,
    started,
    workload,
)

# Two sub-blocks of one block, a third sub-block in another block; listed by name.
PLACES = {"gke-a": ("b1", "s1"), "gke-b": ("b1", "s1"), "gke-c": ("b2", "s1"), "gke-d": ("b1", "s2")}
TAS = "kueue.x-k8s.io/podset-required-topology"


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    for name, (block, sub) in PLACES.items():
        labels = {topology.BLOCK_LABEL: block, topology.SUBBLOCK_LABEL: sub, topology.HOST_LABEL: f"h-{name}"}
        k.add_node(name, project=PROJECT, zone=ZONE, labels=labels)
    yield k
    k.stop()


@pytest.fixture
def clock(kube: FakeKube) -> Clock:
    return Clock(kube)


def cluster(api: Any, clock: Clock, kueue_replaces: bool = True) -> GkeCluster:
    return GkeCluster(
        api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep, kueue_replaces=kueue_replaces
    )


def tas_jobset() -> dict[str, Any]:
    """A Kueue-queued JobSet without a failurePolicy whose PodSet asks for TAS at the sub-block level."""
    js = jobset(policy="none", queue="team-a")
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"]["annotations"] = {TAS: topology.SUBBLOCK_LABEL}
    return js


def test_capacity_names_the_gang_and_the_spares_with_their_places(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    started(kube, jobset())
    bad = node_of(kube, 0)
    sched = GkeScheduler(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)
    sched.fence(bad, CTX, "REBOOT_NODE")
    cap = sched.capacity(JOB, bad, CTX)
    gang = {s.node for s in cap.gang}
    assert bad in gang and len(gang) == 2 and cap.enough
    spares = [s.node for s in cap.spares]
    assert spares == sorted(set(PLACES) - gang)  # every other node fits one 8-GPU pod, by name
    where = {s.node: s.place for s in (*cap.gang, *cap.spares)}
    assert where["gke-c"] == {
        "source": "gke",
        "block": "b2",
        "subblock": "s1",
        "host": "h-gke-c",
        "machine_type": "a3-highgpu-8g",  # node.kubernetes.io/instance-type
    }
    assert cap.native is None


def test_kueue_with_topology_aware_replacement_replaces_the_node_and_pitstop_does_not_restart_it(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    started(kube, tas_jobset())
    assignment = workload(kube)["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert assignment["levels"] == [topology.SUBBLOCK_LABEL]
    sched = cluster(api, clock)
    bad = node_of(kube, 0)
    sched.fence(bad, CTX, "REBOOT_NODE")
    assert sched.capacity(JOB, bad, CTX)["native"] == "kueue-tas"
    out = sched.requeue_outcome(JOB, CTX)
    assert out.get("native") == "kueue-tas" and "Kueue's failed-node replacement" in out["outcome"]
    assert len(out["evicted"]) == 1  # the fenced node's pod alone
    wl_patches = [r for r in kube.requests if r[0] == "PATCH" and "/workloads/" in r[1]]
    assert wl_patches == [] and workload(kube)["spec"]["active"] is True  # no second restart by Pitstop


def test_a_kueue_without_topology_aware_replacement_keeps_today_s_path(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    """The same TAS workload on a Kueue whose gate is off (or older than v0.14): Pitstop restarts the
    gang itself as before, deactivating and reactivating its Workload."""
    started(kube, tas_jobset())
    sched = cluster(api, clock, kueue_replaces=False)
    bad = node_of(kube, 0)
    sched.fence(bad, CTX, "REBOOT_NODE")
    assert sched.capacity(JOB, bad, CTX)["native"] is None
    out = sched.requeue_outcome(JOB, CTX)
    assert out["outcome"].startswith("workload deactivated and reactivated") and "native" not in out
    assert len([r for r in kube.requests if r[0] == "PATCH" and "/workloads/" in r[1]]) == 2


def test_doctor_reports_kueue_s_topology_aware_replacement_and_jobset_failure_policies(
    kube: FakeKube, api: Any, clock: Clock
) -> None:
    from pitstop.adapters.gke.doctor import native_mechanisms

    started(kube, jobset("own"))  # restarts by its own failurePolicy
    before = native_mechanisms(api)
    assert before[0].startswith("jobset: 1 of 1 JobSet(s) restart as a gang by their own failurePolicy")
    assert before[1].startswith("kueue: no Topology: no topology-aware node replacement")
    kube.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": "gke-default"},
            "spec": {"levels": [{"nodeLabel": topology.BLOCK_LABEL}, {"nodeLabel": topology.SUBBLOCK_LABEL}]},
        }
    )
    started(kube, tas_jobset())
    after = native_mechanisms(api)
    assert f"kueue: Topology gke-default (levels: {topology.BLOCK_LABEL}, {topology.SUBBLOCK_LABEL})" in after
    assert any(
        line.startswith("kueue: 1 workload(s) admitted with a topology assignment: Kueue replaces")
        for line in after
    )
    off = native_mechanisms(api, kueue_replaces=False)
    assert any("Pitstop restarts them itself" in line for line in off)
