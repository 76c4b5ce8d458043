"""The runtime control where the functions meet it: each instance's cache of the document
(services/control.py), ingest's hot path, and actuate's step runner refusing a disruptive op for a
paused or silenced incident, which is then held and goes on after the brake is lifted."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from pitstop.adapters.memory_control import MemoryControl
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import control, policy
from pitstop.core.classify import Classifier
from pitstop.core.control import Control, ControlDoc, Stamp
from pitstop.core.ops import Op
from pitstop.core.states import State
from pitstop.services.actuate import Actuator
from pitstop.services.control import RuntimeControl
from pitstop.services.ingest import Ingest
from pitstop.services.sweep import release_held
from tests.helpers import ops_agent_entry
from tests.services.test_remediation_unit import NODE, XID79, Rig

XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
TTL = 30.0


class Source(MemoryControl):
    """The control document, with a switch that makes its read fail (Firestore unreachable)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def read_control(self) -> object:
        if self.down:
            raise ConnectionError("firestore unreachable")
        return super().read_control()


def who(at: float, reason: str = "investigating resets") -> Stamp:
    return {"by": "alice", "at": at, "reason": reason}


# -- the cache ---------------------------------------------------------------------------------------


def test_the_document_is_read_once_per_ttl_and_a_change_is_seen_after_it() -> None:
    now = [0.0]
    src = Source()
    rc = RuntimeControl(src, TTL, clock=lambda: now[0])
    deployed = policy.from_doc(None)
    first = rc.policy(deployed)
    src.change_control(lambda d: control.pause(d, None, who(1.0)))
    now[0] = TTL - 1
    assert rc.policy(deployed) is first and src.reads == 1  # within the TTL: what was read before
    now[0] = TTL
    paused = rc.policy(deployed)
    assert paused is not first and paused.control.pause(None) is not None and src.reads == 2
    assert rc.policy(deployed) is paused  # the same object while nothing changed


def test_a_failed_read_keeps_what_was_read_and_a_first_one_raises() -> None:
    now = [0.0]
    src = Source()
    src.change_control(lambda d: control.pause(d, None, who(1.0)))
    rc = RuntimeControl(src, TTL, clock=lambda: now[0])
    assert rc.current().pause(None) is not None
    src.down, now[0] = True, TTL + 1
    assert rc.current().pause(None) is not None  # the brake stays on through an outage
    with pytest.raises(ConnectionError):
        RuntimeControl(src, TTL, clock=lambda: 0.0).current()  # never read: the delivery is retried


def test_a_document_that_does_not_match_its_schema_pauses_everything() -> None:
    src = Source()
    src.doc = cast(ControlDoc, {"paused": "yes"})  # a hand edit
    got = RuntimeControl(src, TTL).current()
    assert "the control document is not valid" in str(got.pause("train"))


def test_ingest_reads_the_document_once_for_a_storm_not_per_line() -> None:
    now = [1_800_000_000.0]
    src = Source()
    pol = policy.from_doc(
        {
            "mode": "enforce",
            "clusters": [{"name": "train", "scheduler": "slurm", "match": {"name_pattern": "a3-*"}}],
        }
    )
    ingest = Ingest(pol, MemoryStore(), None, None, clock=lambda: now[0],
                    control=RuntimeControl(src, TTL, clock=lambda: now[0]))  # fmt: skip
    clf = Classifier.default()
    for n in range(300):
        ev = clf.classify(ops_agent_entry(XID13, instance=f"a3-node-{n % 7:03d}", insert_id=uuid.uuid4().hex))
        ingest.handle_event(ev)
        now[0] += 0.05  # 300 lines in 15 s
    assert src.reads == 1


# -- actuate's brake ------------------------------------------------------------------------------------


class ControlRig(Rig):
    """The remediation rig with a control document every actuate call reads through its cache."""

    def __init__(self) -> None:
        super().__init__()
        self.source = Source()
        self.runtime = RuntimeControl(self.source, TTL, clock=self.clock)
        self.actuator = Actuator(self.policy, self.store, self.actuator.deps.compute, {"train": self.gang},
                                 None, clock=self.clock, control=self.runtime)  # fmt: skip

    def change(self, fn: Callable[[ControlDoc, Stamp], tuple[ControlDoc, control.Change]]) -> None:
        """A person's change, seen once every instance's cache has expired."""
        self.source.change_control(lambda d: fn(d, who(self.clock())))
        self.clock.now += TTL

    def step(self, op: Op, iid: str, step: int, execution: str = "exec-1") -> tuple[dict[str, Any], int]:
        return self.actuator.handle({"op": str(op), "incident": iid, "step": step, "execution": execution})

    def sweep(self) -> list[Any]:
        started: list[Any] = []
        release_held(self.store, self.runtime.policy(self.policy), self.clock(), started.append)
        return started

    def pages(self, iid: str) -> list[str]:
        notes = [e["notification"] for e in self.store.docs.outbox.values()]
        mine = [n for n in notes if n["kind"] == "page" and cast(Any, n["incident"])["id"] == iid]
        return [str(n["summary"]) for n in mine]


