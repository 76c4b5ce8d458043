"""The closed set of Slurm operations the agent runs for actuate, and the parts that do them.

How it is divided: by responsibility, each part a small class *held* here (composition, no base
classes) and handed only what it needs, so what a part may touch is in its constructor:

- access.SlurmAccess: the one way to Slurm (an argv at a time) and the reads every part shares;
  one instance, shared by all of them.
- nodes.NodeCommands: a node's fence (drain, resume, state).
- jobs.JobCommands: a job as a whole (jobs on a node, requeue and its hold, signal, state).
- capacity.capacity: whether a gang could start again without the fenced node (read-only).
- placement.Placement: Slurm's topology and version, and the node lists Pitstop pinned requeued jobs to.
- the checks: check_files.CheckFiles (a check's directory, lock, records), runner.Runners (the
  runner processes), fence_swap.FenceSwap (a drain swapped for a reservation and back),
  progress.Progress (a started check's answer), fenced.FencedChecks (checks on a fenced node) and
  gang.GangChecks (checks beside a running job); checks.py holds their arguments and command lines.

:class:`SlurmCommands` builds them and dispatches each operation through one explicit table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pitstop.agent.slurm.access import CheckTools, SlurmAccess
from pitstop.agent.slurm.capacity import capacity
from pitstop.agent.slurm.check_files import CheckFiles
from pitstop.agent.slurm.fence_swap import FenceSwap
from pitstop.agent.slurm.fenced import FencedChecks
from pitstop.agent.slurm.gang import GangChecks
from pitstop.agent.slurm.jobs import JobCommands
from pitstop.agent.slurm.nodes import NodeCommands
from pitstop.agent.slurm.placement import Placement
from pitstop.agent.slurm.progress import Progress
from pitstop.agent.slurm.runner import CheckRun, Runners
from pitstop.agent.slurm.text import OPS, Args, CommandRefusedError
from pitstop.core.slurm_wire import (
    Answer,
    CapacityAnswer,
    CheckProgress,
    CheckStarted,
    DrainAnswer,
    JobOnNode,
    JobStateAnswer,
    NodeStateAnswer,
    RequeueAnswer,
    ResumeAnswer,
    SignalAnswer,
)


class SlurmCommands:
    """The agent's operations, each a fixed argv with validated arguments, done by the part that owns
    it; ``execute`` dispatches through one explicit table.

    ``run`` runs one argv (a subprocess by default); ``release_requeued`` lifts Slurm's hold on a
    requeued job; ``checks`` are the tools and directory of checks; ``sleep`` and ``wall`` time the
    hold's release (tests move them).
    """

    def __init__(
        self,
        run: Callable[[list[str]], str] | None = None,
        release_requeued: bool = False,
        checks: CheckTools | None = None,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._tools = checks or CheckTools()
        self.slurm = SlurmAccess(run)
        self.nodes = NodeCommands(self.slurm)
        self.placement = Placement(self.slurm, self._tools.directory)
        self.jobs = JobCommands(self.slurm, release_requeued, sleep, wall, self.placement)
        files = CheckFiles(self._tools.directory)
        self.runners = Runners(files)
        swap = FenceSwap(self.slurm, files)
        progress = Progress(files, self.runners, swap)
        self.fenced = FencedChecks(self.slurm, self._tools, files, self.runners, swap, progress)
        self.gang = GangChecks(self.slurm, self._tools, files, self.runners, progress)
        self.runner = CheckRun(self.slurm, files, swap)

    @property
    def checks(self) -> CheckTools:
        """The tools and directory this agent's checks use (fixed when it is built)."""
        return self._tools

    def execute(self, op: str, args: object) -> Answer:
        table: dict[str, Callable[[Args], Answer]] = {
            "jobs_on_node": self.jobs_on_node,
            "drain": self.drain,
            "resume": self.resume,
            "requeue": self.requeue,
            "signal": self.signal,
            "job_state": self.job_state,
            "node_state": self.node_state,
            "capacity": self.capacity,
            "start_check": self.start_check,
            "check_result": self.check_result,
            "start_gang_check": self.start_gang_check,
            "gang_check_result": self.gang_check_result,
        }
        handler = table.get(op) if op in OPS else None
        if handler is None:
            raise CommandRefusedError(f"unknown operation {op!r}")
        if not isinstance(args, Mapping):
            raise CommandRefusedError("arguments must be an object")
        return handler(args)

    # -- each operation, by the part that owns it ------------------------------------------------

    def jobs_on_node(self, args: Args) -> list[JobOnNode]:
        return self.jobs.jobs_on_node(args)

    def drain(self, args: Args) -> DrainAnswer:
        return self.nodes.drain(args)

    def resume(self, args: Args) -> ResumeAnswer:
        return self.nodes.resume(args)

    def requeue(self, args: Args) -> RequeueAnswer:
        return self.jobs.requeue(args)

    def signal(self, args: Args) -> SignalAnswer:
        return self.jobs.signal(args)

    def job_state(self, args: Args) -> JobStateAnswer:
        return self.jobs.job_state(args)

    def node_state(self, args: Args) -> NodeStateAnswer:
        return self.nodes.node_state(args)

    def capacity(self, args: Args) -> CapacityAnswer:
        return capacity(self.slurm, args, self.placement)

    def start_check(self, args: Args) -> CheckStarted:
        return self.fenced.start_check(args)

    def check_result(self, args: Args) -> CheckProgress:
        return self.fenced.check_result(args)

    def start_gang_check(self, args: Args) -> CheckStarted:
        return self.gang.start_gang_check(args)

    def gang_check_result(self, args: Args) -> CheckProgress:
        return self.gang.gang_check_result(args)

    def run_check(self, d: Path) -> int:
        """The runner process's work (``--run-check DIR``)."""
        return self.runner.run_check(d)
