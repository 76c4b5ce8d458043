"""The gang moves together, once, and soon: early requeue, requeue once the node is back, and
watching for the gang to run again."""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.core import checks, remediation
from pitstop.core.aggregate import RecordGang
from pitstop.core.answers import EarlyResume, Freed, JobWhy, Rescheduled, Resumed
from pitstop.core.domain import CapacityDoc, JobRunDoc
from pitstop.core.evidence import Warrant
from pitstop.core.ids import job_key, requeue_key
from pitstop.core.ops import Op
from pitstop.core.scheduling import Capacity, JobInfo, JobRun, JobState, Placer
from pitstop.services.actuate import moves
from pitstop.services.actuate.context import Step


def runs(s: Step) -> dict[str, JobRun]:
    """Each fenced job with the run the fault hit (a hung job's: the run its localisation saw)."""
    fence = s.recorded(Op.FENCE) or s.recorded(Op.LOCALISE) or {}
    runs: dict[str, JobRunDoc] = fence.get("runs") or {}
    return {str(j): JobRun.of(runs.get(j)) for j in fence.get("jobs", [])}


def requeue_one(s: Step, job: str, fenced: JobRun, onto: tuple[str, ...] = ()) -> str | None:
    """Requeue one job unless it moved on since the fence: None when requeued, else why not;
    ``onto``: the nodes the gang's choice put it on (a scheduler that can place it is asked to).

    Two incidents that see the same run race for its requeue record (cluster, job, run): one
    wins. No clock decides.
    """
    info = s.scheduler.job_info(job, s.ref)
    ckpt = s.recorded(Op.CHECKPOINT)
    checkpointed = bool(ckpt and ckpt.get("signalled"))
    why = remediation.requeue_refusal(checkpointed, info, fenced)
    if why is not None:
        return why
    cluster = s.inc.get("cluster") or "none"
    key = requeue_key(cluster, job, info.run.doc())
    cap, window = s.deps.policy.job_restarts()
    if not s.deps.store.records.claim_job_restart(job_key(cluster, job), key, s.deps.clock(), cap, window):
        return over_budget(s, job, cap, window)
    if not s.deps.store.records.mark_job_requeue(key, s.iid, s.deps.clock()):
        return "this run of the job was already requeued for another incident"
    sched = s.scheduler
    if onto and isinstance(sched, Placer):
        sched.requeue_onto(job, s.ref, info.run, onto)  # the run it may move, where it goes
    else:
        sched.requeue(job, s.ref, info.run)  # the run it may move
    return None


def over_budget(s: Step, job: str, cap: int, window: float) -> str:
    """The job-disruption budget is spent: not requeued, and a person is paged (once per step)."""
    why = (
        f"job {job} was restarted by Pitstop {cap} times within {int(window)} s (budgets.job_restarts):"
        " not requeued again; a person decides"
    )
    log.emit("WARNING", "job-disruption budget spent", incident=s.iid, job=job, cap=cap, window_s=window)
    s.notify(s.inc, "critical", f"Job {job} not restarted: disruption budget spent", todo=why)
    return why


def reschedule_early(s: Step, warrant: Warrant) -> EarlyResume:
    """Requeue each job now when the scheduler can run its gang without the node and that costs
    less than waiting for the repair (services/actuate/moves.py, policy ``moves``); else say why.

    The repair then goes on in the background of the job. A job left waiting is requeued by
    ``reschedule`` once the node is back (the old order), and the incident's ``resume`` says why.
    """
    choice = s.deps.policy.reschedule(s.deps.policy.cluster_for(s.inc["node"]))
    requeued: list[JobWhy] = []
    waiting: list[JobWhy] = []
    moved: list[JobWhy] = []
    for job, then in runs(s).items():
        cap = s.scheduler.capacity(job, s.instance, s.ref) if choice == checks.EARLY else None
        go, why = checks.early_requeue(choice, _capacity_doc(cap))
        onto: tuple[str, ...] = ()
        if cap is not None and s.deps.policy.moves["enabled"]:
            move = moves.choose(s, job, cap)  # priced and recorded on the incident
            go, why, onto = move.go, move.why, move.onto
        if not go:
            waiting.append({"job": job, "why": why})
            continue
        skipped = requeue_one(s, job, then, onto)
        (requeued if skipped is None else moved).append(
            {"job": job, "why": why if skipped is None else skipped}
        )
    resume: EarlyResume = {
        "mode": checks.EARLY if requeued else checks.AFTER_REPAIR,
        "requeued": requeued,
        "waiting": waiting,
    }
    if moved:
        resume["skipped"] = moved
    gang_moved = requeued or any("requeued" in m["why"] for m in moved)
    s.decide(RecordGang(s.at, "job_requeued" if gang_moved else None, resume))
    if requeued:
        log.emit("INFO", "gang requeued before the repair", incident=s.iid, jobs=[r["job"] for r in requeued])
    return resume


