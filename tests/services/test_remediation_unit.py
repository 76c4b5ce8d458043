"""Remediation alone: actuate's ops on the memory store, the fake Compute Engine and an in-memory gang.

No emulator: the memory store keeps the Firestore store's semantics (tests/adapters/test_store_port.py), so
these tests check remediation's decisions and guards quickly; tests/e2e/test_remediation.py runs the
same ops through the workflow runner and real Slurm.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import pytest

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, policy, remediation
from pitstop.core.aggregate import CloseByPerson
from pitstop.core.classify import Classifier
from pitstop.core.domain import Budget
from pitstop.core.ops import Op
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
from pitstop.services.actuate.registry import MUTATING_OPS, OPS, PROBE_OPS, Kind
from tests.helpers import (
    PROJECT,
    ZONE,
    hand_edit,
    load_fixture,
    ops_agent_entry,
    partial_incident,
    retarget_system_event,
    system_event_entry,
)

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def smi_q(gpus: int) -> str:
    """``nvidia-smi -q`` of a node whose GPUs all answer (the stand-in's format)."""
    from pitstop.local.gpu_tools import nvidia_smi
    from pitstop.local.gpu_tools.state import NodeState

    return nvidia_smi.query(NodeState(NODE, gpus, gpus))


def lost_one() -> str:
    """``nvidia-smi -q`` of an 8-GPU node with one GPU fallen off the bus."""
    from pitstop.local.gpu_tools import nvidia_smi
    from pitstop.local.gpu_tools.state import NodeState

    return nvidia_smi.query(NodeState(NODE, 8, 7))


NODE, JOB = "a3-node-000", "77"


def boot_clock(now: float) -> str:
    """The check's clock read on the node (date +%s.%N; cat /proc/uptime): booted 811.25 s before
    ``now``, so the kernel line at 812.25 s since boot was printed a second after the check began."""
    return f"{now:.9f}\n811.25 6000.00\n"


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
        self.checks: list[str] = []
        # what the node's kernel ring buffer holds (dmesg --raw): the fault, printed by the kernel
        self.kmsg = f"<4>[  812.250000] {XID79}\n"
        self.now: Callable[[], float] = lambda: 1_800_000_000.0  # the node's clock (the rig's)

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
        self.checks.append(str(check["kind"]))
        return CheckStart(str(check["name"]), None, "no peer here")

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        if check["kind"] == "corroborate":
            return CheckResult(
                True, {"dmesg": self.kmsg, "clock": boot_clock(self.now()), "nvidia_smi_q": smi_q(8)}
            )
        return CheckResult(False, error="this gang runs no checks")


class Rig:
    def __init__(self) -> None:
        self.clock = Clock()
        self.fake = FakeCompute(time_scale=0.001, clock=self.clock)
        self.fake.add_instance(PROJECT, ZONE, NODE, mig="a3-node")
        self.server, endpoint = serve(self.fake)
        self.store = MemoryStore()
        self.gang = TypedGang()
        self.gang.now = self.clock
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

    def open(self, node: str = NODE) -> str:
        entry = ops_agent_entry(XID79, instance=node, insert_id=uuid.uuid4().hex)
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
    for op in (Op.FENCE, Op.CORROBORATE, Op.CORROBORATION, Op.JUDGE_CORROBORATION):
        rig.ok(op, iid)
    for op in (Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.ACT):
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
    hand_edit(rig.store, iid, lambda d: d.update({"state": State.FAILED}))  # the watchdog failed it
    closed = rig.store.decide(iid, CloseByPerson("ops", True), None, rig.clock())
    assert closed.result == "closed"
    body, status = rig.call(Op.ACT, iid)
    assert status == 409 and body["retryable"] is False and "incident is RESOLVED" in body["error"]
    assert rig.fake.effects_on(NODE, "reset") == []
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == State.RESOLVED and "acted" not in inc["timeline"]
    failed = rig.ok(Op.FAIL, iid)  # the workflow reports its failure: nothing is recorded over the close
    assert failed["recorded"] is False and cast(Any, rig.store.get(iid) or {})["state"] == State.RESOLVED
    body, status = rig.call(Op.VERIFY, iid)  # nor does a probe move it
    assert status == 409 and cast(Any, rig.store.get(iid) or {})["state"] == State.RESOLVED


def test_another_execution_may_not_act_on_a_claimed_step(rig: Rig) -> None:
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid, "exec-1")["ours"]
    for op in (Op.FENCE, Op.CORROBORATE, Op.JUDGE_CORROBORATION):
        rig.ok(op, iid, "exec-1")
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


