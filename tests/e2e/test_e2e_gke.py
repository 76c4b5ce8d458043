"""The whole pipeline on GKE, on one machine: JobSet fault scenarios on one shared GKE stack.

Sink router -> Pub/Sub emulator push -> ingest -> Firestore emulator -> Workflows runner ->
actuate -> fake Compute + the fake Kubernetes API server (through the GKE adapter and the
official client) -> notify -> webhook. The facts asserted are read from the fake API server
(JobSet ``status.restarts``, where its pods run, node ``spec.unschedulable`` and taints, watch
events), from the fake Compute's calls and from Firestore.

Node use (a node's action cooldowns outlast this module, so each fault has a node of its own):
the scenarios fault nodes 0-8; node 9 is every gang's partner, node 10 the spare it moves to. The
scenarios are this module's own (tests/pipeline.py drives the stack), not the demo's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.domain import Incident
from pitstop.local import gke_stack, inject
from pitstop.local.gke_drive import POD_GRACE_S, Gang, evictions, fenced_by
from pitstop.local.gke_stack import JOBSET_LABEL, NAMESPACE, Watch
from pitstop.local.stack import ZONE, ClusterSpec, StackState
from pitstop.tools.cli import local as cli_local
from tests.pipeline import XID79, GkePipeline, print_logs, stack_up

pytestmark = pytest.mark.emulator

NODES = 11  # nine nodes that take a fault each (cooldowns outlast the module), a gang partner and a spare
COMPUTE_SCALE = 0.03  # a reset keeps the VM down ~1 s: time for the gang to restart off a preempted node
REGION = ZONE.rsplit("-", 1)[0]


def spec() -> ClusterSpec:
    """A GKE node pool whose fourth node is a Spot VM (Compute confirms a preemption only of one)."""
    s = ClusterSpec.gke(NODES)
    s.spot = [s.node_names[3]]
    return s


@pytest.fixture(scope="module")
def gk() -> Iterator[GkePipeline]:
    with stack_up("e2e-gke", spec(), compute_scale=COMPUTE_SCALE) as stack:
        gk = GkePipeline(stack)
        gk.keep(list(_partner_spare(gk)))  # healthy, shared by every gang; each fault takes its own node
        yield gk


@pytest.fixture
def scenario(gk: GkePipeline) -> Iterator[GkePipeline]:
    """One fault scenario: the blast-radius window clear first; the stack's logs if it fails."""
    gk.settle()
    try:
        yield gk
    except BaseException:
        print_logs(gk.stack, 60)
        raise


def _partner_spare(gk: GkePipeline) -> tuple[str, str]:
    return gk.nodes[-2], gk.nodes[-1]


def _gang(gk: GkePipeline, name: str, members: list[str]) -> Gang:
    """A JobSet on ``members`` and the partner, free to move to the spare."""
    partner, spare = _partner_spare(gk)
    return gk.gangs.gang(name, [*members, partner], [spare])


def _on_partner_and_spare(gk: GkePipeline, where: list[str], bad: list[str]) -> None:
    """The gang runs again in full on the partner and the spare, none of them a faulty node."""
    assert sorted(where) == sorted(_partner_spare(gk))
    assert not set(where) & set(bad)


def _xid79_confirmed(gk: GkePipeline, g: Gang, bad: str, entry: dict[str, Any]) -> tuple[Incident, list[str]]:
    """An Xid 79 the device plugin confirms on ``bad``, logged as ``entry``: the finished incident
    and where the gang runs again."""
    gk.gangs.device_plugin_xid(bad, 79)
    gk.router.publish(entry)
    inc = gk.finished(bad)
    return inc, gk.gangs.moved(g, [bad])


def _maintenance_window(gk: GkePipeline, node: str) -> float:
    """Upcoming maintenance of the node's VM, published: when its window starts (epoch s)."""
    from pitstop.core.timefmt import to_epoch

    entry = inject.maintenance(gk.state, node)
    gk.router.publish(entry)
    return to_epoch(entry["protoPayload"]["metadata"]["windowStartTime"]) or 0.0


def test_xid79_on_a_jobset_member(scenario: GkePipeline) -> None:
    gk, (bad,) = scenario, scenario.take()
    g = _gang(gk, "xid79", [bad])
    watch = Watch(gk.kube.url, "/api/v1/nodes")
    try:
        inc, where = _xid79_confirmed(gk, g, bad, gk.k8s_entry(bad, XID79))
        back, restarts = gk.gangs.node_back(bad), gk.gangs.restarts(g.name)
        notes = gk.wait(lambda: gk.notes_for(inc["id"]), 30, "the notification")
    finally:
        watch.stop()
        gk.gangs.done_with(g)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert fenced_by(watch.events, bad, inc["id"]), "never seen tainted pitstop.dev/remediation=<id>"
    assert len(gk.calls("reset", bad)) == 1
    assert restarts == 1
    _on_partner_and_spare(gk, where, [bad])
    assert back
    node = gke_stack.node_summary(gk.kube.node(bad))
    assert node["ready"] and not node["unschedulable"] and node["gpu_allocatable"] == 8
    assert not [t for t in node["taints"] if t.startswith(gke_stack.FENCE_KEY)]
    assert not node["xid_critical"]  # the reboot cleared the device plugin's condition
    assert len(notes) == 1


