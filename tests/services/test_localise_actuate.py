"""A hung job's localisation through actuate's ops, on the memory store and the fake Compute Engine:
the culprit handed to exactly one node incident however often the conclusion is asked, and a
scheduler that cannot check a job's nodes (GKE today) restarting the gang in place once and paging.

tests/e2e/test_e2e_hang.py runs the same ops through the workflow, the Monitoring stand-in and real Slurm.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import localise, policy
from pitstop.core.classify import Classifier
from pitstop.core.envelope import unwrap
from pitstop.core.ops import Op
from pitstop.core.scheduling import CheckResult, GangCheckStart, JobInfo, JobRun, JobState, StepRef
from pitstop.core.states import State
from pitstop.local.fake_compute import FakeCompute, serve
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from pitstop.services.actuate import Actuator
from tests.helpers import PROJECT, ZONE, alert_delivery, job_alert
from tests.services.test_remediation_unit import JOB, Clock, TypedGang

NODES = [f"a3-node-{i:03d}" for i in range(16)]
BAD = NODES[11]


class CheckingGang(TypedGang):
    """A gang whose scheduler runs checks across the job: the sweep shows BAD's GPU stuck."""

    def __init__(self) -> None:
        super().__init__()
        self.gang_checks: list[str] = []

    def start_gang_check(self, job: str, check: Mapping[str, Any], ref: StepRef) -> GangCheckStart:
        self.gang_checks.append(str(check["kind"]))
        return GangCheckStart(str(check["name"]), tuple(NODES))

    def gang_check_result(self, job: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        outputs = {}
        for n in NODES:
            outputs[localise.output_key("nvidia_smi_q", n)] = nvidia_smi.query(NodeState(n, hung=n == BAD))
            outputs[localise.output_key("dmesg", n)] = "<6>[    1.000000] Linux version 6.8.0\n"
        return CheckResult(True, outputs)


class HangRig:
    def __init__(self, gang: TypedGang) -> None:
        self.clock = Clock()
        self.fake = FakeCompute(time_scale=0.001, clock=self.clock)
        for n in NODES:
            self.fake.add_instance(PROJECT, ZONE, n, mig="a3-node")
        self.server, endpoint = serve(self.fake)
        self.store, self.gang = MemoryStore(), gang
        cluster = {"name": "train", "scheduler": "slurm", "size": 16, "match": {"name_pattern": "a3-*"}}
        self.policy = policy.from_doc(
            {"mode": "enforce", "clusters": [{**cluster, "mig": {"name": "a3-node", "zone": ZONE}}]}
        )
        self.actuator = Actuator(
            self.policy, self.store, ComputeAdapter(endpoint), {"train": gang}, None, clock=self.clock
        )

    def hang(self) -> str:
        doc = job_alert("open", "0.hang", int(self.clock()) - 120, None, job=JOB)
        ev = Classifier.default().from_delivery(unwrap(alert_delivery(doc)), alert_delivery({})["source"])
        out = self.store.apply({**ev, "_observed_ts": self.clock()}, self.policy, self.clock())
        assert out.incident is not None and out.incident["localise"]["run"] is True
        return str(out.incident["id"])

    def ok(self, op: Op, iid: str) -> dict[str, Any]:
        body, status = self.actuator.handle({"op": str(op), "incident": iid, "step": 1, "execution": "e1"})
        assert status == 200, (op, body)
        return body


@pytest.fixture
def checking() -> Iterator[HangRig]:
    r = HangRig(CheckingGang())
    yield r
    r.server.shutdown()


@pytest.fixture
def blind() -> Iterator[HangRig]:
    r = HangRig(TypedGang())
    yield r
    r.server.shutdown()


def test_the_culprit_gets_one_node_incident_and_the_hang_hands_the_restart_to_it(checking: HangRig) -> None:
    iid = checking.hang()
    assert checking.ok(Op.CLAIM, iid)["plan"] == "localise"
    assert checking.ok(Op.LOCALISE, iid)["nodes"] == NODES
    assert checking.ok(Op.SWEEP, iid)["done"] is True
    links = checking.ok(Op.LINKS, iid)
    assert links["run"] is False and links["sweep"]["culprits"] == [BAD]  # found by the sweep: no ring test
    done = checking.ok(Op.CONCLUDE, iid)
    assert done["outcome"] == "culprits" and done["culprits"] == [BAD]
    assert checking.ok(Op.CONCLUDE, iid)["replayed"] is True
    node_incidents = [i for i in checking.store.list() if i["kind"] == "localised"]
    assert len(node_incidents) == 1 and node_incidents[0]["node"]["instance"] == BAD
    assert node_incidents[0]["id"] == done["incidents"][BAD] and node_incidents[0]["action"] == "REBOOT_NODE"
    assert node_incidents[0]["node"]["instance_id"] == str(
        checking.fake.get_instance(PROJECT, ZONE, BAD)["id"]
    )
    gang = checking.gang
    assert isinstance(gang, CheckingGang) and gang.gang_checks == ["sweep"]
    assert gang.requeues == []  # the restart is the node incident's (fenced, then requeued once per run)
    assert checking.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    hang = checking.store.get(iid)
    assert hang is not None and hang["state"] == State.RESOLVED and hang["timeline"]["localised"]


def test_a_scheduler_that_cannot_check_a_jobs_nodes_restarts_it_in_place_once_and_pages(
    blind: HangRig,
) -> None:
    iid = blind.hang()
    assert blind.ok(Op.CLAIM, iid)["plan"] == "localise"
    assert blind.ok(Op.LOCALISE, iid)["run"] is False
    assert blind.ok(Op.LINKS, iid)["run"] is False
    assert blind.ok(Op.CONCLUDE, iid)["outcome"] == "nothing_found"
    assert blind.ok(Op.CONCLUDE, iid)["replayed"] is True
    assert blind.gang.requeues == [f"{iid}-1"]  # once
    assert blind.ok(Op.RESUMED, iid)["running"] is True
    hang = blind.store.get(iid)
    assert hang is not None and "cannot check a job's nodes" in hang["localisation"]["page"]
    assert blind.ok(Op.CLOSE, iid)["outcome"] == "resolved"


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.PENDING])
def test_a_heartbeat_that_stopped_because_the_job_is_not_running_restarts_and_pages_nothing(
    checking: HangRig, state: JobState
) -> None:
    # A job that finished or was cancelled stops writing its heartbeat exactly like a hung one:
    # the absence alert fires for both (infra/monitoring/telemetry/job-heartbeat.json); the scheduler
    # tells them apart.
    checking.gang.info = JobInfo(JOB, state, JobRun(0, "2026-11-24T08:00:00"))
    iid = checking.hang()
    assert checking.ok(Op.CLAIM, iid)["plan"] == "localise"
    assert checking.ok(Op.LOCALISE, iid)["run"] is False
    assert checking.ok(Op.LINKS, iid)["run"] is False
    assert checking.ok(Op.CONCLUDE, iid)["outcome"] == "not_running"
    gang = checking.gang
    assert isinstance(gang, CheckingGang) and gang.gang_checks == [] and gang.requeues == []
    assert checking.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    hang = checking.store.get(iid)
    assert hang is not None and hang["state"] == State.RESOLVED
    assert f"is {state}" in hang["localisation"]["page"]
    assert [i for i in checking.store.list() if i["kind"] == "localised"] == []
