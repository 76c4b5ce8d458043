"""Localise a hung job: the node check on every node at once, ring links if need be, then either a
node incident per culprit or a page (core/localise.py decides).

First, whether the alert may lead to anything (issue 35 (2)): the job opted in (the scheduler
says so) and its own heartbeat series, read back from Cloud Monitoring by Pitstop, was
established before it stopped; else nothing is checked or restarted, and a person is paged.

Each op is an effect of the step runner (recorded before the scheduler is asked, its check's
spec saved first), so a retried call waits for the same check instead of starting another.
Culprits are handed to the engine as events (fixed ids: a retry is a duplicate delivery), and
their own node incidents fence, requeue the gang (once per run, onto a spare when the scheduler
has one) and repair, exactly as for an Xid. Nothing found: nothing is restarted (a restart needs
a culprit's evidence) and a person is paged with every node and check.

A scheduler whose checks stop the gang first (GKE: the hung pods hold the GPUs a check pod needs;
``GangCheckStart.stopped``) gets it back from the conclusion, once (``GangResume``, the same budget
and run record): past its culprits, each fenced first for its own node incident so the resumed
pods cannot land on it, or in place when nothing was found.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal, cast

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import localise, notifications
from pitstop.core.aggregate import RecordGang, RecordLocalisation
from pitstop.core.answers import Concluded, Done, GangCheckStarted, Linking, LocalisedResume, Localising, Seen
from pitstop.core.domain import (
    CheckRun,
    GangCheckSpec,
    Localisation,
    LocaliseRound,
    NodeRef,
)
from pitstop.core.ids import job_key, requeue_key
from pitstop.core.ops import Op
from pitstop.core.scheduling import GangChecks, GangResume, JobRun, JobState, StepRef
from pitstop.services.actuate.context import Step
from pitstop.services.actuate.gang import over_budget


def _job(s: Step) -> str:
    job = s.inc.get("job")
    return str(job.get("job") if job else None)


def _checks(s: Step) -> GangChecks | None:
    sched = s.scheduler
    return sched if isinstance(sched, GangChecks) else None


def _start(s: Step, sched: GangChecks, spec: GangCheckSpec, seen: Seen | None = None) -> GangCheckStarted:
    """Start a gang check once: its spec (and what the job was, ``seen``) saved before the scheduler
    is asked. A scheduler that stops the gang to check it (GKE) says so: the conclusion resumes it."""
    saved = s.gang_decided().get("check")
    if not isinstance(saved, dict):
        s.save({"check": spec.copy(), "seen": seen} if seen is not None else {"check": spec.copy()})
        saved = spec.copy()
    started = sched.start_gang_check(_job(s), saved, s.ref)
    out: GangCheckStarted = {
        "run": bool(started.nodes),
        "check": saved,
        "nodes": list(started.nodes),
        "stopped": started.stopped,
    }
    return {**out, "why": started.note} if started.note else out


def _note(s: Step, fields: Localisation, round_: LocaliseRound | None = None) -> None:
    """Keep what localisation found on the incident (what the person and the demo read)."""
    s.decide(RecordLocalisation(s.at, _job(s), fields, round_))


def localise_job(s: Step) -> Localising:
    """Start the node check on every node of the hung job (its run recorded for the restart)."""
    job = _job(s)
    seen = s.gang_decided().get("seen")  # an earlier attempt's view: its own stop may have suspended the job
    if not isinstance(seen, dict):
        info = s.scheduler.job_info(job, s.ref)
        fresh: Seen = {"jobs": [job], "runs": {job: info.run.doc()}, "state": str(info.state)}
        seen = fresh
        if info.state != JobState.RUNNING:
            return _localising(seen, f"job {job} is {info.state}: no nodes to check")
        gate = _heartbeat_gate(s, job, info.opted_in)
        if not gate.go:  # the alert alone: nothing is checked, stopped or restarted
            _note(s, {"outcome": "unconfirmed", "page": gate.why})
            log.emit("WARNING", "hang alert not acted on", incident=s.iid, job=job, why=gate.why)
            return {**_localising(seen, gate.why), "refused": True}
    sched = _checks(s)
    if sched is None:
        return _localising(seen, f"the {s.scheduler.name} scheduler cannot check a job's nodes")
    spec = localise.sweep_spec(s.iid, s.step, job, [], s.deps.policy.localise)
    started = _start(s, sched, spec, seen)
    out = _localising(seen, started.get("why"))
    out["run"], out["check"], out["nodes"] = started["run"], started["check"], started["nodes"]
    out["stopped"] = started["stopped"]
    if started[
        "stopped"
    ]:  # resumed, it is the same run (a suspend counts no restart): running again is enough
        out["runs"], out["seen_runs"] = {job: JobRun().doc()}, seen["runs"]
    _note(s, {"nodes": started["nodes"], "started_at": s.deps.clock()})
    log.emit("INFO", "localising a hung job", incident=s.iid, job=job, nodes=len(started["nodes"]))
    return out


_UNREADABLE = (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError)


def _heartbeat_gate(s: Step, job: str, opted_in: bool) -> localise.Gate:
    """The job opted in, and its own heartbeat series (read back by Pitstop) was established before
    the alert opened."""
    cfg, until = s.deps.policy.localise, float(s.inc.get("first_seen") or s.deps.clock())
    ref = s.inc.get("job")
    reader = s.deps.telemetry
    points: list[float] | None = None
    if opted_in and ref is not None and isinstance(reader, localise.Heartbeats):
        start = until - float(cfg["heartbeat_lookback_s"])
        try:
            points = reader.heartbeat_points(str(ref["project"]), str(ref["cluster"]), job, start, until)
        except _UNREADABLE as exc:
            log.emit("WARNING", "heartbeat series unreadable", incident=s.iid, error=str(exc)[:200])
    return localise.heartbeat_gate(job, opted_in, points, cfg, until)


def _localising(seen: Seen, why: str | None) -> Localising:
    """localise's answer: what the job was, no check run (yet), and why."""
    out: Localising = {"jobs": seen["jobs"], "runs": seen["runs"], "state": seen["state"], "run": False}
    if why is not None:
        out["why"] = why
    return out


