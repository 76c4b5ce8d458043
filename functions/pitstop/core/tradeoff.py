"""Wait, move, shrink or hold: the expected GPU-hours each costs a gang at a fault, and the least.

For a gang of ``gpus`` GPUs whose node must be repaired (the action's expected repair time: the
fleet's measured median when it has enough history, else the policy's default):

- **wait** for the repair in place, then restart: ``gpus * (repair + restart)``.
- **move** now onto the best spare (core/topology.pick): ``gpus * restart`` plus, when the move
  spreads the gang over a wider level of the fabric, ``gpus * remaining run * penalty`` (its
  collectives run slower for the rest of the run: the policy's factor per level).
- **shrink**, only for a job that says it is elastic: restart without the node now and grow back
  once it returns: ``gpus * 2 * restart + gpus / nodes * repair`` (its share idles meanwhile).
- **hold** for capacity when no spare may be taken: requeue now and wait for capacity to free up
  elsewhere, ``gpus * (capacity wait + restart)``, taken only when that beats waiting.

Work since the last checkpoint is lost whichever way (every option restarts), so it is left out.
The least expected loss is chosen; ties go to the option earlier in that list (waiting changes the
least). An NVL72 gang with no spare in its NVLink domain cannot move: it waits and a person is
paged. The numbers and one sentence saying them are kept on the incident and in its notification.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pitstop.core import topology
from pitstop.core.domain import MoveChoice, OptionCost
from pitstop.core.policy_types import MovesConfig
from pitstop.core.topology import Pick

WAIT, MOVE, SHRINK, HOLD = "wait", "move", "shrink", "hold"
ORDER = (WAIT, MOVE, SHRINK, HOLD)
# What waiting waits for, as the sentence names it.
REPAIRS: Mapping[str, str] = {
    "RESET_GPU": "the GPU reset",
    "REBOOT_NODE": "the reboot",
    "REPLACE_NODE": "the host report",
    "DRAIN_NODE": "the maintenance",
    "RESCHEDULE_JOB": "the node to come back",
}


@dataclass(frozen=True)
class Costs:
    """The policy's ``moves`` knobs (schemas/policy.defaults.yaml), as numbers."""

    restart_s: float = 600.0
    horizon_s: float = 86400.0
    capacity_wait_s: float = 7200.0
    penalty: Mapping[str, float] = field(default_factory=lambda: {"block": 0.02, "cluster": 0.05})
    repair_s: Mapping[str, float] = field(default_factory=dict)
    min_history: int = 5


@dataclass(frozen=True)
class Situation:
    """One gang at one fault: what is known when the choice is made."""

    action: str
    nodes: int
    gpus: int
    repair_s: float
    repair_from: str  # "default" or "measured (N incidents)"
    pick: Pick | None  # None: the scheduler said there is no capacity
    elastic: bool = False
    remaining_s: float | None = None  # the run left, when the job says (else the policy's horizon)
    placed: bool = True  # the scheduler puts the gang on the picked spares (else it places it itself)


@dataclass(frozen=True)
class Weighed:
    decision: str
    options: tuple[OptionCost, ...]
    why: str
    penalty: float
    page: bool = False

    def cost(self, option: str) -> float | None:
        return next((o["gpu_h"] for o in self.options if o["option"] == option), None)

    def doc(self, s: Situation, costs: Costs, job: str, now: float) -> MoveChoice:
        pick = s.pick
        return {
            "decision": self.decision,
            "why": self.why,
            "options": list(self.options),
            "job": job,
            "nodes": s.nodes,
            "gpus": s.gpus,
            "spares": [seat.node for seat in pick.spares] if pick else [],
            "tier": pick.tier if pick and pick.spares else "unknown",
            "repair_s": round(s.repair_s, 1),
            "repair_from": s.repair_from,
            "restart_s": costs.restart_s,
            "penalty": self.penalty,
            "page": self.page,
            "at": now,
        }


def repair_estimate(action: str, measured: Iterable[float], costs: Costs) -> tuple[float, str]:
    """The action's expected repair time: the median of this fleet's measured ones when there are at
    least ``min_history`` of them, else the policy's default (and which it was)."""
    seen = [m for m in measured if m >= 0]
    if len(seen) >= max(1, costs.min_history):
        return float(statistics.median(seen)), f"measured ({len(seen)} incidents)"
    return float(costs.repair_s.get(action, costs.repair_s.get("default", 1800.0))), "default"


