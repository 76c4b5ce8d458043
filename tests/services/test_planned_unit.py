"""A degraded node's planned move through actuate's ops, without emulators but for Monitoring's:
the memory store, the fake Compute Engine, the Monitoring stand-in served over gRPC and read by
the real client (adapters/monitoring.TelemetryReader), and an in-memory gang of two nodes.

What is checked here op by op (tests/e2e/test_e2e_planned.py runs the whole path on real Slurm): the
comparison is recorded once and replayed, a gang-wide cause stands down with nothing disrupted,
unreadable telemetry moves nothing (a page), and the repair follows the node check's finding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest

from pitstop.adapters.monitoring import TelemetryReader
from pitstop.adapters.prometheus import PromQLReader
from pitstop.core import alerts, policy
from pitstop.core.ops import Op
from pitstop.core.scheduling import CheckResult, JobInfo, JobRun, JobState, StepRef
from pitstop.core.states import State
from pitstop.local import alerting
from pitstop.local.fake_monitoring import FakeMonitoring
from pitstop.local.fake_monitoring import serve as serve_monitoring
from pitstop.local.fake_prometheus import FakePrometheus
from pitstop.local.fake_prometheus import serve as serve_prometheus
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from tests.helpers import PROJECT, ZONE
from tests.services.test_remediation_unit import JOB, NODE, TypedGang
from tests.services.test_remediation_unit import Rig as BaseRig

PEER = "a3-node-001"


class GangOfTwo(TypedGang):
    """The gang runs on NODE and PEER; its diagnostic prints what ``smi`` says about NODE."""

    def __init__(self) -> None:
        super().__init__()
        self.info = JobInfo(JOB, JobState.RUNNING, JobRun(0, "2026-11-24T08:00:00"), (NODE, PEER))
        self.smi = nvidia_smi.query(NodeState(NODE))

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        if check["kind"] == "diagnose":
            return CheckResult(True, {"nvidia_smi_q": self.smi})
        return super().check_result(node, check, ref)


class Rig(BaseRig):
    """test_remediation_unit's rig, with the gang of two and Monitoring's stand-in behind actuate."""

    def __init__(self) -> None:
        super().__init__()
        self.gang: GangOfTwo = GangOfTwo()
        self.gang.now = self.clock
        self.gpu: dict[str, dict[str, Any]] = {}
        self.monitoring, mon = serve_monitoring(FakeMonitoring(None, lambda: self.gpu))
        self.actuator.deps.schedulers = {"train": self.gang}
        self.actuator.deps.telemetry = TelemetryReader(mon)
        self.vm = next(i for i in self.fake.instances.values() if i.name == NODE)

    def open(self, stem: str = "gpu-throttle") -> str:
        """A degraded alert on NODE, as Monitoring publishes it, folded into the store as ingest does."""
        vm_id = str(self.vm.id)
        doc = alerting.notification(
            stem, "open", incident_id="0.deg4242", project=PROJECT, metric_labels={},
            resource_type="gce_instance", display_name=NODE, observed="0.6",
            resource_labels={"project_id": PROJECT, "zone": ZONE, "instance_id": vm_id},
            started_at=int(self.clock()) - 5,
        )  # fmt: skip
        ev = alerts.parse_notification(doc, None, (PROJECT, "pitstop-alerts"), "pitstop-alerts")
        assert ev["kind"] == "degraded", ev["reason"]
        out = self.store.apply({**ev, "_observed_ts": self.clock()}, self.policy, self.clock())
        assert out.incident is not None
        return str(out.incident["id"])

    def close(self) -> None:
        self.server.shutdown()
        self.monitoring.stop(0)

    def to_judge(self, iid: str) -> dict[str, Any]:
        for op in (Op.CLAIM, Op.FENCE, Op.CORROBORATE, Op.CORROBORATION):
            self.ok(op, iid)
        return self.ok(Op.JUDGE_CORROBORATION, iid)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with contextlib.closing(Rig()) as r:
        yield r


def test_a_straggler_among_quiet_peers_moves_and_the_comparison_is_recorded_once(rig: Rig) -> None:
    rig.gpu = {NODE: {"throttle": 0.6}}
    iid = rig.open()
    judged = rig.to_judge(iid)
    assert judged["confirmed"] is True and "stand_down" not in judged
    inc: Any = rig.store.get(iid) or {}
    rec = inc["corroboration"]
    assert (rec["verdict"], rec["node_value"], rec["peers"]) == ("move", 0.6, {PEER: 0.0})
    ev = rec["evidence"]  # the move rests on the node's own reading, read back by Pitstop
    assert (ev["probe"], ev["node"], ev["symptom"]) == ("telemetry", NODE, "throttle"), ev
    rig.gpu = {NODE: {"throttle": 0.6}, PEER: {"throttle": 0.6}}  # the readings change after the fact ...
    again = rig.ok(Op.CORROBORATE, iid)
    assert again["replayed"] is True and again["peers"]["verdict"] == "move"  # ... the decision does not
    rig.ok(Op.CHECKPOINT, iid)
    assert rig.ok(Op.RESCHEDULE_EARLY, iid)["mode"] == "early" and rig.gang.requeues == [f"{iid}-1"]


def test_a_gang_throttling_alike_stands_down_with_nothing_disrupted(rig: Rig) -> None:
    rig.gpu = {NODE: {"throttle": 0.5}, PEER: {"throttle": 0.45}}
    iid = rig.open()
    judged = rig.to_judge(iid)
    assert judged["stand_down"] is True and judged["verdict"] == "gang_wide"
    rig.ok(Op.UNFENCE, iid)  # the workflow's stand_down branch: unfence, then close
    assert rig.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    inc: Any = rig.store.get(iid) or {}
    assert inc["state"] == State.RESOLVED and inc["action"] == "DRAIN_NODE"
    assert "corroborated" not in inc["timeline"] and "job_requeued" not in inc["timeline"]
    assert rig.gang.fenced == [] and rig.gang.requeues == [] and rig.fake.effects_on(NODE, "reset") == []


def test_telemetry_that_cannot_be_read_moves_nothing_and_pages(rig: Rig) -> None:
    """Issue 35 (4): no reading of the node's own symptom, no move. The alert is a hint (a direct
    publisher to the alerts topic, or a writer of the DCGM series, can raise one): the fence is
    lifted, nothing is checkpointed, requeued or repaired, and the close pages a person."""
    rig.monitoring.stop(0)  # Monitoring unreachable: no reading at all
    iid = rig.open()
    judged = rig.to_judge(iid)
    assert judged["confirmed"] is False and judged["stand_down"] is True
    rec = cast(Any, rig.store.get(iid) or {})["corroboration"]
    assert rec["verdict"] == "unconfirmed" and rec["why"].startswith("telemetry unreadable"), rec
    assert "evidence" not in rec
    rig.ok(Op.UNFENCE, iid)  # the workflow's stand_down branch: unfence, then close
    assert rig.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    assert rig.gang.requeues == [] and rig.fake.effects_on(NODE, "reset") == []


@pytest.mark.parametrize(
    ("reason", "action"),
    [("thermal", "REPLACE_NODE"), ("power", "REBOOT_NODE")],  # HW slowdown is a finding, a power cap is not
)
def test_the_repair_follows_the_node_checks_finding(rig: Rig, reason: str, action: str) -> None:
    rig.gpu = {NODE: {"throttle": 0.6}}
    rig.gang.smi = nvidia_smi.query(NodeState(NODE, throttle=0.6, throttle_reason=reason))
    iid = rig.open()
    rig.to_judge(iid)
    for op in (Op.CHECKPOINT, Op.RESCHEDULE_EARLY):
        rig.ok(op, iid)
    assert rig.ok(Op.DIAGNOSE, iid)["run"] is True and rig.gang.checks[-1] == "diagnose"
    assert rig.ok(Op.JUDGE_DIAGNOSIS, iid)["action"] == action
    inc: Any = rig.store.get(iid) or {}
    assert inc["action"] == action and inc["escalations"][-1]["from"] == "DRAIN_NODE"
    assert inc["diagnosis"]["confirmed"] is (action == "REPLACE_NODE")


def test_no_replacement_on_the_alert_alone_when_the_node_check_never_finishes(rig: Rig) -> None:
    """A REPLACE needs the node check's finding: a diagnostic that never ran to its end is none."""
    rig.gpu = {NODE: {"throttle": 0.6}}
    rig.gang.smi = ""  # the check produced nothing readable (it died, or timed out)
    iid = rig.open()
    rig.to_judge(iid)
    for op in (Op.CHECKPOINT, Op.RESCHEDULE_EARLY, Op.DIAGNOSE):
        rig.ok(op, iid)
    judged = rig.ok(Op.JUDGE_DIAGNOSIS, iid)
    assert judged["action"] == "REBOOT_NODE" and judged["confirmed"] is False
    assert (
        rig.ok(Op.ACT, iid)["method"] == "reset" and rig.fake.effects_on(NODE, "report_host_as_faulty") == []
    )