# -- issue 21 (1): log evidence is corroborated on the node before anything is disrupted ----------


def _fenced(rig: Rig) -> str:
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid)["ours"]
    rig.ok(Op.FENCE, iid)
    return iid


def test_a_fault_the_node_confirms_goes_on_and_says_what_was_checked(rig: Rig) -> None:
    iid = _fenced(rig)
    assert rig.ok(Op.CORROBORATE, iid)["run"] is True and rig.gang.checks == ["corroborate"]
    assert rig.ok(Op.CORROBORATION, iid)["done"] is True
    assert rig.ok(Op.JUDGE_CORROBORATION, iid)["confirmed"] is True
    inc = rig.store.get(iid)
    assert inc is not None and inc["corroboration"]["confirmed"] is True
    assert any("kernel ring buffer" in c for c in inc["corroboration"]["checked"])
    assert "corroborated" in inc["timeline"] and rig.gang.requeues == []  # nothing moved yet
    rig.ok(Op.RESCHEDULE_EARLY, iid)
    assert rig.gang.requeues == [f"{iid}-1"]


@pytest.mark.parametrize(
    "kmsg",
    [
        "",  # the line was written through the Logging API: the node's kernel never printed it
        f"<12>[  812.250000] {XID79}\n",  # written to /dev/kmsg from user space (facility LOG_USER)
        "<4>[  812.250000] NVRM: Xid (PCI:0000:a1:00): 13, Graphics Exception\n",  # another Xid
    ],
    ids=["forged-through-the-api", "user-space-kmsg", "another-xid"],
)
def test_a_fault_the_node_does_not_show_pages_and_disrupts_nothing(rig: Rig, kmsg: str) -> None:
    """Issue 21 (1): a verified-looking entry for another VM: fenced, paged, no requeue, no Compute call."""
    rig.gang.kmsg = kmsg
    iid = _fenced(rig)
    rig.ok(Op.CORROBORATE, iid)
    body, status = rig.call(Op.JUDGE_CORROBORATION, iid)
    assert status == 409 and body["retryable"] is False and "not confirmed on the node" in body["error"]
    for op in (Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.ACT, Op.RESCHEDULE):
        body, status = rig.call(op, iid)
        assert status == 409 and body["retryable"] is False, op  # the incident stood down: RESOLVED
    assert rig.gang.requeues == [] and rig.gang.fenced == []  # Pitstop's fence lifted at once
    assert rig.fake.effects_on(NODE, "reset") == []
    assert rig.ok(Op.FAIL, iid)["recorded"] is False  # the workflow's failure: nothing over the stand-down
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == State.RESOLVED and "not confirmed" in inc["rejected"]["why"]
    assert inc["corroboration"]["confirmed"] is False and inc["corroboration"]["checked"]
    assert all(iid not in b["slots"] for b in _budgets(rig, iid))  # no slot held, none counts on
    node = rig.store.records.node(inc["node_key"])
    assert node is not None
    assert [r for r in node["remediations"] if r["incident"] == iid] == []  # no ladder, lemon, cooldown


def _budgets(rig: Rig, iid: str) -> list[Budget]:
    found = [rig.store.records.budget(scope) for scope in rig.store.get(iid)["budget_scopes"]]  # type: ignore[index]
    assert found and all(b is not None for b in found)
    return [b for b in found if b is not None]


