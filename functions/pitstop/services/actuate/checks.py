"""Checks on the fenced node: diagnose before an irreversible action, validate before returning it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal, NoReturn, cast

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import checks, corroboration
from pitstop.core.actions import Action
from pitstop.core.aggregate import RecordCorroboration, RecordDiagnosis, RecordUnconfirmed, RecordValidation
from pitstop.core.answers import (
    CheckStarted,
    Corroborating,
    CorroborationJudged,
    DiagnosisJudged,
    Done,
    Validating,
    ValidationJudged,
)
from pitstop.core.domain import CheckRun, CheckSpec, Measurement, Unfenced
from pitstop.core.evidence import Warrant
from pitstop.core.ops import Op
from pitstop.core.timefmt import to_epoch
from pitstop.core.validation import PAGE
from pitstop.services.actuate import planned
from pitstop.services.actuate.context import Step
from pitstop.services.actuate.gang import free_node, watch_resume


def _start(s: Step, spec: CheckSpec, why: str) -> CheckStarted:
    """Start a check run once: its spec is saved before the scheduler is asked."""
    saved = s.decided().get("check")
    if not isinstance(saved, dict):
        s.save({"check": spec.copy()})
        saved = spec.copy()
    started = s.scheduler.start_check(s.instance, saved, s.ref)
    return {"run": True, "why": why, "check": saved, "peer": started.peer, "note": started.note}


CheckOp = Literal[Op.CORROBORATE, Op.DIAGNOSE, Op.VALIDATE, Op.REVALIDATE]


def _result(s: Step, op: CheckOp) -> CheckRun | None:
    """The scheduler's answer for this step's check run (None when none ran)."""
    rec = s.recorded(op)
    if not rec or not rec.get("run") or "check" not in rec:
        return None
    return cast(CheckRun, asdict(s.scheduler.check_result(s.instance, rec["check"], s.ref)))


def _final(s: Step, op: CheckOp) -> CheckRun | None:
    """The check's result for its judge: a scheduler's final refusal is a run that did not finish."""
    try:
        return _result(s, op)
    except ActuatorError as exc:
        if exc.retryable:
            raise
        return {"done": False, "error": exc.message}


def _has_scheduler(s: Step) -> bool:
    return s.scheduler.name != "none"


def corroborate(s: Step) -> Corroborating | CheckStarted:
    """Ask the node, before anything is disrupted, whether it shows the fault the log names.

    Read-only tools beside whatever runs there (the node is not freed: a forged line must cost the
    job nothing). No scheduler, no channel: nothing confirms, and the judge pages. A degraded
    node (a Monitoring alert, authenticated) is held against its job's other nodes instead.
    """
    if planned.planned(s.inc):
        return planned.compare_peers(s)
    need, why = corroboration.needs_corroboration(s.inc, s.deps.policy.corroborate)
    if not need:
        return {"run": False, "why": why}
    cfg = s.deps.policy.corroboration
    if corroboration.claim_kind(s.inc) in corroboration.SYSTEM_KINDS:  # Compute answers at once
        verdict = corroboration.judge_system(s.inc, _vm_facts(s), cfg["event_margin_s"], s.instance)
        return {"run": False, "system": verdict.record(s.deps.clock(), s.step), "why": why}
    if not _has_scheduler(s):
        return {"run": False, "unavailable": True, "why": "no scheduler to ask the node through"}
    vm = s.vm()
    expected = checks.gpus_of(vm)
    boot = to_epoch(vm.get("last_start_timestamp")) or to_epoch(vm.get("creation_timestamp"))
    spec = corroboration.spec(
        s.inc, s.step, expected or 1, expected, boot,
        rules=s.deps.policy.xids, line_lag_s=cfg["line_lag_s"], remediated=_remediated(s),
    )  # fmt: skip
    return _start(s, spec, why)


def _remediated(s: Step) -> float | None:
    """When the node's last remediation (another incident's reset, reboot or replacement) took effect."""
    prior = corroboration.prior_remediations(s.deps.store.records.node(s.inc["node_key"]), s.iid)
    acted: dict[str, float | None] = {}
    for r in prior:
        other = s.deps.store.get(r["incident"])
        acted[r["incident"]] = other["timeline"].get("acted") if other else None
    return corroboration.remediated_at(prior, acted)


def _vm_facts(s: Step) -> corroboration.VmFacts | None:
    try:
        vm = s.vm()
    except ActuatorError as exc:
        if exc.status == 404:
            return None
        raise
    sched = vm.get("scheduling") or {}
    return corroboration.VmFacts(
        str(vm.get("status") or "UNKNOWN"),
        sched.get("provisioning_model") == "SPOT" or bool(sched.get("preemptible")),
        to_epoch(vm.get("creation_timestamp")),
        to_epoch(vm.get("last_start_timestamp")),
        to_epoch(vm.get("last_stop_timestamp")),
        bool((vm.get("resource_status") or {}).get("upcoming_maintenance")),
    )


def corroboration_done(s: Step) -> Done:
    """The probe the workflow polls until the corroboration check has ended (or none ran)."""
    res = _result(s, Op.CORROBORATE)
    return {"done": res is None or bool(res.get("done"))}


def judge_corroboration(s: Step) -> CorroborationJudged:
    """Go on when the node confirms the fault; else record what was checked and page (409)."""
    rec: Corroborating = s.recorded(Op.CORROBORATE) or {"run": False, "why": None}
    if "peers" in rec:
        return _judge_peers(s, rec["peers"])  # the recorded comparison (planned.py)
    if not rec.get("run") and not rec.get("unavailable") and "system" not in rec:
        return {"confirmed": None, "why": rec.get("why")}
    now = s.deps.clock()
    record: Measurement
    if "system" in rec:
        record = rec["system"]  # corroborate's record, saved with its step
    else:
        result = _final(s, Op.CORROBORATE) if rec.get("run") else None
        spec = rec.get("check") or cast(CheckSpec, {})  # saved with the step, as corroboration.spec made it
        cfg = s.deps.policy.corroboration
        verdict = corroboration.judge(spec, result, checks.evidence_gpu(s.inc), s.instance, cfg)
        record = verdict.record(now, s.step)
    if rec.get("unavailable"):
        record["why"] = f"{rec.get('why')}: {record['why']}"[:500]
    confirmed = record["confirmed"] is True
    log.emit("INFO", "corroborated", incident=s.iid, confirmed=confirmed, why=record["why"])
    if not confirmed:
        _stand_down(s, record)
    s.decide(RecordCorroboration(s.at, record))
    s.label(Op.FENCE, "fenced")  # the fence's courtesy label, held back until the node confirmed
    return {"confirmed": True, "why": record["why"]}


def _stand_down(s: Step, record: Measurement) -> NoReturn:
    """Not confirmed: nothing of it may stay. Pitstop's fence is lifted (a fence someone else set
    stays theirs), the incident resolves as not confirmed with its slots let go and no remediation
    left in the node's history, a person is paged (once per node per window), and the workflow
    ends here (409)."""
    answer = s.scheduler.unfence(s.instance, s.ref)
    unfenced: Unfenced = {"unfenced": s.instance, "resumed": answer.resumed}
    if answer.left_fenced:
        unfenced["left_drained"] = answer.left_fenced
    s.decide(RecordUnconfirmed(s.at, record, unfenced))
    raise ActuatorError(409, f"corroboration: {record['why']}", False)


def _judge_peers(s: Step, record: Measurement) -> CorroborationJudged:
    """A degraded node's comparison on the incident; a move goes on, anything else stands down."""
    s.decide(RecordCorroboration(s.at, record))
    return planned.judged(record)