GangOp = Literal[Op.LOCALISE, Op.LINKS]


def _result(s: Step, op: GangOp) -> CheckRun | None:
    rec = s.recorded(op)
    sched = _checks(s)
    if not rec or not rec.get("run") or "check" not in rec or sched is None:
        return None
    localised = s.recorded(Op.LOCALISE)
    nodes = rec.get("nodes") or (localised.get("nodes") if localised else None) or []
    spec: GangCheckSpec = {**rec["check"], "nodes": nodes}
    return cast(CheckRun, asdict(sched.gang_check_result(_job(s), spec, s.ref)))  # CheckResult's fields


def _final(s: Step, op: GangOp) -> CheckRun | None:
    """A check's result for its judge: a scheduler's final refusal is a check that did not finish."""
    try:
        return _result(s, op)
    except ActuatorError as exc:
        if exc.retryable:
            raise
        return {"done": False, "error": exc.message}


def _done(s: Step, op: GangOp) -> Done:
    """The probe the workflow polls until the check ``op`` started has ended (or none ran)."""
    res = _result(s, op)
    return {"done": res is None or bool(res.get("done"))}


def sweep_done(s: Step) -> Done:
    return _done(s, Op.LOCALISE)


def links_done(s: Step) -> Done:
    return _done(s, Op.LINKS)


def _node_xids(s: Step) -> frozenset[int]:
    """Xids the catalog answers with a node action: in a node's ring buffer, a finding."""
    return localise.node_fault_xids(s.deps.policy.xids)


def links(s: Step) -> Linking:
    """Judge the sweep; nothing found on any node: start the NCCL test between ring neighbours."""
    rec = s.recorded(Op.LOCALISE)
    if not rec or not rec.get("run"):
        return {"run": False, "why": rec.get("why") if rec else None}
    nodes = [str(n) for n in rec.get("nodes") or []]
    cfg = s.deps.policy.localise
    verdict = localise.judge_sweep(
        nodes, _final(s, Op.LOCALISE), float(cfg["max_culprit_percent"]), _node_xids(s)
    )
    _note(s, {}, verdict.record(s.deps.clock()))
    out: Linking = {"run": False, "sweep": verdict.record(s.deps.clock())}
    sched = _checks(s)
    if verdict.culprits or verdict.suspects or len(nodes) < 2 or sched is None:
        return out
    spec = localise.links_spec(s.iid, s.step, _job(s), nodes, cfg)
    spec["gpus"] = 8  # one task per node drives all its GPUs (nccl-tests -g)
    started = _start(s, sched, spec)
    if not started["run"]:  # the scheduler has no link test: said in the record and the page
        why = str(started.get("why") or "the scheduler ran no link test")
        skipped = localise.Verdict(localise.LINKS, (), why, (f"{localise.LINKS}: not run",))
        _note(s, {}, skipped.record(s.deps.clock()))
        out["skipped"] = skipped.record(s.deps.clock())
        return out
    return {**out, **started}


