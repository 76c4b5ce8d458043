"""Exactly once, never stuck: actuate's in-progress records, request ids, the fail guard, requeue by run.

actuate runs against the Firestore emulator and the fake Compute Engine (the real client over
HTTP, request ids honoured); the scheduler is an in-memory gang whose requeue starts a new run.
tests/e2e/test_remediation.py runs the same paths end to end with real Slurm and the workflow runner.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.core import policy as policy_mod
from pitstop.core.classify import Classifier
from pitstop.core.domain import StepRecord
from pitstop.core.ids import request_id
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    FenceAnswer,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    StepRef,
    UnfenceAnswer,
)
from pitstop.local.compute_shapes import Call
from pitstop.local.fake_compute import DURATIONS, FakeCompute, serve
from pitstop.services.actuate import Actuator
from tests.helpers import PROJECT, ZONE, hand_edit, ops_agent_entry

pytestmark = pytest.mark.emulator

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU"
NODES = ("a3-node-000", "a3-node-001")
JOB = "4242"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Gang:
    """A scheduler (the typed contract) with one gang job on every node. A requeue starts a new run."""

    name = "slurm"

    def __init__(self) -> None:
        self.run = {"state": "RUNNING", "restarts": 0, "start_time": "2026-11-22T08:00:00"}
        self.requeues: list[str] = []
        self.fence_error: BaseException | None = None
        self.now: Callable[[], float] = lambda: 1_800_000_000.0  # the node's clock (the rig's)

    def info(self) -> JobInfo:
        return JobInfo(JOB, JobState.of(self.run["state"]), JobRun.of(self.run))

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [self.info()]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        if self.fence_error is not None:
            err, self.fence_error = self.fence_error, None
            raise err
        return FenceAnswer("MIXED", "", False, f"pitstop {ref.incident} {action}")

    def checkpoint(self, job: str, ref: StepRef) -> str:
        return "SIGUSR1"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return self.info()

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return True

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        return UnfenceAnswer(True)

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        self.requeues.append(ref.key)
        self.run = {**self.run, "restarts": int(str(self.run["restarts"])) + 1, "start_time": "Unknown"}
        return RequeueOutcome(job, True, "requeued")

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(False, "the gang's own nodes only", 2, 1)

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        return CheckStart(str(check["name"]), None, "this gang runs no checks")

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        if check["kind"] == "corroborate":  # the node's kernel printed the fault (dmesg --raw)
            dmesg = "".join(f"<4>[ 9.5] {x}\n" for x in (XID79, XID48))
            # date +%s.%N; cat /proc/uptime: 8.5 s since boot, so the lines were printed a second later
            return CheckResult(True, {"dmesg": dmesg, "clock": f"{self.now():.9f}\n8.50 60.00\n"})
        return CheckResult(False, error="this gang runs no checks")


class Notes:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def publish(self, notification: Mapping[str, Any]) -> str:
        self.sent.append(dict(notification))
        return str(len(self.sent))


class FlakySteps(FirestoreStepStore):
    """Step records whose writes fail where the store says (503, as an outage answers)."""

    def __init__(self, coll: Any, store: FlakyStore) -> None:
        super().__init__(coll)
        self.store = store

    def update_held(self, key: str, token: str, fields: StepRecord) -> bool:
        st = self.store
        if fields.get("state") == "done" and st.fail_put.get(key, 0) > 0:
            st.fail_put[key] -= 1
            raise gexc.ServiceUnavailable("firestore: unavailable")  # type: ignore[no-untyped-call]
        if fields.get("state") == "released" and st.fail_release > 0:
            st.fail_release -= 1
            raise gexc.ServiceUnavailable("firestore: unavailable")  # type: ignore[no-untyped-call]
        return super().update_held(key, token, fields)


class FlakyStore(IncidentStore):
    """The incident store, with Firestore failing where a test says (503, as an outage answers)."""

    def __init__(self, client: firestore.Client) -> None:
        super().__init__(client)
        self.fail_put: dict[str, int] = {}  # step record key -> failures of its result write
        self.fail_release = 0  # failures of the write that releases a claim

    def steps(self, iid: str) -> FirestoreStepStore:
        return FlakySteps(self.collections.incidents.document(iid).collection("steps"), self)


class Rig:
    def __init__(self, client: firestore.Client) -> None:
        self.clock = Clock()
        self.fake = FakeCompute(time_scale=0.001, clock=self.clock)
        for n in NODES:
            self.fake.add_instance(PROJECT, ZONE, n, mig="a3-node")
        self.server, endpoint = serve(self.fake)
        self.compute = ComputeAdapter(endpoint)
        self.policy = policy_mod.from_doc(
            {
                "mode": "enforce",
                "clusters": [
                    {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}
                ],
                "budgets": {
                    "cluster": {"max_nodes": 8, "max_percent": 100},
                    "zone": {"max_nodes": 8, "max_percent": 100},
                },
            }
        )
        self.store = FlakyStore(client)
        self.gang = Gang()
        self.gang.now = self.clock
        self.notes = Notes()
        self.actuator = Actuator(
            self.policy,
            self.store,
            self.compute,
            {"train": self.gang},
            self.notes,
            clock=self.clock,
        )
        self.n = 0

    def open(self, node: str, line: str = XID79) -> str:
        """An incident on the node (Xid 79: REBOOT_NODE), its step 1 decided; no starter starts it."""
        self.n += 1
        classifier = Classifier(self.policy.xids, Classifier.default().system_events)
        ev = classifier.classify(ops_agent_entry(line, instance=node, insert_id=f"x-{uuid.uuid4().hex}"))
        out = self.store.apply({**ev, "_observed_ts": self.clock()}, self.policy, self.clock())
        assert out.incident is not None and out.incident["step"] == 1, out
        return str(out.incident["id"])

    def call(self, op: str, iid: str, step: int = 1, execution: str = "exec-1", **extra: Any) -> Any:
        out = self.actuator.handle(
            {"op": op, "incident": iid, "step": step, "execution": execution, "extra": extra}
        )
        if op == "fence" and out[1] == 200:  # every fault here is real: the node confirms it
            for then in ("corroborate", "judge_corroboration"):
                req: dict[str, Any] = {
                    "op": then,
                    "incident": iid,
                    "step": step,
                    "execution": execution,
                    "extra": {},
                }
                assert self.actuator.handle(req)[1] == 200, then
        return out

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.fake.calls if c["method"] == method]


@pytest.fixture
def rig(fs_client: firestore.Client) -> Iterator[Rig]:
    r = Rig(fs_client)
    try:
        yield r
    finally:
        r.server.shutdown()


@pytest.mark.parametrize("release_fails", [False, True], ids=["released", "claim-expired"])
def test_a_result_lost_after_the_reset_does_not_reset_again(rig: Rig, release_fails: bool) -> None:
    iid = rig.open(NODES[0])
    assert rig.call("fence", iid)[1] == 200
    rig.store.fail_put["1-act"] = 1  # the reset happens, then its result cannot be written
    rig.store.fail_release = int(release_fails)  # ... nor, in the second case, the claim released
    body, status = rig.call("act", iid)
    assert status == 503 and body["retryable"] is True
    if release_fails:
        body, status = rig.call("act", iid)
        assert status == 503 and body["in_progress"] is True  # the claim holds until it expires
        rig.clock.now += rig.actuator.claim_s + 1
    body, status = rig.call("act", iid)
    assert status == 200 and body["method"] == "reset"
    assert len(rig.fake.effects_on(NODES[0], "reset")) == 1
    rid = request_id(iid, 1, "act", "reset")
    assert [c["request_id"] for c in rig.calls("reset")] == [rid, rid]  # repeated, and ignored
    again, status = rig.call("act", iid)
    assert status == 200 and again["replayed"] is True and again["operation"] == body["operation"]
    assert len(rig.calls("reset")) == 2


def test_a_concurrent_call_of_the_same_op_is_told_to_wait(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    assert rig.call("fence", iid)[1] == 200
    entered, release = threading.Event(), threading.Event()
    reset = rig.compute.reset

    def slow_reset(*args: Any, **kwargs: Any) -> str:
        if not entered.is_set():  # the first call blocks inside Compute until released
            entered.set()
            assert release.wait(30)
        return reset(*args, **kwargs)

    rig.compute.reset = slow_reset  # type: ignore[method-assign]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(rig.call, "act", iid)
        assert entered.wait(30)
        try:
            body, status = rig.call("act", iid, execution="exec-2")  # e.g. a duplicate execution
        finally:
            release.set()
        assert status == 503 and body["in_progress"] is True and body["retryable"] is True
        done, status = first.result(timeout=60)
    assert status == 200 and done["method"] == "reset"
    replay, status = rig.call("act", iid, execution="exec-2")
    assert status == 200 and replay["replayed"] is True
    assert len(rig.fake.effects_on(NODES[0], "reset")) == 1 and len(rig.calls("reset")) == 1


def test_a_retry_reuses_the_compute_method_chosen_before_the_call(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    hand_edit(rig.store, iid, lambda d: d.update({"action": "REPLACE_NODE"}))
    assert rig.call("fence", iid)[1] == 200
    rig.store.fail_put["1-act"] = 1
    assert rig.call("act", iid)[1] == 503  # the host was reported faulty; the record was lost
    # The report takes its course: the VM stops (it is no longer eligible for a report), and
    # deciding afresh would now recreate it under another id.
    rig.clock.now += (DURATIONS["report"] + 0.3 * DURATIONS["report_restart"]) * rig.fake.scale
    assert rig.compute.get(PROJECT, ZONE, NODES[0])["status"] in ("STOPPING", "REPAIRING")
    body, status = rig.call("act", iid)
    assert status == 200 and body["method"] == "reportHostAsFaulty"
    assert len(rig.fake.effects_on(NODES[0], "report_host_as_faulty")) == 1
    assert rig.calls("recreate") == []


def test_transient_pubsub_and_firestore_trouble_answers_503(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    for err in (
        concurrent.futures.TimeoutError(),  # a publish future that timed out (the Slurm command)
        TimeoutError("publish timed out"),
        gexc.DeadlineExceeded("publish deadline exceeded"),  # type: ignore[no-untyped-call]
        gexc.ServiceUnavailable("pubsub unavailable"),  # type: ignore[no-untyped-call]
    ):
        rig.gang.fence_error = err
        body, status = rig.call("fence", iid)
        assert status == 503 and body["retryable"] is True, err
    body, status = rig.call("fence", iid)
    assert status == 200 and body["jobs"] == [JOB]


def test_fail_never_turns_a_resolved_incident_into_failed(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    hand_edit(rig.store, iid, lambda d: d.update({"state": "RESOLVED"}))
    error = {"tags": ["HttpError"], "code": 500, "message": "HTTP server responded with error code 500"}
    body, status = rig.call("fail", iid, stage="close", error=error)
    assert status == 200 and body["outcome"] == "resolved" and body["state"] == "RESOLVED"
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == "RESOLVED" and "failure" not in inc
    assert not [n for n in rig.notes.sent if n.get("severity") == "critical"]


def test_fail_is_left_to_the_execution_that_owns_the_step(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    assert rig.call("claim", iid, execution="exec-1")[0]["ours"] is True
    body, _ = rig.call("fail", iid, execution="exec-2", stage="claim", error={"message": "boom"})
    assert body["outcome"] == "open"
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == "OPEN"
    body, _ = rig.call("fail", iid, step=1, execution="exec-1", stage="act", error={"message": "boom"})
    assert body["outcome"] == "failed"


def test_a_failure_before_the_fence_says_the_node_was_not_fenced(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    body, _ = rig.call("fail", iid, stage="claim", error={"message": "boom"})
    assert body["outcome"] == "failed"
    (page,) = [n for n in rig.notes.sent if n.get("severity") == "critical"]
    assert "was not fenced" in page["todo"] and "stays fenced" not in page["todo"]


def test_a_gang_is_requeued_once_per_run(rig: Rig) -> None:
    # both members of the gang fail in the same run; each incident fences its node
    first, second = rig.open(NODES[0]), rig.open(NODES[1])
    for iid in (first, second):
        body, _ = rig.call("fence", iid)
        assert body["runs"] == {JOB: {"restarts": 0, "start_time": "2026-11-22T08:00:00"}}
    body, _ = rig.call("reschedule", first)
    assert body["requeued"] == [JOB]
    rig.gang.run = {**rig.gang.run, "state": "RUNNING", "start_time": "2026-11-22T08:03:00"}  # runs again
    rig.clock.now += 700.0  # the second member's host report took 11 minutes: past any cooldown
    body, _ = rig.call("reschedule", second)
    assert body["requeued"] == [] and "moved on since the fence" in body["skipped"][0]["why"]
    assert rig.gang.requeues == [f"{first}-1"]


def test_two_incidents_that_see_the_same_run_requeue_it_once(rig: Rig) -> None:
    first, second = rig.open(NODES[0]), rig.open(NODES[1])
    for iid in (first, second):
        rig.call("fence", iid)
    requeue = rig.gang.requeue

    def unseen(job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        rig.gang.requeues.append(ref.key)
        return RequeueOutcome(job, True, "requeued (not yet visible)")

    rig.gang.requeue = unseen  # type: ignore[method-assign]
    try:  # the first requeue has not shown in Slurm yet when the second incident looks
        assert rig.call("reschedule", first)[0]["requeued"] == [JOB]
        body, _ = rig.call("reschedule", second)
    finally:
        rig.gang.requeue = requeue  # type: ignore[method-assign]
    assert body["requeued"] == [] and "already requeued for another incident" in body["skipped"][0]["why"]
    assert rig.store.records.mark_job_requeue("k-run-1", first, 0.0) is True
    assert rig.store.records.mark_job_requeue("k-run-1", first, 9e9) is True  # its own retry, at any time
    assert rig.store.records.mark_job_requeue("k-run-1", second, 9e9) is False  # no clock lets another in
    assert rig.store.records.mark_job_requeue("k-run-2", second, 0.0) is True  # a later run of the job


def test_escalation_is_decided_before_unfence_and_hands_the_jobs_over(rig: Rig) -> None:
    iid = rig.open(NODES[0], XID48)  # RESET_GPU
    rig.call("fence", iid)
    hand_edit(rig.store, iid, lambda d: d.update({"escalate_to": "REBOOT_NODE", "state": "VERIFYING"}))
    body, status = rig.call("escalate", iid)
    assert status == 200 and body["handed_over"] is True and "step 2" in body["outcome"]
    inc = rig.store.get(iid)
    assert inc is not None and inc["step"] == 2 and inc["action"] == "REBOOT_NODE"
    assert rig.call("escalate", iid)[0]["handed_over"] is True  # asked again: the same answer
    rig.gang.run = {**rig.gang.run, "start_time": "2026-11-22T09:00:00"}  # (not what step 1 saw)
    body, _ = rig.call("fence", iid, step=2)  # the next step takes step 1's jobs, with step 1's run
    assert body["runs"][JOB]["start_time"] == "2026-11-22T08:00:00"


def test_no_escalation_lets_the_step_go_on(rig: Rig) -> None:
    iid = rig.open(NODES[0])
    body, status = rig.call("escalate", iid)
    assert status == 200 and body == {"outcome": "continue", "handed_over": False}