def diagnose(s: Step, warrant: Warrant) -> CheckStarted:
    need, why = checks.needs_diagnosis(s.inc, s.deps.policy)
    if need and not _has_scheduler(s):
        need, why = False, "no scheduler to run a diagnostic through: replacing on the evidence as it is"
    if not need:
        return {"run": False, "why": why}
    freed = free_node(s)
    vm = s.vm()
    expected = checks.gpus_of(vm)  # what the VM has; None: no count can confirm anything
    exp = s.deps.table().expectation(checks.machine_type_of(vm))
    spec = checks.diagnose_spec(s.inc, s.step, s.deps.policy, expected or (exp.gpus if exp else 8), expected)
    return {**_start(s, spec, why), **freed}


def _finished(s: Step, op: CheckOp) -> Done:
    """A probe the workflow polls: has the check run ended (or none ran)? It also watches the gang."""
    res = _result(s, op)
    watch_resume(s)
    return {"done": res is None or bool(res.get("done"))}


def diagnosis(s: Step) -> Done:
    return _finished(s, Op.DIAGNOSE)


def judge_diagnosis(s: Step) -> DiagnosisJudged:
    """Replace on what the node itself shows, or step down to REBOOT_NODE (or page) and record why."""
    rec = s.recorded(Op.DIAGNOSE)
    if not rec or not rec.get("run") or "check" not in rec:
        return {"action": s.inc["action"], "confirmed": None, "why": rec.get("why") if rec else None}
    expected = rec["check"].get("expected_gpus")
    result = _final(s, Op.DIAGNOSE)
    verdict = checks.judge_diagnosis(
        s.inc, result, expected if isinstance(expected, int) else None, s.deps.table()
    )
    if planned.planned(s.inc):  # the gang is off the node: its finding picks the repair
        verdict = planned.repair_verdict(s, verdict, result)
    _record_diagnosis(s, verdict)
    if verdict.action == PAGE:
        raise ActuatorError(409, f"diagnosis: {verdict.why}", False)
    return {"action": verdict.action, "confirmed": verdict.confirmed, "why": verdict.why}


