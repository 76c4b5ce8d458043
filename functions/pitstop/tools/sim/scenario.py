"""The shape of a `pitstop simulate` scenario (schemas/simulate.schema.json), once checked.

A scenario is a plain dict when loaded; simulate.load_scenario validates it against its schema
before it is one of these, so ``mypy --strict`` checks every field the fleet model reads.
Durations are minutes, as in the file; the model converts them to seconds.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pitstop.core.domain import JsonObject
from pitstop.tools.sim.vertex import VertexConf, VertexRun


class Penalty(TypedDict):
    block: float  # a gang that started in one sub-block now spans sub-blocks of its block
    cluster: float  # ... now spans blocks


class TopologyConf(TypedDict):
    """Blocks and sub-blocks (tools/sim/placement.py): where each node and spare sits."""

    nodes_per_subblock: int  # job nodes; the sub-block's spares come on top
    subblocks_per_block: int
    spares_per_subblock: int
    spares_per_block: int  # in a spare sub-block of the block
    penalty: Penalty


class FleetConf(TypedDict):
    nodes: int  # nodes running jobs (spares come on top)
    gpus_per_node: int
    spares: int
    usd_per_gpu_hour: float
    topology: NotRequired[TopologyConf]  # none: every node in one place, no move costs throughput


class JobsConf(TypedDict):
    gang_nodes: int | None  # None: one job over the whole fleet
    checkpoint_interval_min: float
    checkpoint_write_min: float
    restart_min: float
    self_detect_min: float


class Basis(TypedDict):
    """The fleet and days the categories' counts were observed over."""

    nodes: float
    days: float


class Category(TypedDict):
    """One kind of fault: how often, how it shows, and what truly fixes it."""

    count: float
    signal: str  # xid | host_error | maintenance | hang | straggler | none
    bursts: NotRequired[list[list[str]]]  # xid: kernel lines named in sim/trace.LINES
    needs: NotRequired[dict[str, float]]  # the weakest action that fixes it -> its weight


class FaultsConf(TypedDict):
    rate: str  # llama3, or a key of presets_per_1000_node_days
    presets_per_1000_node_days: dict[str, float]
    basis: Basis
    recur_mean_h: float
    categories: dict[str, Category]
    straggler_slowdown: float


class Durations(TypedDict):
    """Minutes each step takes; the two ranges are [low, high] a fault draws from uniformly."""

    reset_gpu: float
    reboot: float
    report_host_faulty: float
    host_swap: float
    mig_recreate: float
    maintenance: float
    maintenance_notice: float
    host_error_restart: float
    human_detect: list[float]
    pitstop_detect: float
    fence: float
    diagnose: float
    validate: float
    gke_not_ready: float
    nvsentinel_cordon: float
    nvsentinel_quarantine_before: float
    nvsentinel_after_window: float
    hang_alert: float
    localise: float
    straggler_alert: float
    straggler_human: list[float]


class Scenario(TypedDict):
    version: int
    seed: int
    days: float
    fleet: FleetConf
    jobs: JobsConf
    faults: FaultsConf
    durations: Durations
    strategies: list[str]  # names in sim/strategies.STRATEGIES
    # open: an overlay merged over the shipped policy, checked by policy.from_doc (its own schema)
    policy: JsonObject
    vertex: NotRequired[VertexConf]  # Vertex AI custom training jobs (tools/sim/vertex.py)


# -- what `pitstop simulate` prints with --json (simulate.simulate, simulate.sweep) --------------

SweepValue = int | float | str  # a --sweep value: a number where it reads as one


class ResumeTimes(TypedDict):
    mean: float  # minutes
    p95: float


class EngineCounts(TypedDict):
    """The Pitstop strategy's engine: its outcomes, incidents, and the actions it decided."""

    results: dict[str, int]
    incidents: int
    escalated: int
    decided: dict[str, int]


class Summary(TypedDict):
    """One strategy's figures (simulate.summarize); GPU-hours rounded to a tenth."""

    strategy: str
    ettr: float
    productive_gpu_hours: float
    wall_gpu_hours: float
    gpu_hours_lost: dict[str, float]  # checkpoint, lost_work, slowed, fabric and each fleet.PHASES
    gpu_hours_lost_by_fault: dict[str, float]
    faults: int
    interruptions: int
    time_to_resume_min: ResumeTimes
    actions: dict[str, int]
    nodes_held: int
    nodes_replaced: int
    nodes_wrongly_replaced: int
    money_lost_usd: float
    spare_tiers: dict[str, int]  # spares taken, by where they sat from the gang (placement.TIERS)
    engine: NotRequired[EngineCounts]  # the pitstop strategies only
    choices: NotRequired[dict[str, int]]  # pitstop-cost: wait / move / hold, as core/tradeoff chose


class SweepRun(TypedDict):
    value: SweepValue
    strategies: list[Summary]


class Sweep(TypedDict):
    field: str
    runs: list[SweepRun]


class Comparison(TypedDict):
    """Every strategy over one trace, the scenario it ran, and the trace's faults by category."""

    strategies: list[Summary]
    scenario: Scenario
    trace: dict[str, int]
    sweep: NotRequired[Sweep]
    vertex: NotRequired[list[VertexRun]]  # the scenario's Vertex AI jobs: morning vs pitstop
