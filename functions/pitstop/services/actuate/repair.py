"""The node action itself: the Compute Engine call, the operation it started, and the VM back."""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import remediation
from pitstop.core.aggregate import RecordActed, RecordVerified
from pitstop.core.answers import Acted, ActPlan, Done, Verified
from pitstop.core.domain import CallFields, VmBefore
from pitstop.core.evidence import Warrant
from pitstop.core.ids import job_key, request_id, requeue_key
from pitstop.core.ops import Op
from pitstop.core.states import State
from pitstop.core.timefmt import to_epoch
from pitstop.services.actuate import gang
from pitstop.services.actuate.context import Step
from pitstop.services.actuate.fence import join_block
from pitstop.services.actuate.gang import watch_resume


def act(s: Step, warrant: Warrant) -> Acted:
    """Take the incident's action on the VM, once: the call is decided and saved before it is made.

    A retry reuses the saved plan, so a reportHostAsFaulty that ran but went unrecorded is
    repeated under its own request id (and ignored by Compute), never followed by a recreate.
    """
    plan = s.decided().get("plan")
    if not isinstance(plan, dict):
        plan = _plan(s)
        s.save({"plan": plan})
    if plan.get("method") not in (None, "none", "wait_for_platform") and (why := _jobs_not_restartable(s)):
        raise ActuatorError(409, f"not acted: {why}", False)  # fails with a page; the node stays fenced
    record: Acted = {**plan, "operation": _call(s, plan)}
    s.decide(RecordActed(s.at))
    log.emit(
        "INFO",
        "remediation action taken",
        incident=s.iid,
        node=s.instance,
        action=s.inc["action"],
        method=record["method"],
        operation=record["operation"],
        attempt=s.claim.attempt if s.claim else 1,
    )
    return record


def _jobs_not_restartable(s: Step) -> str | None:
    """Why the repair must not run under a job still on the node (None: it may).

    A reset, host report or recreate ends every job on the VM; a fenced job still running its
    fenced run there is ended by it, and Pitstop must be able to restart it. Its restart is
    claimed in the job-disruption budget now (the later requeue finds the same run's claim); a
    budget already spent stops the repair: held for a person, who is paged (issue 35, 8).
    """
    cluster = s.inc.get("cluster") or "none"
    cap, window = s.deps.policy.job_restarts()
    for job, fenced in gang.runs(s).items():
        info = s.scheduler.job_info(job, s.ref)
        if not (info.state.on_nodes and info.run == fenced):
            continue  # requeued, moved on or ended: the repair ends nothing of it
        key = requeue_key(cluster, job, info.run.doc())
        if not s.deps.store.records.claim_job_restart(
            job_key(cluster, job), key, s.deps.clock(), cap, window
        ):
            return gang.over_budget(s, job, cap, window)
    return None


def _plan(s: Step) -> ActPlan:
    """What act will do, decided from the VM before any effect; what the VM was is kept for verify."""
    vm = s.vm()
    join_block(s, vm)  # a host moved to another block since the claim counts there too (fenced: past the cap)
    compute = s.deps.compute  # a replacement: host report where Compute allows it, else the MIG
    choice = remediation.choose_call(
        s.inc, vm, compute.report_eligible(vm), compute.mig_of(vm) or _policy_mig(s)
    )
    if choice.error is not None:
        raise ActuatorError(409, choice.error, False)
    plan = _plan_of(choice.fields, remediation.vm_before(vm))
    if plan["method"] == "wait_for_platform":  # not done until the platform's window is over
        end = to_epoch(remediation.platform_window_end(vm))
        plan["verify_wait_s"] = remediation.platform_wait_s(end, s.deps.clock())
    return plan


def _plan_of(call: CallFields, before: VmBefore) -> ActPlan:
    """The call's fields (method ``none`` when it makes none) and the VM as it was."""
    plan: ActPlan = {"method": call.get("method", "none"), "before": before}
    if "behavior" in call:
        plan["behavior"] = call["behavior"]
    if "description" in call:
        plan["description"] = call["description"]
    if "mig" in call:
        plan["mig"] = call["mig"]
    if "why_not_report" in call:
        plan["why_not_report"] = call["why_not_report"]
    return plan


def _policy_mig(s: Step) -> str | None:
    cluster = s.deps.policy.cluster_for(s.inc["node"])
    mig = cluster.raw.get("mig") if cluster else None
    return str(mig["name"]) if mig and mig["zone"] == s.node()[1] else None


def _call(s: Step, plan: ActPlan) -> str | None:
    """Make the planned call under its deterministic request id; the operation to wait for, if any."""
    p, z, i = s.node()
    method = str(plan.get("method"))
    rid = request_id(s.iid, s.step, Op.ACT, method)
    compute = s.deps.compute
    if method == "reset":
        return compute.reset(p, z, i, request_id=rid)
    if method == "performMaintenance":
        return compute.perform_maintenance(p, z, i, request_id=rid)
    if method == "reportHostAsFaulty":
        return compute.report_host_as_faulty(
            p, z, i, str(plan["behavior"]), str(plan["description"]), request_id=rid
        )
    if method == "recreateInstances":
        return compute.recreate(p, z, str(plan["mig"]), i, request_id=rid)
    return None


def operation(s: Step) -> Done:
    acted = s.recorded(Op.ACT)
    started = acted.get("operation") if acted else None
    if not acted or not started:
        return {"done": True}
    p, z, _ = s.node()
    watch_resume(s)
    st = s.deps.compute.operation(p, z, started)
    if st["error"]:
        raise ActuatorError(409, f"{acted['method']} operation failed: {st['error']}", False)
    return {"done": st["done"]}


def verify(s: Step) -> Verified:
    """The VM is back (after a host report or recreate: the new one), its scheduler sees it healthy."""
    acted = s.recorded(Op.ACT)
    cur = s.vm()
    before = (acted.get("before") if acted else None) or {"id": None, "host": None, "status": None}
    vm_ok = remediation.verified(str(acted.get("method") if acted else None), before, cur)
    sched_ok = vm_ok and s.scheduler.node_healthy(s.instance, s.ref)
    watch_resume(s)
    if s.inc["state"] != State.VERIFYING or (vm_ok and sched_ok):
        s.decide(RecordVerified(s.at, vm_ok and sched_ok))
    return {"done": vm_ok and sched_ok, "vm": cur.get("status"), "scheduler_ok": sched_ok}
