"""`pitstop simulate`: the fleet model, its strategies, and that Pitstop's runs the real engine."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from pitstop.core import resources
from pitstop.tools import cli, simulate
from pitstop.tools.sim import placement, trace
from pitstop.tools.sim.fleet import Fleet
from pitstop.tools.sim.scenario import Category, Comparison, Scenario, Summary, SweepValue, TopologyConf
from pitstop.tools.sim.strategies import STRATEGIES, Pitstop, Placed, catalog_action


def scenario(**fields: SweepValue) -> Scenario:
    return simulate.load_scenario(None, fields)


def only(scn: Scenario, name: str, cat: Category) -> Scenario:
    """The scenario with a single fault category."""
    out = copy.deepcopy(scn)
    out["faults"]["categories"] = {name: cat}
    return out


def by_name(result: Comparison) -> dict[str, Summary]:
    return {r["strategy"]: r for r in result["strategies"]}


def test_shipped_scenario_is_valid_and_a_broken_one_names_its_path(tmp_path: Path) -> None:
    scn = scenario()
    assert scn["fleet"]["nodes"] == 2048 and scn["faults"]["rate"] == "llama3"
    cats = scn["faults"]["categories"].values()
    assert sum(c["count"] for c in cats if c["signal"] != "straggler") == 419  # Llama 3 Table 5
    assert sum(c["count"] for c in cats if c["signal"] == "straggler") == 58  # ByteRobust's ratio
    doc = yaml.safe_load(simulate.default_path().read_text())
    doc["faults"]["categories"]["gpu_hbm3"]["bursts"] = [["xid_nope"]]
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(resources.DataFileError, match="faults/categories/gpu_hbm3/bursts/0/0"):
        simulate.load_scenario(bad)
    with pytest.raises(resources.DataFileError, match="unknown rate preset"):
        scenario(rate="rsc9")


def test_same_seed_same_result_other_seed_other_trace() -> None:
    scn = scenario(nodes=256, days=20)
    assert simulate.simulate(scn) == simulate.simulate(copy.deepcopy(scn))
    other = simulate.simulate(scenario(nodes=256, days=20, seed=8))
    assert other["trace"] != simulate.simulate(scn)["trace"]


def test_strategy_ordering_on_the_default_scenario() -> None:
    scn = scenario()
    scn["strategies"] = ["manual", "nvsentinel", "pitstop", "pitstop+tel"]  # the fabric's: tests below
    res = by_name(simulate.simulate(scn))
    assert res["pitstop+tel"]["ettr"] > res["pitstop"]["ettr"]
    assert res["pitstop"]["ettr"] >= res["nvsentinel"]["ettr"] >= res["manual"]["ettr"]
    assert res["pitstop"]["time_to_resume_min"]["mean"] < res["manual"]["time_to_resume_min"]["mean"]
    assert res["pitstop"]["money_lost_usd"] < res["manual"]["money_lost_usd"]


def test_every_gpu_hour_is_accounted_for() -> None:
    for r in simulate.simulate(scenario(nodes=512, days=10))["strategies"]:
        spent = r["productive_gpu_hours"] + sum(r["gpu_hours_lost"].values())
        assert spent == pytest.approx(r["wall_gpu_hours"], abs=1.0), r["strategy"]


def test_zero_faults_leave_only_checkpoint_overhead() -> None:
    scn = scenario(nodes=64, days=1, checkpoint_interval_min=30, checkpoint_write_min=2)
    for cat in scn["faults"]["categories"].values():
        cat["count"] = 0
    # by hand: 1440 min = 45 cycles of 30 min work + 2 min write, so ETTR = 30 / 32
    for r in simulate.simulate(scn)["strategies"]:
        assert r["ettr"] == pytest.approx(30 / 32, abs=1e-5)
        assert r["interruptions"] == 0 and r["gpu_hours_lost"]["checkpoint"] == pytest.approx(
            45 * 2 / 60 * 512
        )


def _closed_form(nodes: int, r_per_day: float, u0_min: float, dt_min: float, w_min: float) -> float:
    lam = nodes * r_per_day / (24 * 60)  # per minute
    return (1 - lam * (u0_min + dt_min / 2)) / (1 + w_min / dt_min)


@pytest.mark.parametrize(("nodes", "dt"), [(128, 60), (512, 30), (512, 10), (1024, 15)])
def test_matches_the_closed_form_with_fixed_durations(nodes: int, dt: int) -> None:
    """Kokolis et al.'s E[ETTR] (reference/goodput-validation.md §1.4): restart-only faults."""
    scn = scenario(
        nodes=nodes,
        spares=0,
        days=400,
        rate="rsc1",
        checkpoint_interval_min=dt,
        checkpoint_write_min=0.5,
        restart_min=10,
    )
    scn["jobs"]["self_detect_min"] = 5
    scn = only(scn, "crash", {"count": 1, "signal": "none"})
    scn["strategies"] = ["pitstop"]
    got = simulate.simulate(scn)["strategies"][0]["ettr"]
    want = _closed_form(nodes, 6.50 / 1000, 15, dt, 0.5)
    assert got == pytest.approx(want, rel=0.02)


