"""`pitstop report`'s checkpoint advice: each job's goodput-optimal interval, from measurements (no I/O).

Inputs, all measured over the report's period:

- the fleet's interruptions per node-hour: its incidents that took a node (or its job) out, that is
  every one but those recorded with nothing to do and those rejected, over the fleet's node-hours
  (``--fleet-nodes`` x the period; without it, the nodes seen: an upper bound on the rate). A period
  with no interruption uses the policy's ``checkpoint_advice.default_failures_per_1000_node_days``,
  labelled default;
- each job's checkpoint series (docs/telemetry.md): its nodes, its checkpoints' write time (the
  median: the cost ``delta``) and the median time between the ends of two checkpoints, less that
  cost (its interval of work ``tau``), once it has ``min_checkpoints`` of them;
- the restart cost: the period's median time from detection to the job running again, once
  ``moves.min_history`` incidents measured it, else the policy's ``moves.restart_s``.

core/checkpointing.py turns these into each job's advice; the GPU-hours it would gain are its GPUs
x the hours its series spans x the goodput gained.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pitstop.core import checkpointing
from pitstop.core.policy import Policy

HOUR = 3600.0
NOT_INTERRUPTED = ("recorded", "rejected")  # report_model outcomes that took nothing out


@dataclass(frozen=True)
class Series:
    """One job's checkpoint series as Monitoring holds it (adapters/monitoring.checkpoint_series)."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]  # (end of a checkpoint, epoch s; seconds its write took)


@dataclass(frozen=True)
class Rate:
    interruptions: int
    node_hours: float
    per_node_hour: float
    default: bool  # no interruption in the period: the policy's default rate


@dataclass(frozen=True)
class JobRow:
    cluster: str
    job: str
    nodes: int
    checkpoints: int
    cost_s: float
    hours: float  # the span of its series in the period
    advice: checkpointing.Advice
    gpu_hours_gained: float | None  # None: its interval is not measured yet


@dataclass(frozen=True)
class Advice:
    rate: Rate
    fleet_nodes: int
    fleet_nodes_given: bool
    restart_s: float
    restart_measured: bool
    jobs: tuple[JobRow, ...]
    skipped: tuple[str, ...]  # series that could not be read as a job's, and why


def rate(outcomes: Iterable[str], fleet_nodes: int, hours: float, policy: Policy) -> Rate:
    """Interruptions per node-hour over the period (the policy's default, labelled, when none)."""
    n = sum(1 for o in outcomes if o not in NOT_INTERRUPTED)
    node_hours = fleet_nodes * hours
    if n and node_hours > 0:
        return Rate(n, node_hours, n / node_hours, False)
    default = policy.checkpoint_advice["default_failures_per_1000_node_days"] / 1000 / 24
    return Rate(n, node_hours, default, True)


def restart(resume_s: Sequence[float], policy: Policy) -> tuple[float, bool]:
    """The restart cost: the measured median time to resume, or the policy's when too few."""
    if len(resume_s) >= policy.moves["min_history"]:
        return statistics.median(resume_s), True
    return float(policy.moves["restart_s"]), False


def _nodes(labels: Mapping[str, str]) -> int | None:
    text = labels.get("nodes", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def job_row(s: Series, node_mtbf_s: float, restart_s: float, policy: Policy) -> JobRow | str:
    """One job's advice, or why its series gives none."""
    cfg = policy.checkpoint_advice
    cluster, job, nodes = s.labels.get("cluster", ""), s.labels.get("job", ""), _nodes(s.labels)
    points = sorted((t, c) for t, c in s.points if c >= 0)  # a negative write time is no measurement
    if nodes is None or not job:
        return f"{cluster or '?'}/{job or '?'}: no positive whole 'nodes' label or no 'job' label"
    if not points:
        return f"{cluster or '?'}/{job}: no checkpoint in the period"
    cost = statistics.median(c for _, c in points)
    actual = None
    if len(points) >= cfg["min_checkpoints"]:
        work = statistics.median(b - a for (a, _), (b, _) in itertools.pairwise(points)) - cost
        actual = work if work > 0 else None
    advice = checkpointing.advise(node_mtbf_s, nodes, cost, restart_s, actual)
    hours = (points[-1][0] - points[0][0]) / HOUR
    gained = None if advice.gain is None else nodes * cfg["gpus_per_node"] * hours * advice.gain
    return JobRow(cluster, job, nodes, len(points), cost, hours, advice, gained)


def build(
    series: Iterable[Series],
    outcomes: Iterable[str],
    resume_s: Sequence[float],
    policy: Policy,
    hours: float,
    fleet_nodes: int | None = None,
    nodes_seen: int = 0,
) -> Advice:
    """The period's advice for every job that wrote its checkpoint series."""
    got = list(series)
    if fleet_nodes:
        fleet, given = fleet_nodes, True
    else:  # the nodes seen: those with an incident, or those of the jobs that checkpoint
        fleet, given = max(nodes_seen, sum(_nodes(s.labels) or 0 for s in got), 1), False
    r = rate(outcomes, fleet, hours, policy)
    restart_s, measured = restart(resume_s, policy)
    rows: list[JobRow] = []
    skipped: list[str] = []
    for s in got:
        row = job_row(s, HOUR / r.per_node_hour, restart_s, policy)
        if isinstance(row, JobRow):
            rows.append(row)
        else:
            skipped.append(row)
    rows.sort(key=lambda j: (-(j.gpu_hours_gained or 0.0), j.cluster, j.job))
    return Advice(r, fleet, given, restart_s, measured, tuple(rows), tuple(skipped))
