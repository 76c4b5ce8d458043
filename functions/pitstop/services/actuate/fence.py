"""Taking the node out of its scheduler and giving it back: claim, fence, checkpoint, unfence."""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import corroboration, remediation, topology, trust, watchdog
from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.aggregate import ClaimStep, JoinBlock, RecordFence, RejectStep
from pitstop.core.answers import Checkpointed, ClaimAnswer, JobsDone
from pitstop.core.domain import Fenced, Unfenced, Vm
from pitstop.core.evidence import Warrant
from pitstop.core.ops import Op, plan_for
from pitstop.core.scheduling import JobInfo
from pitstop.core.timefmt import to_epoch
from pitstop.services.actuate.context import Step

CHECKPOINT_MARGIN_S = 300.0
CHECKPOINT_DEFAULT_WAIT_S = watchdog.CHECKPOINT_WAIT_S


def claim(s: Step) -> ClaimAnswer:
    """This execution takes the step (one owner), after the live VM is checked against the evidence."""
    claimed = s.deps.store.decide(s.iid, ClaimStep(s.at), s.deps.policy, s.deps.clock())
    ours, why = claimed.result == "claimed", claimed.refused or ""
    if ours:
        problem, vm = _identity_problem(s)
        if problem is not None:
            _reject(s, problem)
            ours, why = False, f"rejected: {problem}"
        elif (held := join_block(s, vm)) is not None:
            ours, why = False, held
    action = s.inc["action"]
    return {"ours": ours, "why": why, "plan": plan_for(action, s.inc), "action": action}


def _identity_problem(s: Step) -> tuple[str | None, Vm | None]:
    """Before a node action first touches the VM: is the live VM the one the evidence names?
    (What is wrong, or None; and the VM if it was read.)

    Job actions are not checked (a preempted VM may already be a new one; the job still needs
    its restart), nor a node already acted on (Pitstop's own recreate gives it a new id).
    """
    if s.inc["action"] not in NODE_ACTIONS or s.inc["timeline"].get("acted"):
        return None, None
    try:
        vm = s.vm()
    except ActuatorError as exc:
        if exc.status == 404:
            p, z, i = s.node()
            return f"no VM {i} in {p}/{z}", None
        raise
    created = to_epoch(str(vm.get("creation_timestamp") or "")) or None
    live_id = str(vm["id"]) if vm.get("id") is not None else None
    return trust.vm_identity_problem(s.inc["node"] or {}, float(s.inc["first_seen"]), live_id, created), vm


def join_block(s: Step, vm: Vm | None = None) -> str | None:
    """The node counts against its reservation block's budget from before its fence, not only once
    acted on (the block is read from Compute's host topology, and the node's place is cached in its
    document with it). A block at its budget holds an incident not yet fenced, with a page, and
    this execution stops there (what is held, or None).
    """
    if s.inc["action"] not in NODE_ACTIONS:
        return None  # job actions claim no blast-radius slot
    if vm is None:
        try:
            vm = s.vm()
        except ActuatorError as exc:
            if exc.status == 404:
                return None  # no VM (yet): no block to join; act reads it again
            raise
    block = remediation.block_of(vm)
    if block is None:
        return None
    now = s.deps.clock()
    place = topology.from_vm(vm, s.deps.policy.moves["nvlink_domain_families"])
    out = s.deps.store.decide(s.iid, JoinBlock(block, place), s.deps.policy, now)
    if out.result != "held" or out.incident is None:
        return None
    s.deps.launcher.follow_up(out, s.deps.policy, now)
    log.emit("WARNING", "held before the fence: reservation block at its budget", incident=s.iid, block=block)
    return f"held: {(out.incident.get('held') or {}).get('reason')}"


def _reject(s: Step, problem: str) -> None:
    """End the incident without touching anything: the evidence does not match the live VM."""
    s.decide(RejectStep(s.at, problem))
    log.emit("WARNING", "evidence rejected: not the live VM", incident=s.iid, why=problem)


def fence(s: Step) -> Fenced:
    """Drain the node and record the jobs on it, each with the run the fault hit, and what was there."""
    sched = s.scheduler
    before: list[JobInfo] = []
    if _handed_over(s):  # the jobs the last step's fence recorded, read from its step record
        before = remediation.handed_over(s.recorded(Op.FENCE, s.step - 1) or {})
    jobs = remediation.merge_jobs(before, sched.jobs_on(s.instance, s.ref))
    answer = sched.fence(s.instance, s.ref, s.inc["action"]).doc()
    if not corroboration.needs_corroboration(s.inc, s.deps.policy.corroborate)[0]:
        s.label(Op.FENCE, "fenced")  # else once the node confirms: no Compute call on a forged line
    s.decide(RecordFence(s.at, tuple(j.doc() for j in jobs), answer))
    if answer.get("already_drained_by_other"):
        log.emit("INFO", "node was already drained by someone else; left as it is", incident=s.iid, **answer)
    return {
        "fenced": s.instance,
        "jobs": [j.job for j in jobs],
        "runs": {j.job: j.run.doc() for j in jobs},
        "fence": answer,
    }


def _handed_over(s: Step) -> bool:
    """The previous step handed the node over to this one (escalated before unfence): its jobs,
    with the runs its fault hit, are this step's to move (that step requeued nothing)."""
    escalated = s.recorded(Op.ESCALATE, s.step - 1) if s.step > 1 else None
    return bool(escalated and escalated.get("handed_over"))


def fenced_jobs(s: Step) -> list[str]:
    fenced = s.recorded(Op.FENCE)
    return [str(j) for j in fenced.get("jobs", [])] if fenced else []


def checkpoint(s: Step, warrant: Warrant) -> Checkpointed:
    """Ask each fenced job to save its state, and say how long to wait for it (before the window)."""
    jobs = fenced_jobs(s)
    how = sorted({s.scheduler.checkpoint(job, s.ref) for job in jobs})
    maint = s.inc.get("maintenance")
    ws = to_epoch(maint.get("window_start") if maint else None)
    wait = CHECKPOINT_DEFAULT_WAIT_S if ws is None else max(0.0, ws - s.deps.clock() - CHECKPOINT_MARGIN_S)
    return {
        "signalled": jobs,
        "signal": ", ".join(how) or None,
        "wait_s": min(wait, CHECKPOINT_DEFAULT_WAIT_S),
    }


def jobs_done(s: Step) -> JobsDone:
    running = [j for j in fenced_jobs(s) if s.scheduler.job_info(j, s.ref).state.on_nodes]
    return {"done": not running, "running": running}


def unfence(s: Step) -> Unfenced:
    """Lift Pitstop's fence for this incident; a fence someone else set stays (``left_drained``)."""
    answer = s.scheduler.unfence(s.instance, s.ref)
    s.label(Op.UNFENCE, None)
    out: Unfenced = {"unfenced": s.instance, "resumed": answer.resumed}
    if answer.left_fenced:
        out["left_drained"] = answer.left_fenced
    return out
