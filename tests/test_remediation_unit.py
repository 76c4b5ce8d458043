"""Remediation alone: actuate's ops on the memory store, the fake Compute Engine and an in-memory gang.

No emulator: the memory store keeps the Firestore store's semantics (tests/test_store_port.py), so
these tests check remediation's decisions and guards quickly; tests/test_remediation.py runs the
same ops through the workflow runner and real Slurm.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import policy
from pitstop.core.classify import Classifier
from pitstop.core.ops import MUTATING_OPS, PROBE_OPS, Op
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
from pitstop.core.states import State
from pitstop.local.fake_compute import FakeCompute, serve
from pitstop.services.actuate import Actuator
from pitstop.services.actuate.registry import OPS, Kind

from .helpers import PROJECT, ZONE, ops_agent_entry

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
NODE, JOB = "a3-node-000", "77"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class TypedGang:
    """A scheduler speaking the typed contract natively: one gang job whose requeue starts a new run."""

    name = "slurm"

    def __init__(self) -> None:
        self.info = JobInfo(JOB, JobState.RUNNING, JobRun(0, "2026-11-24T08:00:00"))
        self.fenced: list[str] = []
        self.requeues: list[str] = []

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [self.info]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        self.fenced.append(node)
        return FenceAnswer("MIXED", "", False, f"pitstop {ref.incident} {action}")

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        self.fenced.remove(node)
        return UnfenceAnswer(True)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        return "SIGUSR1"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return self.info

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return True

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        self.requeues.append(ref.key)
        self.info = JobInfo(JOB, JobState.RUNNING, JobRun((run.restarts or 0) + 1, "2026-11-24T08:05:00"))
        return RequeueOutcome(job, True, "requeued")

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(True, "2 idle nodes", 2, 3)

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        return CheckStart(str(check["name"]), None, "no peer here")

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        return CheckResult(False, error="this gang runs no checks")


class Rig:
    def __init__(self) -> None:
        self.clock = Clock()
        self.fake = FakeCompute(time_scale=0.001, clock=self.clock)
        self.fake.add_instance(PROJECT, ZONE, NODE, mig="a3-node")
        self.server, endpoint = serve(self.fake)
        self.store = MemoryStore()
        self.gang = TypedGang()
        self.policy = policy.from_doc(
            {
                "mode": "enforce",
                "clusters": [
                    {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}
                ],
                "validation": {"enabled": False},
            }
        )
        self.actuator = Actuator(
            self.policy, self.store, ComputeAdapter(endpoint), {"train": self.gang}, None, clock=self.clock
        )

    def open(self) -> str:
        entry = ops_agent_entry(XID79, instance=NODE, insert_id=uuid.uuid4().hex)
        ev = Classifier(self.policy.xids, Classifier.default().system_events).classify(entry)
        out = self.store.apply({**ev, "_observed_ts": self.clock()}, self.policy, self.clock())
        assert out.incident is not None and out.incident["step"] == 1
        return str(out.incident["id"])

    def call(self, op: Op, iid: str, execution: str = "exec-1", **extra: Any) -> tuple[dict[str, Any], int]:
        req = {"op": str(op), "incident": iid, "step": 1, "execution": execution, "extra": extra}
        return self.actuator.handle(req)

    def ok(self, op: Op, iid: str, execution: str = "exec-1") -> dict[str, Any]:
        body, status = self.call(op, iid, execution)
        assert status == 200, (op, body)
        return body


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.server.shutdown()


def _through_act(rig: Rig, iid: str) -> None:
    assert rig.ok(Op.CLAIM, iid)["ours"] is True
    for op in (Op.FENCE, Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.ACT):
        rig.ok(op, iid)


def test_every_op_has_one_handler_and_the_kinds_match_the_vocabulary() -> None:
    assert set(OPS) == set(Op)
    assert {op for op, spec in OPS.items() if spec.kind is Kind.EFFECT} == MUTATING_OPS
    assert {op for op, spec in OPS.items() if spec.kind is Kind.PROBE} == PROBE_OPS


def test_a_reboot_runs_through_every_phase_once(rig: Rig) -> None:
    iid = rig.open()
    _through_act(rig, iid)
    rig.clock.now += 3600 * rig.fake.scale + 1
    assert rig.ok(Op.OPERATION, iid)["done"] and rig.ok(Op.VERIFY, iid)["done"]
    for op in (Op.VALIDATE, Op.ESCALATE, Op.UNFENCE, Op.RESCHEDULE, Op.RESUMED):
        rig.ok(op, iid)
    assert rig.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == State.RESOLVED
    tl = inc["timeline"]
    assert tl["fenced"] <= tl["job_requeued"] <= tl["acted"] <= tl["healthy"] <= tl["resolved"]
    assert len(rig.fake.effects_on(NODE, "reset")) == 1 and rig.gang.requeues == [f"{iid}-1"]
    assert rig.gang.fenced == []
    assert rig.ok(Op.ACT, iid)["replayed"] is True  # a retried act replays; nothing is reset again
    assert len(rig.fake.effects_on(NODE, "reset")) == 1


def test_an_execution_that_missed_a_persons_close_never_acts(rig: Rig) -> None:
    """Issue 21 (7): a person closed the incident (``--close --unfence``) while its execution still
    ran; the execution's act must not reset the VM, nor turn the closed incident back into ACTING."""
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid)["ours"]
    rig.ok(Op.FENCE, iid)
    rig.store.mutate(iid, lambda d: d.update(state=State.FAILED))  # the watchdog failed it
    closed = rig.store.close(iid, "ops", rig.clock(), unfence=True)
    assert closed.result == "closed"
    body, status = rig.call(Op.ACT, iid)
    assert status == 409 and body["retryable"] is False and "incident is RESOLVED" in body["error"]
    assert rig.fake.effects_on(NODE, "reset") == []
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == State.RESOLVED and "acted" not in inc["timeline"]
    failed = rig.ok(Op.FAIL, iid)  # the workflow reports its failure: nothing is recorded over the close
    assert failed["recorded"] is False and (rig.store.get(iid) or {})["state"] == State.RESOLVED
    body, status = rig.call(Op.VERIFY, iid)  # nor does a probe move it
    assert status == 409 and (rig.store.get(iid) or {})["state"] == State.RESOLVED


def test_another_execution_may_not_act_on_a_claimed_step(rig: Rig) -> None:
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid, "exec-1")["ours"]
    rig.ok(Op.FENCE, iid, "exec-1")
    body, status = rig.call(Op.ACT, iid, execution="exec-2")
    assert status == 409 and "another execution (exec-1)" in body["error"]
    assert rig.fake.effects_on(NODE, "reset") == []
    assert rig.ok(Op.ACT, iid, "exec-1")["method"] == "reset"


def test_an_op_out_of_order_is_refused(rig: Rig) -> None:
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid)["ours"]
    body, status = rig.call(Op.ACT, iid)  # not fenced yet
    assert status == 409 and "incident is OPEN" in body["error"]
    assert rig.fake.effects_on(NODE, "reset") == []