def _capacity_doc(cap: Capacity | None) -> CapacityDoc:
    return {} if cap is None else {"enough": cap.enough, "need": cap.need, "free": cap.free, "why": cap.why}


def kept_to(s: Step, job: str) -> tuple[str, ...]:
    """Where a requeue of the job must keep it: an NVL72 gang that waits for its node stays on its
    own nodes (its choice's ``stay_on``, services/actuate/moves.choose), else anywhere (none)."""
    choice = s.inc.get("choice") or {}
    return tuple(choice.get("stay_on") or ()) if choice.get("job") == job else ()


def reschedule(s: Step, warrant: Warrant) -> Rescheduled:
    """Requeue each job the fault hit, once: only while it is still the run the fence recorded."""
    requeued: list[str] = []
    skipped: list[JobWhy] = []
    for job, then in runs(s).items():
        why = requeue_one(s, job, then, kept_to(s, job))
        if why is None:
            requeued.append(job)
        else:
            skipped.append({"job": job, "why": why})
    moved = any("requeued" in sk["why"] for sk in skipped)
    s.decide(RecordGang(s.at, "job_requeued" if requeued or moved else None))
    return {"requeued": requeued, "skipped": skipped}


def free_node(s: Step) -> Freed:
    """Requeue the fenced jobs still on the node (no capacity moved them early): a check needs its GPUs.

    Any repair ends them anyway; requeued now, they wait in the queue for capacity instead (an
    NVL72 gang for its own nodes: ``kept_to``). Once per run (``requeue_one``'s record); the
    check's start is answered 503 until the node is empty.
    """
    moved: list[str] = []
    for job, then in runs(s).items():
        info = s.scheduler.job_info(job, s.ref)
        here = info.state in (JobState.RUNNING, JobState.SUSPENDED) and info.run == then
        if here and requeue_one(s, job, then, kept_to(s, job)) is None:
            moved.append(job)
    if moved:
        s.decide(RecordGang(s.at, "job_requeued"))
        log.emit("INFO", "jobs requeued to free the node for a check", incident=s.iid, jobs=moved)
    return {"requeued_to_free": moved} if moved else {}


def watch_resume(s: Step) -> bool:
    """Stamp ``job_running`` once every requeued job runs a new run; whether it is stamped.

    Called by the probes the workflow polls anyway (operation, verify, checks, resumed), so the
    moment the gang runs again is seen while the node is still being repaired.
    """
    tl = s.inc.get("timeline") or {}
    if tl.get("job_running"):
        return True
    if not tl.get("job_requeued"):
        return False
    fenced = runs(s)
    now: dict[str, JobInfo] = {}
    for job in fenced:  # ask job by job: stop at the first still on its old run
        now[job] = s.scheduler.job_info(job, s.ref)
        if remediation.gang_running({job: fenced[job]}, {job: now[job]}) is False:
            return False
    running = remediation.gang_running(fenced, now)
    if running:
        s.decide(RecordGang(s.at, "job_running"), strict=False)  # a probe's stamp
    return bool(running)


def resumed(s: Step) -> Resumed:
    """Probe after the last requeue: done once the gang is seen running again (or nothing waits)."""
    if not (s.inc.get("timeline") or {}).get("job_requeued"):
        return {"done": True, "running": False}
    running = watch_resume(s)
    return {"done": running, "running": running}
