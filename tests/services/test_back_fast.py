"""Back to training at once: early requeue, diagnose before replacing, validate before returning.

actuate runs against the Firestore emulator and the fake Compute Engine (as in test_exactly_once);
the scheduler is the in-memory gang, which here also answers capacity and runs its checks with
the GPU stand-ins (pitstop.local.gpu_tools, real nvidia-smi / dcgmi / all_gather_perf output
formats) as subprocesses, so what actuate judges is parsed from real formats. The same paths run
end to end on real Slurm in tests/e2e/test_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from google.cloud import firestore

from pitstop.core import policy as policy_mod
from pitstop.core.scheduling import Capacity, CheckResult, CheckStart, StepRef
from pitstop.services.actuate import Actuator
from tests.helpers import PROJECT, ZONE, hand_edit
from tests.services.test_exactly_once import JOB, NODES, XID79, Gang, Rig

pytestmark = pytest.mark.emulator

PEER = "a3-node-009"
PEER2 = "a3-node-010"  # the second healthy peer a busbw shortfall is measured against


def _tool(module: str, args: list[str], node: str, state: Mapping[str, Any]) -> str:
    env = {**os.environ, "PITSTOP_NODE": node, "PITSTOP_GPU_STATE": json.dumps(state)}
    out = subprocess.run(
        [sys.executable, "-m", f"pitstop.local.gpu_tools.{module}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout


class CheckingGang(Gang):
    """The gang scheduler, with capacity answers and checks run by the GPU stand-ins."""

    def __init__(self) -> None:
        super().__init__()
        self.free = 4  # idle healthy nodes besides the gang's own
        self.capacity_asked: list[str] = []
        self.started: list[dict[str, Any]] = []
        self.gpu_state: dict[str, dict[str, Any]] = {}
        self.peer: str | None = PEER
        self.more_peers: list[str] = [PEER2]
        self.apply_fabric = True  # False: a scheduler that runs NCCL one rank per node, no plugin
        self.finish = True

    def _peer(self, check: Mapping[str, Any]) -> str | None:
        """The first free peer the check may use (never one it already measured against)."""
        if not check.get("peer") or self.peer is None:
            return None
        return next(
            (p for p in (self.peer, *self.more_peers) if p not in check.get("exclude_peers", [])), None
        )

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        self.capacity_asked.append(job)
        need, free = 2, self.free + 1  # the gang's other node frees up when it is requeued
        return Capacity(free >= need, f"{free} free, needs {need}", need, free)

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        if check["kind"] == "corroborate":  # the fault confirmed on the node (Gang's ring buffer)
            return super().start_check(node, check, ref)
        self.started.append(dict(check))
        peer = self._peer(check)
        note = "" if peer or not check.get("peer") else "no idle healthy node in partition gpu"
        return CheckStart(str(check["name"]), peer, note)

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        if check["kind"] == "corroborate":
            return super().check_result(node, check, ref)
        if not self.finish:
            return CheckResult(False)
        level = str(check["dcgm_level"])
        out = {}
        if check["kind"] != "revalidate":  # the second peer's run is the NCCL test alone
            out["dcgm"] = _tool("dcgmi", ["diag", "-r", level, "-j"], node, self.gpu_state)
        peer = self._peer(check)
        if check["kind"] == "diagnose":
            out["nvidia_smi_q"] = _tool("nvidia_smi", ["-q"], node, self.gpu_state)
            out["nvlink"] = _tool("nvidia_smi", ["nvlink", "--status"], node, self.gpu_state)
        elif peer:
            out.update(self._nccl(node, peer, check))
        note = "" if peer or check["kind"] == "diagnose" else "no idle healthy node in partition gpu"
        return CheckResult(True, out, peer, None, note)

    def _nccl(self, node: str, peer: str, check: Mapping[str, Any]) -> dict[str, str]:
        """The all_gather as the ring runs it, at the slower of the two nodes, with either node's
        wrong data (the stand-in's rule)."""
        fabric = check.get("fabric") if self.apply_fabric else None
        per_rank = int(check["gpus"]) // int(fabric["ranks_per_node"]) if fabric else int(check["gpus"])
        args = ["-b", "1G", "-e", str(check["message_bytes"]), "-f", "2", "-g", str(per_rank)]
        speeds = [float(self.gpu_state.get(n, {}).get("busbw", 190.0)) for n in (node, peer)]
        wrong = max(int(self.gpu_state.get(n, {}).get("wrong", 0)) for n in (node, peer))
        ring = {
            **self.gpu_state,
            node: {**self.gpu_state.get(node, {}), "busbw": min(speeds), "wrong": wrong},
        }
        out = {"nccl": _tool("all_gather_perf", args, node, ring)}
        if fabric:
            out["nccl_setup"] = json.dumps(fabric)
        return out


class FastRig(Rig):
    def __init__(self, client: firestore.Client, **policy: Any) -> None:
        super().__init__(client)
        doc = {**self.policy.doc, **policy}
        self.policy = policy_mod.from_doc({k: v for k, v in doc.items() if k != "version"})
        self.gang = CheckingGang()
        self.gang.now = self.clock
        self.actuator = Actuator(
            self.policy,
            self.store,
            self.compute,
            {"train": self.gang},
            self.notes,
            clock=self.clock,
        )

    def ok(self, op: str, iid: str, step: int = 1) -> dict[str, Any]:
        body, status = self.call(op, iid, step)
        assert status == 200, (op, body)
        return dict(body)

    def repair(self, iid: str, step: int = 1) -> None:
        """fence, early requeue, diagnose, act and wait as the workflow does (the VM healthy after)."""
        for op in ("fence", "reschedule_early"):
            self.ok(op, iid, step)
        if self.ok("diagnose", iid, step)["run"]:
            assert self.ok("diagnosis", iid, step)["done"]
            self.ok("judge_diagnosis", iid, step)
        self.ok("act", iid, step)
        self.clock.now += 3600 * self.fake.scale + 1
        assert self.ok("operation", iid, step)["done"]
        assert self.ok("verify", iid, step)["done"]


@pytest.fixture
def make(fs_client: firestore.Client) -> Iterator[Any]:
    rigs: list[FastRig] = []

    def build(**policy: Any) -> FastRig:
        rigs.append(FastRig(fs_client, **policy))
        return rigs[-1]

    yield build
    for r in rigs:
        r.server.shutdown()


def _replace(rig: FastRig, node: str = NODES[0]) -> str:
    iid = rig.open(node, XID79)
    hand_edit(rig.store, iid, lambda d: d.update({"action": "REPLACE_NODE"}))
    return iid


# -- move the gang at once -----------------------------------------------------------------------


def test_with_capacity_the_gang_is_requeued_right_after_the_fence(make: Any) -> None:
    rig = make()
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    early = rig.ok("reschedule_early", iid)
    assert early["mode"] == "early" and [r["job"] for r in early["requeued"]] == [JOB]
    assert len(rig.gang.requeues) == 1 and rig.fake.effects_on(NODES[0], "reset") == []  # before any repair
    inc = rig.store.get(iid)
    assert inc is not None and inc["timeline"]["job_requeued"] and not inc["timeline"].get("job_running")
    rig.gang.run = {**rig.gang.run, "state": "RUNNING", "start_time": "2026-11-22T08:05:00"}
    rig.ok("act", iid)  # the repair goes on while the gang runs elsewhere
    rig.ok("operation", iid)  # a probe the workflow polls anyway sees the new run
    inc = rig.store.get(iid)
    assert inc is not None and inc["timeline"]["job_running"] <= rig.clock()
    assert inc["timeline"]["job_running"] >= inc["timeline"]["job_requeued"]
    again = rig.ok("reschedule", iid)  # once the node is back: nothing left to move
    assert again["requeued"] == [] and "moved on" in again["skipped"][0]["why"]
    assert len(rig.gang.requeues) == 1


def test_a_gang_still_on_its_old_run_is_not_seen_as_running_again(make: Any) -> None:
    rig = make()
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    rig.ok("reschedule_early", iid)
    rig.gang.run = {**rig.gang.run, "state": "PENDING"}
    assert rig.ok("resumed", iid) == {"done": False, "running": False}
    rig.gang.run = {**rig.gang.run, "state": "RUNNING"}
    assert rig.ok("resumed", iid)["done"] is True


def test_without_capacity_the_old_order_holds_and_the_incident_says_why(make: Any) -> None:
    rig = make()
    rig.gang.free = 0
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    early = rig.ok("reschedule_early", iid)
    assert early["mode"] == "after_repair" and early["requeued"] == []
    assert (
        "not enough healthy capacity" in early["waiting"][0]["why"]
        and "1 free, needs 2" in early["waiting"][0]["why"]
    )
    assert rig.gang.requeues == []
    inc = rig.store.get(iid)
    assert (
        inc is not None
        and inc["resume"]["waiting"][0]["job"] == JOB
        and not inc["timeline"].get("job_requeued")
    )
    late = rig.ok("reschedule", iid)
    assert late["requeued"] == [JOB] and len(rig.gang.requeues) == 1


def test_policy_after_repair_does_not_even_ask_for_capacity(make: Any) -> None:
    rig = make(resume={"reschedule": "after_repair"})
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    early = rig.ok("reschedule_early", iid)
    assert early["requeued"] == [] and "after_repair" in early["waiting"][0]["why"]
    assert rig.gang.capacity_asked == [] and rig.gang.requeues == []


def test_a_cluster_may_choose_its_own_order(make: Any) -> None:
    cluster = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}
    rig = make(resume={"reschedule": "early"}, clusters=[{**cluster, "reschedule": "after_repair"}])
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    assert rig.ok("reschedule_early", iid)["requeued"] == []