def _rounds(s: Step) -> list[LocaliseRound]:
    """Every round's verdict: the sweep's (judged by ``links``) and, if it ran, the link test's."""
    judged = s.recorded(Op.LINKS) or {"run": False}
    rounds: list[LocaliseRound] = [r for r in (judged.get("sweep"), judged.get("skipped")) if r]
    if judged.get("run") and "check" in judged:
        cfg = s.deps.policy.localise
        v = localise.judge_links(
            [localise.split_pair(str(p)) for p in judged["check"].get("pairs", [])],
            _final(s, Op.LINKS),
            float(cfg["link_fraction"]),
            float(cfg["max_culprit_percent"]),
        )
        rounds.append(v.record(s.deps.clock()))
        _note(s, {}, rounds[-1])
    return rounds


def conclude(s: Step) -> Concluded:
    """Culprits → a node incident each (the engine's, as any fault); else nothing restarted and a page."""
    rec: Localising = s.recorded(Op.LOCALISE) or {"jobs": [], "runs": {}, "state": "", "run": False}
    state = JobState.of(rec.get("state"))
    if state in localise.NOT_HUNG:
        return _not_hung(s, state)
    if rec.get("refused"):
        return _page_only(s, str(rec.get("why") or "the hang alert was not acted on"))
    rounds = _rounds(s)
    culprits = [str(c) for r in rounds for c in r.get("culprits", [])]
    nodes = [str(n) for n in rec.get("nodes") or []]
    if culprits:
        opened = _hand_over(s, sorted(set(culprits)), rounds)
        if opened:
            _note(s, {"culprits": sorted(set(culprits)), "incidents": opened, "outcome": "culprits"})
            s.decide(RecordGang(s.at, "localised"))
            out: Concluded = {"outcome": "culprits", "culprits": sorted(set(culprits)), "incidents": opened}
            if rec.get("stopped"):
                out["resumed"], out["why"] = _resume_past(s, rec, opened)
            return out
    return _restart_in_place(s, rec, nodes, rounds)


def _resume_past(s: Step, rec: Localising, opened: dict[str, str]) -> tuple[bool, str]:
    """The gang the checks stopped, resumed once past its culprits: each is fenced first, for its own
    node incident (the same cordon and taint that incident's fence then finds in place), so the
    resumed pods land on spares, or wait for the repaired nodes."""
    action = str(s.deps.policy.localise["culprit_action"])
    for node, iid in sorted(opened.items()):
        s.scheduler.fence(node, StepRef(iid), action)
    skipped = _resume_once(s, rec)  # over budget: left stopped, and the budget's page says so
    how = "resumed once past its fenced culprits" if skipped is None else f"not resumed: {skipped}"
    resume: LocalisedResume = {"mode": "spares", "requeued": [_job(s)] if skipped is None else [], "why": how}
    s.decide(RecordGang(s.at, "job_requeued" if skipped is None else None, resume))
    return skipped is None, how


def _resume_once(s: Step, rec: Localising) -> str | None:
    """Start again the gang this step's checks stopped, once per run and within the job-restart
    budget, as every requeue (None: resumed; else why not, and it stays stopped for a person)."""
    sched = s.scheduler
    if not isinstance(sched, GangResume):
        return f"the {sched.name} scheduler cannot resume a job"
    job = _job(s)
    cluster = s.inc.get("cluster") or "none"
    key = requeue_key(cluster, job, JobRun.of((rec.get("seen_runs") or {}).get(job)).doc())
    cap, window = s.deps.policy.job_restarts()
    if not s.deps.store.records.claim_job_restart(job_key(cluster, job), key, s.deps.clock(), cap, window):
        return over_budget(s, job, cap, window)
    s.deps.store.records.mark_job_requeue(key, s.iid, s.deps.clock())
    out = sched.resume_gang(job, s.ref)
    log.emit("INFO" if out.restarted else "WARNING", "hung gang resumed after its checks"
             if out.restarted else "hung gang not resumed", incident=s.iid, job=job, how=out.how)  # fmt: skip
    return None if out.restarted else out.how


