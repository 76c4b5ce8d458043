"""Which handler answers each op the workflow calls, and everything else an op is: the only table.

Each op has one core/ops.OpSpec: its handler (its answer is the handler's return type), how it
runs (claim, effect recorded once, or probe answered fresh), the states its incident may be in,
and whether it disrupts the job or touches the VM.
"""

from __future__ import annotations

from pitstop.core.answers import OpAnswer
from pitstop.core.ops import AFTER_FENCE, FENCED_ONLY, OPEN_ONLY, WORKING, Kind, Op, OpSpec
from pitstop.core.states import State
from pitstop.core.steps import Release
from pitstop.services.actuate import checks, ending, fence, gang, localise, repair, resubmit
from pitstop.services.actuate.context import Step

__all__ = ["MUTATING_OPS", "OPS", "PROBE_OPS", "Kind", "OpSpec", "Spec"]

E, P = Kind.EFFECT, Kind.PROBE
Spec = OpSpec[Step, OpAnswer | Release]

OPS: dict[Op, Spec] = {
    Op.CLAIM: OpSpec(fence.claim, Kind.CLAIM),
    Op.FENCE: OpSpec(fence.fence, E, frozenset({State.OPEN, State.FENCED})),
    Op.CORROBORATE: OpSpec(checks.corroborate, E, FENCED_ONLY),
    Op.CORROBORATION: OpSpec(checks.corroboration_done, P),
    Op.JUDGE_CORROBORATION: OpSpec(checks.judge_corroboration, E, FENCED_ONLY),
    Op.CHECKPOINT: OpSpec.disrupting(fence.checkpoint, E, FENCED_ONLY),
    Op.JOBS_DONE: OpSpec(fence.jobs_done, P),
    Op.RESCHEDULE_EARLY: OpSpec.disrupting(gang.reschedule_early, E, FENCED_ONLY),
    Op.DIAGNOSE: OpSpec.disrupting(checks.diagnose, E, FENCED_ONLY),
    Op.DIAGNOSIS: OpSpec(checks.diagnosis, P),
    Op.JUDGE_DIAGNOSIS: OpSpec(checks.judge_diagnosis, E, FENCED_ONLY),
    Op.ACT: OpSpec.disrupting(repair.act, E, frozenset({State.FENCED, State.ACTING})),
    Op.OPERATION: OpSpec(repair.operation, P),
    Op.VERIFY: OpSpec(repair.verify, P),
    Op.VALIDATE: OpSpec(checks.validate, E, AFTER_FENCE),
    Op.VALIDATION: OpSpec(checks.validation, P),
    Op.REVALIDATE: OpSpec(checks.revalidate, E, AFTER_FENCE),
    Op.REVALIDATION: OpSpec(checks.revalidation, P),
    Op.JUDGE_VALIDATION: OpSpec(checks.judge_validation, E, AFTER_FENCE),
    Op.ESCALATE: OpSpec(ending.escalate, E, WORKING),
    Op.UNFENCE: OpSpec(fence.unfence, E, AFTER_FENCE),
    Op.RESCHEDULE: OpSpec.disrupting(gang.reschedule, E, WORKING),
    Op.RESUMED: OpSpec(gang.resumed, P),
    Op.CLOSE: OpSpec(ending.close, E, WORKING),
    Op.FAIL: OpSpec(ending.fail, E),
    Op.LOCALISE: OpSpec(localise.localise_job, E, OPEN_ONLY),
    Op.SWEEP: OpSpec(localise.sweep_done, P),
    Op.LINKS: OpSpec(localise.links, E, OPEN_ONLY),
    Op.LINKS_DONE: OpSpec(localise.links_done, P),
    Op.CONCLUDE: OpSpec(localise.conclude, E, OPEN_ONLY),
    Op.RESUBMIT: OpSpec.disrupting(resubmit.resubmit, E, OPEN_ONLY),
}
assert set(OPS) == set(Op)  # every op the workflow may call has its spec

# Effects: recorded under the incident and replayed when called again, so a retry acts once.
MUTATING_OPS = frozenset(op for op, spec in OPS.items() if spec.kind is Kind.EFFECT)
# Probes the workflow polls; recording them would replay a stale answer. They change nothing but
# timeline stamps of what they observe (healthy, job_running).
PROBE_OPS = frozenset(op for op, spec in OPS.items() if spec.kind is Kind.PROBE)