# -- diagnose before an irreversible action ------------------------------------------------------


def test_a_replace_the_diagnostic_does_not_confirm_steps_down_to_a_reboot(make: Any) -> None:
    rig = make()
    iid = _replace(rig)
    rig.repair(iid)
    assert [c["kind"] for c in rig.gang.started] == ["diagnose"]
    assert len(rig.fake.effects_on(NODES[0], "reset")) == 1  # rebooted, not reported
    assert rig.fake.effects_on(NODES[0], "report_host_as_faulty") == []
    inc = rig.store.get(iid)
    assert inc is not None and inc["action"] == "REBOOT_NODE"
    assert (
        inc["diagnosis"]["confirmed"] is False and "stepping down to REBOOT_NODE" in inc["diagnosis"]["why"]
    )
    assert inc["escalations"][-1]["from"] == "REPLACE_NODE" and inc["escalations"][-1]["to"] == "REBOOT_NODE"
    assert inc["timeline"]["diagnosed"]


def test_a_gpu_gone_from_the_bus_confirms_the_replacement(make: Any) -> None:
    rig = make()
    rig.gang.gpu_state = {NODES[0]: {"gpus": 7}}  # one GPU fell off the bus: nvidia-smi shows 7 of 8
    iid = _replace(rig)
    rig.repair(iid)
    reports = rig.fake.effects_on(NODES[0], "report_host_as_faulty")
    assert len(reports) == 1 and rig.fake.effects_on(NODES[0], "reset") == []
    inc = rig.store.get(iid)
    assert inc is not None and inc["action"] == "REPLACE_NODE" and inc["diagnosis"]["confirmed"] is True
    act = rig.ok("act", iid)  # replayed: the host report carries the diagnostic
    assert "diagnostic confirms" in act["description"] and "7" in act["description"]


