"""The whole pipeline on GKE, on one machine: every GKE demo scenario on one shared GKE stack.

Sink router -> Pub/Sub emulator push -> ingest -> Firestore emulator -> Workflows runner ->
actuate -> fake Compute + the fake Kubernetes API server (through the GKE adapter and the
official client) -> notify -> webhook. The facts asserted are read from the fake API server
(JobSet ``status.restarts``, where its pods run, node ``spec.unschedulable`` and taints, watch
events), from the fake Compute's calls and from Firestore.

Node use (a node's action cooldowns outlast this module, so each fault has a node of its own):
the scenarios fault nodes 0-6; node 7 is every gang's partner, node 8 the spare it moves to.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.local import gke_stack
from pitstop.local.stack import ZONE, Stack, StackState
from pitstop.tools.cli import local as cli_local
from pitstop.tools.demo import GKE_COMPUTE_SCALE, POD_GRACE_S, GkeScenarios, gke_spec
from pitstop.tools.demo_stage import Result

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def sc() -> Iterator[GkeScenarios]:
    stack = Stack(
        Path(tempfile.mkdtemp(prefix="pitstop-e2e-gke-")), gke_spec(), compute_scale=GKE_COMPUTE_SCALE
    )
    try:
        stack.up()
        yield GkeScenarios(stack)
    except BaseException:
        _print_logs(stack, 20)
        raise
    finally:
        stack.down()


def _print_logs(stack: Stack, lines: int) -> None:
    """The stack's log tails, so a failure in CI says what each process did."""
    for name in ("ingest", "actuate", "notify", "executions", "kube"):
        log = stack.workdir / f"{name}.log"
        if log.exists():
            print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-lines:]))


def _run(sc: GkeScenarios, name: str) -> Result:
    sc.settle()
    try:
        result: Result = getattr(sc, name)()
    except BaseException:
        _print_logs(sc.stack, 60)
        raise
    print(result.detail, json.dumps(result.facts, default=str))
    return result


def _healthy_elsewhere(sc: GkeScenarios, facts: dict[str, Any], bad: list[str]) -> None:
    """The gang runs again in full on the partner and the spare, none of them a faulty node."""
    assert sorted(facts["moved_to"]) == sorted([sc.partner, sc.spare])
    assert not set(facts["moved_to"]) & set(bad)