def test_trace_reproduces_the_llama3_counts_within_sampling_error() -> None:
    scn = scenario(spares=0)
    totals = [len(trace.generate(simulate.with_fields(scn, {"seed": s}))) for s in range(5)]
    mean = sum(totals) / len(totals)
    assert abs(mean - 477) < 3 * math.sqrt(477 / len(totals))  # 419 interruptions and 58 stragglers
    expected = trace.expected_count(scn)
    assert expected["faulty_gpu"] == pytest.approx(148) and expected["gpu_hbm3"] == pytest.approx(72)
    rsc1 = trace.expected_count(simulate.with_fields(scn, {"rate": "rsc1"}))
    stragglers = rsc1.pop("gpu_straggler")
    assert sum(rsc1.values()) == pytest.approx(6.50 / 1000 * 2048 * 54)  # a failure rate: without them
    assert stragglers == pytest.approx(58)


def _pitstop_run(scn: Scenario) -> tuple[Summary, Pitstop]:
    strategy = Pitstop(scn)
    sim = Fleet(scn, strategy)
    led = sim.run(trace.generate(scn))
    return simulate.summarize("pitstop", led, sim, scn), strategy


def test_the_engine_ladder_and_lemon_rules_replace_a_host_the_catalog_would_only_reset() -> None:
    scn = only(
        scenario(nodes=64, spares=4, days=60),
        "bad_hbm",
        {"count": 300, "signal": "xid", "bursts": [["xid48_dram", "xid63"]], "needs": {"REPLACE_NODE": 1}},
    )
    assert catalog_action(("xid48_dram", "xid63"), "xid") == "RESET_GPU"
    row, strategy = _pitstop_run(scn)
    assert row["engine"]["decided"].get("REPLACE_NODE", 0) > 0 and row["actions"].get("REPLACE_NODE", 0) > 0
    reasons = " ".join(
        w for inc in strategy.world.docs.incidents.values() for e in inc["escalations"] for w in e["why"]
    )
    assert "faulted again" in reasons  # the ladder
    assert row["engine"]["results"]["absorbed"] > 0  # the Xid 63 of each burst joins its 48
    assert row["nodes_wrongly_replaced"] == 0


def test_an_exhausted_blast_radius_budget_holds_incidents() -> None:
    scn = only(
        scenario(nodes=64, spares=4, days=20),
        "storm",
        {"count": 2000, "signal": "xid", "bursts": [["xid79"]], "needs": {"REBOOT_NODE": 1}},
    )
    scn["policy"] = {"budgets": {"cluster": {"max_nodes": 1, "max_percent": 100}}}
    row, strategy = _pitstop_run(scn)
    assert row["nodes_held"] > 0 and row["engine"]["results"]["held"] > 0
    # each hold ended: the sweep's retry once the window slid, or the paged person's release
    assert strategy.world.results["released"] == row["nodes_held"]
    assert not [i for i in strategy.world.docs.incidents.values() if i["state"] == "HELD"]
    roomy, _ = _pitstop_run({**scn, "policy": {}})
    assert roomy["nodes_held"] < row["nodes_held"]


