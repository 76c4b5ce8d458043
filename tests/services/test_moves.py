"""The gang's choice at a fault, through actuate's ops (memory store, the fake Compute, a scheduler
that names where its nodes sit and can pin a requeued gang, as the Slurm agent does).

What is checked: the claim caches the node's place read from Compute (physicalHostTopology) in
its node document; the early reschedule picks the spare of the gang's sub-block though another
was listed first and asks the scheduler to put the gang there; the numbers are recorded on the
incident and said in its notification; an NVL72 gang (A4X: its sub-block is its NVLink domain,
cloud.google.com/ai-hypercomputer/docs/terminology) never leaves its domain and pages when the
domain has no spare; a short reset is waited for while a host report moves the gang.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, cast

import pytest

from pitstop.core import engine, policy, remediation, topology
from pitstop.core.domain import Incident, NodeDoc, NodeRef
from pitstop.core.ops import Op
from pitstop.core.scheduling import Capacity, JobRun, RequeueOutcome, StepRef
from pitstop.core.topology import Seat
from pitstop.local.fake_compute import FakeCompute
from tests.helpers import PROJECT, ZONE
from tests.services.test_remediation_unit import NODE, Rig, TypedGang


def slurm(path: list[str]) -> Seat:
    return Seat("", topology.from_switches(path))


class PlacedGang(TypedGang):
    """The gang on NODE and ``a3-node-002`` (sub-block s1 of block b1); idle: ``a3-node-001`` in
    another block (listed first) and ``a3-node-003`` in the gang's own sub-block."""

    def __init__(self, spares: list[tuple[str, list[str]]] | None = None, places: bool = True) -> None:
        super().__init__()
        self.onto: list[tuple[str, ...]] = []
        self.spares = spares or [("a3-node-001", ["b2-s1", "b2"]), ("a3-node-003", ["b1-s1", "b1"])]
        self.places = places

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        gang = (Seat(NODE, topology.from_switches(["b1-s1", "b1"])),
                Seat("a3-node-002", topology.from_switches(["b1-s1", "b1"])))  # fmt: skip
        spares = tuple(Seat(n, topology.from_switches(p)) for n, p in self.spares)
        return Capacity(
            bool(spares), f"{len(spares)} idle", 2, 1 + len(spares), gang, spares, places=self.places
        )

    def requeue_onto(self, job: str, ref: StepRef, run: JobRun, nodes: tuple[str, ...]) -> RequeueOutcome:
        self.onto.append(nodes)
        return self.requeue(job, ref, run)


class Moves(Rig):
    def __init__(self, gang: PlacedGang, machine: str = "a3-ultragpu-8g", **moves: Any) -> None:
        super().__init__()
        self.gang = self.placed = gang
        self.actuator.deps.schedulers = {"train": gang}
        self.fake.instances.clear()
        self.fake.add_instance(PROJECT, ZONE, NODE, machine, mig="a3-node", block="b1", subblock="s1")
        doc = {**self.policy.doc, "moves": {**self.policy.doc["moves"], **moves}}
        self.policy = self.actuator.deps.policy = policy.from_doc(doc)

    def to_reschedule(self, iid: str) -> dict[str, Any]:
        assert self.ok(Op.CLAIM, iid)["ours"]
        for op in (Op.FENCE, Op.CORROBORATE, Op.CORROBORATION, Op.JUDGE_CORROBORATION):
            self.ok(op, iid)
        return self.ok(Op.RESCHEDULE_EARLY, iid)


@pytest.fixture
def stop() -> Iterator[list[Moves]]:
    made: list[Moves] = []
    yield made
    for r in made:
        r.server.shutdown()


def test_the_claim_caches_the_node_s_place_from_compute(stop: list[Moves]) -> None:
    rig = Moves(PlacedGang())
    stop.append(rig)
    iid = rig.open()
    assert rig.ok(Op.CLAIM, iid)["ours"]
    inc = rig.store.get(iid)
    assert inc is not None and inc["node"] is not None
    doc = rig.store.records.node(engine.node_key(inc["node"]))
    assert doc is not None
    place = doc.get("topology") or {}
    assert (place.get("block"), place.get("subblock"), place.get("source")) == ("b1", "s1", "compute")
    assert place.get("machine_type") == "a3-ultragpu-8g" and place.get("host")