def test_xid79_on_a_jobset_member(sc: GkeScenarios) -> None:
    r = _run(sc, "xid79")
    f = r.facts
    assert (f["state"], f["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert f["fenced"], "never seen cordoned with pitstop.dev/remediation=<incident>:NoSchedule"
    assert f["resets"] == 1
    assert f["restarts"] == 1
    _healthy_elsewhere(sc, f, [sc.nodes[0]])
    node = gke_stack.node_summary(sc.kube.node(sc.nodes[0]))
    assert node["ready"] and not node["unschedulable"] and node["gpu_allocatable"] == 8
    assert not [t for t in node["taints"] if t.startswith(gke_stack.FENCE_KEY)]
    assert not node["xid_critical"]  # the reboot cleared the device plugin's condition
    assert f["notifications"] == 1
    assert r.passed, r.detail


def test_two_members_failing_together_restart_the_jobset_once(sc: GkeScenarios) -> None:
    r = _run(sc, "two_members")
    f = r.facts
    assert f["states"] == ["RESOLVED", "RESOLVED"]
    assert f["resets"] == [1, 1]
    assert f["restarts"] == 1
    _healthy_elsewhere(sc, f, sc.nodes[1:3])
    assert all(f["back"])
    assert r.passed, r.detail


def test_spot_preemption_of_a_gke_node(sc: GkeScenarios) -> None:
    r = _run(sc, "preemption")
    f = r.facts
    assert (f["state"], f["action"]) == ("RESOLVED", "RESCHEDULE_JOB")
    assert f["new_vm"] and f["vm"] == "RUNNING"
    assert f["restarts"] == 1
    _healthy_elsewhere(sc, f, [sc.nodes[3]])
    assert f["back"]
    assert r.passed, r.detail


def test_upcoming_maintenance_evicts_with_grace_before_the_window(sc: GkeScenarios) -> None:
    r = _run(sc, "maintenance")
    f = r.facts
    assert (f["state"], f["action"]) == ("RESOLVED", "DRAIN_NODE")
    assert len(f["evicted"]) == 1, f["evicted"]
    assert f["evicted"][0]["grace"] == POD_GRACE_S  # the pod's own grace period: SIGTERM, then the wait
    assert f["evicted"][0]["at"] < f["window_start"]
    assert f["perform_maintenance"] == 1
    assert f["restarts"] == 1
    _healthy_elsewhere(sc, f, [sc.nodes[4]])
    assert f["back"]
    assert r.passed, r.detail


def test_a_pdb_that_blocks_eviction_is_named_in_the_incident(sc: GkeScenarios) -> None:
    r = _run(sc, "pdb_blocks")
    f = r.facts
    assert f["state"] == "FAILED"
    assert "PodDisruptionBudget train-pdb" in f["failure"]
    assert f["node_while_failed"]["unschedulable"]  # a failed remediation keeps its node fenced
    assert f["pod_stayed"] and f["restarts"] == 0
    assert f["perform_maintenance"] == 0
    assert (f["closed"], f["unfence"]) == ("RESOLVED", "done")
    assert f["back"]  # --unfence lifted Pitstop's cordon and taint
    assert r.passed, r.detail


def test_xid_from_a_regional_cluster_resolves_the_zone(sc: GkeScenarios) -> None:
    r = _run(sc, "regional")
    f = r.facts
    assert f["zone"] == ZONE
    assert (f["state"], f["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert f["resets"] == 1
    assert f["restarts"] == 1
    assert f["back"]
    assert r.passed, r.detail


def test_a_serial_console_xid_is_acted_on_only_with_the_device_plugins_word(sc: GkeScenarios) -> None:
    r = _run(sc, "serial")
    f = r.facts
    assert f["lone"] == {"trust": "unverified", "action": "NONE", "untouched": True}
    assert (f["state"], f["trust"], f["action"]) == ("RESOLVED", "verified", "REBOOT_NODE")
    assert f["cluster"] == sc.state.cluster["name"]  # a gce_instance line, placed in its cluster
    assert f["resets"] == 1
    assert f["restarts"] == 1
    _healthy_elsewhere(sc, f, [sc.nodes[8]])
    assert f["back"]
    assert r.passed, r.detail


# -- the stack from the outside: kubectl and `pitstop local status` ------------------------------


def test_kubectl_gets_jobsets_with_the_stack_kubeconfig(sc: GkeScenarios) -> None:
    g = sc.gang("kubectl", [sc.partner], [])
    try:
        kubeconfig = Path(sc.state.workdir, "kubeconfig")
        assert sc.state.kubeconfig == str(kubeconfig)
        argv = ["kubectl", "--kubeconfig", str(kubeconfig), "get", "jobsets", "-o", "json"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
        items = {i["metadata"]["name"]: i for i in json.loads(out)["items"]}
        assert "kubectl" in items
        policy = items["kubectl"]["spec"]["failurePolicy"]
        assert policy["rules"] == gke_stack.HOST_MAINTENANCE_POLICY["rules"]
        assert policy["restartStrategy"] == "Recreate"  # the JobSet webhook's default, as served
        table = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "jobsets"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert table.split()[:2] == ["NAME", "AGE"] and "kubectl" in table.split()
    finally:
        sc.done_with(g)


def test_local_status_json_reports_k8s_nodes_and_jobsets(sc: GkeScenarios) -> None:
    g = sc.gang("status", [sc.partner], [])
    try:
        argv = [sys.executable, "-m", "pitstop.tools.cli", "local", "status", "--json"]
        proc = subprocess.run(
            [*argv, "--workdir", sc.state.workdir], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert "slurm_nodes" not in report
        nodes = {n["name"]: n for n in report["k8s_nodes"]}
        assert set(nodes) == set(sc.nodes)
        assert set(nodes[sc.partner]) >= {"name", "ready", "unschedulable", "taints", "gpu_allocatable"}
        assert nodes[sc.partner]["ready"] and nodes[sc.partner]["gpu_allocatable"] == 8
        jobsets = {j["name"]: j for j in report["jobsets"]}
        assert jobsets["status"]["restarts"] == 0 and jobsets["status"]["nodes"] == [sc.partner]
        # what each GKE incident did, from the fake API server's record (the xid79 scenario's
        # incident, when it ran before this test: fenced, one pod evicted, reset, unfenced)
        for inc in report["incidents"]:
            kube = inc["effects"]["kube"]
            assert set(kube) <= {"cordon", "taint", "evict", "untaint", "uncordon"}, inc
            if inc["action"] == "REBOOT_NODE" and inc["state"] == "RESOLVED":
                assert kube.get("taint") == kube.get("untaint") == 1, inc
                assert inc["effects"]["compute"].get("reset") == 1, inc
    finally:
        sc.done_with(g)


def test_local_up_gke_options_make_a_gke_spec_with_a_jobset() -> None:
    """`pitstop local up --scheduler gke --nodes 5 --job-nodes 3`: the daemon gets a GKE spec whose
    stack creates the JobSet (the daemon's own --job-nodes, a Slurm job, is left at 0)."""
    args = argparse.Namespace(scheduler="gke", config=None, nodes=5, spot="", job_nodes=3)
    spec = cli_local.cluster_spec(args)
    assert (spec.scheduler, spec.nodes, spec.jobset_nodes, args.job_nodes) == ("gke", 5, 3, 0)
    assert all(n.startswith("gke-train-") for n in spec.node_names)
    slurm = cli_local.cluster_spec(
        argparse.Namespace(scheduler="slurm", config=None, nodes=5, spot="", job_nodes=3)
    )
    assert (slurm.scheduler, slurm.jobset_nodes) == ("slurm", 0)


def test_stack_state_of_a_gke_stack_names_its_kubeconfig(sc: GkeScenarios) -> None:
    state = StackState.load(sc.state.workdir)
    assert state.kubeconfig is not None and Path(state.kubeconfig).exists()
    assert state.slurm_conf == "" and "kube" in state.endpoints


def test_the_stacks_npd_sets_the_kernel_xid_condition_from_the_vms_ring_buffer(sc: GkeScenarios) -> None:
    """The stack runs the NPD stand-in (local/npd.py) with infra/gke/npd.yaml's rule file: the kernel
    of a VM prints an Xid the device plugin does not watch and its Node gets PitstopKernelXid with that
    line (a driver line before it that is no Xid is passed over). The condition stays until the VM
    next boots."""
    node = sc.nodes[-1]
    sc.kernel_prints(node, "NVRM: GPU at PCI:0000:a1:00: GPU-6b2e1f0c")  # the driver, but no Xid
    line = "NVRM: Xid (PCI:0000:a1:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
    sc.kernel_prints(node, line)

    def cond() -> dict[str, Any] | None:
        got = [c for c in sc.kube.node(node)["status"]["conditions"] if c["type"] == "PitstopKernelXid"]
        return got[0] if got and got[0]["status"] == "True" else None

    got = gke_stack.wait_for(cond, 60.0, "the NPD stand-in to set PitstopKernelXid")
    assert (got["reason"], got["message"]) == ("NvrmXid", line)


# -- the pieces the stack is made of (no stack needed) ---------------------------------------------


def test_the_kubelet_sees_a_vm_down_period_shorter_than_its_loop() -> None:
    """A reset the time-scaled fake Compute finishes between two kubelet steps still reboots the Node."""
    seen = iter([{"n": "RUNNING"}, {"n": "STOPPING"}, {"n": "RUNNING"}])

    class Vms(gke_stack.ComputeVms):
        def fetch(self) -> dict[str, str]:
            return next(seen)

    vms = Vms("http://127.0.0.1:9")
    vms.poll()
    assert vms("n") == "RUNNING"
    vms.poll()
    vms.poll()  # back up before the kubelet looked
    assert [vms("n"), vms("n")] == ["STOPPING", "RUNNING"]
    assert vms("unknown") is None


def test_the_gke_stack_policy_validates_and_names_its_control_plane() -> None:
    from pitstop.adapters.gke import GkeScheduler
    from pitstop.core import policy as policy_mod
    from pitstop.core.resources import DataFileError
    from pitstop.local.stack import policy_for
    from pitstop.services.schedulers import Wiring, schedulers_for

    doc = policy_for(gke_spec())
    pol = policy_mod.from_doc(doc)
    (cluster,) = pol.clusters
    assert (cluster.scheduler, cluster.raw["gke"]["location"], cluster.raw["gke"]["cluster"]) == (
        "gke",
        ZONE,
        "train",
    )
    local = schedulers_for(pol, Wiring("pitstop-local", kube_endpoint="http://127.0.0.1:9"))["train"]
    assert isinstance(local, GkeScheduler) and local.cluster.evict_deadline_s == 10
    assert local.cluster.kube.client.configuration.host == "http://127.0.0.1:9"
    remote = schedulers_for(pol, Wiring("pitstop-local"))["train"]
    assert isinstance(remote, GkeScheduler) and remote.cluster.kube._client is None  # connects on first use
    del doc["clusters"][0]["gke"]
    with pytest.raises(DataFileError):
        policy_mod.from_doc(doc)  # a GKE cluster must say where its control plane is