def _cli(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    return buf.getvalue()


def test_cli_json_has_the_documented_shape() -> None:
    doc = json.loads(_cli(["simulate", "--json", "--nodes", "128", "--days", "5"]))
    assert set(doc) >= {"strategies", "scenario"}
    names = [r["strategy"] for r in doc["strategies"]]
    assert names == [
        "manual",
        "gke",
        "nvsentinel",
        "pitstop",
        "pitstop+tel",
        "pitstop-topology",
        "pitstop-cost",
    ]
    for r in doc["strategies"]:
        assert 0 < r["ettr"] <= 1
        lost = {"checkpoint", "lost_work", "slowed", "fabric", "detect", "wait", "restart"}
        assert set(r["gpu_hours_lost"]) == lost
        assert set(r["time_to_resume_min"]) == {"mean", "p95"}
        for k in ("interruptions", "nodes_held", "nodes_wrongly_replaced", "money_lost_usd"):
            assert isinstance(r[k], int | float)
    resources.validate(doc["scenario"], simulate.SCHEMA, "echoed scenario")
    assert doc["scenario"]["fleet"]["nodes"] == 128


def test_cli_table_sweep_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "ettr.png"
    out = _cli(["simulate", "--days", "3", "--nodes", "64", "--sweep", "nodes=32,64", "--plot", str(png)])
    assert "pitstop-cost at each node repair" in out and "ETTR by nodes" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_a_straggler_slows_its_gang_until_a_person_notices_and_the_alert_moves_it_at_a_checkpoint() -> None:
    """One job, stragglers only, a person always 60 min late: each straggler on the job costs the
    gang 60 min x (1 - 1/1.34) of its time; with the alert, 10 min of it, then the planned move at
    the next checkpoint loses no work."""
    scn = only(
        scenario(nodes=64, spares=8, days=20, seed=3),
        "slow",
        {"count": 6, "signal": "straggler", "needs": {"REBOOT_NODE": 1}},
    )
    scn["faults"]["basis"] = {"nodes": 64, "days": 20}
    scn["durations"]["straggler_human"] = [60, 60]
    scn["strategies"] = ["manual", "pitstop+tel"]
    faults = trace.generate(scn)
    on_job = [f for f in faults if f.node < 64]
    assert on_job
    res = by_name(simulate.simulate(scn))
    gpus = 64 * 8
    factor = 1 - 1 / 1.34
    manual = res["manual"]["gpu_hours_lost"]["slowed"]
    assert manual == pytest.approx(len(on_job) * 1.0 * factor * gpus, rel=0.05)
    tel = res["pitstop+tel"]
    assert tel["gpu_hours_lost"]["slowed"] < manual / 3
    assert tel["gpu_hours_lost"]["lost_work"] < res["manual"]["gpu_hours_lost"]["lost_work"]
    assert tel["engine"]["decided"].get("DRAIN_NODE", 0) == len(faults)  # each through the engine


def test_a_hang_is_found_at_the_heartbeats_window_instead_of_the_jobs_timeout_and_a_person() -> None:
    scn = only(
        scenario(nodes=64, spares=8, days=20, seed=5),
        "nic",
        {"count": 6, "signal": "hang", "needs": {"REBOOT_NODE": 1}},
    )
    scn["faults"]["basis"] = {"nodes": 64, "days": 20}
    scn["strategies"] = ["pitstop", "pitstop+tel"]
    res = by_name(simulate.simulate(scn))
    before, after = res["pitstop"], res["pitstop+tel"]
    assert after["gpu_hours_lost"]["detect"] < before["gpu_hours_lost"]["detect"] / 4
    assert after["time_to_resume_min"]["mean"] < before["time_to_resume_min"]["mean"]
    assert after["engine"]["decided"] == {"RESTART_JOB": after["faults"]}  # one hang incident per fault
    assert before["engine"]["incidents"] == 0  # today nothing Pitstop reads shows a hang


# -- topology (issue 37) --------------------------------------------------------------------------


def _fabric(scn: Scenario, topo: TopologyConf, spares: int, gang: int) -> Scenario:
    out = copy.deepcopy(scn)
    out["fleet"]["topology"] = topo
    out["fleet"]["spares"] = spares
    out["jobs"]["gang_nodes"] = gang
    return out


def _fault(fid: str, day: float, node: int, burst: tuple[str, ...], needs: str) -> trace.Fault:
    return trace.Fault(fid, day * 86400.0, node, "hand", "xid", burst, needs, "0000:1b:00", 1200.0, 21600.0)


def _run(scn: Scenario, name: str, faults: list[trace.Fault]) -> tuple[Summary, Fleet]:
    sim = Fleet(scn, STRATEGIES[name](scn))
    return simulate.summarize(name, sim.run(faults), sim, scn), sim


def test_layout_puts_spares_in_their_sub_block_their_block_then_a_block_of_their_own() -> None:
    topo: TopologyConf = {
        "nodes_per_subblock": 4, "subblocks_per_block": 2, "spares_per_subblock": 1, "spares_per_block": 1,
        "penalty": {"block": 0.02, "cluster": 0.05},
    }  # fmt: skip
    places = placement.layout(
        {"nodes": 16, "gpus_per_node": 8, "spares": 8, "usd_per_gpu_hour": 1, "topology": topo}
    )
    where = [(p["block"], p["subblock"]) for p in places if p is not None]
    assert where[0] == where[3] == ("b0", "sb0") and where[4] == ("b0", "sb1") and where[8] == ("b1", "sb2")
    assert where[16:20] == [("b0", "sb0"), ("b0", "sb1"), ("b1", "sb2"), ("b1", "sb3")]  # one per sub-block
    assert where[20:22] == [("b0", "sb0-spare"), ("b1", "sb1-spare")]  # one per block
    assert where[22:] == [("b2", "sbspare")] * 2  # the rest: a block of their own


def test_topology_aware_pitstop_keeps_the_gang_in_its_block_where_the_blind_one_crosses() -> None:
    """Two gangs, one per block; the scheduler lists block 0's spare first. A reboot on gang 1
    (block 1): the blind Pitstop restarts it on block 0's spare and its ring crosses blocks for the
    rest of the run (the 5 % penalty); topology-aware Pitstop (core/topology.pick) takes block 1's."""
    topo: TopologyConf = {
        "nodes_per_subblock": 32, "subblocks_per_block": 1, "spares_per_subblock": 1, "spares_per_block": 0,
        "penalty": {"block": 0.02, "cluster": 0.05},
    }  # fmt: skip
    scn = _fabric(scenario(nodes=64, days=10), topo, spares=2, gang=32)
    faults = [_fault("f0", 1.0, 40, ("xid79",), "REBOOT_NODE")]
    blind, blind_sim = _run(scn, "pitstop+tel", faults)
    aware, aware_sim = _run(scn, "pitstop-topology", faults)
    assert blind["spare_tiers"] == {"cluster": 1} and aware["spare_tiers"] == {"subblock": 1}
    assert 64 in blind_sim.jobs[1].members and 65 in aware_sim.jobs[1].members
    assert blind["gpu_hours_lost"]["fabric"] > 0 == aware["gpu_hours_lost"]["fabric"]
    # 9 days at 5 % of 256 GPUs, less the restart: what the blind move costs
    assert blind["gpu_hours_lost"]["fabric"] == pytest.approx(0.05 * 256 * 24 * 9, rel=0.02)
    assert sum(aware["gpu_hours_lost"].values()) < sum(blind["gpu_hours_lost"].values())


def test_cost_aware_pitstop_waits_for_a_gpu_reset_and_moves_for_a_host_report() -> None:
    """One gang in sub-block 0; the only spare sits in the block's spare sub-block (a move there
    costs 2 % for the day the policy assumes is left). core/tradeoff prices waiting for a GPU reset
    (3 min) below the move, and the host report (~40 min) above it."""
    topo: TopologyConf = {
        "nodes_per_subblock": 32, "subblocks_per_block": 2, "spares_per_subblock": 0, "spares_per_block": 1,
        "penalty": {"block": 0.02, "cluster": 0.05},
    }  # fmt: skip
    scn = _fabric(scenario(nodes=32, days=5), topo, spares=1, gang=32)
    faults = [
        _fault("f0", 1.0, 5, ("xid48_dram", "xid63"), "RESET_GPU"),
        _fault("f1", 3.0, 10, ("xid64_remap",), "REPLACE_NODE"),
    ]
    priced, sim = _run(scn, "pitstop-cost", faults)
    assert isinstance(sim.strategy, Placed)
    assert [(a, d) for a, d, _ in sim.strategy.decisions] == [("RESET_GPU", "wait"), ("REPLACE_NODE", "move")]
    assert sim.strategy.decisions[0][2].startswith("waited for the GPU reset")
    assert priced["choices"] == {"move": 1, "wait": 1}
    assert priced["spare_tiers"] == {"own node": 1, "block": 1}  # its node back, then the block's spare
    unpriced, _ = _run(scn, "pitstop-topology", faults)
    assert unpriced["spare_tiers"] == {"block": 1, "subblock": 1}  # moved at once both times
    assert unpriced["gpu_hours_lost"]["fabric"] > priced["gpu_hours_lost"]["fabric"]


def test_a_node_just_back_from_its_repair_gives_way_to_a_fresh_spare_as_narrow_for_the_gang() -> None:
    """One gang over two blocks (it spans the cluster whichever spare it takes), a spare in each
    block's spare sub-block. A reboot of node 5 (block 0) moves the gang onto block 0's spare and
    node 5 comes back to the idle pool; two hours later node 6 (block 0) fails: the nearest spare is
    node 5 (the gang's own sub-block) but it is on probation (``moves.probation_s``), so block 1's
    fresh spare goes, no wider for the gang."""
    topo: TopologyConf = {
        "nodes_per_subblock": 16, "subblocks_per_block": 1, "spares_per_subblock": 0, "spares_per_block": 1,
        "penalty": {"block": 0.02, "cluster": 0.05},
    }  # fmt: skip
    scn = _fabric(scenario(nodes=32, days=3), topo, spares=2, gang=32)
    faults = [
        _fault("f0", 1.0, 5, ("xid79",), "REBOOT_NODE"),
        _fault("f1", 1.0 + 2 / 24, 6, ("xid79",), "REBOOT_NODE"),
    ]
    aware, sim = _run(scn, "pitstop-topology", faults)
    assert isinstance(sim.strategy, Placed) and 5 in sim.strategy.returned
    assert {32, 33} <= sim.jobs[0].members and 5 not in sim.jobs[0].members
    assert aware["spare_tiers"] == {"block": 2}
    assert aware["gpu_hours_lost"]["fabric"] == 0


def test_the_a3_ultra_scenario_runs_by_name_with_every_strategy() -> None:
    doc = json.loads(_cli(["simulate", "--scenario", "a3-ultra", "--json", "--days", "10"]))
    fleet = doc["scenario"]["fleet"]
    assert fleet["nodes"] * fleet["gpus_per_node"] == 4096 and "vertex" not in doc
    res = {r["strategy"]: r for r in doc["strategies"]}
    assert {"pitstop+tel", "pitstop-topology", "pitstop-cost"} <= set(res)
    assert "cluster" not in res["pitstop-topology"]["spare_tiers"]
    assert (
        res["pitstop-topology"]["gpu_hours_lost"]["fabric"] < res["pitstop+tel"]["gpu_hours_lost"]["fabric"]
    )
