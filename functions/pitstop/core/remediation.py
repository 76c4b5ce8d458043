"""A remediation step's decisions, without I/O: which op may run now, which Compute call an action
takes, whether a job may be requeued, and what the incident and its notifications say.

actuate (services/actuate/) asks the world (Compute, the scheduler, the store) and hands the
answers here; everything it decides from them is decided in this module, so it is tested alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from pitstop.core import checks, notifications
from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action
from pitstop.core.answers import Page, PageIncident
from pitstop.core.catalog import SXID_KIND
from pitstop.core.domain import (
    CallFields,
    Fenced,
    FenceDoc,
    Incident,
    JobRestarts,
    Measurement,
    Notice,
    NotifiedIncident,
    Unfenced,
    Vm,
    VmBefore,
)
from pitstop.core.notifications import notification_id
from pitstop.core.scheduling import JobInfo, JobRun, JobState
from pitstop.core.timeline import durations, repair_s, resume_s


def instance_of(inc: Incident) -> str:
    """The incident's VM (a node-level incident's; a job-level one names a job, not a node)."""
    node = inc["node"]
    if node is None:
        raise TypeError(f"incident {inc['id']} is about a job, not a node")
    return node["instance"]


# -- what the scheduler said ---------------------------------------------------------------------


def merge_jobs(first: Iterable[JobInfo], then: Iterable[JobInfo]) -> list[JobInfo]:
    """Jobs from two sources, once each; for a job in both, the first source's entry (its run) wins."""
    out = list(first)
    seen = {j.job for j in out}
    return [*out, *(j for j in then if j.job not in seen)]


def handed_over(fence: Fenced) -> list[JobInfo]:
    """The jobs a previous step's fence recorded, with the runs its fault hit (for the next step)."""
    runs = fence.get("runs") or {}
    return [JobInfo(str(j), JobState.UNKNOWN, JobRun.of(runs.get(j))) for j in fence.get("jobs", [])]


def admit_restart(
    doc: JobRestarts | None, run_key: str, now: float, cap: int, window_s: float
) -> tuple[bool, JobRestarts]:
    """The job-disruption budget: may this run of the job be requeued, and the job's record after.

    The record holds the runs Pitstop requeued within the window (``runs: {run key: at}``); a run
    already in it is admitted again (a retry, or another incident of the same fault).
    """
    runs = {
        str(k): float(at)
        for k, at in ((doc.get("runs") if doc else None) or {}).items()
        if isinstance(at, int | float) and now - float(at) < window_s
    }
    if run_key in runs:
        return True, {"runs": runs}
    if len(runs) >= cap:
        return False, {"runs": runs}
    return True, {"runs": {**runs, run_key: now}}


def requeue_refusal(checkpointed: bool, info: JobInfo, fenced: JobRun) -> str | None:
    """Why a job must not be requeued for this fault (None: requeue it).

    After a checkpoint request (``checkpointed``: a drain, or a degraded node's planned move, asked
    it) a job exits on purpose: it must come back. Otherwise a job that completed, was cancelled,
    or is already pending again is left alone; so is one whose run moved on since the fence
    (requeued already, by Pitstop for another member of its gang or by anyone).
    """
    state = info.state
    finished_ok = state == JobState.COMPLETED and checkpointed
    if state in (JobState.PENDING, JobState.CANCELLED, JobState.UNKNOWN) or (
        state == JobState.COMPLETED and not finished_ok
    ):
        return f"job is {state}"
    if fenced.known and info.run != fenced:
        return (
            f"job moved on since the fence (restarts {fenced.restarts} -> {info.run.restarts}, "
            f"start {fenced.start_time} -> {info.run.start_time}): already requeued"
        )
    return None


def gang_running(watched: Mapping[str, JobRun], now: Mapping[str, JobInfo]) -> bool | None:
    """Whether every requeued job runs a new run (True), not yet (False), or none is watched (None).

    A job that ended on its own is not waited for. RUNNING only: a requeued Slurm job is COMPLETING
    its old run first (already with its new restart count).
    """
    seen = 0
    for job, then in watched.items():
        info = now[job]
        if info.state in (JobState.COMPLETED, JobState.CANCELLED):
            continue
        seen += 1
        if info.state != JobState.RUNNING or info.run == then:
            return False
    return True if seen else None


# -- the Compute call an action takes -----------------------------------------------------------


@dataclass(frozen=True)
class CallChoice:
    """The Compute Engine method for the action and its arguments, or why none can be made."""

    fields: CallFields
    error: str | None = None


