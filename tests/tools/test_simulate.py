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
from pitstop.tools.sim import trace
from pitstop.tools.sim.fleet import Fleet
from pitstop.tools.sim.scenario import Category, Comparison, Scenario, Summary, SweepValue
from pitstop.tools.sim.strategies import Pitstop, catalog_action


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
    res = by_name(simulate.simulate(scenario()))
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
    assert names == ["manual", "gke", "nvsentinel", "pitstop", "pitstop+tel"]
    for r in doc["strategies"]:
        assert 0 < r["ettr"] <= 1
        assert set(r["gpu_hours_lost"]) == {"checkpoint", "lost_work", "slowed", "detect", "wait", "restart"}
        assert set(r["time_to_resume_min"]) == {"mean", "p95"}
        for k in ("interruptions", "nodes_held", "nodes_wrongly_replaced", "money_lost_usd"):
            assert isinstance(r[k], int | float)
    resources.validate(doc["scenario"], simulate.SCHEMA, "echoed scenario")
    assert doc["scenario"]["fleet"]["nodes"] == 128


def test_cli_table_sweep_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "ettr.png"
    out = _cli(["simulate", "--days", "3", "--nodes", "64", "--sweep", "nodes=32,64", "--plot", str(png)])
    assert "pitstop" in out and "ETTR by nodes" in out
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