def test_the_gang_moves_to_the_spare_of_its_sub_block_though_another_was_listed_first(
    stop: list[Moves],
) -> None:
    rig = Moves(PlacedGang())
    stop.append(rig)
    iid = rig.open()
    resume = rig.to_reschedule(iid)
    assert resume["mode"] == "early" and rig.placed.onto == [("a3-node-002", "a3-node-003")]
    inc = rig.store.get(iid)
    assert inc is not None
    choice = inc.get("choice") or {}
    assert choice.get("decision") == "move" and choice.get("spares") == ["a3-node-003"]
    assert choice.get("tier") == "subblock" and choice.get("penalty") == 0.0
    # 2 nodes x 8 GPUs: move = 16 x 600 s = 2.7 GPU-h; wait for the reboot = 16 x (600 + 600) s = 5.3
    assert choice.get("why") == "moved to sub-block b1-s1: 2.7 GPU-h expected vs 5.3 waiting for the reboot"
    assert "moved to sub-block b1-s1" in remediation.summary(inc, {"unfenced": NODE, "resumed": True})


def test_a_gang_its_scheduler_cannot_place_is_requeued_unpinned_and_the_choice_says_so(
    stop: list[Moves],
) -> None:
    """A Placer whose capacity says it does not place this job (GKE: a JobSet Kueue queues, or one
    opted out of pinning): the move is weighed and told, the gang requeued for the scheduler to
    place, nothing pinned."""
    rig = Moves(PlacedGang(places=False))
    stop.append(rig)
    iid = rig.open()
    assert rig.to_reschedule(iid)["mode"] == "early"
    assert rig.placed.onto == [] and len(rig.gang.requeues) == 1
    inc = rig.store.get(iid)
    assert inc is not None
    why = (inc.get("choice") or {}).get("why")
    nearest = "a spare the scheduler picks (nearest: sub-block b1-s1)"
    assert why == f"moved to {nearest}: 2.7 GPU-h expected vs 5.3 waiting for the reboot"


def test_a_spare_just_back_from_a_repair_gives_way_to_a_fresh_one_of_the_same_sub_block(
    stop: list[Moves],
) -> None:
    """a3-node-003 came back from a Pitstop reboot ten minutes ago (its node document's latest
    incident, acted on and healthy): the pick reads that through the store and takes a3-node-004 of
    the same sub-block instead, and the reason says why."""
    rig = Moves(PlacedGang([("a3-node-003", ["b1-s1", "b1"]), ("a3-node-004", ["b1-s1", "b1"])]))
    stop.append(rig)
    iid = rig.open()
    inc, now = rig.store.get(iid), rig.clock()
    assert inc is not None and inc["node"] is not None
    spare = NodeRef(**{**inc["node"], "instance": "a3-node-003"})
    # staged by hand as the store keeps them: the spare's node document and its resolved incident
    back: dict[str, Any] = {**copy.deepcopy(inc), "id": "earlier", "node": spare, "state": "RESOLVED"}
    back["timeline"] = {**inc["timeline"], "acted": now - 1200, "healthy": now - 600, "resolved": now - 600}
    rig.store.docs.incidents["earlier"] = cast(Incident, back)
    doc = {"node": spare, "latest_incident": "earlier", "remediations": [], "last_action_at": {}}
    rig.store.records.put_node(engine.node_key(spare), cast(NodeDoc, doc))
    rig.to_reschedule(iid)
    assert rig.placed.onto == [("a3-node-002", "a3-node-004")]
    inc = rig.store.get(iid)
    assert inc is not None
    choice = inc.get("choice") or {}
    assert choice.get("spares") == ["a3-node-004"] and choice.get("tier") == "subblock"
    assert "passed over a3-node-003: back from a repair, on probation" in str(choice.get("why"))