def penalty_of(pick: Pick | None, costs: Costs) -> float:
    """The throughput the move costs for the rest of the run: nothing unless it widens the gang."""
    if pick is None or not pick.spares or not pick.widens:
        return 0.0
    return float(costs.penalty.get(pick.after, costs.penalty.get("cluster", 0.0)))


def _gpu_h(gpus: int, seconds: float) -> float:
    return round(gpus * seconds / 3600.0, 1)


def options(s: Situation, costs: Costs) -> tuple[list[OptionCost], float]:
    """Each option open to the gang, priced; and the move's throughput penalty."""
    g, restart = s.gpus, costs.restart_s
    what = REPAIRS.get(s.action, "the repair")
    out: list[OptionCost] = [
        {"option": WAIT, "gpu_h": _gpu_h(g, s.repair_s + restart), "how": f"wait for {what}, then restart"}
    ]
    penalty = penalty_of(s.pick, costs)
    if s.pick is not None and s.pick.spares:
        remaining = costs.horizon_s if s.remaining_s is None else s.remaining_s
        slower = f" + {penalty:.0%} slower collectives for {remaining / 3600:.0f} h" if penalty else ""
        out.append(
            {
                "option": MOVE,
                "gpu_h": _gpu_h(g, restart + remaining * penalty),
                "how": f"restart now on {_where(s)}{slower}",
            }
        )
    if s.elastic and s.nodes > 1:
        idle = s.repair_s * g / s.nodes
        how = "restart without the node now, grow back once it returns"
        out.append({"option": SHRINK, "gpu_h": _gpu_h(1, g * 2 * restart + idle), "how": how})
    if (s.pick is None or not s.pick.spares) and not (s.pick and s.pick.domain):  # NVL72: its domain only
        how = "requeue now and wait for capacity elsewhere"
        out.append({"option": HOLD, "gpu_h": _gpu_h(g, costs.capacity_wait_s + restart), "how": how})
    return out, penalty


def weigh(s: Situation, costs: Costs) -> Weighed:
    """The least expected loss among the options open to the gang, and the sentence saying why."""
    opts, penalty = options(s, costs)
    best = min(opts, key=lambda o: (o["gpu_h"], ORDER.index(o["option"])))
    domain_full = s.pick is not None and s.pick.blocked is not None and s.pick.domain is not None
    return Weighed(best["option"], tuple(opts), _why(best, opts, s), penalty, page=domain_full)


def _why(best: OptionCost, opts: list[OptionCost], s: Situation) -> str:
    """One sentence: what was chosen, its expected loss, against the next best (and why no move)."""
    others = sorted((o for o in opts if o is not best), key=lambda o: o["gpu_h"])
    versus = f" vs {others[0]['gpu_h']:g} {_phrase(others[0], s)}" if others else ""
    head = {
        WAIT: f"waited for {REPAIRS.get(s.action, 'the repair')}",
        MOVE: f"moved to {_where(s)}",
        SHRINK: "shrank the gang",
        HOLD: "requeued to wait for capacity",
    }[best["option"]]
    tail = f" ({s.pick.blocked})" if s.pick is not None and s.pick.blocked else ""
    return f"{head}: {best['gpu_h']:g} GPU-h expected{versus}{tail}"


def _phrase(o: OptionCost, s: Situation) -> str:
    return {
        WAIT: f"waiting for {REPAIRS.get(s.action, 'the repair')}",
        MOVE: f"moving to {_where(s)}",
        SHRINK: "shrinking the gang",
        HOLD: "waiting for capacity",
    }[o["option"]]


def costs_of(moves: MovesConfig) -> Costs:
    """The policy's ``moves`` section as the numbers :func:`weigh` takes."""
    return Costs(
        restart_s=float(moves["restart_s"]),
        horizon_s=float(moves["horizon_s"]),
        capacity_wait_s=float(moves["capacity_wait_s"]),
        penalty={"block": float(moves["penalty"]["block"]), "cluster": float(moves["penalty"]["cluster"])},
        repair_s={k: float(v) for k, v in moves["repair_s"].items()},
        min_history=int(moves["min_history"]),
    )


def _where(s: Situation) -> str:
    """Where a move goes: the picked spares, or (a scheduler that places the gang itself) a spare
    it picks, the nearest one named."""
    if s.pick is None or not s.pick.spares:
        return "a spare"
    if s.placed or s.pick.spares[0].node == topology.UNNAMED:
        return s.pick.where
    return f"a spare the scheduler picks (nearest: {s.pick.where})"