def test_unconfirmed_faults_page_once_per_node_per_window(rig: Rig) -> None:
    """Issue 35 (5): forged lines cannot keep a node fenced, hold budget slots, or flood the pager:
    each unconfirmed incident stands down at once, and only the first within the window pages."""
    rig.gang.kmsg = ""
    pages = []
    for _ in range(2):
        iid = _fenced(rig)
        rig.ok(Op.CORROBORATE, iid)
        assert rig.call(Op.JUDGE_CORROBORATION, iid)[1] == 409
        pages += [e for e in rig.store.docs.outbox.values() if e["notification"]["kind"] == "page"
                  and e["notification"]["incident"]["id"] == iid]  # fmt: skip
        rig.clock.now += 60
    assert len(pages) == 1


def test_a_gpu_missing_from_the_bus_confirms_without_a_kernel_line(rig: Rig) -> None:
    rig.gang.kmsg = ""
    seven = CheckResult(True, {"dmesg": "", "nvidia_smi_q": lost_one(), "gpu_grant": "gpu:8"})
    rig.gang.check_result = lambda node, check, ref: seven  # type: ignore[method-assign]
    iid = _fenced(rig)
    rig.ok(Op.CORROBORATE, iid)
    assert rig.ok(Op.JUDGE_CORROBORATION, iid)["confirmed"] is True
    inc = rig.store.get(iid)
    assert inc is not None and "7 of 8 GPUs visible" in inc["corroboration"]["why"]


def test_the_node_is_asked_for_a_line_printed_after_its_last_remediation_took_effect(rig: Rig) -> None:
    """Issue 35 (1): a line printed before the node's last remediation (a GPU reset leaves the ring
    buffer as it was) says nothing of a new episode. The check is bounded by when that remediation
    took effect: the earlier incident's ``acted`` time, read from the node's history."""
    rig.policy = rig.actuator.deps.policy = policy.from_doc(
        {**rig.policy.doc, "cooldowns": {"REBOOT_NODE": 0}}
    )
    first = rig.open()
    _through_act(rig, first)
    rig.clock.now += 3600 * rig.fake.scale + 1
    for op in (Op.OPERATION, Op.VERIFY, Op.VALIDATE, Op.ESCALATE, Op.UNFENCE, Op.RESCHEDULE, Op.RESUMED):
        rig.ok(op, first)
    assert rig.ok(Op.CLOSE, first)["outcome"] == "resolved"
    acted = cast(Any, rig.store.get(first) or {})["timeline"]["acted"]
    rig.clock.now += rig.policy.budget_window_s + 1  # the first one's budget slot lapses
    second = rig.open()
    assert rig.ok(Op.CLAIM, second)["ours"]
    rig.ok(Op.FENCE, second)
    check = rig.ok(Op.CORROBORATE, second)["check"]
    assert check["remediated_at"] == acted and check["since"] == rig.clock.now, check
    assert (check["xids"], check["pcis"]) == ([79], ["0000:a1:00"])
    rig.gang.now = lambda: acted - 20  # the node's ring buffer holds only the line of before the reset
    rig.ok(Op.CORROBORATION, second)
    body, status = rig.call(Op.JUDGE_CORROBORATION, second)
    assert status == 409 and "not confirmed on the node" in body["error"], body
    assert len(rig.fake.effects_on(NODE, "reset")) == 1  # the first incident's, only


@pytest.mark.parametrize("grant", [None, "gpu:4"])
def test_a_low_gpu_count_from_a_step_that_may_see_fewer_gpus_is_no_evidence(
    rig: Rig, grant: str | None
) -> None:
    """Issue 35 (11): nvidia-smi in a job step that did not ask for the node's GPUs explicitly (an
    exclusive job's step gets none of its implicit GRES; ConstrainDevices=yes hides the rest) prints
    "No devices were found": that once read as 0 of 8 GPUs visible and confirmed a forged line."""
    rig.gang.kmsg = ""
    outputs = {"dmesg": "", "nvidia_smi_q": "No devices were found\n"} | (
        {"gpu_grant": grant} if grant else {}
    )
    rig.gang.check_result = lambda node, check, ref: CheckResult(True, outputs)  # type: ignore[method-assign]
    iid = _fenced(rig)
    rig.ok(Op.CORROBORATE, iid)
    body, status = rig.call(Op.JUDGE_CORROBORATION, iid)
    assert status == 409 and "not confirmed on the node" in body["error"]
    inc = rig.store.get(iid)
    assert inc is not None and any("the count is no evidence" in c for c in inc["corroboration"]["checked"])
    assert rig.gang.requeues == [] and rig.fake.effects_on(NODE, "reset") == []