def test_a_diagnostic_that_never_finished_is_no_evidence(make: Any) -> None:
    rig = make()
    rig.gang.finish = False
    iid = _replace(rig)
    rig.ok("fence", iid)
    rig.ok("reschedule_early", iid)
    assert rig.ok("diagnose", iid)["run"] is True
    assert rig.ok("diagnosis", iid)["done"] is False
    judged = rig.ok("judge_diagnosis", iid)  # the workflow's wait ran out
    assert judged["action"] == "REBOOT_NODE" and "did not finish" in judged["why"]


def test_a_job_that_could_not_move_early_is_requeued_before_the_check_needs_its_gpus(make: Any) -> None:
    rig = make()
    rig.gang.free = 0  # no capacity: the gang stays on the node after the fence
    rig.gang.gpu_state = {NODES[0]: {"gpus": 7}}
    iid = _replace(rig)
    rig.ok("fence", iid)
    assert rig.ok("reschedule_early", iid)["requeued"] == [] and rig.gang.requeues == []
    started = rig.ok("diagnose", iid)
    assert started["run"] is True and started["requeued_to_free"] == [JOB] and len(rig.gang.requeues) == 1
    assert rig.ok("diagnosis", iid)["done"]
    assert rig.ok("judge_diagnosis", iid)["confirmed"] is True
    rig.ok("act", iid)
    rig.clock.now += 3600 * rig.fake.scale + 1
    assert rig.ok("verify", iid)["done"]
    assert "requeued_to_free" not in rig.ok("validate", iid)  # it left already: nothing requeued twice
    assert rig.ok("reschedule", iid)["requeued"] == [] and len(rig.gang.requeues) == 1