def test_two_members_failing_together_restart_the_jobset_once(scenario: GkePipeline) -> None:
    gk, (a, b) = scenario, scenario.take(2)
    g = gk.gangs.gang("pair", [a, b], list(_partner_spare(gk)))
    try:
        for n in (a, b):
            gk.gangs.device_plugin_xid(n, 79)
        for n in (a, b):
            gk.router.publish(gk.k8s_entry(n, XID79))
        incs = [gk.finished(a), gk.finished(b)]
        where = gk.gangs.moved(g, [a, b])
        back, restarts = [gk.gangs.node_back(n) for n in (a, b)], gk.gangs.restarts(g.name)
    finally:
        gk.gangs.done_with(g)
    assert [i["state"] for i in incs] == ["RESOLVED", "RESOLVED"]
    assert [i["action"] for i in incs] == ["REBOOT_NODE", "REBOOT_NODE"]
    assert [len(gk.calls("reset", n)) for n in (a, b)] == [1, 1]
    assert restarts == 1
    _on_partner_and_spare(gk, where, [a, b])
    assert all(back)


def test_spot_preemption_of_a_gke_node(scenario: GkePipeline) -> None:
    gk, (bad,) = scenario, scenario.take(spot=True)
    g = _gang(gk, "spot", [bad])
    try:
        before = inject.instance(gk.state, bad)["id"]
        gk.router.publish(inject.preempt(gk.state, bad))
        inc = gk.finished(bad)
        where = gk.gangs.moved(g, [bad])
        after, back, restarts = (
            inject.instance(gk.state, bad),
            gk.gangs.node_back(bad),
            gk.gangs.restarts(g.name),
        )
    finally:
        gk.gangs.done_with(g)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "RESCHEDULE_JOB")
    assert after["id"] != before and after["status"] == "RUNNING"  # the MIG recreated it
    assert restarts == 1
    _on_partner_and_spare(gk, where, [bad])
    assert back


def test_upcoming_maintenance_evicts_with_grace_before_the_window(scenario: GkePipeline) -> None:
    gk, (bad,) = scenario, scenario.take()
    g = _gang(gk, "maint", [bad])
    watch = Watch(gk.kube.url, f"/api/v1/namespaces/{NAMESPACE}/pods")
    try:
        window = _maintenance_window(gk, bad)
        inc = gk.finished(bad, timeout=120)
        where = gk.gangs.moved(g, [bad])
        back, restarts = gk.gangs.node_back(bad), gk.gangs.restarts(g.name)
    finally:
        watch.stop()
        gk.gangs.done_with(g)
    evicted = evictions(watch.events, bad)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "DRAIN_NODE")
    assert len(evicted) == 1, evicted
    assert evicted[0]["grace"] == POD_GRACE_S  # the pod's own grace period: SIGTERM, then the wait
    assert evicted[0]["at"] < window
    assert len(gk.calls("perform_maintenance", bad)) == 1
    assert restarts == 1
    _on_partner_and_spare(gk, where, [bad])
    assert back


def test_a_pdb_that_blocks_eviction_is_named_in_the_incident(scenario: GkePipeline) -> None:
    gk, (bad,), pdb = scenario, scenario.take(), "train-pdb"
    g = _gang(gk, "pdb", [bad])
    gk.kube.create_pdb(pdb, {JOBSET_LABEL: g.name}, min_available=2)
    try:
        _maintenance_window(gk, bad)
        inc = gk.finished(bad, timeout=120)
        held = gke_stack.node_summary(gk.kube.node(bad))
        stayed, restarts = bad in gk.gangs.placed(g.name), gk.gangs.restarts(g.name)
        closed = inject.close_with_unfence(gk.state, gk.db, inc["id"], "e2e")
        back = gk.gangs.node_back(bad)
    finally:
        gk.kube.delete_pdb(pdb)
        gk.gangs.done_with(g)
    assert inc["state"] == "FAILED"
    failure = inc.get("failure")
    assert failure is not None and f"PodDisruptionBudget {pdb}" in failure["error"]
    assert held["fenced"]  # a failed remediation keeps its node fenced
    assert stayed and restarts == 0
    assert not gk.calls("perform_maintenance", bad)
    closure = closed.get("closure")
    answer = closure.get("unfence") if closure else None
    unfence = answer["outcome"] if isinstance(answer, dict) else None
    assert (closed.get("state"), unfence) == ("RESOLVED", "done")
    assert back  # --unfence lifted Pitstop's taint