def test_an_nvl72_gang_never_leaves_its_domain_it_waits_and_a_person_is_paged(stop: list[Moves]) -> None:
    rig = Moves(PlacedGang([("a3-node-001", ["b1-s2", "b1"])]), machine="a4x-highgpu-4g")
    stop.append(rig)
    iid = rig.open()
    resume = rig.to_reschedule(iid)
    assert resume["mode"] == "after_repair" and rig.placed.onto == [] and rig.gang.requeues == []
    assert "NVLink domain" in resume["waiting"][0]["why"]
    inc = rig.store.get(iid)
    assert inc is not None and (inc.get("choice") or {}).get("page") is True
    pages = [e for e in rig.store.outbox.unsent(float("inf")) if e["notification"].get("kind") == "page"]
    assert len(pages) == 1 and "NVLink domain" in str(pages[0]["notification"])
    # the requeue that later frees the node (or follows its repair) keeps the gang on its own
    # nodes: unpinned, Slurm would start it on the idle tray of the other rack at once
    assert (inc.get("choice") or {}).get("stay_on") == sorted([NODE, "a3-node-002"])
    rig.ok(Op.RESCHEDULE, iid)
    assert rig.placed.onto == [tuple(sorted([NODE, "a3-node-002"]))] and len(rig.gang.requeues) == 1


@pytest.mark.parametrize(
    ("action_xid", "decision"),
    [("RESET_GPU", "wait"), ("REPLACE_NODE", "move")],
)
def test_a_short_reset_is_waited_for_while_a_host_report_moves_the_gang(
    stop: list[Moves], action_xid: str, decision: str
) -> None:
    """The only spare sits in another sub-block of the gang's block (2 % slower for the day left):
    16 GPUs x (600 s + 2 % of 24 h) = 10.3 GPU-h to move, against 3.5 to wait for a reset
    (180 s) and 13.3 for a host report (2400 s)."""
    rig = Moves(PlacedGang([("a3-node-001", ["b1-s2", "b1"])]))
    stop.append(rig)
    rig.policy = rig.actuator.deps.policy = policy.from_doc(
        {**rig.policy.doc, "xid_overrides": {"79": action_xid}}
    )
    iid = rig.open()
    rig.to_reschedule(iid)
    inc = rig.store.get(iid)
    assert inc is not None and inc["action"] == action_xid
    choice = inc.get("choice") or {}
    assert choice.get("decision") == decision, choice.get("why")
    costs = {o["option"]: o["gpu_h"] for o in choice.get("options") or []}
    assert costs["move"] == 10.3 and costs["wait"] == {"RESET_GPU": 3.5, "REPLACE_NODE": 13.3}[action_xid]
    assert rig.placed.onto == ([("a3-node-001", "a3-node-002")] if decision == "move" else [])


def test_with_moves_off_the_gang_moves_whenever_there_is_capacity_as_before(stop: list[Moves]) -> None:
    rig = Moves(PlacedGang([("a3-node-001", ["b2-s1", "b2"])]), enabled=False)
    stop.append(rig)
    iid = rig.open()
    assert rig.to_reschedule(iid)["mode"] == "early" and rig.placed.onto == [] and len(rig.gang.requeues) == 1
    inc = rig.store.get(iid)
    assert inc is not None and "choice" not in inc


def test_a_fake_compute_vm_carries_its_documented_topology_shape() -> None:
    """resourceStatus.physicalHostTopology {cluster, block, subblock, host}, as the REST resource
    ResourceStatusPhysicalHostTopology names its fields."""
    fake = FakeCompute()
    inst = fake.add_instance(PROJECT, ZONE, "x", block="b9", subblock="s3")
    topo = inst.to_api()["resourceStatus"]["physicalHostTopology"]
    assert set(topo) == {"cluster", "block", "subblock", "host"} and (topo["block"], topo["subblock"]) == (
        "b9",
        "s3",
    )