def test_no_diagnostic_before_a_reboot(make: Any) -> None:
    rig = make()
    iid = rig.open(NODES[0])  # REBOOT_NODE
    rig.ok("fence", iid)
    assert rig.ok("diagnose", iid) == {"run": False, "why": "a diagnostic runs only before REPLACE_NODE"}


def test_a_replacement_a_measurement_asked_for_is_diagnosed_and_pages_when_not_confirmed(make: Any) -> None:
    """Issue 21 (5): validation's busbw shortfall alone never condemns a host: REPLACE always passes
    the diagnostic, and a diagnostic that finds nothing pages instead of rebooting again."""
    rig = make()
    measured = {"kind": "validate", "hardware_fault": True, "why": "busbw 120.00 GB/s < 169.86"}
    iid = _replace(rig, NODES[1])
    hand_edit(rig.store, iid, lambda d: d.update(measured=[measured]))
    rig.ok("fence", iid)
    started = rig.ok("diagnose", iid)
    assert started["run"] is True and "busbw 120.00" in started["why"]
    assert rig.ok("diagnosis", iid)["done"]
    body, status = rig.call("judge_diagnosis", iid)
    assert status == 409 and body["retryable"] is False and "a person decides" in body["error"]
    inc = rig.store.get(iid)
    assert inc is not None and inc["action"] == "REPLACE_NODE" and inc["diagnosis"]["confirmed"] is False
    assert rig.fake.effects_on(NODES[1], "report_host_as_faulty") == []
    assert rig.fake.effects_on(NODES[1], "reset") == []


@pytest.mark.parametrize(("machine_type", "expected"), [("a3-highgpu-4g", 4), ("n1-standard-8", None)])
def test_a_healthy_vm_with_fewer_than_eight_gpus_is_never_condemned_on_a_count(
    make: Any, machine_type: str, expected: int | None
) -> None:
    """Issue 21 (4): the expected GPU count is the VM's own (guestAccelerators); a machine type that
    lists none never confirms on a count. Before, any type outside the validation table expected 8."""
    rig = make()
    node = "a3-node-011"
    rig.fake.add_instance(PROJECT, ZONE, node, machine_type=machine_type, mig="a3-node")
    rig.gang.gpu_state = {node: {"total_gpus": 4, "gpus": 4}}  # all of its 4 GPUs healthy
    iid = _replace(rig, node)
    rig.repair(iid)
    spec = rig.gang.started[-1]
    assert spec["kind"] == "diagnose" and spec["expected_gpus"] == expected
    inc = rig.store.get(iid)
    assert inc is not None and inc["diagnosis"]["confirmed"] is False and inc["action"] == "REBOOT_NODE"
    assert inc["diagnosis"]["gpus_visible"] == 4 and inc["diagnosis"]["gpus_expected"] == expected
    assert (
        rig.fake.effects_on(node, "report_host_as_faulty") == []
        and rig.fake.effects_on(node, "recreate") == []
    )


