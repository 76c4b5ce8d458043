"""How a step ends: a stronger fault takes over (escalate), the incident resolves, or it fails."""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.core import remediation
from pitstop.core.actions import RANK
from pitstop.core.aggregate import FailStep, ResolveStep, StepUp
from pitstop.core.answers import Closed, Escalated, FailAnswer
from pitstop.core.ops import CONTINUE, Op
from pitstop.core.states import ACTIVE_STATES, State
from pitstop.core.steps import Release
from pitstop.core.timeline import durations
from pitstop.services.actuate.context import Step

# States a failed step may still turn into FAILED: the incident has not ended, nor waits for a person.
_FAILABLE = ACTIVE_STATES | {State.OPEN}


def escalate(s: Step) -> Escalated:
    """Decide a step-up while the node is still fenced: after verify, before unfence.

    A stronger fault that arrived during this step starts the next step (or is held), which
    keeps the node fenced: this step then neither unfences nor requeues (``handed_over``; the
    next step's fence takes its jobs over). Otherwise ``continue``.
    """
    fresh = s.deps.store.get(s.iid) or s.inc.copy()
    if fresh["step"] != s.step:
        return {"outcome": f"superseded by step {fresh['step']}", "handed_over": True}
    if fresh["state"] == State.HELD:  # this op's own step-up, held, whose answer was lost
        return {
            "outcome": f"escalation held: {(fresh.get('held') or {}).get('reason')}",
            "handed_over": True,
        }
    stronger = fresh.get("escalate_to")
    if stronger and RANK[stronger] > RANK[fresh["action"]]:
        stepped = _step_up(s, s.deps.clock())
        if stepped is not None:
            log.emit("INFO", "escalated before returning the node", incident=s.iid, **stepped)
            return {"outcome": stepped["outcome"], "handed_over": True}
    return {"outcome": CONTINUE, "handed_over": False}


def close(s: Step) -> Closed:
    now = s.deps.clock()
    fresh = s.deps.store.get(s.iid) or s.inc.copy()
    stronger = fresh.get("escalate_to")
    if stronger and RANK[stronger] > RANK[fresh["action"]]:
        # A stronger fault that arrived after escalate decided, when the node was back in service:
        # it is a new fault for the next step (which fences the node again).
        stepped = _step_up(s, now)
        if stepped is not None:
            return stepped
    return _resolve(s, now)


def _resolve(s: Step, now: float) -> Closed:
    done = s.changed(ResolveStep(s.at, s.recorded(Op.UNFENCE) or {}))
    return {"outcome": "resolved", "durations_s": durations(done)}


def _step_up(s: Step, now: float) -> Closed | None:
    """The fault got worse while it was being fixed: its next step goes the way every step does.

    The engine decides it (policy, cooldown, budgets, mode), the store records it, and the
    launcher pages or starts it, exactly as for an event. None when the engine dropped the
    stronger action (a job action inside its cooldown): this step then closes as usual.
    """
    out = s.deps.store.decide(s.iid, StepUp(), s.deps.policy, now)
    s.deps.launcher.follow_up(out, s.deps.policy, now)
    inc = out.incident
    if inc is None or out.result in ("ignored", "suppressed"):
        return None
    if out.result == "held":
        return {"outcome": f"escalation to {inc['action']} held: {(inc['held'] or {}).get('reason')}"}
    return {"outcome": f"escalated to {inc['action']} (step {inc['step']})"}


def fail(s: Step) -> FailAnswer | Release:
    """Record a failed step and page a person, unless the incident is past failing.

    A RESOLVED incident stays RESOLVED (e.g. a close whose answer was lost, then an error in its
    retry); so does a HELD or already FAILED one. A step another execution owns is left to it.
    The answer then says what the incident is, and is not recorded (a Release): the step's real
    failure, if one comes, is still recorded when it is reported.
    """
    stage, what = remediation.failure(s.extra)
    now = s.deps.clock()
    out = s.deps.store.decide(s.iid, FailStep(s.at, stage, what, s.recorded(Op.UNFENCE) or {}), None, now)
    if out.result == "refused":
        why_not = str(out.refused)
        log.emit("WARNING", "failure not recorded", incident=s.iid, stage=stage, why=why_not, error=what)
        state = str(out.incident["state"]) if out.incident is not None else "?"
        answer: FailAnswer = {"outcome": state.lower(), "state": state, "stage": stage, "error": what,
                              "why": why_not, "recorded": False}  # fmt: skip
        return Release(dict(answer), f"nothing done: {why_not}")
    s.deps.launcher.follow_up(out, s.deps.policy, now)  # the page it recorded
    return {"outcome": "failed", "stage": stage, "error": what}
