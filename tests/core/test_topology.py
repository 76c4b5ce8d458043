"""core/topology.py and core/tradeoff.py alone: where nodes sit, which spare a gang takes, and the
priced choice between waiting, moving, shrinking and holding.

Shapes as the platforms document them:
- Compute: ``resourceStatus.physicalHostTopology`` {cluster, block, subblock, host}
  (https://cloud.google.com/compute/docs/instances/view-instance-topology; the proto and REST field
  is ``subblock``: ResourceStatusPhysicalHostTopology in google-cloud-compute 1.57.0, whose
  ``to_dict`` is what adapters/compute.get returns).
- GKE: ``cloud.google.com/gce-topology-block|subblock|host`` node labels
  (https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas).
- A4X: "An NVLink domain, also known as a subblock ... consists of 18 A4X Max or A4X instances (72
  GPUs)" (https://cloud.google.com/ai-hypercomputer/docs/terminology).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import cast

import pytest

from pitstop.core import policy as policy_mod
from pitstop.core import topology, tradeoff
from pitstop.core.domain import Place, Vm
from pitstop.core.topology import Seat

NVL72 = ("a4x-",)


def vm(block: str, subblock: str, machine: str = "a3-ultragpu-8g", host: str = "h1") -> Vm:
    """instances.get as adapters/compute reads it (the library's to_dict)."""
    return cast(
        Vm,
        {
            "name": "n",
            "machine_type": f"https://www.googleapis.com/compute/v1/projects/p/zones/z/machineTypes/{machine}",
            "resource_status": {
                "physical_host_topology": {
                    "cluster": "c1",
                    "block": block,
                    "subblock": subblock,
                    "host": host,
                }
            },
        },
    )


def at(block: str, subblock: str, machine: str = "a3-ultragpu-8g") -> Place | None:
    return topology.from_vm(vm(block, subblock, machine), NVL72)


def test_a_vm_s_place_comes_from_compute_s_physical_host_topology() -> None:
    place = at("b1", "s2")
    assert place == {
        "source": "compute",
        "cluster": "c1",
        "block": "b1",
        "subblock": "s2",
        "host": "h1",
        "machine_type": "a3-ultragpu-8g",
    }
    assert topology.from_vm(cast(Vm, {"resource_status": {}}), NVL72) is None  # not in a dense deployment


def test_an_a4x_vm_s_sub_block_is_its_nvlink_domain() -> None:
    assert (at("b1", "s2", "a4x-highgpu-4g") or {}).get("nvlink_domain") == "c1/b1/s2"
    assert "nvlink_domain" not in (at("b1", "s2", "a4-highgpu-8g") or {})


def test_a_gke_node_s_place_comes_from_its_topology_labels() -> None:
    labels = {
        topology.BLOCK_LABEL: "b7",
        topology.SUBBLOCK_LABEL: "s3",
        topology.HOST_LABEL: "h9",
        topology.MACHINE_LABEL: "a4x-highgpu-4g",
    }
    place = topology.from_labels(labels, NVL72)
    assert place is not None
    assert (place["block"], place["subblock"], place["host"], place["source"]) == ("b7", "s3", "h9", "gke")
    assert place.get("nvlink_domain") == "/b7/s3"
    assert topology.from_labels({"kubernetes.io/hostname": "x"}, NVL72) is None


def test_a_slurm_node_s_place_is_its_switch_path_leaf_first() -> None:
    place = topology.from_switches(["sb-2", "blk-1", "root"])
    assert place == {"source": "slurm", "subblock": "sb-2", "block": "blk-1", "cluster": "root"}
    assert topology.from_switches([]) is None


def test_places_share_their_nearest_level_and_only_within_one_source() -> None:
    a, b, c, d = at("b1", "s1"), at("b1", "s1"), at("b1", "s2"), at("b2", "s1")
    assert topology.shared(a, b) == "subblock"
    assert topology.shared(a, c) == "block"
    assert topology.shared(a, d) == "cluster"  # same sub-block name in another block is another sub-block
    slurm = topology.from_switches(["s1", "b1"])
    assert topology.shared(a, slurm) == "unknown"
    assert topology.span([a, b]) == "subblock" and topology.span([a, b, c]) == "block"


def test_the_spare_in_the_gang_s_sub_block_wins_though_another_was_listed_first() -> None:
    gang = [Seat("n1", at("b1", "s1")), Seat("n2", at("b1", "s1"))]
    spares = [Seat("far", at("b2", "s9")), Seat("near-block", at("b1", "s2")), Seat("near", at("b1", "s1"))]
    pick = topology.pick(gang, {"n1"}, spares, 1)
    assert [s.node for s in pick.spares] == ["near"]
    assert (pick.tier, pick.widens, pick.passed_over) == ("subblock", False, ("far", "near-block"))
    pick = topology.pick(gang, {"n1"}, spares[:2], 1)
    assert [s.node for s in pick.spares] == ["near-block"] and pick.after == "block" and pick.widens
    pick = topology.pick(gang, {"n1"}, spares[:1], 1)
    assert pick.tier == "cluster" and pick.where == "sub-block s9"


def test_an_nvl72_gang_never_leaves_its_nvlink_domain() -> None:
    gang = [Seat("t1", at("b1", "rack1", "a4x-highgpu-4g")), Seat("t2", at("b1", "rack1", "a4x-highgpu-4g"))]
    elsewhere = [Seat("t9", at("b1", "rack2", "a4x-highgpu-4g"))]
    pick = topology.pick(gang, {"t1"}, elsewhere, 1, nvl72=True)
    assert pick.spares == () and pick.domain == "c1/b1/rack1"
    assert pick.blocked is not None and "NVLink domain" in pick.blocked
    inside = [*elsewhere, Seat("t5", at("b1", "rack1", "a4x-highgpu-4g"))]
    assert [s.node for s in topology.pick(gang, {"t1"}, inside, 1, nvl72=True).spares] == ["t5"]
    assert [s.node for s in topology.pick(gang, {"t1"}, elsewhere, 1).spares] == ["t9"]  # not NVL72: anywhere


def test_an_nvl72_gang_on_slurm_keeps_to_its_leaf_switch_and_one_of_unknown_place_stays() -> None:
    """Slurm names no machine type: the gang is NVL72 by its VM's (Compute), its domain its leaf switch."""
    gang = [
        Seat("t1", topology.from_switches(["b1-r1", "b1"])),
        Seat("t2", topology.from_switches(["b1-r1", "b1"])),
    ]
    spares = [
        Seat("t9", topology.from_switches(["b1-r2", "b1"])),
        Seat("t5", topology.from_switches(["b1-r1", "b1"])),
    ]
    assert [s.node for s in topology.pick(gang, {"t1"}, spares, 1, nvl72=True).spares] == ["t5"]
    unknown = topology.pick([Seat("t1"), Seat("t2")], {"t1"}, spares, 1, nvl72=True)
    assert unknown.spares == () and unknown.blocked == "the gang's NVLink domain is not known"


COSTS = tradeoff.Costs(
    restart_s=600, horizon_s=86400, capacity_wait_s=7200,
    penalty={"block": 0.02, "cluster": 0.05},
    repair_s={"RESET_GPU": 180, "REPLACE_NODE": 2400, "default": 1800}, min_history=3,
)  # fmt: skip


def situation(action: str, pick: topology.Pick | None, elastic: bool = False) -> tradeoff.Situation:
    repair, source = tradeoff.repair_estimate(action, [], COSTS)
    return tradeoff.Situation(action, nodes=64, gpus=512, repair_s=repair, repair_from=source, pick=pick,
                              elastic=elastic)  # fmt: skip


def test_a_short_reset_is_waited_for_while_a_host_report_moves_the_gang() -> None:
    gang = [Seat(f"n{i}", at("b1", "s1")) for i in range(64)]
    pick = topology.pick(gang, {"n0"}, [Seat("spare", at("b2", "s5"))], 1)  # a spare in another block
    reset = tradeoff.weigh(situation("RESET_GPU", pick), COSTS)
    assert reset.decision == "wait"
    # 512 GPUs: wait 512 x (180 + 600) s = 110.9 GPU-h; move 512 x (600 + 5 % of a day) s = 699.7
    assert (reset.cost("wait"), reset.cost("move")) == (110.9, 699.7)
    assert reset.why == "waited for the GPU reset: 110.9 GPU-h expected vs 699.7 moving to sub-block s5"
    near = topology.pick(gang, {"n0"}, [Seat("spare", at("b1", "s1"))], 1)
    replace = tradeoff.weigh(situation("REPLACE_NODE", near), COSTS)
    assert replace.decision == "move" and replace.penalty == 0.0
    assert replace.why == "moved to sub-block s1: 85.3 GPU-h expected vs 426.7 waiting for the host report"


def test_an_nvl72_gang_without_a_spare_in_its_domain_waits_and_pages() -> None:
    gang = [Seat("t1", at("b1", "rack1", "a4x-highgpu-4g")), Seat("t2", at("b1", "rack1", "a4x-highgpu-4g"))]
    pick = topology.pick(gang, {"t1"}, [Seat("t9", at("b1", "rack2", "a4x-highgpu-4g"))], 1, nvl72=True)
    out = tradeoff.weigh(situation("REPLACE_NODE", pick), COSTS)
    assert out.decision == "wait" and out.page
    assert [o["option"] for o in out.options] == ["wait"]  # no move, and no hold for capacity elsewhere
    assert "no spare in the gang's NVLink domain c1/b1/rack1" in out.why


def test_without_a_spare_holding_for_capacity_is_weighed_against_waiting() -> None:
    none = topology.Pick(blocked="0 spare(s) for 1 needed")
    out = tradeoff.weigh(situation("REPLACE_NODE", none), COSTS)
    assert [o["option"] for o in out.options] == ["wait", "hold"] and out.decision == "wait" and not out.page
    quick = tradeoff.Costs(**{**COSTS.__dict__, "capacity_wait_s": 60})
    assert tradeoff.weigh(situation("REPLACE_NODE", none), quick).decision == "hold"


def test_an_elastic_job_may_shrink_when_that_costs_least() -> None:
    none = topology.Pick(blocked="0 spare(s) for 1 needed")
    out = tradeoff.weigh(situation("REPLACE_NODE", none, elastic=True), COSTS)
    # shrink: 512 x 2 x 600 s + 512/64 x 2400 s = 176 GPU-h < wait 426.7
    assert out.decision == "shrink" and out.cost("shrink") == 176.0
    assert tradeoff.weigh(situation("REPLACE_NODE", none, elastic=False), COSTS).cost("shrink") is None


@pytest.mark.parametrize(
    ("measured", "expect"), [([], (2400.0, "default")), ([100, 300, 200], (200.0, "measured (3 incidents)"))]
)
def test_the_repair_time_is_the_fleet_s_measured_median_once_there_is_enough_history(
    measured: list[float], expect: tuple[float, str]
) -> None:
    assert tradeoff.repair_estimate("REPLACE_NODE", measured, COSTS) == expect


def test_the_shipped_policy_carries_the_moves_knobs() -> None:
    moves = policy_mod.from_doc(None).moves
    costs = tradeoff.costs_of(moves)
    assert costs.restart_s == 600 and costs.penalty["cluster"] == 0.05 and costs.repair_s["RESET_GPU"] == 180
    assert moves["nvlink_domain_families"] == ["a4x-"] and moves["enabled"] is True


def test_a_move_among_places_nobody_named_is_not_priced_as_slower() -> None:
    """A scheduler without topology (Slurm without a topology plugin, nodes without labels): the
    move costs its restart alone, as before topology was known; the scheduler's own room for the
    gang without a named spare is a move too."""
    gang = [Seat("n1"), Seat("n2")]
    pick = topology.pick(gang, {"n1"}, [Seat("s1")], 1)
    assert pick.after == "unknown" and not pick.widens and tradeoff.penalty_of(pick, COSTS) == 0.0
    out = tradeoff.weigh(situation("REBOOT_NODE", topology.Pick.unnamed()), COSTS)
    assert out.decision == "move" and out.why.startswith("moved to a spare the scheduler picks:")


def _random_place(rnd: random.Random) -> Place | None:
    """A place as the platforms give it: sometimes none, sometimes a block without a sub-block."""
    if rnd.random() < 0.1:
        return None
    p: Place = {"source": rnd.choice(["compute", "gke"]), "block": rnd.choice(["b0", "b1", "b2"])}
    if rnd.random() < 0.8:
        p["subblock"] = rnd.choice(["s0", "s1", ""])
    return p


def test_the_nearest_level_from_sets_is_the_least_shared_level_over_the_gang() -> None:
    """pick ranks spares by the nearest level they share with any staying member; it reads that from
    sets (a 2,048-node gang is asked about every spare): the same as the least of ``shared``."""
    rnd = random.Random(37)

    for _ in range(300):
        anchor = [_random_place(rnd) for _ in range(rnd.randrange(0, 6))]
        spare = Seat("x", _random_place(rnd))
        want = min((topology.TIERS.index(topology.shared(a, spare.place)) for a in anchor), default=3)
        assert topology._nearest_to(anchor)(spare) == want, (anchor, spare)


DAY = 86400.0


def test_a_just_repaired_spare_ranks_after_a_fresh_one_that_spreads_the_gang_as_widely() -> None:
    """The fabric's cost is the widest level the gang spans after the move: a gang already over two
    blocks spans the cluster whichever spare it takes, so the spare just back from a repair in its
    own sub-block (where a repaired node comes back) gives way to a fresh one in another block."""
    gang = [Seat("n1", at("b1", "s1")), Seat("n2", at("b1", "s1")), Seat("n3", at("b2", "s4"))]
    back = Seat("back", at("b1", "s1"), returned_at=10 * DAY - 600)
    fresh = Seat("fresh", at("b3", "s7"))
    pick = topology.pick(gang, {"n1"}, [back, fresh], 1, now=10 * DAY, probation_s=DAY)
    assert [s.node for s in pick.spares] == ["fresh"] and pick.probation == ("back",)
    assert (pick.tier, pick.before, pick.after, pick.widens) == ("cluster", "cluster", "cluster", False)
    assert pick.passed_over == () and "passed over back" in pick.where and "probation" in pick.where
    # back longer ago than the probation, or no probation at all: the nearest spare, as before
    for seat, probation in ((replace(back, returned_at=8 * DAY), DAY), (back, 0.0)):
        pick = topology.pick(gang, {"n1"}, [fresh, seat], 1, now=10 * DAY, probation_s=probation)
        assert [s.node for s in pick.spares] == ["back"] and pick.probation == ()
        assert pick.tier == "subblock" and pick.passed_over == ("fresh",) and "passed over" not in pick.where


def test_probation_never_costs_the_gang_a_wider_span() -> None:
    """Span first: the only spare that keeps the gang in its sub-block is taken though it was just
    repaired; among the spares of the next span, the fresh one goes first."""
    gang = [Seat("n1", at("b1", "s1")), Seat("n2", at("b1", "s1"))]
    back = Seat("back", at("b1", "s1"), returned_at=10 * DAY - 60)
    block_back = Seat("block-back", at("b1", "s2"), returned_at=10 * DAY - 60)
    block_fresh = Seat("block-fresh", at("b1", "s3"))
    spares = [block_back, block_fresh, back]
    pick = topology.pick(gang, {"n1"}, spares, 1, now=10 * DAY, probation_s=DAY)
    assert [s.node for s in pick.spares] == ["back"] and pick.after == "subblock" and not pick.widens
    assert pick.probation == () and pick.passed_over == ("block-back", "block-fresh")
    pick = topology.pick(gang, {"n1"}, spares[:2], 1, now=10 * DAY, probation_s=DAY)
    assert [s.node for s in pick.spares] == ["block-fresh"] and pick.probation == ("block-back",)
    assert pick.after == "block" and pick.passed_over == ()
    pick = topology.pick(gang, {"n1"}, spares[:2], 2, now=10 * DAY, probation_s=DAY)
    assert [s.node for s in pick.spares] == ["block-fresh", "block-back"] and pick.probation == ()


def test_the_span_after_a_move_is_the_span_of_the_staying_members_and_the_spare() -> None:
    """pick ranks spares by the span the gang would have with each; it reads that in one comparison
    (a 2,048-node gang is asked about every spare): the same as ``span`` over them all."""
    rnd = random.Random(3737)

    for _ in range(300):
        staying = [_random_place(rnd) for _ in range(rnd.randrange(0, 6))]
        spare = Seat("x", _random_place(rnd))
        want = topology.TIERS.index(topology.span([*staying, spare.place])) if staying else 0
        got = topology._span_after(staying, topology.span(staying))(spare)
        assert got == want, (staying, spare)