def test_policy_can_turn_the_diagnostic_off(make: Any) -> None:
    rig = make(diagnose={"enabled": False, "dcgm_level": 1})
    iid = _replace(rig)
    rig.ok("fence", iid)
    assert rig.ok("diagnose", iid)["run"] is False and rig.gang.started == []


# -- validate before returning to service --------------------------------------------------------


def _validate(rig: FastRig, iid: str, step: int = 1) -> tuple[dict[str, Any], int]:
    started = rig.ok("validate", iid, step)
    assert started["run"] is True and started["machine_type"] == "a3-megagpu-8g"
    assert rig.ok("validation", iid, step)["done"]
    body, status = rig.call("judge_validation", iid, step)
    return dict(body), status


def test_a_healthy_node_passes_and_its_figures_go_on_the_incident(make: Any) -> None:
    rig = make()
    iid = rig.open(NODES[0])
    rig.repair(iid)
    body, status = _validate(rig, iid)
    assert status == 200 and body["outcome"] == "pass"
    spec = rig.gang.started[-1]
    assert spec["kind"] == "validate" and spec["dcgm_level"] == 2 and spec["message_bytes"] == 8 << 30
    inc = rig.store.get(iid)
    assert inc is not None and inc["validation"]["passed"] is True
    assert inc["validation"]["busbw_gbps"] == 190.0 and inc["validation"]["peer"] == PEER
    assert inc["validation"]["dcgm"] == "pass" and inc["timeline"]["validated"] >= inc["timeline"]["healthy"]
    assert rig.ok("escalate", iid)["outcome"] == "continue"


def _revalidate(rig: FastRig, iid: str, step: int = 1) -> tuple[dict[str, Any], int]:
    """The workflow after the first run: revalidate (and its wait, when it runs), then the judge."""
    again = rig.ok("revalidate", iid, step)
    if again["run"]:
        assert rig.ok("revalidation", iid, step)["done"]
    body, status = rig.call("judge_validation", iid, step)
    return dict(body), status


def test_a_reset_node_short_against_two_peers_steps_up_to_replace(make: Any) -> None:
    """Issue 21 (5): short against the first peer, then against a different one, both under the
    fabric's NCCL setup (8 ranks per node, the TCPXO profile): a hardware finding, REPLACE."""
    rig = make()
    rig.gang.gpu_state = {NODES[0]: {"busbw": 120}}
    iid = rig.open(NODES[0])
    rig.repair(iid)
    started = rig.ok("validate", iid)
    assert started["run"] is True and rig.gang.started[-1]["fabric"]["name"] == "GPUDirect-TCPXO"
    assert rig.ok("validation", iid)["done"]
    again = rig.ok("revalidate", iid)
    assert again["run"] is True and again["peer"] == PEER2 and "busbw short against " + PEER in again["why"]
    second = rig.gang.started[-1]
    assert second["kind"] == "revalidate" and second["exclude_peers"] == [PEER]
    assert second["fabric"] == rig.gang.started[-2]["fabric"] and second["message_bytes"] == 8 << 30
    assert rig.ok("revalidation", iid)["done"]
    body, status = rig.call("judge_validation", iid)
    assert status == 200 and body["outcome"] == "step_up" and body["verdict"] == "degraded"
    inc = rig.store.get(iid)
    assert inc is not None and inc["escalate_to"] == "REPLACE_NODE"
    assert inc["validation"]["busbw_gbps"] == 120.0 and inc["validation"]["threshold_gbps"] == 169.86
    assert [p["peer"] for p in inc["validation"]["nccl_peers"]] == [PEER, PEER2]
    handed = rig.ok("escalate", iid)  # the node stays fenced: the next step replaces it
    assert handed["handed_over"] is True
    inc = rig.store.get(iid)
    assert inc is not None and inc["step"] == 2 and inc["action"] == "REPLACE_NODE"
    assert "validation failed: busbw 120.00" in inc["escalations"][-1]["why"][0]
    assert f"against {PEER2}" in inc["escalations"][-1]["why"][0]
    rig.ok("fence", iid, 2)
    assert rig.ok("diagnose", iid, 2)["run"] is True  # REPLACE always passes the diagnostic


