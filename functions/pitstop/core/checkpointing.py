"""How often a job should checkpoint: the interval that maximises its goodput, and what it gains.

The model is Daly's (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", Future Generation Computer Systems 22(3):303-312, 2006): interruptions arrive at
random (exponential, mean time between them ``M`` for the job), a checkpoint takes ``delta`` seconds,
a restart ``restart`` seconds, and ``tau`` seconds of work lie between checkpoints. The expected
wall-clock time per second of work is ``M * exp(R/M) * (exp((tau + delta)/M) - 1) / tau``; its
inverse is the goodput fraction (:func:`goodput`). It counts the checkpoint writes, the work lost
since the last checkpoint and the restart at each interruption, and interruptions during either.

Setting its derivative to zero gives ``M * (1 - exp(-(tau + delta)/M)) = tau``, one root, the exact
optimum (:func:`optimum`, found by bisection: the left side minus ``tau`` falls strictly). Daly's
higher-order closed form (:func:`daly`) and Young's first-order ``sqrt(2 delta M)`` (J. W. Young,
"A first order approximation to the optimum checkpoint interval", CACM 17(9):530-531, 1974;
:func:`young`) approximate it; both are shown beside it. A job's ``M`` is the node MTBF divided by
its node count (reference/topology-and-vertex.md, "Checkpoint interval").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_BISECT_STEPS = 200  # halvings: far past a double's precision at any scale


def young(delta: float, mtbf: float) -> float:
    """Young (1974): the first-order optimum interval of work, ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * delta * mtbf)


def daly(delta: float, mtbf: float) -> float:
    """Daly (2006), the higher-order estimate: ``sqrt(2dM) * (1 + sqrt(d/2M)/3 + (d/2M)/9) - d``
    while ``d < 2M``, else ``M`` (a checkpoint costlier than two MTBFs: checkpoint once per MTBF)."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def goodput(tau: float, delta: float, mtbf: float, restart: float) -> float:
    """Daly's model: the share of wall-clock time that is work kept, checkpointing every ``tau``
    seconds of work (0 for no work between checkpoints)."""
    if tau <= 0.0:
        return 0.0
    if math.isinf(mtbf):
        return tau / (tau + delta)
    x = (tau + delta) / mtbf  # in logs: exp(x) overflows for an interval of many MTBFs
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))
    return math.exp(math.log(tau) - math.log(mtbf) - restart / mtbf - log_expm1)


def optimum(delta: float, mtbf: float) -> float:
    """The interval of work that maximises :func:`goodput` (the restart cost only scales it): the
    root of ``M * (1 - exp(-(tau + delta)/M)) - tau``, which falls strictly from above 0 at 0."""
    lo, hi = 0.0, mtbf  # the root is below M: the left side never reaches M
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2.0
        if -mtbf * math.expm1(-(mid + delta) / mtbf) > mid:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Advice:
    """One job's checkpoint interval, as it is and as advised, and the goodput of each."""

    mtbf_s: float  # the job's: node MTBF / its nodes
    advised_s: float  # the optimum of Daly's model
    young_s: float
    daly_s: float
    goodput_advised: float
    actual_s: float | None = None  # its measured interval (None: not measured)
    goodput_actual: float | None = None

    @property
    def gain(self) -> float | None:
        """Goodput (a share of wall-clock time) the advised interval adds to the actual one."""
        return None if self.goodput_actual is None else self.goodput_advised - self.goodput_actual


def advise(
    node_mtbf_s: float, nodes: int, delta_s: float, restart_s: float, actual_s: float | None = None
) -> Advice:
    """The advice for a job of ``nodes`` nodes that takes ``delta_s`` to checkpoint, on a fleet whose
    node MTBF is ``node_mtbf_s`` (finite: with no interruption there is nothing to weigh)."""
    if not (node_mtbf_s > 0.0 and math.isfinite(node_mtbf_s)) or nodes < 1 or delta_s < 0.0:
        raise ValueError(f"no advice for node MTBF {node_mtbf_s}, {nodes} nodes, checkpoint {delta_s} s")
    m = node_mtbf_s / nodes
    best = optimum(delta_s, m)
    actual_g = None if actual_s is None else goodput(actual_s, delta_s, m, restart_s)
    return Advice(
        mtbf_s=m,
        advised_s=best,
        young_s=young(delta_s, m),
        daly_s=daly(delta_s, m),
        goodput_advised=goodput(best, delta_s, m, restart_s),
        actual_s=actual_s,
        goodput_actual=actual_g,
    )
