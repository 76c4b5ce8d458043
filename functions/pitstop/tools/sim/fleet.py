"""The fleet: nodes, gang jobs, a spare pool, and the time each job spends in each phase.

A job runs, is interrupted by a fault on one of its nodes, waits for its strategy to notice
(``detect``), waits for enough healthy nodes (``wait``), restarts (``restart``) and runs again.
Work since the last checkpoint is lost at an interruption. Checkpoints are not events: a run
segment's committed work follows from its length, so a 54-day run costs one event per fault.
A straggling node (a ``straggler`` fault) interrupts nothing: while it is a member, its gang runs
``faults.straggler_slowdown`` times slower, and the difference is lost (``slowed``).
With a topology (tools/sim/placement.py), a gang restarted on spares that spread it over a wider
level of the fabric than it started in loses the level's penalty of its run time from then on
(``fabric``); which spares it gets is its strategy's choice (``Strategy.spares_for``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pitstop.core.actions import RANK
from pitstop.core.domain import Place
from pitstop.core.topology import Tier
from pitstop.tools.sim import placement
from pitstop.tools.sim.scenario import Scenario
from pitstop.tools.sim.trace import Fault, recurrence

PHASES = ("detect", "wait", "restart")


@dataclass
class Response:
    """What a strategy does about one fault: when the job is requeued, when (if) the node
    leaves the job and comes back healthy, and what was done to it."""

    requeue_at: float
    node_back_at: float | None  # None: the node stays in the job (nothing wrong with it)
    action: str
    interrupt_at: float | None = None  # a planned stop later than the fault (maintenance)
    checkpointed: bool = False  # the job saved just before stopping: nothing lost
    fixed: bool | None = None  # None: fixed iff the action is at least what the fault needs
    held: bool = False
    replaced: bool = False
    on_back: Callable[[float], None] | None = None
    wait_for_node: bool = False  # the gang waits for this node to come back instead of a spare


class Strategy(Protocol):
    name: str

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response: ...

    def spares_for(self, job: Job, free: list[int], need: int, sim: Fleet) -> list[int]:
        """Which ``need`` of the idle nodes ``free`` (the pool's order) the gang restarts on."""
        ...


@dataclass
class Job:
    idx: int
    gang: int
    members: set[int]
    phase: str = "run"
    phase_since: float = 0.0
    run_start: float = 0.0
    down_since: float = 0.0
    cause: str = ""
    gen: int = 0
    slow_since: float | None = None  # a straggler among its members since (while running)
    slow_cause: str = ""
    home: Tier = "unknown"  # the level of the fabric it started in (placement.spread)
    fabric: float = 0.0  # the share of its run lost to a wider spread since its last start
    fabric_cause: str = ""
    left: set[int] = field(default_factory=set)  # members taken out since it last started
    awaiting: set[int] = field(default_factory=set)  # nodes it waits for rather than take a spare


@dataclass
class Ledger:
    """Seconds of one job's wall time by where they went (multiplied by GPUs when reported)."""

    productive: float = 0.0
    checkpoint: float = 0.0
    lost_work: float = 0.0
    slowed: float = 0.0  # run time lost to a straggling member (its gang ran slower)
    fabric: float = 0.0  # run time lost to collectives across a wider level of the fabric
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    by_fault: dict[str, float] = field(default_factory=dict)
    interruptions: int = 0
    resume_s: list[float] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    held: int = 0
    replaced: int = 0
    wrongly_replaced: int = 0
    faults_seen: int = 0
    spare_tiers: dict[str, int] = field(default_factory=dict)  # spares taken, by where they sat


class Fleet:
    """One strategy's run over a fault trace."""

    def __init__(self, scn: Scenario, strategy: Strategy) -> None:
        self.scn = scn
        self.strategy = strategy
        fleet, jobs = scn["fleet"], scn["jobs"]
        self.horizon = scn["days"] * 86400.0
        self.cp_s = jobs["checkpoint_interval_min"] * 60.0
        self.write_s = jobs["checkpoint_write_min"] * 60.0
        self.restart_s = jobs["restart_min"] * 60.0
        gang = jobs["gang_nodes"] or fleet["nodes"]
        count = max(1, fleet["nodes"] // gang)
        self.jobs = [Job(j, gang, set(range(j * gang, (j + 1) * gang))) for j in range(count)]
        physical = fleet["nodes"] + fleet["spares"]
        self.job_of: list[int] = [-1] * physical
        for job in self.jobs:
            for n in job.members:
                self.job_of[n] = job.idx
        self.places: list[Place | None] = placement.layout(fleet)
        self.keys = [placement.key(p) for p in self.places]
        topo = fleet.get("topology")
        self.penalty = (
            {"block": topo["penalty"]["block"], "cluster": topo["penalty"]["cluster"]} if topo else {}
        )
        for job in self.jobs:
            job.home = placement.spread(self.keys[n] for n in job.members)
        self.healthy = [True] * physical
        self.slowdown = float(scn["faults"]["straggler_slowdown"])
        self.slow: dict[int, str] = {}  # straggling nodes (in service) and their fault category
        # Idle healthy nodes, longest idle first: a scheduler does not prefer the node just repaired.
        self.pool: dict[int, None] = dict.fromkeys(n for n in range(physical) if self.job_of[n] < 0)
        self.ledger = Ledger()
        self._heap: list[tuple[float, int, str, Any]] = []
        self.now = 0.0  # the time of the event being handled (a strategy's clock)
        self._seq = itertools.count()

    # -- the event loop ----------------------------------------------------------------------

    def schedule(self, t: float, kind: str, data: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, data))

    def run(self, trace: list[Fault]) -> Ledger:
        for f in trace:
            self.schedule(f.t, "fault", f)
        handlers: dict[str, Callable[[float, Any], None]] = {
            "fault": self._on_fault,
            "interrupt": self._on_interrupt,
            "requeue": self._on_requeue,
            "back": self._on_back,
            "resumed": self._on_resumed,
            "call": lambda t, fn: fn(t),
        }
        while self._heap and self._heap[0][0] < self.horizon:
            t, _, kind, data = heapq.heappop(self._heap)
            self.now = t
            handlers[kind](t, data)
        for job in self.jobs:
            self._finish(job)
        return self.ledger

    # -- faults ------------------------------------------------------------------------------

    def _on_fault(self, t: float, f: Fault) -> None:
        if not self.healthy[f.node]:
            return  # already out of service: this defect is repaired with it
        self.ledger.faults_seen += 1
        if f.signal == "straggler":
            self.slow[f.node] = f.category
            j = self.job_of[f.node]
            if j >= 0 and self.jobs[j].phase == "run" and self.jobs[j].slow_since is None:
                self.jobs[j].slow_since, self.jobs[j].slow_cause = t, f.category
        r = self.strategy.respond(f, t, self)
        self._count_action(f, r)
        at = r.interrupt_at if r.interrupt_at is not None else t
        if at > t:
            self.schedule(at, "interrupt", (f, r))
        else:
            self._on_interrupt(t, (f, r))

    def _count_action(self, f: Fault, r: Response) -> None:
        led = self.ledger
        led.actions[r.action] = led.actions.get(r.action, 0) + 1
        led.held += int(r.held)
        if r.replaced:
            led.replaced += 1
            led.wrongly_replaced += int(RANK[f.needs] < RANK["REPLACE_NODE"])

    def _on_interrupt(self, t: float, fr: tuple[Fault, Response]) -> None:
        f, r = fr
        if not self.healthy[f.node]:
            return
        j = self.job_of[f.node]
        if r.node_back_at is not None:
            self.healthy[f.node] = False
            self.slow.pop(f.node, None)  # out of service: it slows no gang any more
            self.pool.pop(f.node, None)
            if j >= 0:
                self.jobs[j].members.discard(f.node)
                self.jobs[j].left.add(f.node)
                if r.wait_for_node:
                    self.jobs[j].awaiting.add(f.node)
                self.job_of[f.node] = -1
            self.schedule(max(r.node_back_at, t), "back", (f, r))
        elif not self._fixed(f, r):
            nxt = recurrence(f, self.scn, max(r.requeue_at, t) + f.recur_s)
            self.schedule(nxt.t, "fault", nxt)
        if j >= 0:
            self._interrupt_job(self.jobs[j], t, f, r)

    def _interrupt_job(self, job: Job, t: float, f: Fault, r: Response) -> None:
        if job.phase in ("run", "restart"):
            self.ledger.interruptions += 1
            if job.phase == "run":
                self._close_run(job, t, r.checkpointed, f.category)
                job.down_since, job.cause = t, f.category
            self._enter(job, "detect", t)
            job.gen += 1
        if job.phase == "detect":
            self.schedule(max(r.requeue_at, t), "requeue", (job.idx, job.gen))

    def _fixed(self, f: Fault, r: Response) -> bool:
        return r.fixed if r.fixed is not None else RANK[r.action] >= RANK[f.needs]

    def _on_back(self, t: float, fr: tuple[Fault, Response]) -> None:
        f, r = fr
        self.healthy[f.node] = True
        self.pool[f.node] = None
        if r.on_back is not None:
            r.on_back(t)
        if not self._fixed(f, r):
            nxt = recurrence(f, self.scn, t + f.recur_s)
            self.schedule(nxt.t, "fault", nxt)
        for job in sorted(self.jobs, key=lambda j: f.node not in j.awaiting):  # its own node first
            if job.phase == "wait":
                self._try_start(job, t)

    # -- a job's way back --------------------------------------------------------------------

    def _on_requeue(self, t: float, ref: tuple[int, int]) -> None:
        job = self.jobs[ref[0]]
        if job.gen != ref[1] or job.phase != "detect":
            return
        self._enter(job, "wait", t)
        self._try_start(job, t)

    def _try_start(self, job: Job, t: float) -> None:
        for n in [n for n in job.awaiting if n in self.pool]:
            job.awaiting.discard(n)
            self._take(job, n, "own node")
        if job.awaiting:
            return  # the gang waits for its node rather than take a spare
        need = job.gang - len(job.members)
        if need > 0 and self.pool:
            free = self.free()
            chosen = self.strategy.spares_for(job, free, min(need, len(free)), self)
            gang = {self.keys[n] for n in job.members | job.left}
            for n in chosen:
                self._take(job, n, placement.tier_of(self.keys[n], gang))
        if len(job.members) == job.gang:
            self._enter(job, "restart", t)
            self.schedule(t + self.restart_s, "resumed", (job.idx, job.gen))

    def free(self) -> list[int]:
        """The idle healthy nodes no waiting gang keeps for itself, longest idle first."""
        reserved = {n for job in self.jobs for n in job.awaiting}
        return [n for n in self.pool if n not in reserved]

    def _take(self, job: Job, n: int, tier: str) -> None:
        del self.pool[n]
        job.members.add(n)
        self.job_of[n] = job.idx
        self.ledger.spare_tiers[tier] = self.ledger.spare_tiers.get(tier, 0) + 1

    def _on_resumed(self, t: float, ref: tuple[int, int]) -> None:
        job = self.jobs[ref[0]]
        if job.gen != ref[1] or job.phase != "restart":
            return
        self._enter(job, "run", t)
        job.run_start = t
        job.left.clear()
        now = placement.spread(self.keys[n] for n in job.members)
        job.fabric = self.penalty.get(now, 0.0) if placement.wider(now, job.home) else 0.0
        job.fabric_cause = job.cause
        slow = next((self.slow[n] for n in sorted(job.members) if n in self.slow), None)
        job.slow_since, job.slow_cause = (t, slow) if slow is not None else (None, "")
        self.ledger.resume_s.append(t - job.down_since)

    # -- accounting --------------------------------------------------------------------------

    def _enter(self, job: Job, phase: str, t: float) -> None:
        if job.phase in PHASES:
            spent = t - job.phase_since
            self.ledger.phases[job.phase] += spent
            self.ledger.by_fault[job.cause] = self.ledger.by_fault.get(job.cause, 0.0) + spent
        job.phase, job.phase_since = phase, t

    def _close_run(self, job: Job, t: float, saved: bool, cause: str | None) -> None:
        """Split a run segment into committed work, checkpoint writes and (at a fault) lost work;
        a straggling member's share of it first (the gang's work went that much slower)."""
        length = t - job.run_start
        if job.slow_since is not None:
            slowed = (t - max(job.slow_since, job.run_start)) * (1.0 - 1.0 / self.slowdown)
            length -= slowed
            self.ledger.slowed += slowed
            self.ledger.by_fault[job.slow_cause] = self.ledger.by_fault.get(job.slow_cause, 0.0) + slowed
            job.slow_since = None
        if job.fabric:
            fabric = length * job.fabric
            length -= fabric
            self.ledger.fabric += fabric
            self.ledger.by_fault[job.fabric_cause] = self.ledger.by_fault.get(job.fabric_cause, 0.0) + fabric
        cycle = self.cp_s + self.write_s
        k = math.floor(length / cycle)
        rest = length - k * cycle
        led = self.ledger
        led.productive += k * self.cp_s
        led.checkpoint += k * self.write_s
        if saved or cause is None:
            led.productive += min(rest, self.cp_s)
            led.checkpoint += max(0.0, rest - self.cp_s)
        else:
            led.lost_work += rest
            led.by_fault[cause] = led.by_fault.get(cause, 0.0) + rest

    def _finish(self, job: Job) -> None:
        if job.phase == "run":
            self._close_run(job, self.horizon, True, None)
        else:
            self._enter(job, "end", self.horizon)