def choose_call(
    inc: Incident,
    vm: Vm,
    report_ok: tuple[bool, str],
    mig: str | None,
) -> CallChoice:
    """``reset`` for a GPU reset or reboot; for a replacement, report the host faulty where Compute
    allows it (reservation-bound VMs), else recreate the VM in its managed instance group; for a
    drain, ``performMaintenance`` when the platform lets Pitstop start the window now."""
    action = inc["action"]
    if action in (Action.RESET_GPU, Action.REBOOT_NODE):
        return CallChoice({"method": "reset"})
    if action == Action.DRAIN_NODE:
        maint = (vm.get("resource_status") or {}).get("upcoming_maintenance") or {}
        return CallChoice(
            {"method": "performMaintenance" if maint.get("can_reschedule") else "wait_for_platform"}
        )
    if action != Action.REPLACE_NODE:
        return CallChoice({})
    ok, why = report_ok
    if ok:
        gpu_fault = (
            inc.get("xid") is not None or inc.get("kind") == SXID_KIND
        )  # an NVSwitch is the GPU baseboard's
        behavior = "UNRECOVERABLE_GPU_ERROR" if gpu_fault else "PERFORMANCE"
        return CallChoice(
            {"method": "reportHostAsFaulty", "behavior": behavior, "description": evidence(inc)}
        )
    if mig is None:
        node = instance_of(inc)
        return CallChoice({}, f"cannot replace {node}: {why}, and it is not in a managed instance group")
    return CallChoice({"method": "recreateInstances", "mig": mig, "why_not_report": why})


def vm_before(vm: Vm) -> VmBefore:
    """What the VM was before the call, for verify: its id, host and status."""
    return {
        "id": vm.get("id"),
        "host": (vm.get("resource_status") or {}).get("physical_host"),
        "status": vm.get("status"),
    }


def block_of(vm: Vm) -> str | None:
    """The VM's reservation block (``cluster/block``) from Compute's physical host topology."""
    topo = (vm.get("resource_status") or {}).get("physical_host_topology") or {}
    return f"{topo.get('cluster', '')}/{topo['block']}" if topo.get("block") else None


def verified(method: str, before: VmBefore, vm: Vm) -> bool:
    """The VM is back: RUNNING, on a new host after a host report, a new VM after a recreate."""
    ok = vm.get("status") == "RUNNING"
    if method == "wait_for_platform":  # done only once the platform's window is over
        return ok and not (vm.get("resource_status") or {}).get("upcoming_maintenance")
    if method == "reportHostAsFaulty":
        return ok and (vm.get("resource_status") or {}).get("physical_host") != before.get("host")
    if method == "recreateInstances":
        return ok and vm.get("id") != before.get("id")
    return ok


PLATFORM_MARGIN_S = 1800.0  # after the window's end: the platform reports completion in that time


def platform_window_end(vm: Vm) -> str | None:
    """The end of the VM's pending maintenance window (RFC 3339), or its latest start."""
    maint = (vm.get("resource_status") or {}).get("upcoming_maintenance") or {}
    end = maint.get("window_end_time") or maint.get("latest_window_start_time")
    return str(end) if end else None


def platform_wait_s(window_end: float | None, now: float) -> float:
    """How long verify waits for maintenance Pitstop may not start itself: to the window's end."""
    return 0.0 if window_end is None else max(0.0, window_end - now + PLATFORM_MARGIN_S)


def evidence(inc: Incident) -> str:
    """The host report's description: what Pitstop saw, from validated fields only."""
    counts = ", ".join(
        f"{k.replace('sxid_', 'SXid ').replace('xid_', 'Xid ')} x{v}"
        for k, v in inc["counts"].items()
        if k != "events"
    )
    gpus = ", ".join(g["pci"] for g in inc.get("gpus", {}).values())
    why = "; ".join(w for e in inc.get("escalations", []) for w in e.get("why", []) if w.startswith("lemon"))
    diagnosis = inc.get("diagnosis") or {}
    if diagnosis.get("confirmed"):
        why = "; ".join(w for w in (why, str(diagnosis.get("why"))) if w)
    return f"pitstop {inc['id']}: {counts} on GPU {gpus or 'n/a'}{'; ' + why if why else ''}"[:256]


# -- what the incident records and says -----------------------------------------------------------


def measured(doc: Incident, record: Measurement, step: int) -> list[Measurement]:
    """The incident's measurements with this one (one per kind and step: a retried judge replaces it)."""
    kept = [
        cast(Measurement, dict(m))  # as stored: anything but a record is dropped
        for m in doc.get("measured") or []
        if isinstance(m, Mapping) and (m.get("kind"), m.get("step")) != (record.get("kind"), step)
    ]
    latest: Measurement = {**record, "step": step}
    return [*kept, latest][-checks.MAX_MEASURED :]


def failure(extra: Mapping[str, object]) -> tuple[str, str]:
    """The stage that failed and one line saying how, from the workflow's error map."""
    stage = str(extra.get("stage", "?"))
    err = extra.get("error")
    message = err.get("message") if isinstance(err, dict) else str(err)
    body = err.get("body") if isinstance(err, dict) else None
    detail = body.get("error") if isinstance(body, dict) else None
    return stage, f"{stage} failed: {detail or message}"[:500]


