"""`pitstop report --readiness`: may a cluster be enforced? What observe mode recorded, as enforce
would have met it, and the README's criteria for enforce (quickstart step 9), checked (no I/O).

For each incident of the last days: what enforce would have done (its action and the workflow's
plan, or what would have held it), the evidence it would have had and whether anything confirmed
it (observe mode runs no node check: said so, with what the check would read), the jobs it would
have restarted and the GPU-hours at stake. Then, per cluster, each criterion: ``pass`` or ``fail``
where the incident store can tell, ``check`` where it cannot, with what to run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, cast

from pitstop.core import corroboration
from pitstop.core.actions import NODE_ACTIONS, RECORD_ONLY_ACTIONS, Action
from pitstop.core.catalog import SXID_KIND
from pitstop.core.control import silence_text
from pitstop.core.domain import Incident, Silenced
from pitstop.core.ops import Plan, plan_for
from pitstop.core.policy import Policy
from pitstop.core.timefmt import to_rfc3339
from pitstop.tools.report_model import Doc, detected_at, outcome

DEFAULT_DAYS = 14
OBSERVE_DAYS = 7  # criterion 2: at least a week of observe
UNSENT_AFTER_S = 900.0  # a page still in the outbox this long after it was recorded: notify is broken
GPUS_PER_NODE = 8  # an A3 VM's; --gpus-per-node for others
Status = Literal["pass", "fail", "check"]
NO_CLUSTER = "(no cluster)"

# What each plan of the workflow (workflows/remediate.yaml) runs, in order.
STEPS = {
    Plan.NOTIFY_ONLY: "notify (nothing on the node)",
    Plan.DRAIN: "fence -> confirm with Compute -> checkpoint -> requeue the gang early -> "
    "performMaintenance or wait for the platform's window -> validate -> unfence",
    Plan.REMEDIATE: "fence -> confirm the fault -> requeue the gang early -> {diagnose}act: {call} -> verify "
    "-> validate -> unfence -> requeue what still waits",
    Plan.LOCALISE: "check every node of the job (node checks, then NCCL between neighbours) -> the "
    "culprit gets its own incident, or one restart in place and a page",
}
CALLS = {
    Action.RESET_GPU: "instances.reset",
    Action.REBOOT_NODE: "instances.reset",
    Action.REPLACE_NODE: "reportHostAsFaulty (else recreate in its MIG)",
    Action.RESCHEDULE_JOB: "none (the platform stopped the VM)",
}
# What enforce's check of a system event reads (core/corroboration.judge_system).
SYSTEM_CHECKS = {
    "preemption": "a Spot VM stopped, restarted or recreated since {t}",
    "host_error": "the VM stopped, restarted or recreated since {t}",
    "lifecycle": "the VM stopped, restarted or recreated since {t}",
    "maintenance": "upcomingMaintenance set on the VM",
}


@dataclass(frozen=True)
class Would:
    """One incident, as enforce would have met it."""

    id: str
    subject: str
    cluster: str
    kind: str
    xid: int | None
    detected: float | None
    outcome: str  # report_model's: would act, held, recorded, ...
    action: str
    enforce: str  # what enforce would have done, in words
    steps: str  # the workflow's plan ("" when nothing would run)
    evidence: str  # what the fault was known from
    checked: str  # whether anything confirmed it, or what enforce's check would read
    jobs: str  # the jobs it would have restarted
    gpus: int | None
    hours: float | None
    hours_why: str

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpus is None or self.hours is None else round(self.gpus * self.hours, 1)


@dataclass(frozen=True)
class Criterion:
    n: int
    text: str
    status: Status
    finding: str


@dataclass(frozen=True)
class ClusterReadiness:
    cluster: str
    scheduler: str
    mode: str  # in force now (the policy's, or the cluster's own in the runtime control)
    incidents: tuple[Would, ...]
    criteria: tuple[Criterion, ...]

    @property
    def ready(self) -> bool:
        """No criterion failed (the ``check`` ones are still a person's to make)."""
        return all(c.status != "fail" for c in self.criteria)

    @property
    def gpu_hours(self) -> float:
        return round(sum(w.gpu_hours or 0.0 for w in self.incidents), 1)


@dataclass(frozen=True)
class Readiness:
    start: float
    end: float
    days: float
    clusters: tuple[ClusterReadiness, ...]
    control: tuple[str, ...]  # the runtime control in force
    changes: tuple[str, ...]  # its changes in the period

    @property
    def ready(self) -> bool:
        return all(c.ready for c in self.clusters)


# -- one incident ---------------------------------------------------------------------------------


def _map(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def subject(inc: Doc) -> str:
    node, job = _map(inc.get("node")), _map(inc.get("job"))
    if node.get("instance"):
        return str(node["instance"])
    return f"job {job.get('job')}" if job else "?"


def what_enforce_does(inc: Doc) -> tuple[str, str]:
    """(what enforce would have done, the workflow's steps; "" when none would run)."""
    action = str(inc.get("action") or "NONE")
    silenced, holds = inc.get("silenced"), inc.get("holds")
    held = _map(inc.get("held")) or (_map(holds[-1]) if isinstance(holds, list) and holds else {})
    if inc.get("workflow"):  # a step was decided after all (a hold released): that is what it did
        held = {}
    if isinstance(silenced, Mapping):
        return f"nothing: {silence_text(cast(Silenced, silenced))}", ""  # as the engine wrote it
    if action == Action.NONE:
        return "nothing: a record", ""
    plan = plan_for(action, cast(Incident, inc))  # a stored incident: plan_for reads it with get
    steps = STEPS[plan].format(
        call=CALLS.get(Action(action), "none"),
        diagnose="diagnose -> " if action == Action.REPLACE_NODE else "",
    )
    if held:
        return f"held, not started: {held.get('reason')}", steps
    closure = _map(inc.get("closure"))
    if closure.get("from_state") == "HELD":  # the close keeps no reason for the hold it ended
        return f"held, not started; {closure.get('by')} closed it", steps
    if action in RECORD_ONLY_ACTIONS:
        return f"{action}: the job's owner is told, nothing on the node", steps
    return f"{action} ({plan})", steps


def evidence(inc: Doc, policy: Policy) -> tuple[str, str]:
    """(what the fault was known from, whether anything confirmed it or what enforce would check)."""
    kind = str(inc.get("kind") or "?")
    rec = _map(inc.get("corroboration"))
    if rec:
        said = "confirmed" if rec.get("confirmed") is True else "not confirmed"
        return _source(kind, inc, policy), f"{said} on the node: {rec.get('why')}"
    return _source(kind, inc, policy), _check(kind, inc, policy)


def _check(kind: str, inc: Doc, policy: Policy) -> str:
    """What enforce would check before it disrupts anything (observe mode checks nothing)."""
    if inc.get("action") in RECORD_ONLY_ACTIONS:
        return "no check: nothing on the node would be disrupted"
    if kind in corroboration.SYSTEM_KINDS:
        t = to_rfc3339(
            float(str(inc.get("first_seen") or 0.0)) - float(corroboration.DEFAULTS["event_margin_s"])
        )
        reads = SYSTEM_CHECKS[kind].format(t=t)
        return f"not checked (observe mode); enforce would read the VM from Compute (instances.get): {reads}"
    if kind in ("gpu_xid", SXID_KIND):
        if not policy.corroborate:
            return "not checked: corroboration.enabled is false in the policy, enforce acts on the line"
        code = f"Xid {inc.get('xid')}" if kind == "gpu_xid" else "the SXid"
        gke = inc.get("scheduler") in ("gke", "kubernetes")
        where = (
            "its Node condition (XidCriticalError, PitstopKernelXid)" if gke else "dmesg --raw, nvidia-smi -q"
        )
        return f"not checked (observe mode runs no node check); enforce would look for {code} in {where}"
    checks = {
        "hang": "not checked; enforce would check every node of the job before anything moves",
        "degraded": "not checked; enforce would hold it against the job's other nodes first",
        "vertex_job": "not checked; enforce would read the job back (customJobs.get) first",
    }
    return checks.get(kind, "not checked")


def _source(kind: str, inc: Doc, policy: Policy) -> str:
    if kind in ("gpu_xid", SXID_KIND):
        if inc.get("trust") == "verified":
            return "the kernel's own journal line (verified)"
        act = (
            "act on it after the node check"
            if policy.trust_text_syslog == "act"
            else "only record and page it"
        )
        return f"text syslog only (unverified): enforce would {act}"
    known = {
        "preemption": "a Compute Engine system event (preemption)",
        "host_error": "a Compute Engine system event (host error)",
        "maintenance": "a Compute Engine upcoming-maintenance notice",
        "lifecycle": "a Compute Engine system event",
        "hang": "a Cloud Monitoring alert: the job's heartbeat stopped",
        "degraded": "a Cloud Monitoring alert: the node's GPUs throttle or their errors rise",
        "vertex_job": "the Vertex AI job's log",
    }
    return known.get(kind, kind)


def jobs(inc: Doc) -> str:
    stored = inc.get("jobs")
    listed = [str(_map(j).get("id")) for j in stored] if isinstance(stored, list) else []
    if listed:
        return ", ".join(listed)
    job = _map(inc.get("job"))
    if job:
        return f"job {job.get('job')} (the hung job: once, in place or after its culprit)"
    action = str(inc.get("action") or "NONE")
    if action in RECORD_ONLY_ACTIONS or inc.get("silenced") or inc.get("held"):
        return "none"
    return (
        f"the jobs on {subject(inc)} then: not read in observe mode (the fence reads them from the scheduler)"
    )


def at_stake(inc: Doc, now: float, gpus: int) -> tuple[int | None, float | None, str]:
    """(GPUs, hours, how the hours are known): the node's GPUs, for as long as the store knows the
    fault kept it from training: until a person closed the incident, or so far for one still open.
    Nothing for a record or a job's episode (its size is not recorded)."""
    action = str(inc.get("action") or "NONE")
    if action not in NODE_ACTIONS and action != Action.RESCHEDULE_JOB:
        return None, None, "no node action"
    start = detected_at(inc)
    closure, state = _map(inc.get("closure")), str(inc.get("state") or "")
    if start is None:
        return gpus, None, "no detection time"
    if closure.get("at") is not None:
        return (
            gpus,
            max(0.0, (float(str(closure["at"])) - start) / 3600),
            f"until {closure.get('by')} closed it",
        )
    if state in ("OPEN", "HELD", "FAILED"):
        return gpus, max(0.0, (now - start) / 3600), f"so far ({state.lower()})"
    return (
        gpus,
        None,
        "not known: it ended with no one closing it (when the node was repaired is not recorded)",
    )


def would(inc: Doc, policy: Policy, now: float, gpus: int = GPUS_PER_NODE) -> Would:
    does, steps = what_enforce_does(inc)
    source, checked = evidence(inc, policy)
    n, hours, why = at_stake(inc, now, gpus)
    xid = inc.get("xid")
    return Would(
        id=str(inc.get("id") or "?"),
        subject=subject(inc),
        cluster=str(inc.get("cluster") or NO_CLUSTER),
        kind=str(inc.get("kind") or "?"),
        xid=int(xid) if isinstance(xid, int) else None,
        detected=detected_at(inc),
        outcome=outcome(inc),
        action=str(inc.get("action") or "NONE"),
        enforce=does,
        steps=steps,
        evidence=source,
        checked=checked,
        jobs=jobs(inc),
        gpus=n,
        hours=None if hours is None else round(hours, 2),
        hours_why=why,
    )


# -- the criteria (README, quickstart step 9) -------------------------------------------------------


def criteria(
    cluster: str, scheduler: str, docs: Sequence[Doc], days: float, unsent: int
) -> tuple[Criterion, ...]:
    """Each of the README's five criteria for this cluster, checked where the store can tell."""
    return (_kernel_lines(docs), _observed(docs, days), _nothing_failed(docs, unsent),
            _scheduler(cluster, scheduler), _coexistence())  # fmt: skip


def _kernel_lines(docs: Sequence[Doc]) -> Criterion:
    text = "every GPU VM of the cluster sends verified kernel lines (the Ops Agent's journald config)"
    driver = [d for d in docs if d.get("kind") in ("gpu_xid", SXID_KIND)]
    unverified = sorted({subject(d) for d in driver if d.get("trust") != "verified"})
    if unverified:
        nodes = ", ".join(unverified[:10])
        fix = "install infra/ops-agent/config.yaml there (quickstart step 6)"
        return Criterion(1, text, "fail", f"driver lines arrived as text syslog only from {nodes}: {fix}")
    seen = len({subject(d) for d in driver})
    count = "gcloud logging read 'log_id(\"pitstop-kernel\")' --freshness=1d"
    found = f"{seen} node(s) logged driver lines, each verified; VMs that logged none are not in the store"
    return Criterion(1, text, "check", f"{found}: count them with `{count}`")


def _observed(docs: Sequence[Doc], days: float) -> Criterion:
    text = f"at least {OBSERVE_DAYS} days of observe, and every would-be action one you would have taken"
    enforced = [d for d in docs if d.get("mode") == "enforce"]
    if days < OBSERVE_DAYS:
        return Criterion(
            2, text, "fail", f"this report covers {days:g} days: ask for --days {OBSERVE_DAYS} or more"
        )
    if enforced:
        said = (
            f"{len(enforced)} incident(s) of the period were decided in enforce mode: not observed throughout"
        )
        return Criterion(2, text, "fail", said)
    acting = [d for d in docs if outcome(d) == "would act"]
    return Criterion(
        2, text, "check", f"observed throughout; judge each of the {len(acting)} would-be action(s) above"
    )


def _nothing_failed(docs: Sequence[Doc], unsent: int) -> Criterion:
    text = "no incident failed, every page was published, the webhook and dead-letter topics are clean"
    failed = [
        f"{d.get('id')} at {_map(d.get('failure')).get('stage')}" for d in docs if d.get("state") == "FAILED"
    ]
    if failed or unsent:
        said = [f"FAILED: {', '.join(failed[:10])}"] if failed else []
        said += [f"{unsent} page(s) still unpublished after {int(UNSENT_AFTER_S / 60)} min"] if unsent else []
        return Criterion(3, text, "fail", "; ".join(said))
    unseen = "the dead-letter subscriptions (pitstop-*-dead-inspect) and that a page reached your channel"
    return Criterion(3, text, "pass", f"none failed and the outbox is empty; not checked here: {unseen}")


def _scheduler(cluster: str, scheduler: str) -> Criterion:
    text = "the scheduler's pieces work: every JobSet restarts as a gang (GKE), the agent runs (Slurm)"
    how = {
        "slurm": "on the controller: systemctl status pitstop-slurm-agent",
        "gke": "pitstop doctor --kubeconfig K --context C",
        "kubernetes": "pitstop doctor --kubeconfig K --context C",
    }
    return Criterion(
        4, text, "check", f"not in the store: {how.get(scheduler, 'see docs/deploy.md')} ({cluster})"
    )


def _coexistence() -> Criterion:
    text = "the other repairers on these nodes are settled (GKE auto-repair, slurm-gcp, NHC, NVSentinel)"
    return Criterion(5, text, "check", "a person's decision: docs/coexistence.md")


# -- the whole report --------------------------------------------------------------------------------


def build(
    incidents: Iterable[Doc],
    policy: Policy,
    now: float,
    days: float = DEFAULT_DAYS,
    *,
    unsent: Mapping[str, int] | None = None,
    changes: Sequence[str] = (),
    only: str | None = None,
    gpus: int = GPUS_PER_NODE,
) -> Readiness:
    """Readiness per configured cluster (``only``: one) over the incidents of the last ``days``.
    ``unsent``: pages unpublished for UNSENT_AFTER_S, by cluster."""
    start = now - days * 86400
    docs = sorted(
        (d for d in incidents if (detected_at(d) or 0.0) >= start), key=lambda d: detected_at(d) or 0.0
    )
    names = [c.name for c in policy.clusters if only in (None, c.name)]
    if only is None and any(not d.get("cluster") for d in docs):
        names.append(NO_CLUSTER)
    out = []
    for name in names:
        mine = [d for d in docs if str(d.get("cluster") or NO_CLUSTER) == name]
        cl = policy.cluster_named(name)
        scheduler = cl.scheduler if cl is not None else "none"
        rows = tuple(would(d, policy, now, gpus) for d in mine)
        crit = criteria(name, scheduler, mine, days, (unsent or {}).get(name, 0)) if cl is not None else ()
        out.append(ClusterReadiness(name, scheduler, policy.mode_for(name if cl else None), rows, crit))
    return Readiness(start, now, days, tuple(out), tuple(policy.control.lines(now)), tuple(changes))


def to_json(r: Readiness) -> dict[str, object]:
    def cluster(c: ClusterReadiness) -> dict[str, object]:
        rows = [{**asdict(w), "gpu_hours": w.gpu_hours} for w in c.incidents]
        return {**asdict(c), "ready": c.ready, "gpu_hours": c.gpu_hours, "incidents": rows}

    head = {"start": r.start, "end": r.end, "days": r.days, "ready": r.ready}
    return {
        **head,
        "control": list(r.control),
        "changes": list(r.changes),
        "clusters": list(map(cluster, r.clusters)),
    }


def render(r: Readiness) -> str:
    """The report as text, one cluster after another."""
    period = f"{to_rfc3339(r.start)} .. {to_rfc3339(r.end)} ({r.days:g} days)"
    out = [f"Readiness for enforce: incidents detected {period}"]
    if r.control or r.changes:
        out += ["", "runtime control in force:", *(f"  {x}" for x in r.control or ["nothing"])]
        out += ["runtime control changes in the period:", *(f"  {x}" for x in r.changes)] if r.changes else []
    for c in r.clusters:
        gh = f", {c.gpu_hours:g} GPU-hours at stake where known" if c.gpu_hours else ""
        out += [
            "",
            f"== cluster {c.cluster} ({c.scheduler}, mode {c.mode} now): {len(c.incidents)} incident(s){gh}",
        ]
        for w in c.incidents:
            out += _would_lines(w)
        if c.criteria:
            verdict = "READY once the CHECK items are done" if c.ready else "NOT READY"
            out += ["", f"  criteria for enforce (README, quickstart step 9): {verdict}"]
            out += [f"  {x.n}. {x.status.upper():<5} {x.text}\n           {x.finding}" for x in c.criteria]
    return "\n".join(out)


def _would_lines(w: Would) -> list[str]:
    what = f"Xid {w.xid}" if w.xid is not None else w.kind
    when = to_rfc3339(w.detected) if w.detected is not None else "?"
    stake = f"{w.gpus} GPUs, hours {w.hours_why}" if w.gpus else w.hours_why
    if w.gpu_hours is not None:
        stake = f"{w.gpus} GPUs x {w.hours:g} h = {w.gpu_hours:g} GPU-hours ({w.hours_why})"
    lines = [f"- {w.id}  {when}  {w.subject}  {what}  [{w.outcome}]", f"    enforce: {w.enforce}"]
    lines += [f"    plan:     {w.steps}"] if w.steps else []
    lines += [f"    evidence: {w.evidence}", f"    checked:  {w.checked}", f"    jobs:     {w.jobs}"]
    return [*lines, f"    at stake: {stake}"]