def _page_only(s: Step, why: str) -> Concluded:
    """The alert alone, not acted on: nothing checked, stopped or restarted; a person is paged."""
    job = _job(s)
    s.notify(s.inc, "critical", f"Hung job {job}? Not acted on: {why}",
             id=notifications.notification_id("localise", s.iid, s.step, "unconfirmed"))  # fmt: skip
    return {"outcome": "unconfirmed", "why": why}


def _not_hung(s: Step, state: JobState) -> Concluded:
    """The job ended, was suspended or is queued: no restart, no page, a note to its owner."""
    job = _job(s)
    text = localise.not_hung_text(job, str(state))
    _note(s, {"outcome": "not_running", "page": text})
    s.notify(s.inc, "info", text, id=notifications.notification_id("localise", s.iid, s.step, "not_running"))
    log.emit("INFO", "hang alert for a job that is not running: nothing done", incident=s.iid, job=job)
    return {"outcome": "not_running", "state": str(state)}


def _node_ref(s: Step, node: str) -> NodeRef | None:
    """The culprit's VM (its zone from the cluster's configuration; its id from Compute)."""
    cluster = s.deps.policy.cluster_named(str(s.inc.get("cluster") or ""))
    zones = (cluster.match.get("zones") if cluster else None) or []
    mig = cluster.raw.get("mig") if cluster else None
    zone = (mig["zone"] if mig else None) or (zones[0] if len(zones) == 1 else None)
    job = s.inc.get("job")
    project = str((job.get("project") if job else None) or "")
    if not zone or not project:
        return None
    try:
        vm = s.deps.compute.get(project, str(zone), node)
    except ActuatorError as exc:
        if exc.status == 404:
            return None
        raise
    iid = str(vm["id"]) if vm.get("id") is not None else None
    return {"project": project, "zone": str(zone), "instance": node, "instance_id": iid}


def _hand_over(s: Step, culprits: list[str], rounds: list[LocaliseRound]) -> dict[str, str]:
    """Open each culprit's node incident through the engine; returns {node: incident id}."""
    action = str(s.deps.policy.localise["culprit_action"])
    why = "; ".join(str(r.get("why")) for r in rounds if r.get("culprits"))
    opened: dict[str, str] = {}
    now = s.deps.clock()
    for node in culprits:
        ref = _node_ref(s, node)
        if ref is None:
            log.emit("WARNING", "culprit not found in Compute", incident=s.iid, node=node)
            continue
        ev = localise.culprit_event(s.inc, ref, action, why, s.step)
        out = s.deps.store.apply(ev, s.deps.policy, now)
        s.deps.launcher.follow_up(out, s.deps.policy, now)
        target = out.incident["id"] if out.incident else out.duplicate_of
        if target:
            opened[node] = str(target)
        log.emit("INFO", "hang culprit handed to its node incident", incident=s.iid, node=node,
                 result=out.result, node_incident=target)  # fmt: skip
    return opened


def _restart_in_place(s: Step, rec: Localising, nodes: list[str], rounds: list[LocaliseRound]) -> Concluded:
    """No culprit: a page with every node and check; nothing restarted (a gang its checks stopped,
    GKE, is resumed once as it was: budget and run record as every requeue)."""
    job = _job(s)
    then = JobRun.of((rec.get("runs") or {}).get(job))
    if rec.get("stopped"):  # its checks stopped it (GKE): it gets back what it had
        skipped = _resume_once(s, rec)
        restart = (
            "resumed in place once (its checks stopped it)" if skipped is None else f"not resumed: {skipped}"
        )
    else:  # no node showed a fault: nothing confirms a restart would help, or that it hung at all
        skipped = f"left running (run {then.restarts}): no node showed a fault, so nothing restarts it"
        restart = f"not restarted: {skipped}"
    text = localise.page_text(job, nodes, rounds, restart, str(rec.get("why") or ""))
    resume: LocalisedResume = {
        "mode": "in_place",
        "requeued": [job] if skipped is None else [],
        "why": restart,
    }
    s.decide(RecordGang(s.at, "job_requeued" if skipped is None else None, resume))
    _note(s, {"outcome": "nothing_found", "page": text})
    s.notify(s.inc, "critical", f"Hung job {job}: no culprit fenced; {restart}", todo=text,
             id=notifications.notification_id("localise", s.iid, s.step, "nothing_found"))  # fmt: skip
    log.emit("WARNING", "hang not localised: paged", incident=s.iid, job=job, restart=restart)
    return {"outcome": "nothing_found", "requeued": skipped is None, "why": restart}