def test_a_gke_nodes_peers_are_read_through_prometheus(rig: Rig) -> None:
    """A GKE cluster's node: the comparison asks Managed Service for Prometheus (the PromQL stand-in,
    dcgm-exporter's throttle reasons), not Cloud Monitoring's timeSeries (down here: never asked)."""
    prom = FakePrometheus(PROJECT, "train", ZONE, [NODE, PEER], lambda: rig.gpu)
    server, url = serve_prometheus(prom)
    gke = {"location": ZONE, "cluster": "train"}
    rig.actuator.deps.policy = policy.from_doc(
        {
            "mode": "enforce",
            "clusters": [
                {
                    "name": "train",
                    "scheduler": "gke",
                    "size": 8,
                    "match": {"name_pattern": "a3-*"},
                    "gke": gke,
                }
            ],
            "validation": {"enabled": False},
        }
    )
    rig.actuator.deps.prometheus = PromQLReader(url)
    rig.monitoring.stop(0)
    try:
        rig.gpu = {NODE: {"throttle": 0.6, "throttle_reason": "thermal"}}
        iid = rig.open()
        assert rig.to_judge(iid)["confirmed"] is True
    finally:
        server.shutdown()
    inc = rig.store.get(iid)
    assert inc is not None
    rec = inc["corroboration"]
    assert (rec["source"], rec["verdict"], rec["peers"]) == ("prometheus", "move", {PEER: 0.0}), rec["why"]
    assert (
        rec["node_value"] == pytest.approx(0.6, abs=0.05)
        and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in rec["why"]
    )
    assert prom.queries and all(NODE.replace("-", "\\\\-") in q for q in prom.queries)
