"""Which handler answers each op the workflow calls, and how it runs: the only dispatch table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from pitstop.core.answers import OpAnswer
from pitstop.core.ops import MUTATING_OPS, PROBE_OPS, Op
from pitstop.core.steps import Release
from pitstop.services.actuate import checks, ending, fence, gang, localise, repair
from pitstop.services.actuate.context import Step


class Kind(Enum):
    CLAIM = "claim"  # takes the step for one execution (a conditioned change of the incident)
    EFFECT = "effect"  # recorded under the incident by the step runner: runs once, replayed after
    PROBE = "probe"  # asked again and again by the workflow's polls: answered fresh, never recorded


@dataclass(frozen=True)
class OpSpec:
    run: Callable[[Step], OpAnswer | Release]
    kind: Kind


OPS: dict[Op, OpSpec] = {
    Op.CLAIM: OpSpec(fence.claim, Kind.CLAIM),
    Op.FENCE: OpSpec(fence.fence, Kind.EFFECT),
    Op.CORROBORATE: OpSpec(checks.corroborate, Kind.EFFECT),
    Op.CORROBORATION: OpSpec(checks.corroboration_done, Kind.PROBE),
    Op.JUDGE_CORROBORATION: OpSpec(checks.judge_corroboration, Kind.EFFECT),
    Op.CHECKPOINT: OpSpec(fence.checkpoint, Kind.EFFECT),
    Op.JOBS_DONE: OpSpec(fence.jobs_done, Kind.PROBE),
    Op.RESCHEDULE_EARLY: OpSpec(gang.reschedule_early, Kind.EFFECT),
    Op.DIAGNOSE: OpSpec(checks.diagnose, Kind.EFFECT),
    Op.DIAGNOSIS: OpSpec(checks.diagnosis, Kind.PROBE),
    Op.JUDGE_DIAGNOSIS: OpSpec(checks.judge_diagnosis, Kind.EFFECT),
    Op.ACT: OpSpec(repair.act, Kind.EFFECT),
    Op.OPERATION: OpSpec(repair.operation, Kind.PROBE),
    Op.VERIFY: OpSpec(repair.verify, Kind.PROBE),
    Op.VALIDATE: OpSpec(checks.validate, Kind.EFFECT),
    Op.VALIDATION: OpSpec(checks.validation, Kind.PROBE),
    Op.REVALIDATE: OpSpec(checks.revalidate, Kind.EFFECT),
    Op.REVALIDATION: OpSpec(checks.revalidation, Kind.PROBE),
    Op.JUDGE_VALIDATION: OpSpec(checks.judge_validation, Kind.EFFECT),
    Op.ESCALATE: OpSpec(ending.escalate, Kind.EFFECT),
    Op.UNFENCE: OpSpec(fence.unfence, Kind.EFFECT),
    Op.RESCHEDULE: OpSpec(gang.reschedule, Kind.EFFECT),
    Op.RESUMED: OpSpec(gang.resumed, Kind.PROBE),
    Op.CLOSE: OpSpec(ending.close, Kind.EFFECT),
    Op.FAIL: OpSpec(ending.fail, Kind.EFFECT),
    Op.LOCALISE: OpSpec(localise.localise_job, Kind.EFFECT),
    Op.SWEEP: OpSpec(localise.sweep_done, Kind.PROBE),
    Op.LINKS: OpSpec(localise.links, Kind.EFFECT),
    Op.LINKS_DONE: OpSpec(localise.links_done, Kind.PROBE),
    Op.CONCLUDE: OpSpec(localise.conclude, Kind.EFFECT),
}

# The table and the op vocabulary agree (a test checks it too): every op has one handler, the
# recorded ones are exactly the effects, the fresh ones exactly the probes.
assert set(OPS) == set(Op)
assert {op for op, spec in OPS.items() if spec.kind is Kind.EFFECT} == MUTATING_OPS
assert {op for op, spec in OPS.items() if spec.kind is Kind.PROBE} == PROBE_OPS
