"""The closed set of Slurm operations the agent runs for actuate: jobs on a node, drain, resume,
requeue (and lifting the requeue hold), signal, job and node state, capacity."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from pitstop.adapters import log
from pitstop.agent.slurm.gang import GangCheckRuns
from pitstop.agent.slurm.text import (
    _HOLDING_STATES,
    _REASON_TEXT,
    ACTIONS,
    INCIDENT,
    JOB,
    OPS,
    REQUEUE_SETTLE_S,
    REVOKE_MARGIN_S,
    SIGNALS,
    Args,
    CommandRefusedError,
    SlurmOutputError,
    _need,
    _run_fields,
    job_leader,
    parse_nodes,
)
from pitstop.core.slurm_wire import (
    DRAIN_REASON_PREFIX,
    Answer,
    CapacityAnswer,
    DrainAnswer,
    JobOnNode,
    JobStateAnswer,
    NodeStateAnswer,
    RequeueAnswer,
    ResumeAnswer,
    SignalAnswer,
    drain_reason,
)


class SlurmCommands(GangCheckRuns):
    """The closed set of operations, each a fixed argv with validated arguments (the check runs are
    CheckRuns'); ``execute`` dispatches through one explicit table."""

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

    def jobs_on_node(self, args: Args) -> list[JobOnNode]:
        """The jobs on a node, each with its run (``restarts``, ``start_time``) from ``scontrol show job``.

        The run tells a later requeue whether the job is still the one the fault hit.
        """
        node = self._member(args)
        out = self._run(["squeue", "-h", "-w", node, "-o", "%i|%T|%u|%D|%N|%j"])
        jobs: list[JobOnNode] = []
        for line in out.splitlines():
            parts = line.split("|", 5)
            if len(parts) == 6 and JOB.fullmatch(parts[0]):
                jobs.append(
                    {
                        "id": parts[0],
                        "state": parts[1],
                        "user": parts[2],
                        "nodes": int(parts[3] or 0),
                        "nodelist": parts[4],
                        "name": parts[5][:128],
                        **_run_fields(self._show_job(parts[0]) or {}),
                    }
                )
            elif line.strip():
                log.emit("WARNING", "slurm agent: squeue line not understood, skipped", line=line[:200])
        return jobs

    def drain(self, args: Args) -> DrainAnswer:
        node = self._member(args)
        incident = _need(args, "incident", INCIDENT)
        action = args.get("action")
        if not isinstance(action, str) or action not in ACTIONS:
            raise CommandRefusedError("argument action is missing or invalid")
        # The reason is built here from validated parts only: no log text ever reaches Slurm.
        reason = drain_reason(incident, action)
        before = self.node_info(node)
        out: DrainAnswer = {
            "node": node,
            "previous_state": before.state,
            "previous_reason": before.reason,
            "already_drained_by_other": False,
            "reason": None,
        }
        ours = before.reason.startswith(f"{DRAIN_REASON_PREFIX}{incident} ")
        if before.drained and not ours:
            # Someone else's drain (a person, or Pitstop for another incident): left as it is.
            log.emit(
                "INFO",
                "slurm agent: node already drained by someone else; left alone",
                node=node,
                state=before.state,
                reason=before.reason,
            )
            return {**out, "reason": None, "already_drained_by_other": True}
        if before.base == "DOWN" and before.reason and not ours:
            # DOWN alone is not a fence: Slurm returns the node to service when its slurmd registers
            # again (ReturnToService), i.e. right after the reboot Pitstop is about to do. Drain it,
            # keeping what was there in the reason.
            kept = _REASON_TEXT.sub("", before.reason)[:80]
            reason = f"{reason} (was {before.base}: {kept})"
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return {**out, "reason": reason}

    def resume(self, args: Args) -> ResumeAnswer:
        node = self._member(args)
        prefix = DRAIN_REASON_PREFIX
        if args.get("incident") is not None:  # commands from before the incident was sent: any Pitstop drain
            prefix += _need(args, "incident", INCIDENT) + " "
        info = self.node_info(node)
        out: ResumeAnswer = {"node": node, "state": info.state, "reason": info.reason, "resumed": False}
        if not info.out_of_service:
            return {**out, "resumed": False}
        if not info.reason.startswith(prefix):
            log.emit(
                "INFO",
                "slurm agent: node drained by someone else; left drained",
                node=node,
                state=info.state,
                reason=info.reason,
            )
            return {**out, "resumed": False, "left_drained": info.reason}
        theirs = _down_by_other(info.reason)
        if theirs is not None:  # Pitstop's drain sat on a person's DOWN: leave the node to them
            # kept out of service with their reason: a drain, since a DOWN node whose slurmd registers
            # is returned to service by ReturnToService=2 (slurm.conf(5)), and never runs a job between
            self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={theirs}"])
            log.emit("INFO", "slurm agent: node left out of service as set", node=node, reason=theirs)
            return {**out, "resumed": False, "left_drained": f"DOWN: {theirs} (set before Pitstop's fence)"}
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return {**out, "resumed": True}

    def requeue(self, args: Args) -> RequeueAnswer:
        job = _need(args, "job", JOB)
        target = job_leader(job)
        try:
            self._run(["scontrol", "requeue", target])
        except RuntimeError as exc:
            if "Job is pending execution" not in str(exc):
                raise
            # Already back in the queue (e.g. the other component of a heterogeneous job requeued it).
            return {"job": job, "requeued": target, "already_pending": True}
        if not self.release_requeued:
            return {"job": job, "requeued": target}
        return {"job": job, "requeued": target, "released": self._release_hold(target)}

    def _release_hold(self, target: str) -> bool:
        """Lift the BeginTime hold Slurm puts on a requeued batch job (about 120 s), so the gang
        starts again at once.

        Slurm sets that hold when the requeued job leaves COMPLETING (its old run's steps ended on
        every node), so lifting it earlier is undone: wait until the job is PENDING, then lift it.
        Not in the same second, though: each slurmd revoked the job's old credential when it ended
        the old run, and rejects a credential created in the second of that revocation or before
        it ("Job credential revoked": the relaunch fails and the job ends; seen in CI). So the
        hold is lifted from the start of a later whole second on.
        Bounded: a job still completing after ``REQUEUE_SETTLE_S`` keeps Slurm's hold.
        """
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while time.monotonic() < deadline:
            kv = self._show_job(target)
            state = (kv or {}).get("JobState", "UNKNOWN")
            if state == "PENDING":
                self._sleep(REVOKE_MARGIN_S + 1.0 - self._wall() % 1.0)
                self._run(["scontrol", "update", f"JobId={target}", "StartTime=now"])
                return True
            if state not in ("COMPLETING", "RUNNING", "CONFIGURING", "REQUEUED"):
                return False  # started already, or gone
            self._sleep(0.25)
        return False

    def signal(self, args: Args) -> SignalAnswer:
        job = _need(args, "job", JOB)
        sig = args.get("signal")
        if not isinstance(sig, str) or sig not in SIGNALS:
            raise CommandRefusedError("argument signal is missing or not allowed")
        target = job_leader(job)  # every component of a heterogeneous job checkpoints together
        self._run(["scancel", f"--signal={sig.removeprefix('SIG')}", "--full", target])
        return {"job": job, "signal": sig, "signalled": target}

    def job_state(self, args: Args) -> JobStateAnswer:
        job = _need(args, "job", JOB)
        kv = self._show_job(job)
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

    def node_state(self, args: Args) -> NodeStateAnswer:
        info = self.node_info(self._member(args))
        return {"node": info.node, "state": info.state, "reason": info.reason}

    # -- capacity: could the gang start again now without the fenced node? ---------------------

    def capacity(self, args: Args) -> CapacityAnswer:
        """Whether the job's gang could start again now without ``node``: ``enough``, ``need``
        (its node count), ``free`` (what was counted) and ``why`` (one line saying so).

        Counted, in each of the job's partitions (the best one answers): nodes that are idle,
        responding, neither drained, down, failed nor in maintenance, and in no active
        reservation (a job in a reservation counts only that reservation's nodes) nor in the
        job's ExcNodeList, plus the job's own nodes that are healthy (they free up when it is
        requeued), never the fenced node. A job Slurm does not know, one already pending, or one
        pinned to the fenced node (ReqNodeList) cannot move now: ``enough`` is False and ``why``
        says so. One that ended on the fault has freed its nodes, which count as idle.
        """
        job = _need(args, "job", JOB)
        fenced = self._member(args)
        kv = self._show_job(job)
        if kv is None:
            why = f"job {job} is not known to Slurm: nothing to requeue"
            return {"job": job, "state": "UNKNOWN", "enough": False, "need": None, "free": None, "why": why}
        state = kv.get("JobState", "UNKNOWN")
        count = re.match(r"[0-9]+", kv.get("NumNodes", ""))
        partitions = [p for p in kv.get("Partition", "").split(",") if p]
        if count is None or not partitions:
            raise SlurmOutputError(f"no NumNodes or Partition for job {job}")
        need = int(count.group(0))
        nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
        reservations = self._reservations()
        resv = kv.get("Reservation") or None
        reserved = self._reserved(reservations, but=resv)
        allowed = self._hostnames([reservations[resv].nodes]) if resv in reservations else None
        if resv is not None and allowed is None:
            allowed = set()  # its reservation is gone: it can start nowhere
        own = self._hostnames([kv.get("NodeList", "")]) if state in _HOLDING_STATES else set()
        excluded = self._hostnames([kv.get("ExcNodeList", "")])
        required = self._hostnames([kv.get("ReqNodeList", "")])
        best: tuple[int, str, list[str], list[str]] | None = None
        for part in partitions:
            idle = sorted(
                n
                for n, (info, parts) in nodes.items()
                if part in parts
                and n != fenced
                and n not in own
                and info.free_idle
                and n not in reserved
                and n not in excluded
                and (allowed is None or n in allowed)
            )
            mine = sorted(n for n in own if n != fenced and n in nodes and nodes[n][0].usable_own)
            if best is None or len(idle) + len(mine) > best[0]:
                best = (len(idle) + len(mine), part, idle, mine)
        assert best is not None
        free, part, idle, mine = best
        where = f"partition {part}" + (f", reservation {resv}" if resv else "")
        why = (
            f"{len(idle)} idle healthy node{'' if len(idle) == 1 else 's'} in {where} + {len(mine)} of the"
            f" job's own; needs {need}"
        )
        enough = free >= need
        if state == "PENDING":
            enough, why = False, f"job {job} is already pending, nothing to move ({why})"
        elif fenced in required:
            enough, why = False, f"job {job} requires the fenced node {fenced} (its node list is pinned)"
        # A job that ended on the fault (FAILED, NODE_FAIL, ...) has freed its nodes: they count as
        # idle above, and whether it is requeued at all is actuate's call (it knows the run).
        return {
            "job": job,
            "state": state,
            "enough": enough,
            "need": need,
            "free": free,
            "partition": part,
            "idle": idle[:64],
            "own": mine[:64],
            "why": why,
        }

    # -- checks on a fenced node (diagnose / validate): see the module docstring ----------------


# DOWN reasons slurmctld sets itself (a slurmd that stopped answering, or came back after a reboot it
# did not expect): Pitstop's repair is what they wait for. Any other DOWN reason is a person's.
SLURM_DOWN_REASONS = frozenset({"Not responding", "Node unexpectedly rebooted"})
_WAS_DOWN = re.compile(r" \(was DOWN: (?P<reason>.+)\)$")


def _down_by_other(reason: str) -> str | None:
    """The DOWN reason someone else had set before Pitstop's drain (kept in its reason), if any."""
    m = _WAS_DOWN.search(reason)
    if m is None or m["reason"] in SLURM_DOWN_REASONS:
        return None
    return m["reason"]