def _record_diagnosis(s: Step, verdict: checks.DiagnosisVerdict) -> None:
    """The diagnosis on the incident; not confirmed, this step steps down (and says why)."""
    record = verdict.record(s.deps.clock())
    chosen = planned.planned(s.inc) and verdict.action != s.inc["action"]
    stepped = not verdict.confirmed and s.inc["action"] == Action.REPLACE_NODE
    action = verdict.action if (chosen or stepped) and verdict.action != PAGE else None
    s.decide(RecordDiagnosis(s.at, record, action, verdict.why))
    log.emit("INFO", "diagnosed", incident=s.iid, confirmed=verdict.confirmed, why=verdict.why)


def validate(s: Step) -> Validating:
    need, why = checks.needs_validation(s.inc, s.deps.policy, _has_scheduler(s))
    if need and (s.inc.get("fence") or {}).get("already_drained_by_other"):
        need, why = False, "the node stays drained by someone else, who returns it to service"
    if not need:
        return {"run": False, "why": why}
    mt = s.decided().get("machine_type")
    if not isinstance(mt, str):
        vm = s.vm()
        mt = checks.machine_type_of(vm)
        s.save({"machine_type": mt, "gpus": checks.gpus_of(vm)})
    gpus = s.decided().get("gpus")
    freed = free_node(s)
    table = s.deps.table()
    spec = checks.validate_spec(
        s.inc, s.step, s.deps.policy, mt, table, gpus if isinstance(gpus, int) else None
    )
    return {**_start(s, spec, why), "machine_type": mt, **freed}


def validation(s: Step) -> Done:
    return _finished(s, Op.VALIDATE)


def _first_verdict(s: Step) -> checks.ValidationVerdict | None:
    """The first validation run judged (None when none ran)."""
    rec = s.recorded(Op.VALIDATE)
    if not rec or not rec.get("run"):
        return None
    return checks.judge_validation(
        s.inc["action"], str(rec["machine_type"]), _final(s, Op.VALIDATE), s.deps.policy, s.deps.table(),
        s.instance, _expected(rec),
    )  # fmt: skip


def _expected(rec: Validating) -> int | None:
    """The GPUs the VM has, as the validation's check was told (None: unknown)."""
    got = rec["check"].get("expected_gpus") if "check" in rec else None
    return got if isinstance(got, int) else None


def revalidate(s: Step) -> CheckStarted:
    """A busbw shortfall (measured the fabric's way) or corrupt data against one peer: the NCCL
    test again with a different healthy peer, through the same scheduler (which picks it the way it
    picked the first). One peer's result may be that peer's, the path's or the fabric's; it never
    condemns the node alone."""
    first = _first_verdict(s)
    if first is None or not first.wants_second_peer:
        return {
            "run": False,
            "why": "no busbw shortfall measured the fabric's way or corrupt data to check again",
        }
    validated = s.recorded(Op.VALIDATE)
    assert validated is not None and "check" in validated  # _first_verdict: it ran
    spec = checks.revalidate_spec(validated["check"], s.step, [str(first.peer)])
    saved = s.decided().get("recheck")
    if not isinstance(saved, dict):
        s.save({"recheck": spec.copy()})
        saved = spec.copy()
    started = s.scheduler.start_check(s.instance, saved, s.ref)
    what = "wrong data" if first.validation.verdict == "corrupt" else "busbw short"
    why = f"{what} against {first.peer}: measured again against another healthy peer"
    return {"run": True, "check": saved, "peer": started.peer, "note": started.note, "why": why}


def revalidation(s: Step) -> Done:
    return _finished(s, Op.REVALIDATE)


def judge_validation(s: Step) -> ValidationJudged:
    """Return the node on a pass; hardware evidence steps up to REPLACE_NODE; anything else pages."""
    rec = s.recorded(Op.VALIDATE)
    if not rec or not rec.get("run"):
        return {"outcome": "skipped", "why": rec.get("why") if rec else None}
    mt = str(rec["machine_type"])
    verdict = checks.judge_validation(
        s.inc["action"], mt, _final(s, Op.VALIDATE), s.deps.policy, s.deps.table(), s.instance, _expected(rec)
    )
    if verdict.wants_second_peer:
        rechecked = s.recorded(Op.REVALIDATE)
        second = _final(s, Op.REVALIDATE) if rechecked and rechecked.get("run") else None
        verdict = checks.judge_second_peer(
            s.inc["action"], mt, verdict, second, s.deps.policy, s.deps.table()
        )
    return _record_validation(s, verdict)


def _record_validation(s: Step, verdict: checks.ValidationVerdict) -> ValidationJudged:
    record = verdict.record(s.deps.clock())
    passed = verdict.validation.passed
    replace = verdict.next == Action.REPLACE_NODE
    replace_why = f"validation failed: {verdict.validation.why}" if replace else None
    s.decide(RecordValidation(s.at, record, passed, replace_why))
    log.emit("INFO", "validated", incident=s.iid, verdict=verdict.validation.verdict, next=verdict.next)
    if verdict.next == PAGE:
        raise ActuatorError(409, f"validation failed: {verdict.validation.why}", False)
    outcome: Literal["pass", "step_up"] = "pass" if passed else "step_up"
    return {"outcome": outcome, "verdict": verdict.validation.verdict, "why": verdict.validation.why}
