"""Checks on a fenced node (diagnose, validate, revalidate, corroborate): ``start_check`` and
``check_result``.

A part of the agent's checks by responsibility: what decides whether and how a check starts on a
node Pitstop drained (its own drain for this incident, the node responding and idle, or a
corroboration beside the job it runs), and what takes a failed start back. The Slurm side of the
swap is fence_swap.py's, the runner runner.py's, the answer progress.py's, the files
check_files.py's and the arguments and command lines checks.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

from pitstop.adapters import log
from pitstop.agent.slurm.access import CheckTools, SlurmAccess
from pitstop.agent.slurm.check_files import CheckFiles, write_result
from pitstop.agent.slurm.checks import _agent_user, _started, check_minutes, check_spec
from pitstop.agent.slurm.fence_swap import FenceSwap
from pitstop.agent.slurm.progress import Progress
from pitstop.agent.slurm.records import CheckState
from pitstop.agent.slurm.runner import Runners
from pitstop.agent.slurm.text import (
    JOB,
    USER,
    Args,
    CheckNotReadyError,
    CommandRefusedError,
    SlurmOutputError,
)
from pitstop.core.slurm_wire import DRAIN_REASON_PREFIX, CheckProgress, CheckStarted


class FencedChecks:
    """Start a check on a fenced node once per name, and answer how it goes."""

    def __init__(
        self,
        slurm: SlurmAccess,
        tools: CheckTools,
        files: CheckFiles,
        runners: Runners,
        swap: FenceSwap,
        progress: Progress,
    ) -> None:
        self.slurm, self.tools, self.files = slurm, tools, files
        self.runners, self.swap, self.progress = runners, swap, progress

    def start_check(self, args: Args) -> CheckStarted:
        """Start a diagnostic or validation on the fenced node, once per check name; returns at once.

        ``{"started": name, "peer": str | None, "note": str, "job": id}``. A start delivered again
        answers what the first one started. The node must carry Pitstop's drain for this
        incident (someone else's drain is left alone: refused), respond, and run no job
        (else a retryable "not ready").
        """
        spec = check_spec(args, True, self.slurm.member)
        node, name = spec["node"], spec["name"]
        with self.files.lock(name) as d:
            st = self.files.load(d)
            if st is not None and st.get("node") != node:
                raise CommandRefusedError(f"check {name} runs on {st.get('node')}, not {node}")
            if st is not None and st.get("started"):
                return _started(st)
            if st is None or st.get("undone"):
                gone = self._not_responding(spec) if spec["kind"] == "corroborate" else None
                if gone is not None:
                    return self._answered(d, spec, gone)
                st = self._new_check(spec)
                self.files.save(d, st)
            try:
                self._begin(d, st)
            except Exception as exc:
                self._undo_start(d, st, exc)
                raise
            return _started(st)

    def check_result(self, args: Args) -> CheckProgress:
        """The check's state now (a fresh probe): ``done`` only once the tools ran (or could not)
        and the node is fenced again as before; then ``outputs`` (each tool's stdout), ``peer``,
        ``note``, ``error`` (None, or why a tool or the run failed) and ``exit_codes``."""
        spec = check_spec(args, False, self.slurm.member)
        node, name = spec["node"], spec["name"]
        if not (self.files.path(name) / "state.json").exists():
            raise CommandRefusedError(f"no check {name} was started")
        with self.files.lock(name) as d:
            st = self.files.load(d)
            if st is None or st.get("node") != node:
                raise CommandRefusedError(f"no check {name} was started on {node}")
            return self.progress.now(d, st)

    def _new_check(self, spec: CheckState) -> CheckState:
        node, incident = spec["node"], spec["incident"]
        nodes = self.slurm.nodes()
        if node not in nodes:
            raise SlurmOutputError(f"scontrol show node does not list {node}")
        info, partitions = nodes[node]
        if "DRAIN" not in info.flags or not info.reason.startswith(f"{DRAIN_REASON_PREFIX}{incident} "):
            raise CommandRefusedError(
                f"node {node} is not fenced by Pitstop for {incident} (state {info.state}, reason"
                f" {info.reason[:80]!r}): a check runs only on a node Pitstop drained"
            )
        if info.marked or "NOT_RESPONDING" in info.flags or info.base in ("DOWN", "FAIL"):
            raise CheckNotReadyError(
                f"node {node} is {info.state}, not responding: try again once it is back"
            )
        borrowed = self._running_job(node) if spec["kind"] == "corroborate" else None
        busy = info.base != "IDLE" or info.flags - {"DRAIN", "CLOUD", "RESERVED", "MAINTENANCE"}
        if busy and borrowed is None:
            raise CheckNotReadyError(f"node {node} is {info.state}: a check needs it idle; try again")
        if not partitions:
            raise CommandRefusedError(f"node {node} is in no partition: no job can run on it")
        user = _agent_user()
        if USER.fullmatch(user) is None:
            raise CommandRefusedError("the agent's user name is not one a reservation can name")
        tools = self.tools
        return {
            **spec,
            "reason": info.reason,  # the drain put back afterwards, exactly
            "partitions": list(partitions),
            "partition": partitions[0],
            "peer": None,
            "note": ""
            if spec.get("want_peer", True)
            else "no peer asked for: validated without the NCCL test",
            "user": user,
            "job": borrowed,
            "borrowed": borrowed is not None,
            "tools": {
                "nvidia_smi": list(tools.nvidia_smi),
                "dmesg": list(tools.dmesg),
                "clock": list(tools.clock),
                "dcgmi": list(tools.dcgmi),
                "all_gather_perf": list(tools.all_gather_perf),
                "srun_mpi": tools.srun_mpi,
                "gres": tools.gres,
                "fabric_root": tools.fabric_root,
            },
            "minutes": check_minutes(spec["kind"], spec["dcgm_level"]),
            "started": None,
            "finished": False,
            "respawns": 0,
            "created_at": time.time(),
        }

    def _begin(self, d: Path, st: CheckState) -> None:
        """The start's steps, each skipped when an earlier attempt already took it."""
        node, name = st["node"], st["name"]
        if st.get("borrowed"):
            return self.runners.begin_beside(d, st)
        self.swap.reserve(d, st)  # first: once resumed, the reservation is the node's only fence
        info = self.slurm.node_info(node)
        if info.drained:
            if info.reason != st["reason"]:
                raise CommandRefusedError(
                    f"node {node} was drained meanwhile by someone else ({info.reason[:80]!r}): no check"
                )
            self.slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        if st["job"] is None:
            st["job"] = self.swap.find_job(name, st["user"]) or self.swap.submit(st)
            self.files.save(d, st)
        self.runners.reap()
        if not self.runners.alive(d):
            self.runners.spawn(d)
        st["started"] = {"started": name, "peer": st["peer"], "note": st["note"], "job": st["job"]}
        self.files.save(d, st)
        log.emit("INFO", "slurm agent: check started", check=name, node=node, peer=st["peer"], job=st["job"])

    def _running_job(self, node: str) -> str | None:
        """A job running on the node now (a corroboration runs its read-only tools beside it)."""
        out = self.slurm.run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%i"])
        jobs = [j for j in out.split() if JOB.fullmatch(j)]
        return jobs[0] if jobs else None

    def _not_responding(self, spec: CheckState) -> str | None:
        """The node's state when slurmctld sees it not responding (its slurmd gone): no tool can run
        there, and that observation, slurmctld's own, is what a corroboration reports."""
        info = self.slurm.node_info(spec["node"])
        if info.marked or "NOT_RESPONDING" in info.flags:
            return f"{info.state} {info.reason}".strip()[:200]
        return None

    def _answered(self, d: Path, spec: CheckState, node_state: str) -> CheckStarted:
        """A check answered without running anything: finished at once, its output the node's state."""
        (d / "slurm_node.out").write_text(node_state)
        write_result(d, {"keys": ["slurm_node"], "exit_codes": {}, "error": None})
        note = "node not responding"
        started: CheckStarted = {"started": spec["name"], "peer": None, "note": note, "job": None}
        st: CheckState = {**spec, "peer": None, "note": note, "job": None, "user": _agent_user()}
        self.files.save(d, {**st, "started": started, "finished": True, "finished_at": time.time()})
        return started

    def _undo_start(self, d: Path, st: CheckState, exc: BaseException) -> None:
        """A start that failed midway is taken back (the fence restored, the reservation gone) and
        forgotten, so a retry starts afresh; if that fails too, the next try continues from the record."""
        try:
            if self.swap.finish(d, st, wait_s=30.0):
                self.files.save(d, {"name": st["name"], "node": st["node"], "undone": str(exc)[:300]})
        except Exception as undo:
            log.emit(
                "WARNING",
                "slurm agent: a failed check start could not be taken back yet",
                check=st["name"],
                error=str(undo)[:300],
            )
