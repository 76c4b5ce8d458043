"""The third scheduler, `kubernetes`: any Kubernetes cluster on Compute Engine VMs, by kubeconfig.

The worked example of a scheduler folder (docs/architecture.md, Where a change goes):
plugins/schedulers/kubernetes/ holds its code, its policy block and its manifest. Driven here
through a real kubeconfig against the fake API server (the `kubernetes` client, as in production).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.adapters.errors import ActuatorError
from pitstop.core import policy as policy_mod
from pitstop.core.resources import DataFileError
from pitstop.core.scheduling import StepRef
from pitstop.local.fake_k8s import FakeKube
from pitstop.plugins.schedulers.kubernetes.adapter import KubernetesScheduler, kubeconfig_env
from pitstop.services.schedulers import Wiring, factories, schedulers_for

NODES = ["kadm-gpu-000", "kadm-gpu-001"]
REF = StepRef("iaaaaaaaaa", 1)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    for n in NODES:
        k.add_node(n, project="train-prod", zone="us-central1-a")
    yield k
    k.stop()


def _policy(**conf: object) -> policy_mod.Policy:
    cluster = {
        "name": "kadm",
        "scheduler": "kubernetes",
        "match": {"name_pattern": "kadm-*"},
        "kubernetes": conf,
    }
    return policy_mod.from_doc({"clusters": [cluster]})


def test_the_registry_builds_it_from_the_policy_and_connects_by_kubeconfig(
    kube: FakeKube, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    kube.write_kubeconfig(path)
    sched = schedulers_for(_policy(), Wiring("train-prod"))["kadm"]
    assert (
        isinstance(sched, KubernetesScheduler) and sched.name == "kubernetes" and "kubernetes" in factories()
    )
    typed = KubernetesScheduler.from_policy("kadm", {}, {kubeconfig_env("kadm"): path.read_text()})
    fenced = typed.fence(NODES[0], REF, "REBOOT_NODE")
    assert not fenced.fenced_by_other and fenced.reason == "pitstop.dev/remediation=iaaaaaaaaa:NoSchedule"
    node = kube.get("Node", NODES[0]) or {}
    assert [t["value"] for t in node["spec"]["taints"] if t["key"] == "pitstop.dev/remediation"] == [
        "iaaaaaaaaa"
    ]
    back = typed.unfence(NODES[0], REF)
    after = (kube.get("Node", NODES[0]) or {})["spec"]
    assert back.resumed and not after.get("unschedulable") and not after.get("taints")


def test_a_missing_kubeconfig_fails_only_this_clusters_steps() -> None:
    sched = KubernetesScheduler.from_policy("kadm", {"kubeconfig_env": "NOT_SET_HERE"}, {})
    with pytest.raises(ActuatorError) as err:
        sched.node_healthy(NODES[0], REF)
    assert err.value.status == 409 and "NOT_SET_HERE" in err.value.message


def test_the_policy_schema_knows_its_block() -> None:
    assert _policy(context="prod", kubeconfig_env="KADM_CONFIG").clusters[0].scheduler == "kubernetes"
    with pytest.raises(DataFileError):
        _policy(kubeconfig_env="lower-case")