@pytest.mark.parametrize(("state", "first"), [({"busbw": 120}, "degraded"), ({"wrong": 4}, "corrupt")])
def test_a_shortfall_or_corrupt_data_only_against_the_first_peer_returns_the_node_and_names_the_peer(
    make: Any, state: dict[str, Any], first: str
) -> None:
    """The first peer is the slow one (or corrupts the ring's data, issue 21): the repaired node
    runs clean and at full speed with the second, so it returns to service; the incident names the
    first peer as suspect; nothing is replaced or reported."""
    rig = make()
    rig.gang.gpu_state = {PEER: state}
    iid = rig.open(NODES[0])
    rig.repair(iid)
    rig.ok("validate", iid)
    body, status = _revalidate(rig, iid)
    assert (
        status == 200 and body["outcome"] == "pass" and f"{PEER} or the path to it is suspect" in body["why"]
    )
    assert ("clean data" in body["why"]) is (first == "corrupt")
    inc = rig.store.get(iid)
    assert inc is not None and not inc.get("escalate_to") and inc["validation"]["passed"] is True
    assert inc["validation"]["peer"] == PEER2 and inc["validation"]["hardware_fault"] is False
    assert [(p["peer"], p["verdict"]) for p in inc["validation"]["nccl_peers"]] == [
        (PEER, first),
        (PEER2, "pass"),
    ]
    assert rig.ok("escalate", iid)["outcome"] == "continue"  # on to unfence
    assert rig.fake.effects_on(NODES[0], "report_host_as_faulty") == []


def test_corrupt_data_against_two_peers_steps_up_to_replace(make: Any) -> None:
    """Issue 21: all_gather returns wrong data (nccl-tests' #wrong > 0) against the first peer and
    again against a different one: the host's, a hardware finding, REPLACE (diagnostic first)."""
    rig = make()
    rig.gang.gpu_state = {NODES[0]: {"wrong": 4}}
    iid = rig.open(NODES[0])
    rig.repair(iid)
    rig.ok("validate", iid)
    assert rig.ok("validation", iid)["done"]
    again = rig.ok("revalidate", iid)
    assert again["run"] is True and again["peer"] == PEER2 and f"wrong data against {PEER}" in again["why"]
    assert rig.ok("revalidation", iid)["done"]
    body, status = rig.call("judge_validation", iid)
    assert status == 200 and body["outcome"] == "step_up" and body["verdict"] == "corrupt"
    inc = rig.store.get(iid)
    assert inc is not None and inc["escalate_to"] == "REPLACE_NODE"
    assert [(p["peer"], p["verdict"]) for p in inc["validation"]["nccl_peers"]] == [
        (PEER, "corrupt"),
        (PEER2, "corrupt"),
    ]
    assert rig.ok("escalate", iid)["handed_over"] is True
    rig.ok("fence", iid, 2)
    assert rig.ok("diagnose", iid, 2)["run"] is True  # REPLACE always passes the diagnostic