def node_note(inc: Incident, unfenced: Unfenced) -> tuple[str, str]:
    """Where the node stands in its scheduler (one sentence), and what a person does about its fence.

    Only what is true: a fence someone else set is theirs (Pitstop neither replaced nor lifts it),
    a node never fenced was not, and one already returned is back in service.
    """
    if not inc.get("node"):  # a hung job's episode: Pitstop fenced no node for it
        return f"{notifications.subject(inc)} has no node of its own fenced.", ""
    node = instance_of(inc)
    fence: FenceDoc = inc.get("fence") or {}
    if fence.get("already_drained_by_other"):
        return (
            f"{node} stays drained by someone else: it was already {fence.get('previous_state')} with "
            f"reason '{fence.get('previous_reason')}' before Pitstop's fence, and Pitstop neither "
            "replaced nor lifts that drain.",
            "let whoever drained it return it to service, then ",
        )
    if unfenced.get("left_drained"):
        return (
            f"{node} stays drained with reason '{unfenced['left_drained']}', which is not Pitstop's "
            "drain for this incident, so Pitstop did not lift it.",
            "let whoever drained it return it to service, then ",
        )
    if unfenced:
        return f"{node} is back in service.", ""
    if not (inc.get("timeline") or {}).get("fenced"):
        return f"{node} was not fenced by Pitstop (the remediation stopped before its fence).", ""
    reason = fence.get("reason") or f"pitstop {inc['id']}"
    return f"{node} stays fenced (drained) with reason '{reason}'.", "resume it in the scheduler and "


def summary(inc: Incident, unfenced: Unfenced) -> str:
    node = notifications.subject(inc)  # a hung job's episode has no node: its job
    loc = inc.get("localisation") or {}
    if loc.get("culprits"):
        handed = ", ".join(f"{n} ({i})" for n, i in sorted((loc.get("incidents") or {}).items()))
        return f"{node}: {inc['reason']} Localised: culprits {handed} are remediated in their own incidents."
    if loc.get("outcome") == "nothing_found":
        return (
            f"{node}: {inc['reason']} Localised: no culprit fenced; {(inc.get('resume') or {}).get('why')}."
        )
    if inc["action"] in RECORD_ONLY_ACTIONS:
        return f"{node}: {inc['reason']} No node action taken."
    where, todo = node_note(inc, unfenced)
    if todo:  # a drain Pitstop did not set still holds the node
        return f"{node}: {inc['action']} done; node healthy, but {where} {inc['reason']}{gang_note(inc)}"
    return f"{node}: {inc['action']} done; node healthy and back in service. {inc['reason']}{gang_note(inc)}"


def gang_note(inc: Incident) -> str:
    """The gang's choice and its numbers, as the notification says it ("" when none was weighed)."""
    choice = inc.get("choice") or {}
    why = choice.get("why")
    return f" Gang {choice.get('job')}: {why}." if why else ""


NOTIFIED_FIELDS = (
    "id",
    "node",
    "cluster",
    "kind",
    "xid",
    "action",
    "state",
    "reason",
    "counts",
    "failure",
    "rejected",
    "resume",
    "diagnosis",
    "validation",
    "choice",
    "job",  # a job-level episode's subject (a hang, a Vertex AI job)
    "vertex",  # a Vertex AI job: what its step read back and did
)


def notification(inc: Incident, severity: str, text: str, **extra: Any) -> Notice:
    """An incident notification (its id is fixed by the incident, its step and its state); ``extra``
    adds to it or overrides (``jobs``, ``todo``, or a notification ``id`` of another decision)."""
    out: Notice = {
        "id": notification_id("incident", inc.get("id"), inc.get("step"), inc.get("state")),
        "kind": "incident",
        "severity": severity,
        "summary": text,
        "incident": cast(NotifiedIncident, {k: inc.get(k) for k in NOTIFIED_FIELDS}),  # its keys, all
        "durations_s": durations(inc),
        "resume_s": resume_s(inc),
        "repair_s": repair_s(inc),
    }
    return cast(Notice, {**out, **extra})  # the extras are the caller's keys, unchecked here


def page_notification(reason: str, inc: Incident | None) -> Page:
    """The page for a decision: its id is fixed by the incident, the reason and the decision's time.

    ``inc`` may be the coalescer's slim view of the incident (services/count_shards.slim): each
    field is read with ``get``, None where it has none."""
    if inc is None:
        return _page(reason, None, None, {"id": None, "node": None, "job": None, "cluster": None,
                                          "action": None, "state": None, "held": None})  # fmt: skip
    fields: PageIncident = {  # job: a hang's subject
        "id": inc.get("id"),
        "node": inc.get("node"),
        "job": inc.get("job"),
        "cluster": inc.get("cluster"),
        "action": inc.get("action"),
        "state": inc.get("state"),
        "held": inc.get("held"),
    }
    return _page(reason, inc.get("id"), inc.get("updated_at"), fields)


def _page(reason: str, iid: str | None, at: float | None, fields: PageIncident) -> Page:
    nid = notification_id("page", iid, reason, at)
    return {"id": nid, "kind": "page", "severity": "critical", "summary": reason, "incident": fields}
