"""Jobs: the jobs on a node with their runs, requeue (and lifting Slurm's requeue hold), signal, state.

One of the agent's parts by responsibility (commands.py composes them): everything here asks about
or acts on a job as a whole; a node's fence is nodes.py's, the capacity count capacity.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pitstop.adapters import log
from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.placement import Placement
from pitstop.agent.slurm.text import (
    JOB,
    REQUEUE_SETTLE_S,
    REVOKE_MARGIN_S,
    SIGNALS,
    Args,
    CommandRefusedError,
    _need,
    _run_fields,
    job_leader,
    own_check,
)
from pitstop.core.slurm_wire import JobOnNode, JobStateAnswer, RequeueAnswer, SignalAnswer


class JobCommands:
    """``jobs_on_node``, ``requeue``, ``signal`` and ``job_state``; ``release_requeued`` lifts the
    hold Slurm puts on a requeued job (``sleep`` and ``wall`` time that lift: tests move them)."""

    def __init__(
        self,
        slurm: SlurmAccess,
        release_requeued: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
        placement: Placement | None = None,
    ) -> None:
        self.slurm, self.release_requeued = slurm, release_requeued
        self._sleep, self._wall = sleep, wall
        self.placement = placement

    def jobs_on_node(self, args: Args) -> list[JobOnNode]:
        """The jobs on a node, each with its run (``restarts``, ``start_time``) from ``scontrol show job``.

        The run tells a later requeue whether the job is still the one the fault hit.
        """
        node = self.slurm.member(args)
        out = self.slurm.run(["squeue", "-h", "-w", node, "-o", "%i|%T|%u|%D|%N|%j"])
        jobs: list[JobOnNode] = []
        for line in out.splitlines():
            parts = line.split("|", 5)
            if len(parts) == 6 and JOB.fullmatch(parts[0]):
                kv = self.slurm.show_job(parts[0]) or {}
                if own_check(parts[5], kv):
                    continue  # another incident's check job (a peer on this node): not the node's to move
                jobs.append(
                    {
                        "id": parts[0],
                        "state": parts[1],
                        "user": parts[2],
                        "nodes": int(parts[3] or 0),
                        "nodelist": parts[4],
                        "name": parts[5][:128],
                        **_run_fields(kv),
                    }
                )
            elif line.strip():
                log.emit("WARNING", "slurm agent: squeue line not understood, skipped", line=line[:200])
        return jobs

    def requeue(self, args: Args) -> RequeueAnswer:
        """Requeue the job; ``onto`` (node names): pin it, while it is pending, to exactly those
        nodes (the spare Pitstop chose and its own healthy ones); without, a pin Pitstop set at an
        earlier move is cleared so Slurm may place it anywhere again."""
        job = _need(args, "job", JOB)
        target = job_leader(job)
        onto = self._onto(args)
        try:
            self.slurm.run(["scontrol", "requeue", target])
        except RuntimeError as exc:
            if "Job is pending execution" not in str(exc):
                raise
            # Already back in the queue (e.g. the other component of a heterogeneous job requeued it).
            return {"job": job, "requeued": target, "already_pending": True}
        out: RequeueAnswer = {"job": job, "requeued": target}
        pin = self._pin_for(target, onto)
        if pin is None and not self.release_requeued:
            return out
        pending = self._wait_pending(target)
        if pending and pin is not None:
            self._pin(target, pin, out)
        if self.release_requeued:
            out["released"] = pending and self._release_hold(target)
        return out

    def _onto(self, args: Args) -> list[str] | None:
        onto = args.get("onto")
        if onto is None:
            return None
        if not isinstance(onto, list) or not onto or len(onto) > 1024:
            raise CommandRefusedError("argument onto must be a non-empty list of nodes")
        return sorted({self.slurm.member({"node": n}) for n in onto})  # each a node of this cluster

    def _pin_for(self, target: str, onto: list[str] | None) -> list[str] | None:
        """The node list to set ([] clears Pitstop's earlier pin; None: nothing to change)."""
        if onto is not None:
            return onto
        if self.placement is not None and self.placement.pinned(target) is not None:
            return []
        return None

    def _pin(self, target: str, pin: list[str], out: RequeueAnswer) -> None:
        """ReqNodeList (and NumNodes, when fewer: a shrink) set while the job is pending; remembered."""
        argv = ["scontrol", "update", f"JobId={target}", f"ReqNodeList={','.join(pin)}"]
        kv = self.slurm.show_job(target) or {}
        count = kv.get("NumNodes", "").split("-")[0]
        if pin and count.isdigit() and len(pin) < int(count):
            argv.append(f"NumNodes={len(pin)}")
        if not pin and self.placement is not None:
            mine = self.placement.pinned(target) or []
            if set(self.slurm.hostnames([kv.get("ReqNodeList", "")])) != set(mine):
                self.placement.remember(target, None)  # someone else changed it since: theirs now
                return
        self.slurm.run(argv)
        if self.placement is not None:
            self.placement.remember(target, pin or None)
        if pin:
            out["placed"] = pin
        else:
            out["unpinned"] = True

    def _wait_pending(self, target: str) -> bool:
        """Wait (bounded) until the requeued job is PENDING: its old run has left its nodes."""
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while time.monotonic() < deadline:
            state = (self.slurm.show_job(target) or {}).get("JobState", "UNKNOWN")
            if state == "PENDING":
                return True
            if state not in ("COMPLETING", "RUNNING", "CONFIGURING", "REQUEUED"):
                return False  # started already, or gone
            self._sleep(0.25)
        return False

    def _release_hold(self, target: str) -> bool:
        """Lift the BeginTime hold Slurm puts on a requeued batch job (about 120 s), so the gang
        starts again at once.

        Slurm sets that hold when the requeued job leaves COMPLETING (its old run's steps ended on
        every node), so lifting it earlier is undone: the caller waited until the job is PENDING.
        Not in the same second, though: each slurmd revoked the job's old credential when it ended
        the old run, and rejects a credential created in the second of that revocation or before
        it ("Job credential revoked": the relaunch fails and the job ends; seen in CI). So the
        hold is lifted from the start of a later whole second on.
        """
        self._sleep(REVOKE_MARGIN_S + 1.0 - self._wall() % 1.0)
        self.slurm.run(["scontrol", "update", f"JobId={target}", "StartTime=now"])
        return True

    def signal(self, args: Args) -> SignalAnswer:
        job = _need(args, "job", JOB)
        sig = args.get("signal")
        if not isinstance(sig, str) or sig not in SIGNALS:
            raise CommandRefusedError("argument signal is missing or not allowed")
        target = job_leader(job)  # every component of a heterogeneous job checkpoints together
        self.slurm.run(["scancel", f"--signal={sig.removeprefix('SIG')}", "--full", target])
        return {"job": job, "signal": sig, "signalled": target}

    def job_state(self, args: Args) -> JobStateAnswer:
        job = _need(args, "job", JOB)
        kv = self.slurm.show_job(job)
        if kv is None:
            return {"job": job, "state": "UNKNOWN", "restarts": None, "start_time": None}
        return {
            "job": job,
            "state": kv.get("JobState", "UNKNOWN"),
            "nodelist": kv.get("NodeList", ""),
            "user": kv.get("UserId", "").split("(")[0],
            "comment": kv.get("Comment", "")[:256],  # the owner's opt-in to hang remediation (core/localise)
            **_run_fields(kv),
        }
