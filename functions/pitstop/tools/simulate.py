"""`pitstop simulate`: what each remediation strategy would cost a training fleet, on one fault trace.

A scenario (schemas/simulate.default.yaml, validated against simulate.schema.json) fixes the
fleet, the jobs, the fault mix and the action durations. One seeded trace is drawn and every
strategy runs over it (tools/sim/), so differences come from the strategies alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

import yaml

from pitstop.core import policy, resources
from pitstop.core.domain import Incident
from pitstop.tools import timing
from pitstop.tools.progress import Note, Progress, silent
from pitstop.tools.sim import trace as trace_mod
from pitstop.tools.sim import vertex as vertex_sim
from pitstop.tools.sim.fleet import PHASES, Fleet, Ledger
from pitstop.tools.sim.scenario import Comparison, Scenario, Summary, SweepRun, SweepValue
from pitstop.tools.sim.strategies import STRATEGIES, Pitstop, Placed

SCHEMA = "simulate.schema.json"
# --sweep and the override flags: a short name for each scenario field they may set.
FIELDS = {
    "nodes": ("fleet", "nodes"),
    "spares": ("fleet", "spares"),
    "days": ("days",),
    "seed": ("seed",),
    "rate": ("faults", "rate"),
    "gang_nodes": ("jobs", "gang_nodes"),
    "checkpoint_interval_min": ("jobs", "checkpoint_interval_min"),
    "checkpoint_write_min": ("jobs", "checkpoint_write_min"),
    "restart_min": ("jobs", "restart_min"),
}


def default_path() -> Path:
    return resources.schema_dir() / "simulate.default.yaml"


def scenario_path(name: str) -> Path:
    """A scenario file's path, or a shipped one's by name (``a3-ultra``: schemas/simulate.a3-ultra.yaml)."""
    shipped = resources.schema_dir() / f"simulate.{name}.yaml"
    return shipped if "/" not in name and not Path(name).exists() and shipped.is_file() else Path(name)


def load_scenario(
    path: str | Path | None = None, overrides: Mapping[str, SweepValue] | None = None
) -> Scenario:
    """The scenario file (or the shipped default) with overrides applied, validated."""
    where = scenario_path(str(path)) if path else default_path()
    doc = _read(where)
    base = doc.pop("extends", None)
    if base is not None:  # a scenario written as its differences from another (one level)
        merged = policy.deep_merge(_read(where.parent / str(base)), doc)
        doc = {k: v for k, v in merged.items() if v is not None}  # null: without the base's section
    resources.validate(doc, SCHEMA, str(where))
    return with_fields(doc, overrides or {}, str(where))


def _read(path: Path) -> dict[str, object]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise resources.DataFileError(f"{path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise resources.DataFileError(f"{path}: not a mapping")
    return doc


def with_fields(
    scn: Mapping[str, object], fields: Mapping[str, SweepValue], where: str = "scenario"
) -> Scenario:
    """A copy with short-named fields set; validated again, and the rate must be known."""
    doc = copy.deepcopy(dict(scn))
    for name, value in fields.items():
        if name not in FIELDS:
            raise resources.DataFileError(f"{where}: unknown field {name!r} (one of {', '.join(FIELDS)})")
        *parents, leaf = FIELDS[name]
        target = doc
        for p in parents:
            child = target.get(p)
            if not isinstance(child, dict):
                raise resources.DataFileError(f"{where}: {p}: not a mapping")
            target = child
        target[leaf] = value
    resources.validate(doc, SCHEMA, where)
    out = cast(Scenario, doc)  # its schema checked it just above
    rate = out["faults"]["rate"]
    if rate != "llama3" and rate not in out["faults"]["presets_per_1000_node_days"]:
        raise resources.DataFileError(f"{where}: faults/rate: unknown rate preset {rate!r}")
    return out


def _gpu_hours(seconds: float, scn: Scenario, gang: int) -> float:
    return seconds * gang * float(scn["fleet"]["gpus_per_node"]) / 3600.0


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def summarize(name: str, led: Ledger, sim: Fleet, scn: Scenario) -> Summary:
    """One strategy's figures: ETTR, GPU-hours lost by phase and by fault, resume times, money."""
    gang = sim.jobs[0].gang
    wall = sim.horizon * len(sim.jobs)
    lost = {
        "checkpoint": led.checkpoint,
        "lost_work": led.lost_work,
        "slowed": led.slowed,
        "fabric": led.fabric,
        **led.phases,
    }
    lost_gh = {k: round(_gpu_hours(v, scn, gang), 1) for k, v in lost.items()}
    total_lost = _gpu_hours(sum(lost.values()), scn, gang)
    out: Summary = {
        "strategy": name,
        "ettr": round(led.productive / wall, 5) if wall else 0.0,
        "productive_gpu_hours": round(_gpu_hours(led.productive, scn, gang), 1),
        "wall_gpu_hours": round(_gpu_hours(wall, scn, gang), 1),
        "gpu_hours_lost": lost_gh,
        "gpu_hours_lost_by_fault": {
            k: round(_gpu_hours(v, scn, gang), 1) for k, v in sorted(led.by_fault.items()) if v > 0
        },
        "faults": led.faults_seen,
        "interruptions": led.interruptions,
        "time_to_resume_min": {
            "mean": round(sum(led.resume_s) / len(led.resume_s) / 60.0, 1) if led.resume_s else 0.0,
            "p95": round(_p95(led.resume_s) / 60.0, 1),
        },
        "actions": dict(sorted(led.actions.items())),
        "nodes_held": led.held,
        "nodes_replaced": led.replaced,
        "nodes_wrongly_replaced": led.wrongly_replaced,
        "money_lost_usd": round(total_lost * scn["fleet"]["usd_per_gpu_hour"], 0),
        "spare_tiers": dict(sorted(led.spare_tiers.items())),
    }
    if isinstance(sim.strategy, Placed) and sim.strategy.priced:
        out["choices"] = dict(sorted(sim.strategy.choices.items()))
    if isinstance(sim.strategy, Pitstop | Placed):
        w = sim.strategy.world
        out["engine"] = {
            "results": dict(sorted(w.results.items())),
            "incidents": len(w.docs.incidents),
            "escalated": sum(1 for i in w.docs.incidents.values() if i["escalations"]),
            "decided": _decided(w.docs.incidents.values()),
        }
    return out