def test_xid_from_a_regional_cluster_resolves_the_zone(scenario: GkePipeline) -> None:
    gk, (bad,) = scenario, scenario.take()
    g = _gang(gk, "regional", [bad])
    try:
        inc, where = _xid79_confirmed(gk, g, bad, gk.k8s_entry(bad, XID79, location=REGION))
        back, restarts = gk.gangs.node_back(bad), gk.gangs.restarts(g.name)
    finally:
        gk.gangs.done_with(g)
    assert inc["node"] is not None and inc["node"]["zone"] == ZONE
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert len(gk.calls("reset", bad)) == 1
    assert restarts == 1
    _on_partner_and_spare(gk, where, [bad])
    assert back


def test_a_serial_console_xid_is_acted_on_only_with_the_device_plugins_word(scenario: GkePipeline) -> None:
    gk, (forged, bad) = scenario, scenario.take(2)
    gk.router.publish(gk.serial_entry(forged, XID79))
    gk.wait(lambda: gk.incidents(forged), 30, f"the record of {forged}'s line")
    g = _gang(gk, "serial", [bad])
    try:
        inc, where = _xid79_confirmed(gk, g, bad, gk.serial_entry(bad, XID79))
        back, restarts = gk.gangs.node_back(bad), gk.gangs.restarts(g.name)
    finally:
        gk.gangs.done_with(g)
    lone = gk.incidents(forged)[-1]
    assert (lone["trust"], lone["action"]) == ("unverified", "NONE")
    assert not gk.calls("reset", forged) and not gke_stack.node_summary(gk.kube.node(forged))["fenced"]
    assert (inc["state"], inc["trust"], inc["action"]) == ("RESOLVED", "verified", "REBOOT_NODE")
    assert (
        inc["node"] is not None and inc["node"].get("cluster") == gk.state.cluster["name"]
    )  # a gce_instance line, placed in its cluster
    assert len(gk.calls("reset", bad)) == 1
    assert restarts == 1
    _on_partner_and_spare(gk, where, [bad])
    assert back


# -- the stack from the outside: kubectl and `pitstop local status` ------------------------------


def test_kubectl_gets_jobsets_with_the_stack_kubeconfig(gk: GkePipeline) -> None:
    g = gk.gangs.gang("kubectl", [_partner_spare(gk)[0]], [])
    try:
        kubeconfig = Path(gk.state.workdir, "kubeconfig")
        assert gk.state.kubeconfig == str(kubeconfig)
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
        gk.gangs.done_with(g)


def test_local_status_json_reports_k8s_nodes_and_jobsets(gk: GkePipeline) -> None:
    partner = _partner_spare(gk)[0]
    g = gk.gangs.gang("status", [partner], [])
    try:
        argv = [sys.executable, "-m", "pitstop.tools.cli", "local", "status", "--json"]
        proc = subprocess.run(
            [*argv, "--workdir", gk.state.workdir], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert "slurm_nodes" not in report
        nodes = {n["name"]: n for n in report["k8s_nodes"]}
        assert set(nodes) == set(gk.nodes)
        assert set(nodes[partner]) >= {"name", "ready", "unschedulable", "taints", "gpu_allocatable"}
        assert nodes[partner]["ready"] and nodes[partner]["gpu_allocatable"] == 8
        jobsets = {j["name"]: j for j in report["jobsets"]}
        assert jobsets["status"]["restarts"] == 0 and jobsets["status"]["nodes"] == [partner]
        # what each GKE incident did, from the fake API server's record (the xid79 scenario's
        # incident, when it ran before this test: fenced, one pod evicted, reset, unfenced)
        for inc in report["incidents"]:
            kube = inc["effects"]["kube"]
            assert set(kube) <= {"cordon", "taint", "evict", "untaint", "uncordon"}, inc
            if inc["action"] == "REBOOT_NODE" and inc["state"] == "RESOLVED":
                assert kube.get("taint") == kube.get("untaint") == 1, inc
                assert inc["effects"]["compute"].get("reset") == 1, inc
    finally:
        gk.gangs.done_with(g)


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


def test_stack_state_of_a_gke_stack_names_its_kubeconfig(gk: GkePipeline) -> None:
    state = StackState.load(gk.state.workdir)
    assert state.kubeconfig is not None and Path(state.kubeconfig).exists()
    assert state.slurm_conf == "" and "kube" in state.endpoints


def test_the_stacks_npd_sets_the_kernel_xid_condition_from_the_vms_ring_buffer(gk: GkePipeline) -> None:
    """The stack runs the NPD stand-in (local/npd.py) with infra/gke/npd.yaml's rule file: the kernel
    of a VM prints an Xid the device plugin does not watch and its Node gets PitstopKernelXid with that
    line (a driver line before it that is no Xid is passed over). The condition stays until the VM
    next boots."""
    node = gk.nodes[-1]
    gk.kernel_prints(node, "NVRM: GPU at PCI:0000:a1:00: GPU-6b2e1f0c")  # the driver, but no Xid
    line = "NVRM: Xid (PCI:0000:a1:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
    gk.kernel_prints(node, line)

    def cond() -> dict[str, Any] | None:
        got = [c for c in gk.kube.node(node)["status"]["conditions"] if c["type"] == "PitstopKernelXid"]
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

    doc = policy_for(spec())
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