@pytest.mark.parametrize(
    ("state", "verdict"), [({"busbw": 120}, "degraded_one_peer"), ({"wrong": 4}, "corrupt_one_peer")]
)
def test_a_shortfall_or_corrupt_data_with_no_second_peer_pages_and_replaces_nothing(
    make: Any, state: dict[str, Any], verdict: str
) -> None:
    rig = make()
    rig.gang.more_peers = []
    rig.gang.gpu_state = {NODES[0]: state}
    iid = rig.open(NODES[0])
    rig.repair(iid)
    rig.ok("validate", iid)
    body, status = _revalidate(rig, iid)
    assert status == 409 and body["retryable"] is False and "no second healthy peer" in body["error"]
    inc = rig.store.get(iid)
    assert inc is not None and not inc.get("escalate_to") and inc["validation"]["hardware_fault"] is False
    assert inc["validation"]["verdict"] == verdict


def test_a_shortfall_measured_one_rank_per_node_pages_without_a_second_run(make: Any) -> None:
    """A scheduler that ran NCCL its own way (one rank per node driving 8 GPUs, no plugin): the low
    figure says nothing of the host, so no second peer is asked and nothing is replaced."""
    rig = make()
    rig.gang.apply_fabric = False
    rig.gang.gpu_state = {NODES[0]: {"busbw": 120}}
    iid = rig.open(NODES[0])
    rig.repair(iid)
    rig.ok("validate", iid)
    assert rig.ok("validation", iid)["done"]
    assert rig.ok("revalidate", iid)["run"] is False
    body, status = rig.call("judge_validation", iid)
    assert (
        status == 409
        and "did not run with the fabric's NCCL setup (GPUDirect-TCPXO)" in body["error"]
        and "no evidence against the host" in body["error"]
    )
    assert [c["kind"] for c in rig.gang.started].count("revalidate") == 0


def test_a_replaced_node_that_fails_pages_and_stays_fenced(make: Any) -> None:
    rig = make(diagnose={"enabled": False, "dcgm_level": 1})
    rig.gang.gpu_state = {NODES[0]: {"dcgm": "fail", "dcgm_gpu": 3}}
    iid = _replace(rig)
    rig.repair(iid)
    body, status = _validate(rig, iid)
    assert status == 409 and body["retryable"] is False and "DCGM diagnostic failed" in body["error"]
    inc = rig.store.get(iid)
    assert inc is not None and inc["validation"]["verdict"] == "dcgm_fail" and not inc.get("escalate_to")
    failed, status = rig.call("fail", iid, stage="validate", error={"message": body["error"]})
    assert status == 200 and failed["outcome"] == "failed"
    page = rig.notes.sent[-1]
    assert page["severity"] == "critical" and page["incident"]["validation"]["verdict"] == "dcgm_fail"
    assert "stays fenced" in page["todo"]


def test_without_a_free_peer_dcgm_decides_unless_policy_requires_one(make: Any) -> None:
    rig = make()
    rig.gang.peer = None
    iid = rig.open(NODES[0])
    rig.repair(iid)
    body, status = _validate(rig, iid)
    assert status == 200 and body["outcome"] == "pass" and "busbw not measured" in body["why"]
    strict = make(
        validation={**rig.policy.validation, "require_peer": True},
    )
    strict.gang.peer = None
    other = strict.open(NODES[1])
    strict.repair(other)
    body, status = _validate(strict, other)
    assert status == 409 and "require_peer" in body["error"]


def test_validation_that_never_finished_fails_closed(make: Any) -> None:
    rig = make()
    iid = rig.open(NODES[0])
    rig.repair(iid)
    rig.gang.finish = False
    assert rig.ok("validate", iid)["run"] is True
    assert rig.ok("validation", iid)["done"] is False
    body, status = rig.call("judge_validation", iid)
    assert status == 409 and "did not finish" in body["error"]


def test_a_node_outside_any_scheduler_is_not_validated(make: Any) -> None:
    # no scheduler, no channel to the node: corroboration could only page (tested in
    # test_remediation_unit); off here, so validation's own rule is what this test sees
    rig = make(clusters=[], corroboration={"enabled": False})
    iid = rig.open(NODES[0])
    rig.ok("fence", iid)
    skipped = rig.ok("validate", iid)
    assert skipped["run"] is False and "no scheduler" in skipped["why"]
