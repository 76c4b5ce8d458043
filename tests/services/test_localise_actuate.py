"""A hung job's localisation through actuate's ops, on the memory store, the fake Compute Engine
and the Monitoring stand-in (the job's heartbeat series, read back by the real client): the culprit
handed to exactly one node incident however often the conclusion is asked; a scheduler that cannot
check a job's nodes restarting nothing and paging; and a hang alert for a job that did not opt in,
or whose own heartbeat was never established, checking and restarting nothing (issue 35 (2)).

tests/e2e/test_e2e_hang.py runs the same ops through the workflow, the Monitoring stand-in and real Slurm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from google.cloud import monitoring_v3

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.memory_store import MemoryStore
from pitstop.adapters.monitoring import TelemetryReader
from pitstop.core import localise, policy
from pitstop.core.classify import Classifier
from pitstop.core.envelope import unwrap
from pitstop.core.ops import Op
from pitstop.core.scheduling import (
    CheckResult,
    FenceAnswer,
    GangCheckStart,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    StepRef,
)
from pitstop.core.states import State
from pitstop.local import trainer
from pitstop.local.fake_compute import FakeCompute, serve
from pitstop.local.fake_monitoring import FakeMonitoring
from pitstop.local.fake_monitoring import serve as serve_monitoring
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from pitstop.services.actuate import Actuator
from pitstop.services.close import close_incident
from tests.helpers import PROJECT, ZONE, alert_delivery, hand_edit, job_alert
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
        gang.info = dataclasses.replace(gang.info, opted_in=True)  # its owner opted it in
        self.monitoring, self.mon_endpoint = serve_monitoring(FakeMonitoring())
        cluster = {"name": "train", "scheduler": "slurm", "size": 16, "match": {"name_pattern": "a3-*"}}
        self.policy = policy.from_doc(
            {"mode": "enforce", "clusters": [{**cluster, "mig": {"name": "a3-node", "zone": ZONE}}]}
        )
        self.actuator = Actuator(
            self.policy, self.store, ComputeAdapter(endpoint), {"train": gang}, None, clock=self.clock
        )
        self.actuator.deps.telemetry = TelemetryReader(self.mon_endpoint)

    def beats(self, times: list[float]) -> None:
        """The job's heartbeat points at these times, written as README's snippet writes them."""
        client = trainer.heartbeat_client(self.mon_endpoint)
        for step, t in enumerate(times):
            series = monitoring_v3.TimeSeries()
            series.metric.type, series.resource.type = trainer.METRIC, "global"
            series.metric.labels.update({"cluster": "train", "job": JOB})
            point = {"interval": {"end_time": {"seconds": int(t)}}, "value": {"int64_value": step}}
            series.points = [monitoring_v3.Point(point)]
            client.create_time_series(name=f"projects/{PROJECT}", time_series=[series])

    def close(self) -> None:
        self.server.shutdown()
        self.monitoring.stop(0)

    def hang(self, established: bool = True) -> str:
        """The job beat every 30 s for 15 minutes (``established``), then stopped; its alert opens."""
        if established:
            self.beats([self.clock() - 1020 + 30 * i for i in range(30)])
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
    r.close()


@pytest.fixture
def blind() -> Iterator[HangRig]:
    r = HangRig(TypedGang())
    yield r
    r.close()


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
    node_incidents: list[Any] = [i for i in checking.store.query() if i["kind"] == "localised"]
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


def test_a_scheduler_that_cannot_check_a_jobs_nodes_restarts_nothing_and_pages(blind: HangRig) -> None:
    """Issue 35 (2): a restart needs what the job's nodes showed; nothing checked, nothing restarted
    (was: one restart in place on the alert alone)."""
    iid = blind.hang()
    assert blind.ok(Op.CLAIM, iid)["plan"] == "localise"
    assert blind.ok(Op.LOCALISE, iid)["run"] is False
    assert blind.ok(Op.LINKS, iid)["run"] is False
    done = blind.ok(Op.CONCLUDE, iid)
    assert done["outcome"] == "nothing_found" and done["requeued"] is False
    assert blind.ok(Op.CONCLUDE, iid)["replayed"] is True
    assert blind.gang.requeues == []
    assert blind.ok(Op.RESUMED, iid)["done"] is True  # nothing to wait for
    hang = blind.store.get(iid)
    assert hang is not None and "cannot check a job's nodes" in hang["localisation"]["page"]
    assert "not restarted" in hang["localisation"]["page"] and "job_requeued" not in hang["timeline"]
    assert blind.ok(Op.CLOSE, iid)["outcome"] == "resolved"


@pytest.mark.parametrize(
    ("opted_in", "beats", "words"),
    [
        (False, "established", "did not opt in"),  # a job that writes no heartbeat of its own
        (True, "one", "holds 1 points"),  # one forged point, then silence
        (True, "short", "holds 10 points over 270 s"),  # beat for under heartbeat_min_span_s
        (True, "none", "holds 0 points"),
        (True, "unreadable", "could not be read back"),
    ],
)
def test_a_hang_alert_the_job_never_earned_checks_and_restarts_nothing(
    checking: HangRig, opted_in: bool, beats: str, words: str
) -> None:
    """Issue 35 (2): anyone with monitoring.timeSeries.create writes one point of a running job's
    heartbeat and stops; Monitoring fires the absence alert and publishes a genuine notification.
    Only a job that opted in (the scheduler says so) and whose own series Pitstop reads back was
    established is checked at all; else the incident pages and nothing is swept, stopped or restarted."""
    gang = checking.gang
    assert isinstance(gang, CheckingGang)
    gang.info = dataclasses.replace(gang.info, opted_in=opted_in)
    now = checking.clock()
    points = {
        "established": [now - 1020 + 30 * i for i in range(30)],
        "one": [now - 180],
        "short": [now - 450 + 30 * i for i in range(10)],
    }.get(beats, [])
    checking.beats(points)
    if beats == "unreadable":
        checking.monitoring.stop(0)
    iid = checking.hang(established=False)
    assert checking.ok(Op.CLAIM, iid)["plan"] == "localise"
    loc = checking.ok(Op.LOCALISE, iid)
    assert (loc["run"], loc.get("refused")) == (False, True) and words in loc["why"], loc
    assert checking.ok(Op.LINKS, iid)["run"] is False
    done = checking.ok(Op.CONCLUDE, iid)
    assert done["outcome"] == "unconfirmed" and words in done["why"]
    assert gang.gang_checks == [] and gang.requeues == []  # nothing swept, stopped or restarted
    assert checking.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    hang: Any = checking.store.get(iid)
    assert hang["localisation"]["outcome"] == "unconfirmed" and words in hang["localisation"]["page"]
    assert [i for i in checking.store.query() if i["kind"] == "localised"] == []


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
    assert [i for i in checking.store.query() if i["kind"] == "localised"] == []


class StoppingGang(TypedGang):
    """A gang whose checks stop it first, as GKE's do (its pods hold the GPUs): the first start answers
    503 while its pods leave the nodes, and the conclusion resumes it once. It has no link test (a
    scheduler may not): that is said in a round of its own and in the page."""

    name = "gke"

    def __init__(self, bad: str | None = BAD) -> None:
        super().__init__()
        self.bad, self.starts = bad, 0
        self.events: list[str] = []

    def start_gang_check(self, job: str, check: Mapping[str, Any], ref: StepRef) -> GangCheckStart:
        if check["kind"] == localise.LINKS:
            return GangCheckStart(str(check["name"]), (), False, "this scheduler runs no link test")
        self.starts += 1
        self.info = JobInfo(JOB, JobState.SUSPENDED, self.info.run)  # its own stop, seen by a retry
        if self.starts == 1:
            raise ActuatorError(503, "waiting for the pods of the job to leave its nodes", True)
        return GangCheckStart(str(check["name"]), tuple(NODES), True)

    def gang_check_result(self, job: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        assert check["nodes"] == NODES  # the nodes it stopped, handed back
        outputs = {localise.output_key("nvidia_smi_q", n): nvidia_smi.query(NodeState(n, hung=n == self.bad))
                   for n in NODES}  # fmt: skip
        return CheckResult(True, outputs)

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        self.events.append(f"fence {node} for {ref.incident}")
        return super().fence(node, ref, action)

    def release_jobs(self, jobs: list[str], ref: StepRef) -> list[str]:
        self.events.append(f"release {','.join(jobs)} for {ref.key}")
        return [f"{j}: resumed" for j in jobs]

    def resume_gang(self, job: str, ref: StepRef) -> RequeueOutcome:
        self.events.append(f"resume {ref.key}")
        self.info = JobInfo(JOB, JobState.RUNNING, self.info.run)  # the same run: a suspend is no restart
        return RequeueOutcome(job, True, "resumed")


def test_a_gang_stopped_for_its_checks_is_resumed_once_past_its_fenced_culprit() -> None:
    rig = HangRig(StoppingGang())
    try:
        iid = rig.hang()
        assert rig.ok(Op.CLAIM, iid)["plan"] == "localise"
        body, status = rig.actuator.handle({"op": "localise", "incident": iid, "step": 1, "execution": "e1"})
        assert status == 503 and body["retryable"] is True  # the pods are still leaving: asked again
        started = rig.ok(Op.LOCALISE, iid)  # the job is SUSPENDED by now: its first view stands
        assert started["nodes"] == NODES and started["stopped"] is True and started["state"] == "RUNNING"
        assert rig.ok(Op.LINKS, iid)["sweep"]["culprits"] == [BAD]
        done = rig.ok(Op.CONCLUDE, iid)
        assert done["outcome"] == "culprits" and done["resumed"] is True
        node_iid = done["incidents"][BAD]
        gang = rig.gang
        assert isinstance(gang, StoppingGang)
        assert gang.events == [f"fence {BAD} for {node_iid}", f"resume {iid}-1"]  # fenced before it resumes
        assert rig.ok(Op.CONCLUDE, iid)["replayed"] is True and len(gang.events) == 2
        assert gang.requeues == []
        assert rig.ok(Op.RESUMED, iid)["running"] is True  # running again, though the same run
        assert rig.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    finally:
        rig.close()


def test_a_stopped_gang_with_no_culprit_is_resumed_in_place_once_and_paged_saying_links_not_run() -> None:
    rig = HangRig(StoppingGang(bad=None))
    try:
        iid = rig.hang()
        rig.ok(Op.CLAIM, iid)
        rig.actuator.handle({"op": "localise", "incident": iid, "step": 1, "execution": "e1"})
        assert rig.ok(Op.LOCALISE, iid)["stopped"] is True
        links = rig.ok(Op.LINKS, iid)
        assert links["run"] is False and "runs no link test" in links["skipped"]["why"]
        done = rig.ok(Op.CONCLUDE, iid)
        assert done["outcome"] == "nothing_found" and done["requeued"] is True
        gang = rig.gang
        assert isinstance(gang, StoppingGang) and gang.events == [f"resume {iid}-1"] and gang.requeues == []
        hang = rig.store.get(iid)
        assert hang is not None
        page = hang["localisation"]["page"]
        assert "links: not run" in page and "runs no link test" in page and "resumed in place once" in page
        assert all(n in page for n in NODES)
        assert rig.ok(Op.RESUMED, iid)["running"] is True
    finally:
        rig.close()


def test_a_person_closing_a_hang_that_failed_while_its_gang_was_stopped_resumes_the_gang() -> None:
    rig = HangRig(StoppingGang())
    try:
        iid = rig.hang()
        rig.ok(Op.CLAIM, iid)
        rig.actuator.handle({"op": "localise", "incident": iid, "step": 1, "execution": "e1"})
        assert rig.ok(Op.LOCALISE, iid)["stopped"] is True
        hand_edit(
            rig.store, iid, lambda d: d.update({"state": "FAILED"})
        )  # a later step failed: the gang stays stopped
        done = close_incident(rig.store, {"train": rig.gang}, iid, "alice", rig.clock() + 60, unfence=False)
        gang = rig.gang
        assert done.ok and f"{iid}: {JOB}: resumed" in done.lines
        assert isinstance(gang, StoppingGang) and gang.events == [f"release {JOB} for {iid}-closed"]
    finally:
        rig.close()