def _decided(incidents: Iterable[Incident]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for inc in incidents:
        counts[inc["action"]] = counts.get(inc["action"], 0) + 1
    return dict(sorted(counts.items()))


def simulate(scn: Scenario, note: Note = silent) -> Comparison:
    """Every strategy of the scenario over one trace: ``{"strategies": [...], "scenario": {...}}``."""
    faults = trace_mod.generate(scn)
    rows = []
    for name in scn["strategies"]:
        note(f"{name} on {scn['fleet']['nodes']:,} nodes, {len(faults):,} faults over {scn['days']} days")
        sim = Fleet(scn, STRATEGIES[name](scn))
        rows.append(summarize(name, sim.run(faults), sim, scn))
    out: Comparison = {"strategies": rows, "scenario": scn, "trace": _trace_counts(faults)}
    if "vertex" in scn:
        out["vertex"] = vertex_jobs(scn)
    return out


def vertex_jobs(scn: Scenario) -> list[vertex_sim.VertexRun]:
    """The scenario's Vertex AI jobs, by a person in the morning and by Pitstop (its job budget)."""
    budget = policy.from_doc(scn["policy"]).job_restarts()
    d = scn["durations"]
    human, detect = [float(x) for x in d["human_detect"]], float(d["pitstop_detect"])
    return [
        vertex_sim.run(who, scn["vertex"], float(scn["days"]), scn["seed"], human, detect, budget)
        for who in ("morning", "pitstop")
    ]


def _trace_counts(faults: list[trace_mod.Fault]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in faults:
        counts[f.category] = counts.get(f.category, 0) + 1
    return dict(sorted(counts.items()))


def parse_sweep(text: str) -> tuple[str, list[SweepValue]]:
    """``nodes=256,512`` → ("nodes", [256, 512]); numbers stay numbers."""
    key, sep, values = text.partition("=")
    if not sep or key not in FIELDS or not values:
        raise argparse.ArgumentTypeError(
            f"--sweep wants FIELD=V1,V2,... with FIELD one of {', '.join(FIELDS)}"
        )
    return key, [_number(v) for v in values.split(",") if v]


def _number(v: str) -> SweepValue:
    for number in (int, float):
        try:
            return number(v)
        except ValueError:
            pass
    return v


def sweep(scn: Scenario, key: str, values: Sequence[SweepValue], note: Note = silent) -> list[SweepRun]:
    """One full comparison per value of a field (each with its own trace from the same seed)."""
    runs: list[SweepRun] = []
    for k, v in enumerate(values, 1):
        note(f"--sweep {key}={v} ({k} of {len(values)})", force=True)
        runs.append(
            {"value": v, "strategies": simulate(with_fields(scn, {key: v}, "--sweep"), note)["strategies"]}
        )
    return runs


# -- output ------------------------------------------------------------------------------------


def format_table(result: Comparison) -> str:
    """The comparison as a fixed-width text table, one row per strategy."""
    scn = result["scenario"]
    head = (
        f"{scn['fleet']['nodes']} nodes x {scn['fleet']['gpus_per_node']} GPUs, "
        f"{scn['fleet']['spares']} spares, "
        f"{scn['days']} days, rate {scn['faults']['rate']}, checkpoint every "
        f"{scn['jobs']['checkpoint_interval_min']} min, seed {scn['seed']}"
    )
    if "topology" in scn["fleet"]:
        topo = scn["fleet"]["topology"]
        head += (
            f"; blocks of {topo['subblocks_per_block']} sub-blocks of {topo['nodes_per_subblock']} nodes"
            f" (+{topo['spares_per_subblock']} spares each, +{topo['spares_per_block']} per block)"
        )
    cols = (
        "strategy",
        "ETTR",
        "lost kGPU-h",
        "ckpt",
        "work",
        "slow",
        "fabric",
        "detect",
        "wait",
        "restart",
        "intr",
        "resume",
        "p95",
        "held",
        "repl",
        "wrong",
        "$M lost",
    )
    fmt = "{:<17}{:>7}{:>12}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>9}{:>6}{:>8}{:>7}{:>6}{:>6}{:>6}{:>9}"
    lines = [
        head,
        "GPU-hours lost in thousands by cause (slow: a straggler's gang running slower; fabric: a gang"
        " spread over more blocks or sub-blocks than it started in); resume and p95 in minutes",
        fmt.format(*cols),
    ]
    for r in result["strategies"]:
        lost = r["gpu_hours_lost"]
        lines.append(
            fmt.format(
                r["strategy"],
                f"{r['ettr']:.4f}",
                f"{sum(lost.values()) / 1e3:,.1f}",
                *(f"{lost[k] / 1e3:,.1f}" for k in ("checkpoint", "lost_work", "slowed", "fabric", *PHASES)),
                r["interruptions"],
                r["time_to_resume_min"]["mean"],
                r["time_to_resume_min"]["p95"],
                r["nodes_held"],
                r["nodes_replaced"],
                r["nodes_wrongly_replaced"],
                f"{r['money_lost_usd'] / 1e6:,.2f}",
            )
        )
    for r in result["strategies"]:
        if "choices" in r:
            chose = ", ".join(f"{k} {v}" for k, v in r["choices"].items()) or "nothing to weigh"
            lines.append(f"{r['strategy']} at each node repair (core/tradeoff): {chose}")
    return "\n".join(lines)


def format_vertex(runs: list[vertex_sim.VertexRun]) -> str:
    """The Vertex AI jobs' lines: who resumes a failed job, how fast, and the idle GPU-hours."""
    lines = ["Vertex AI jobs   failures  resubmitted  paged  idle GPU-h  lost work GPU-h  resume min (mean)"]
    for r in runs:
        lines.append(
            f"{r['strategy']:<16} {r['failures']:>8}  {r['resubmitted']:>11}  {r['paged']:>5}  "
            f"{r['idle_gpu_hours']:>10}  {r['lost_work_gpu_hours']:>15}  {r['time_to_resume_min']:>17}"
        )
    return "\n".join(lines)


def format_sweep(key: str, runs: list[SweepRun]) -> str:
    names = [r["strategy"] for r in runs[0]["strategies"]] if runs else []
    lines = [f"ETTR by {key}", "".join(f"{c:>12}" for c in (key, *names))]
    for run in runs:
        cells = [f"{r['ettr']:.4f}" for r in run["strategies"]]
        lines.append("".join(f"{c:>12}" for c in (str(run["value"]), *cells)))
    return "\n".join(lines)


def plot(path: str, result: Comparison, sweep_key: str | None, runs: list[SweepRun]) -> None:
    """ETTR (per strategy, against the swept field when there is one) and GPU-hours lost by cause."""
    import matplotlib  # only with --plot: the rest of pitstop does not need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["strategy"] for r in result["strategies"]]
    if sweep_key and runs:
        xs = [run["value"] for run in runs]
        for i, name in enumerate(names):
            left.plot(xs, [run["strategies"][i]["ettr"] for run in runs], marker="o", label=name)
        left.set_xlabel(sweep_key)
        nums = [x for x in xs if isinstance(x, int | float)]  # a swept rate is a word: no log axis
        if len(nums) == len(xs) and min(nums) > 0 and max(nums) / min(nums) >= 10:
            left.set_xscale("log", base=2)  # fleet sizes double; a linear axis hides the small ones
        left.legend()
    else:
        left.bar(names, [r["ettr"] for r in result["strategies"]], color="tab:blue")
    left.set_ylabel("ETTR (productive / wall time)")
    left.set_title("Effective training time ratio")
    left.grid(alpha=0.3)
    bottom = [0.0] * len(names)
    for cause in ("checkpoint", "lost_work", "slowed", "fabric", *PHASES):
        vals = [r["gpu_hours_lost"][cause] for r in result["strategies"]]
        right.bar(names, vals, bottom=bottom, label=cause.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    right.set_ylabel("GPU-hours lost")
    right.set_title("GPU-hours lost by cause")
    right.legend()
    scn = result["scenario"]
    fig.suptitle(
        f"pitstop simulate: {scn['fleet']['nodes']} nodes, {scn['days']} days, rate {scn['faults']['rate']}, "
        f"seed {scn['seed']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command -------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    overrides = {
        k: getattr(args, k)
        for k in ("nodes", "spares", "days", "seed", "rate")
        if getattr(args, k) is not None
    }
    scn = load_scenario(args.scenario, overrides)
    if args.strategies:
        scn = copy.deepcopy(scn)
        scn["strategies"] = [s for s in args.strategies.split(",") if s]
        resources.validate(scn, SCHEMA, "--strategies")
    if args.bench:  # bench.bench_simulate on this scenario: one comparison and a fleet-size sweep, timed
        sizes = args.sweep[1] if args.sweep and args.sweep[0] == "nodes" else SIMULATE_SWEEP_NODES
        print(json.dumps(bench_simulate(scn, sweep_nodes=sizes), indent=2))
        return 0
    note = Progress("simulate").note
    result = simulate(scn, note)
    key: str | None = None
    runs: list[SweepRun] = []
    if args.sweep:
        key, values = args.sweep
        runs = sweep(scn, key, values, note)
        result["sweep"] = {"field": key, "runs": runs}
    if args.plot:
        plot(args.plot, result, key, runs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
        if "vertex" in result:
            print("\n" + format_vertex(result["vertex"]))
        if key:
            print("\n" + format_sweep(key, runs))
    return 0


def add(sub: Any) -> None:
    """Add ``simulate`` to the pitstop CLI."""
    s = sub.add_parser(
        "simulate", help="compare remediation strategies on a simulated fleet (ETTR, GPU-hours, $)"
    )
    s.add_argument(
        "--scenario",
        default=None,
        help="scenario YAML, or a shipped one by name: a3-ultra (default: schemas/simulate.default.yaml)",
    )
    s.add_argument(
        "--rate", default=None, help="fault rate: llama3, or a preset of the scenario (rsc1, rsc2)"
    )
    s.add_argument("--nodes", type=int, default=None, help="nodes running jobs")
    s.add_argument("--spares", type=int, default=None, help="idle nodes a gang can restart on at once")
    s.add_argument("--days", type=float, default=None, help="length of the simulated period")
    s.add_argument("--seed", type=int, default=None, help="seed of the fault trace (same seed, same trace)")
    s.add_argument(
        "--strategies",
        default=None,
        help="comma-separated: manual,gke,nvsentinel,pitstop,pitstop+tel,pitstop-topology,pitstop-cost",
    )
    s.add_argument("--sweep", type=parse_sweep, default=None, help="FIELD=V1,V2,... e.g. nodes=256,512,1024")
    s.add_argument("--json", action="store_true", help='{"strategies": [...], "scenario": {...}}')
    s.add_argument("--plot", metavar="FILE.png", default=None, help="ETTR and GPU-hours lost by cause")
    s.add_argument(
        "--bench",
        action="store_true",
        help="time one comparison and a sweep of fleet sizes (--sweep nodes=...) instead; JSON",
    )
    s.set_defaults(func=cmd_simulate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pitstop")
    add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


# Issue 15's targets: one 2,048-node, 54-day Llama-3-rate comparison under 30 s on one core, and
# a sweep of 10 fleet sizes under 5 min. The sweep's sizes bracket the default fleet.
SIMULATE_SWEEP_NODES = tuple(256 * k for k in range(1, 11))
SIMULATE_TARGETS_S = {"single": 30.0, "sweep": 300.0}


class SingleRun(TypedDict):
    nodes: int
    wall_s: float
    cpu_s: float
    trace_faults: int
    faults_handled: int
    target_s: float


class SweepTimes(TypedDict):
    nodes: list[int]
    runs: int
    wall_s: float
    cpu_s: float
    target_s: float


class SimulateBench(TypedDict):
    """``pitstop bench simulate``'s figures (``--bench``)."""

    benchmark: str
    rate: str
    days: float
    strategies: list[str]
    cpus: int  # the CPUs the run was pinned to (timing.one_core)
    single: SingleRun
    sweep: SweepTimes


def bench_simulate(
    scn: Scenario | None = None,
    nodes: int | None = None,
    sweep_nodes: Sequence[int] = SIMULATE_SWEEP_NODES,
) -> SimulateBench:
    """Wall time of one full comparison (trace + every strategy) and of a sweep over fleet sizes.

    ``scn``: a loaded scenario (default: the shipped one, 2,048 nodes for 54 days at the Llama 3
    rate); ``nodes`` overrides its fleet for the single run. Both run in this one process, pinned
    to one CPU, one after the other.
    """
    base = scn if scn is not None else load_scenario()
    one = with_fields(base, {"nodes": nodes}, "bench") if nodes is not None else base
    with timing.one_core() as cpus:
        result, wall, cpu = timing.timed(lambda: simulate(one))
        runs, sweep_wall, sweep_cpu = timing.timed(lambda: sweep(base, "nodes", list(sweep_nodes)))
    return {
        "benchmark": "simulate",
        "rate": one["faults"]["rate"],
        "days": one["days"],
        "strategies": list(one["strategies"]),
        "cpus": cpus,
        "single": {
            "nodes": one["fleet"]["nodes"],
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "trace_faults": sum(result["trace"].values()),
            "faults_handled": sum(r["faults"] for r in result["strategies"]),
            "target_s": SIMULATE_TARGETS_S["single"],
        },
        "sweep": {
            "nodes": list(sweep_nodes),
            "runs": len(runs),
            "wall_s": round(sweep_wall, 3),
            "cpu_s": round(sweep_cpu, 3),
            "target_s": SIMULATE_TARGETS_S["sweep"],
        },
    }