@pytest.fixture
def rig() -> Iterator[ControlRig]:
    r = ControlRig()
    try:
        yield r
    finally:
        r.server.shutdown()


def _corroborated(rig: ControlRig) -> str:
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid)["ours"] is True
    for op in (Op.FENCE, Op.CORROBORATE, Op.CORROBORATION, Op.JUDGE_CORROBORATION):
        rig.ok(op, iid)
    return iid


def test_a_pause_holds_a_running_step_before_its_next_disruptive_op_and_resume_goes_on(
    rig: ControlRig,
) -> None:
    iid = _corroborated(rig)
    rig.change(lambda d, w: control.pause(d, None, w))
    body, status = rig.call(Op.RESCHEDULE_EARLY, iid)
    assert status == 409 and body["retryable"] is False
    assert "paused (everything) by alice" in body["error"] and "investigating resets" in body["error"]
    for op in (Op.CHECKPOINT, Op.DIAGNOSE, Op.ACT):  # the incident is held now: nothing runs on it
        assert rig.call(op, iid)[1] == 409, op
    inc = rig.store.get(iid)
    assert inc is not None and inc["state"] == State.HELD and cast(Any, inc["held"])["control"] == "pause"
    assert rig.gang.fenced == [NODE] and rig.gang.requeues == []  # the node stays fenced; nothing moved
    assert rig.fake.effects_on(NODE, "reset") == []
    assert len(rig.pages(iid)) == 1 and "The node stays fenced" in rig.pages(iid)[0]
    assert rig.ok(Op.FAIL, iid)["recorded"] is False  # the workflow's failure: it stays held, not FAILED
    assert rig.sweep() == []  # still paused
    rig.change(lambda d, w: control.resume(d, None, w))
    (released,) = rig.sweep()
    assert released.result == "released" and released.start_step == 2  # a new step, no cooldown in the way
    assert rig.step(Op.CLAIM, iid, 2)[0]["ours"] is True
    for op in (
        Op.FENCE,
        Op.CORROBORATE,
        Op.CORROBORATION,
        Op.JUDGE_CORROBORATION,
        Op.RESCHEDULE_EARLY,
        Op.ACT,
    ):
        body, status = rig.step(op, iid, 2)
        assert status == 200, (op, body)
    assert len(rig.fake.effects_on(NODE, "reset")) == 1


def test_once_the_repair_began_the_step_finishes_it(rig: ControlRig) -> None:
    iid = _corroborated(rig)
    for op in (Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.ACT):
        rig.ok(op, iid)
    rig.change(lambda d, w: control.pause(d, "train", w))
    rig.clock.now += 3600 * rig.fake.scale + 1
    assert rig.ok(Op.OPERATION, iid)["done"] and rig.ok(Op.VERIFY, iid)["done"]
    for op in (Op.VALIDATE, Op.ESCALATE, Op.UNFENCE, Op.RESCHEDULE, Op.RESUMED):
        rig.ok(op, iid)  # the job it stopped is restarted: stopping here would strand it
    assert rig.ok(Op.CLOSE, iid)["outcome"] == "resolved"
    assert len(rig.fake.effects_on(NODE, "reset")) == 1


def test_a_silence_on_the_node_holds_a_running_step_until_it_ends(rig: ControlRig) -> None:
    iid = _corroborated(rig)
    rig.change(lambda d, w: control.silence(d, "node", NODE, 3600, w))
    body, status = rig.call(Op.DIAGNOSE, iid)
    assert status == 409 and f"silenced (node {NODE}" in body["error"]
    inc = rig.store.get(iid)
    assert inc is not None and cast(Any, inc["held"])["control"] == "silence"
    assert rig.sweep() == []
    rig.clock.now += 3600
    (released,) = rig.sweep()
    assert released.start_step == 2


def test_a_new_fault_on_a_silenced_node_starts_no_step(rig: ControlRig) -> None:
    rig.change(lambda d, w: control.silence(d, "node", NODE, 3600, w))
    pol = rig.runtime.policy(rig.policy)
    e = Classifier.default().classify(ops_agent_entry(XID79, instance=NODE, insert_id=uuid.uuid4().hex))
    out = rig.store.apply({**e, "_observed_ts": rig.clock()}, pol, rig.clock())
    assert out.start_step is None and out.incident is not None and out.incident["silenced"]["value"] == NODE
    assert Control.of(rig.source.doc).silence(out.incident, rig.clock()) is not None