def test_corroboration_off_in_policy_acts_on_the_log_as_before(rig: Rig) -> None:
    rig.actuator.deps.policy = policy.from_doc({**rig.policy.doc, "corroboration": {"enabled": False}})
    iid = _fenced(rig)
    assert rig.ok(Op.CORROBORATE, iid)["run"] is False and rig.gang.checks == []
    assert rig.ok(Op.JUDGE_CORROBORATION, iid)["confirmed"] is None
    rig.ok(Op.RESCHEDULE_EARLY, iid)
    assert rig.gang.requeues == [f"{iid}-1"]


def _preemption(rig: Rig, node: str) -> str:
    """Google's preemption shape for ``node``, timestamped now, through the engine."""
    entry = system_event_entry(next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted"))
    retarget_system_event(entry, node)
    entry["resource"]["labels"]["instance_id"] = rig.fake.get_instance(PROJECT, ZONE, node)["id"]
    entry["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rig.clock()))
    ev = Classifier(rig.policy.xids, Classifier.default().system_events).classify(entry)
    assert ev["kind"] == "preemption", ev
    out = rig.store.apply({**ev, "_observed_ts": rig.clock()}, rig.policy, rig.clock())
    assert out.incident is not None
    return str(out.incident["id"])


def test_a_system_event_published_straight_to_the_topic_restarts_nothing(rig: Rig) -> None:
    """Issue 21 (3): an Editor publishes Google's preemption shape for a Spot VM that runs on.
    Compute shows no stop since long before the event: paged, no requeue, no Compute mutation."""
    spot = "a3-spot-001"
    rig.fake.add_instance(PROJECT, ZONE, spot, provisioning="SPOT", mig="a3-node")
    iid = _preemption(rig, spot)
    assert rig.ok(Op.CLAIM, iid)["ours"]
    rig.ok(Op.FENCE, iid)
    assert rig.ok(Op.CORROBORATE, iid)["run"] is False and rig.gang.checks == []
    body, status = rig.call(Op.JUDGE_CORROBORATION, iid)
    assert status == 409 and "Compute shows no stop (lastStopTimestamp)" in body["error"]
    assert rig.call(Op.RESCHEDULE_EARLY, iid)[1] == 409 and rig.gang.requeues == []
    assert [c for c in rig.fake.calls if c["method"] != "get"] == []


def test_a_real_preemption_is_confirmed_by_compute(rig: Rig) -> None:
    spot = "a3-spot-002"
    rig.fake.add_instance(PROJECT, ZONE, spot, provisioning="SPOT", mig="a3-node")
    rig.fake.preempt(PROJECT, ZONE, spot)
    iid = _preemption(rig, spot)
    assert rig.ok(Op.CLAIM, iid)["ours"]
    for op in (Op.FENCE, Op.CORROBORATE):
        rig.ok(op, iid)
    assert rig.ok(Op.JUDGE_CORROBORATION, iid)["confirmed"] is True
    rig.ok(Op.RESCHEDULE_EARLY, iid)
    assert rig.gang.requeues == [f"{iid}-1"]


def test_maintenance_the_platform_must_start_is_not_done_before_its_window(rig: Rig) -> None:
    """Issue 21 (6): with canReschedule false Pitstop cannot start the maintenance; the node must not
    return to service (and the job be hit again) until the platform's window is over."""
    entry = rig.fake.schedule_maintenance(PROJECT, ZONE, NODE, starts_in_s=600)
    vm = rig.fake.instances[f"projects/{PROJECT}/zones/{ZONE}/instances/{NODE}"]
    assert vm.maintenance is not None
    vm.maintenance["canReschedule"] = False
    ev = Classifier(rig.policy.xids, Classifier.default().system_events).classify(entry)
    assert ev["action"] == "DRAIN_NODE", ev
    out = rig.store.apply({**ev, "_observed_ts": rig.clock()}, rig.policy, rig.clock())
    assert out.incident is not None
    iid = str(out.incident["id"])
    assert rig.ok(Op.CLAIM, iid)["ours"]
    for op in (Op.FENCE, Op.CORROBORATE, Op.JUDGE_CORROBORATION, Op.RESCHEDULE_EARLY, Op.DIAGNOSE):
        rig.ok(op, iid)
    acted = rig.ok(Op.ACT, iid)
    assert acted["method"] == "wait_for_platform" and acted["verify_wait_s"] > 600 + 3 * 3600
    assert rig.ok(Op.VERIFY, iid)["done"] is False  # running, but the window is still ahead
    vm.maintenance = None
    assert rig.ok(Op.VERIFY, iid)["done"] is True  # the platform reports it done


def test_a_job_restarted_past_its_disruption_budget_is_held_for_a_person(rig: Rig) -> None:
    """Budgets capped concurrent nodes, not gang restarts: one job could be kept restarting forever.
    Past budgets.job_restarts (gang restarts per job per window) the job is not requeued and a
    person is paged; the node's own repair goes on."""
    wide = {"max_nodes": 8, "max_percent": 100}
    restarts = {"max": 2, "window_s": 3600}
    budgets = {**rig.policy.doc["budgets"], "cluster": wide, "zone": wide, "block": wide}
    budgets["job_restarts"] = restarts
    doc = {**rig.policy.doc, "budgets": budgets}  # one block
    rig.policy = rig.actuator.deps.policy = policy.from_doc(doc)
    nodes = [f"a3-node-00{n}" for n in range(1, 5)]
    for n in nodes:
        rig.fake.add_instance(PROJECT, ZONE, n, mig="a3-node")

    def one(node: str) -> dict[str, Any]:
        iid = rig.open(node)
        assert rig.ok(Op.CLAIM, iid)["ours"]
        for op in (Op.FENCE, Op.CORROBORATE, Op.JUDGE_CORROBORATION):
            rig.ok(op, iid)
        return rig.ok(Op.RESCHEDULE_EARLY, iid)

    answers = [one(n) for n in nodes[:3]]  # three faults on three members, one after the other
    assert [len(a["requeued"]) for a in answers] == [1, 1, 0]
    assert "budgets.job_restarts" in answers[2]["skipped"][0]["why"]
    assert len(rig.gang.requeues) == 2
    rig.clock.now += 3601  # the window slid past the first two
    assert len(one(nodes[3])["requeued"]) == 1


def test_a_spent_job_budget_holds_the_repair_under_the_running_job(rig: Rig) -> None:
    """Issue 35 (8): the job budget capped requeues, not disruption: with it spent, the next
    confirmed fault still reset the VM under the running job, which then was never restarted.
    Now the repair claims the job's restart first; spent, it does not act (409: a page, the node
    stays fenced for a person)."""
    wide = {"max_nodes": 8, "max_percent": 100}
    budgets = {**rig.policy.doc["budgets"], "cluster": wide, "zone": wide, "block": wide}
    budgets["job_restarts"] = {"max": 1, "window_s": 3600}
    rig.policy = rig.actuator.deps.policy = policy.from_doc({**rig.policy.doc, "budgets": budgets})
    for n in ("a3-node-001", "a3-node-002"):
        rig.fake.add_instance(PROJECT, ZONE, n, mig="a3-node")

    def confirmed(node: str) -> str:
        iid = rig.open(node)
        assert rig.ok(Op.CLAIM, iid)["ours"]
        for op in (Op.FENCE, Op.CORROBORATE, Op.JUDGE_CORROBORATION, Op.RESCHEDULE_EARLY):
            rig.ok(op, iid)
        return iid

    confirmed("a3-node-001")  # the job's one restart in the window: requeued early
    second = confirmed("a3-node-002")  # over budget: the job stays on its run, on this node
    assert len(rig.gang.requeues) == 1
    body, status = rig.call(Op.ACT, second)
    assert status == 409 and "not acted" in body["error"] and "budgets.job_restarts" in body["error"]
    assert rig.fake.effects_on("a3-node-002", "reset") == []
    inc = rig.store.get(second)
    assert inc is not None and inc["state"] == State.FENCED and "acted" not in inc["timeline"]


def test_a_node_counts_against_its_block_from_the_claim_and_a_full_block_holds_before_the_fence(
    rig: Rig,
) -> None:
    """Issue 21 (11): a node joined its reservation block's budget only once acted on, so while the
    first node of a block was being fenced and checked, any number of its neighbours could be
    fenced too. Now the claim reads the block (Compute's physicalHostTopology) before the fence."""
    wide = {"max_nodes": 8, "max_percent": 100}
    one = {"max_nodes": 1, "max_percent": 100}
    budgets = {**rig.policy.doc["budgets"], "cluster": wide, "zone": wide, "block": one}
    rig.policy = rig.actuator.deps.policy = policy.from_doc({**rig.policy.doc, "budgets": budgets})
    rig.fake.add_instance(PROJECT, ZONE, "a3-node-001", mig="a3-node")  # same block as NODE
    first = rig.open()
    assert rig.ok(Op.CLAIM, first)["ours"]
    block = engine.block_scope("c1/block-1")
    assert block in cast(Any, rig.store.get(first) or {})["budget_scopes"]  # before the fence, before any act
    second = rig.open("a3-node-001")  # its node's block is not known yet: the decision lets it go
    claimed = rig.ok(Op.CLAIM, second)
    assert claimed["ours"] is False and block in claimed["why"]
    inc = rig.store.get(second)
    assert inc is not None and inc["state"] == State.HELD and (inc["held"] or {})["scope"] == block
    assert rig.gang.fenced == []  # neither fenced by the claim; the held one never is
    rig.ok(Op.FENCE, first)
    body, status = rig.call(Op.FENCE, second)
    assert status == 409 and "incident is HELD" in body["error"] and rig.gang.fenced == [NODE]
    assert set(cast(Any, rig.store.records.budget(block) or {})["slots"]) == {first}


def test_a_notification_carries_what_its_caller_adds_and_may_take_another_id() -> None:
    """A hang's page names its own decision (localise), not the incident's state: its id is given."""
    inc = partial_incident({"id": "iabcdefgh2", "step": 1, "state": "RESOLVED", "timeline": {}})
    plain = remediation.notification(inc, "info", "done", jobs=["42"])
    assert plain["id"].startswith("incident-iabcdefgh2-") and plain["jobs"] == ["42"]
    paged = remediation.notification(inc, "critical", "hung", todo="look", id="localise-iabcdefgh2-x")
    assert (paged["id"], paged["todo"], paged["summary"]) == ("localise-iabcdefgh2-x", "look", "hung")


def _npd_node(changed_at: str) -> str:
    """A GKE Node as actuate's adapter returns it: Pitstop's NPD condition holding the kernel's line."""
    cond = {"type": "PitstopKernelXid", "status": "True", "reason": "NvrmXid", "message": XID79}
    cond["lastTransitionTime"] = changed_at
    return json.dumps({"status": {"nodeInfo": {"bootID": "b"}, "conditions": [cond]}})


@pytest.mark.parametrize(
    ("changed_at", "confirmed"),
    [("2999-01-01T00:00:00Z", True), ("2001-01-01T00:00:00Z", False)],  # this boot / an earlier one
    ids=["after-the-vms-last-start", "before-it"],
)
def test_gke_npd_condition_is_dated_against_the_vms_last_start(
    rig: Rig, changed_at: str, confirmed: bool
) -> None:
    """Issue 21: the spec carries Compute's lastStartTimestamp; the NPD condition counts only after it."""
    seen = CheckResult(True, {"node_condition": _npd_node(changed_at)})
    rig.gang.check_result = lambda node, check, ref: seen  # type: ignore[method-assign]
    iid = _fenced(rig)
    rec = rig.ok(Op.CORROBORATE, iid)
    assert isinstance(rec["check"]["boot_after"], float)
    body, status = rig.call(Op.JUDGE_CORROBORATION, iid)
    assert (status == 200) is confirmed, body
