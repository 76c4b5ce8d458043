"""The incident as one aggregate: every change to an incident is a typed command, decided here.

:func:`decide` is the only code that writes an incident's fields. It takes the incident as stored,
one command and what the store read with it (:class:`Given`: the time, the node's document, the
budgets, the policy), and returns an :class:`~pitstop.core.engine.Outcome`: the incident after,
the node document and budget documents to write with it, the notifications to record in the
outbox in the same commit, the workflow step to start, or why the command was refused. The store
(core/store.py) applies an outcome atomically; nothing else may change an incident.

Three families of commands:

- *the engine's*: an event folded in, a held incident released, a step-up, a person's close, the
  watchdog's failure, a reservation block joined, a burst ended (core/engine.py decides them);
- *the workflow run's*: its start leased, recorded, or refused (PENDING → STARTED; ``lease_until``);
- *a step's*: each remediation op's record of what it did (claim, fence, corroboration, act,
  verify, diagnosis, validation, the gang's milestones, localisation, resolve, fail, reject).

Every step command carries its :class:`At` (step and execution), and its precondition
(the step is the incident's, the state is one the op belongs to, the execution owns the step) is
checked here, on the incident the store read in the transaction that writes the result: there is
no window between the check and the write.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from pitstop.core import (
    corroboration,
    degraded,
    engine,
    evidence,
    lifecycle,
    notifications,
    remediation,
    vertex,
)
from pitstop.core.actions import RANK, RECORD_ONLY_ACTIONS, Action
from pitstop.core.answers import EarlyResume, LocalisedResume
from pitstop.core.control import Control, Hold
from pitstop.core.domain import (
    Draft,
    FaultEvent,
    FenceDoc,
    Incident,
    JobDoc,
    JsonObject,
    Localisation,
    LocaliseRound,
    Measurement,
    Milestone,
    MoveChoice,
    NodeDoc,
    Place,
    Resume,
    UnfenceAnswer,
    Unfenced,
    VertexRecord,
)
from pitstop.core.engine import Budgets, Outcome
from pitstop.core.evidence import Waiver, Warrant
from pitstop.core.ops import Op
from pitstop.core.policy import Policy
from pitstop.core.states import ACTIVE_STATES, UNCLAIMABLE_STATES, RunState, State
from pitstop.core.steps import Guard, Refusal

# Asked by a decision of the node's latest incident as it read it (None: the node has none): the
# caller (services/coalesce.py) counts the event in memory instead, and nothing is decided.
Countable = Callable[[Incident | None], bool]

UNKNOWN_OWNER = "unknown"  # a step claimed by a caller that named no execution
# States a failed step may still turn into FAILED: the incident has not ended, nor waits for a person.
FAILABLE = ACTIVE_STATES | {State.OPEN}
# States in which the runtime control may still stop a step (core/control.py): the repair has not
# begun. Once it has (ACTING, VERIFYING), the step finishes it and restarts the job it stopped.
HOLDABLE = frozenset({State.OPEN, State.FENCED})
START_REFUSALS = 3  # the third refused start of a step fails its incident (services/sweep.py)


# -- what every decision is given besides the incident ---------------------------------------------


@dataclass(frozen=True)
class Given:
    """What the store read for one decision, in the transaction that writes its outcome."""

    now: float
    policy: Policy | None = None
    node: NodeDoc | None = None  # the subject's document (engine commands read it)
    budgets: Budgets = field(default_factory=dict)  # read lazily: only what the decision asks for


# -- the engine's commands (core/engine.py decides) ------------------------------------------------


@dataclass(frozen=True)
class FoldEvent:
    """A classified event, folded into its subject's episode (``ingest``); the key is its delivery's."""

    event: FaultEvent
    trigger: str
    countable: Countable | None = None  # asked of the latest incident: count it in memory instead


@dataclass(frozen=True)
class ReleaseHeld:
    """A HELD incident tried again (the sweep) or released past its budget by a person (``force``)."""

    by: str
    force: bool


@dataclass(frozen=True)
class StepUp:
    """The stronger action a fault asked for while it was being fixed becomes the next step."""


@dataclass(frozen=True)
class CloseByPerson:
    by: str
    unfence: bool


@dataclass(frozen=True)
class FailStuck:
    """The watchdog: the step's execution died or overran (if it still owns the incident)."""

    execution: str
    why: str


@dataclass(frozen=True)
class JoinBlock:
    """The node's reservation block, read from Compute before the fence; ``place``: where the node
    sits (core/topology.from_vm), cached in its node document with it."""

    block: str
    place: Place | None = None


@dataclass(frozen=True)
class EndBurst:
    """A record-only or observe-mode episode whose burst may be over (``burst_until``: as summed
    from every count shard, which may extend the incident's own)."""

    burst_until: float


# -- the workflow run's commands -------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseStart:
    """One starter at a time may start a decided step: it leases it first."""

    step: int
    lease_s: float = 60.0


@dataclass(frozen=True)
class RecordStarted:
    step: int
    execution: str


@dataclass(frozen=True)
class RefuseStart:
    """Workflows refused the step's start: counted; a permanent refusal or the last one fails it."""

    step: int
    error: str
    permanent: bool


# -- a remediation step's commands (actuate) -------------------------------------------------------


@dataclass(frozen=True)
class At:
    """A step command's precondition, carried by the command: the step of the incident it is
    about, the execution that sends it ("": none named), and the states its op may find the
    incident in (None: any; core/ops.OpSpec.states)."""

    step: int
    execution: str = ""
    states: frozenset[State] | None = None


@dataclass(frozen=True)
class ClaimStep:
    """This execution takes the step: the first claim owns it; a different one is refused."""

    at: At


@dataclass(frozen=True)
class RejectStep:
    """The evidence names a VM that is not the live one: resolved with nothing done."""

    at: At
    why: str


@dataclass(frozen=True)
class RecordFence:
    at: At
    jobs: tuple[JobDoc, ...]
    fence: FenceDoc


@dataclass(frozen=True)
class RecordActed:
    """The repair call is about to be made: the incident is ACTING."""

    at: At


@dataclass(frozen=True)
class RecordVerified:
    """The repair's effect was seen (VERIFYING); ``healthy``: the VM and its scheduler say so."""

    at: At
    healthy: bool


@dataclass(frozen=True)
class RecordGang:
    """What the gang did: a milestone (``job_requeued``, ``job_running``, ``localised``) and how it
    was restarted."""

    at: At
    milestone: Milestone | None = None
    resume: Resume | EarlyResume | LocalisedResume | None = None


@dataclass(frozen=True)
class RecordChoice:
    """The gang's choice at this fault and its numbers (core/tradeoff.py): wait, move, shrink or
    hold, each option's expected GPU-hours; ``page``: no spare its NVLink domain allows (paged once)."""

    at: At
    choice: MoveChoice


@dataclass(frozen=True)
class RecordCorroboration:
    at: At
    record: Measurement


@dataclass(frozen=True)
class RecordUnconfirmed:
    """The node check did not confirm the fault (or could not run): nothing may stay of it. The
    step's fence was already lifted (``unfenced``: what the scheduler said); the incident resolves
    as not confirmed, its blast-radius slots are removed (nothing was done: they do not count on
    through the window), it leaves no remediation in the node's history (no cooldown, ladder step
    or lemon count), and it pages once per node per window."""

    at: At
    record: Measurement
    unfenced: Unfenced


@dataclass(frozen=True)
class RecordDiagnosis:
    """The diagnosis; ``action``: what the step does now if the finding changes it (None: as it is)."""

    at: At
    record: Measurement
    action: str | None
    why: str


@dataclass(frozen=True)
class RecordValidation:
    """The validation; ``replace_why``: the node must be replaced (hardware evidence), and why."""

    at: At
    record: Measurement
    passed: bool
    replace_why: str | None


@dataclass(frozen=True)
class RecordLocalisation:
    """What a hung job's localisation found so far (merged); ``round``: one more round's verdict."""

    at: At
    job: str
    fields: Localisation
    round: LocaliseRound | None = None


@dataclass(frozen=True)
class RecordVertex:
    """What a Vertex AI job's step read back and decided (``outcome`` resubmit: before its effect),
    and then did (``resubmitted``: the new job; stamps ``job_requeued``)."""

    at: At
    record: VertexRecord


@dataclass(frozen=True)
class ResolveStep:
    """The step ends and the incident with it; ``unfenced``: what its unfence did (for the notice)."""

    at: At
    unfenced: Unfenced


@dataclass(frozen=True)
class HoldStep:
    """The runtime control (a pause or a silence, core/control.py) refused the step's next
    disruptive op: the incident waits, its node still fenced, and the step's remediation is
    forgotten (no cooldown holds it again); the sweep lets it go on, as a new step, once the
    control no longer holds it."""

    at: At
    hold: Hold


@dataclass(frozen=True)
class FailStep:
    at: At
    stage: str
    error: str
    unfenced: Unfenced


@dataclass(frozen=True)
class RecordUnfenceAnswer:
    """What the scheduler answered to a person's close with ``--unfence``."""

    answer: UnfenceAnswer


EngineCommand = FoldEvent | ReleaseHeld | StepUp | CloseByPerson | FailStuck | JoinBlock | EndBurst
RunCommand = LeaseStart | RecordStarted | RefuseStart
StepCommand = (
    ClaimStep
    | RejectStep
    | RecordFence
    | RecordActed
    | RecordVerified
    | RecordGang
    | RecordChoice
    | RecordCorroboration
    | RecordUnconfirmed
    | RecordDiagnosis
    | RecordValidation
    | RecordLocalisation
    | RecordVertex
    | ResolveStep
    | FailStep
    | HoldStep
)
Command = EngineCommand | RunCommand | StepCommand | RecordUnfenceAnswer

# Commands decided with the subject's node document (and the budgets, read lazily).
NODE_COMMANDS = (ReleaseHeld, StepUp, CloseByPerson, FailStuck, JoinBlock, RecordUnconfirmed, HoldStep)
# Commands that may claim or let go blast-radius slots: a store lets them take turns on the budgets.
BUDGET_COMMANDS = (*NODE_COMMANDS, EndBurst, ResolveStep, RejectStep)  # RecordUnconfirmed among them


def reads_node(cmd: Command) -> bool:
    """Whether the store reads the subject's node document for this command."""
    return isinstance(cmd, NODE_COMMANDS)


def touches_budgets(cmd: Command) -> bool:
    return isinstance(cmd, BUDGET_COMMANDS)


# -- the one writer --------------------------------------------------------------------------------


def draft(inc: Incident) -> Draft:
    """A copy of the incident this module may change (the caller's stays as it was)."""
    return cast(Draft, copy.deepcopy(dict(inc)))


def decide(inc: Incident | None, cmd: Command, given: Given) -> Outcome:
    """What ``cmd`` does to the incident: the outcome the store applies atomically, or a refusal.

    ``inc`` None: no incident exists (an event opens one; anything else is ignored).
    """
    if isinstance(cmd, FoldEvent):
        return _fold(inc, cmd, given)
    if inc is None:
        return Outcome("ignored")
    if isinstance(cmd, EngineCommand):
        return _engine(inc, cmd, given)
    if isinstance(cmd, RunCommand):
        return _run(inc, cmd, given)
    if isinstance(cmd, RecordUnfenceAnswer):
        return _unfence_answer(inc, cmd, given.now)
    return _step(inc, cmd, given)


def _fold(inc: Incident | None, cmd: FoldEvent, given: Given) -> Outcome:
    if cmd.countable is not None and cmd.countable(inc):
        return Outcome("absorbed", incident=inc, coalesced=True)
    policy = _policy(given)
    return engine.apply_event(cmd.event, given.node, inc, given.budgets, policy, given.now, cmd.trigger)


def _policy(given: Given) -> Policy:
    if given.policy is None:
        raise TypeError("this decision needs the policy")
    return given.policy


def _engine(inc: Incident, cmd: EngineCommand, given: Given) -> Outcome:
    now, budgets = given.now, given.budgets
    node = given.node if given.node is not None else engine.new_node(inc["node"], inc.get("job"))
    if isinstance(cmd, ReleaseHeld):
        return engine.release_held(inc, node, budgets, _policy(given), now, cmd.by, cmd.force)
    if isinstance(cmd, StepUp):
        return engine.step_up(inc, node, budgets, _policy(given), now)
    if isinstance(cmd, CloseByPerson):
        return engine.close_by_person(inc, node, budgets, cmd.by, now, cmd.unfence)
    if isinstance(cmd, FailStuck):
        return engine.fail_stuck(inc, node, budgets, cmd.execution, cmd.why, now)
    if isinstance(cmd, JoinBlock):
        return engine.join_block(inc, node, budgets, cmd.block, _policy(given), now, cmd.place)
    if isinstance(cmd, EndBurst):
        return engine.end_burst(inc, budgets, cmd.burst_until, now)
    raise TypeError(f"not an engine command: {cmd!r}")  # FoldEvent is decided before


# -- the workflow run ------------------------------------------------------------------------------


def _run(inc: Incident, cmd: RunCommand, given: Given) -> Outcome:
    wf, now = inc.get("workflow") or {}, given.now
    if wf.get("step") != cmd.step:
        return _refused(inc, f"the workflow run is for step {wf.get('step')}, not {cmd.step}")
    doc = draft(inc)
    run = doc["workflow"]
    assert run is not None  # the step matched
    if isinstance(cmd, LeaseStart):
        if wf.get("state") != RunState.PENDING or inc["state"] in UNCLAIMABLE_STATES:
            return _refused(inc, f"step {cmd.step} is not waiting for a start")  # started, or ended
        held = given.policy.control.hold(inc, now, enforce=True) if given.policy is not None else None
        if held is not None:  # decided before the brake: it starts once the sweep finds it free
            return _refused(inc, held.why)
        if float(wf.get("lease_until", 0)) > now:
            return _refused(inc, "another starter holds the lease")
        run["lease_until"] = now + cmd.lease_s
        run["attempts"] = int(wf.get("attempts", 0)) + 1
        return Outcome("leased", incident=doc)  # its write conditioned on the incident as read
    if isinstance(cmd, RecordStarted):
        run.update({"state": RunState.STARTED, "execution": cmd.execution, "started_at": now})
        doc["updated_at"] = now
        return Outcome("started", incident=doc)
    return _refuse_start(doc, cmd, now)


def _refuse_start(doc: Draft, cmd: RefuseStart, now: float) -> Outcome:
    if doc["state"] != State.OPEN:
        return _refused(doc, f"incident is {doc['state']}")
    n = int(doc.get("start_refusals") or 0) + 1
    doc["start_refusals"] = n
    doc["updated_at"] = now
    if not (cmd.permanent or n >= START_REFUSALS):
        return Outcome("start_refused", incident=doc)
    lifecycle.move(doc, State.FAILED, "start refused")
    doc["failure"] = {"stage": "start", "error": cmd.error, "at": now}
    reason = f"Remediation of {doc['id']} could not start: {cmd.error}"
    return Outcome("failed", incident=doc, notices=[remediation.page_notification(reason, doc)])


# -- a step's records --------------------------------------------------------------------------------


def step_refusal(inc: Incident, cmd: StepCommand) -> str | None:
    """Why this command may not change the incident now: not the incident's step, a state its op
    does not belong to, or a step another execution owns. None: it may."""
    at = cmd.at
    if inc["step"] != at.step:
        return f"superseded by step {inc['step']}"
    owner = (inc.get("workflow") or {}).get("claimed_by")
    if owner and at.execution and owner not in (at.execution, UNKNOWN_OWNER):
        return f"another execution ({owner}) owns step {at.step}"
    if isinstance(cmd, (ClaimStep, RejectStep)) and inc["state"] in UNCLAIMABLE_STATES:
        return f"incident is {inc['state']}"
    if isinstance(cmd, FailStep) and inc["state"] not in FAILABLE:
        return f"incident is {inc['state']}"
    if at.states is not None and inc["state"] not in at.states:
        return f"incident is {inc['state']}: {type(cmd).__name__} is not for an incident in that state"
    return None


def op_refusal(
    inc: Incident,
    op: Op,
    at: At,
    disruptive: bool,
    corroborate: bool = True,
    control: Control | None = None,
    now: float = 0.0,
) -> Refusal | None:
    """Why ``at`` may not run ``op`` on the incident now (None: it may): a newer step owns it, its
    state is not one the op belongs to, another execution owns the step, or the op disrupts and
    the runtime control holds the incident (a pause or a silence, before the repair began:
    ``held``, the caller holds it) or the fault is not confirmed on the node yet. The step runner
    asks it with its claim."""
    if inc["step"] != at.step:
        return Refusal(f"superseded by step {inc['step']}", superseded_by=inc["step"])
    if at.states is not None and inc["state"] not in at.states:
        return Refusal(f"incident is {inc['state']}: {op} is not for an incident in that state")
    owner = (inc.get("workflow") or {}).get("claimed_by")
    if owner and at.execution and owner not in (at.execution, UNKNOWN_OWNER):
        return Refusal(f"another execution ({owner}) owns step {at.step}")
    hold = control.hold(inc, now, enforce=True) if disruptive and control is not None else None
    if hold is not None and inc["state"] in HOLDABLE:  # once the repair began, the step finishes it
        return Refusal(hold.why, held=hold.kind)
    if disruptive and corroboration.needs_corroboration(inc, corroborate)[0]:
        return Refusal(f"the fault is not confirmed on the node: {op} waits for a confirmed corroboration")
    return None


# Kinds whose disruption rests on the node's own reading, whatever the policy says of log lines
# (core/degraded.py: a degraded node's telemetry, read back by Pitstop).
OWN_READING_KINDS = frozenset({"degraded"})


def op_warrant(inc: Incident, op: Op, corroborate: bool) -> Warrant | Refusal:
    """What a disruptive op rests on, read from the incident its claim read: the Evidence a
    confirmed check kept; a Waiver when nothing asks the node for this incident (the policy turned
    the check off, or its kind has a gate of its own); else a refusal (a confirmed check whose
    evidence was not kept is no warrant)."""
    needs, why = corroboration.needs_corroboration(inc, corroborate)
    if needs:
        return Refusal(f"the fault is not confirmed on the node: {op} waits for a confirmed corroboration")
    checked = inc.get("corroboration")
    if checked is not None and checked.get("confirmed") is not True:
        return Refusal(f"the check on the node did not confirm the fault: {op} has nothing to rest on")
    kind = corroboration.claim_kind(inc)
    if checked is None and kind in OWN_READING_KINDS:
        return Refusal(f"a {kind} node moves only on its own reading: {op} waits for it")
    if not corroboration.corroborated_before(inc):
        return Waiver(why)
    found = evidence.recorded(inc.get("corroboration"), remediation.instance_of(inc))
    if found is None:
        return Refusal(f"the confirmed check kept no evidence of the node: {op} has nothing to rest on")
    return found


def op_guard(
    op: Op,
    at: At,
    disruptive: bool,
    corroborate: bool,
    control: Control | None = None,
    now: float = 0.0,
    warrants: list[Warrant] | None = None,
) -> Guard:
    """:func:`op_refusal` as the step runner's guard, asked of the incident its claim reads; for a
    disruptive op, also its :func:`op_warrant`, appended to ``warrants`` for the handler."""

    def guard(parent: JsonObject | None) -> Refusal | None:
        if parent is None:
            return Refusal("no such incident")
        inc = cast(Incident, parent)  # as its writer wrote it
        refused = op_refusal(inc, op, at, disruptive, corroborate, control, now)
        if refused is not None or not disruptive:
            return refused
        got = op_warrant(inc, op, corroborate)
        if isinstance(got, Refusal):
            return got
        if warrants is not None:
            warrants.append(got)
        return None

    return guard


def _step(inc: Incident, cmd: StepCommand, given: Given) -> Outcome:
    why = step_refusal(inc, cmd)
    if why is not None:
        return _refused(inc, why)
    doc, now = draft(inc), given.now
    try:
        if isinstance(cmd, RecordUnconfirmed):
            out = _unconfirmed(doc, cmd, given)
        elif isinstance(cmd, HoldStep):
            out = _hold_step(doc, cmd, given)
        else:
            out = _step_change(doc, cmd, now)
    except lifecycle.IllegalTransitionError as exc:  # a state the table does not lead to from here
        return _refused(inc, str(exc))
    doc["updated_at"] = now
    if out.release_slots:  # its blast-radius slots let go: they count on until the window slides
        out.budgets.update(engine.own_slots(doc, given.budgets))
    return out


def _step_change(doc: Draft, cmd: StepCommand, now: float) -> Outcome:
    match cmd:
        case ClaimStep():
            return _claim(doc, cmd)
        case RejectStep():
            return _reject(doc, cmd, now)
        case RecordFence():
            return _fence(doc, cmd, now)
        case RecordActed():
            lifecycle.move(doc, State.ACTING, f"act of step {cmd.at.step}")
            _stamp(doc, "acted", now)
            return Outcome("acting", incident=doc)
        case RecordVerified():
            lifecycle.move(doc, State.VERIFYING, f"verify of step {cmd.at.step}")
            _stamp(doc, "healthy" if cmd.healthy else None, now)
            return Outcome("verifying", incident=doc)
        case RecordGang():
            _stamp(doc, cmd.milestone, now)
            if cmd.resume is not None:
                doc["resume"] = cast(Resume, cmd.resume)  # the shapes a gang's restart keeps
            return Outcome("changed", incident=doc)
        case RecordChoice():
            return _choice(doc, cmd)
        case RecordCorroboration():
            doc["corroboration"] = cmd.record
            _stamp(doc, "corroborated" if cmd.record.get("confirmed") is True else None, now)
            return Outcome("changed", incident=doc)
        case RecordDiagnosis():
            return _diagnosis(doc, cmd, now)
        case RecordValidation():
            return _validation(doc, cmd, now)
        case RecordLocalisation():
            return _localisation(doc, cmd)
        case RecordVertex():
            doc["vertex"] = cmd.record
            _stamp(doc, "job_requeued" if cmd.record.get("outcome") == "resubmitted" else None, now)
            return Outcome("changed", incident=doc)
        case ResolveStep():
            return _resolve(doc, cmd, now)
        case FailStep():
            return _fail(doc, cmd, now)
        case RecordUnconfirmed() | HoldStep():
            raise TypeError("decided with the node's document (_unconfirmed, _hold_step)")


def _stamp(doc: Draft, milestone: Milestone | None, now: float) -> None:
    if milestone and not doc["timeline"].get(milestone):
        doc["timeline"][milestone] = now


def _claim(doc: Draft, cmd: ClaimStep) -> Outcome:
    wf = doc.get("workflow") or {}
    wf["claimed_by"] = cmd.at.execution or wf.get("claimed_by") or UNKNOWN_OWNER
    wf["state"] = RunState.STARTED
    doc["workflow"] = wf
    return Outcome("claimed", incident=doc)


def _reject(doc: Draft, cmd: RejectStep, now: float) -> Outcome:
    lifecycle.move(doc, State.RESOLVED, "rejected")
    doc["rejected"] = {"why": cmd.why, "at": now}
    doc["timeline"]["resolved"] = now
    text = f"Incident {doc['id']} rejected, nothing done: {cmd.why}"
    return Outcome("rejected", incident=doc, notices=[remediation.notification(doc, "warning", text)],
                   release_slots=True)  # fmt: skip


def _fence(doc: Draft, cmd: RecordFence, now: float) -> Outcome:
    lifecycle.move(doc, State.FENCED, f"fence of step {cmd.at.step}")
    _stamp(doc, "fenced", now)
    doc["jobs"], doc["fence"] = list(cmd.jobs), cmd.fence
    return Outcome("fenced", incident=doc)


def _choice(doc: Draft, cmd: RecordChoice) -> Outcome:
    """The choice recorded once per step (a retry of the step records the same one again); an
    NVL72 gang with no spare in its domain pages a person the first time."""
    paged_before = bool((doc.get("choice") or {}).get("page"))
    doc["choice"] = cmd.choice
    out = Outcome("changed", incident=doc)
    if cmd.choice.get("page") and not paged_before:
        text = f"{engine.subject_name(doc)}: the gang waits for its node: {cmd.choice.get('why')}"
        out.notices = [remediation.page_notification(text, doc)]
    return out


def _diagnosis(doc: Draft, cmd: RecordDiagnosis, now: float) -> Outcome:
    doc["diagnosis"] = cmd.record
    doc["measured"] = remediation.measured(doc, cmd.record, cmd.at.step)
    if cmd.action is not None and cmd.action != doc["action"]:
        doc["escalations"].append({"from": doc["action"], "to": cmd.action, "at": now, "why": [cmd.why]})
        doc["action"] = cmd.action
    _stamp(doc, "diagnosed", now)
    return Outcome("changed", incident=doc)


def _validation(doc: Draft, cmd: RecordValidation, now: float) -> Outcome:
    doc["validation"] = cmd.record
    doc["measured"] = remediation.measured(doc, cmd.record, cmd.at.step)
    _stamp(doc, "validated" if cmd.passed else None, now)
    if cmd.replace_why is not None and RANK[Action.REPLACE_NODE] > RANK[doc["action"]]:
        doc["escalate_to"] = Action.REPLACE_NODE
        doc["escalate_why"] = [cmd.replace_why]
    return Outcome("changed", incident=doc)


def _localisation(doc: Draft, cmd: RecordLocalisation) -> Outcome:
    loc = doc.get("localisation") or Localisation(job=cmd.job, nodes=[], rounds=[])
    loc.update(cmd.fields)
    if cmd.round is not None:
        loc["rounds"] = [*loc.get("rounds", []), cmd.round][-4:]
    doc["localisation"] = loc
    return Outcome("changed", incident=doc)


def _resolve(doc: Draft, cmd: ResolveStep, now: float) -> Outcome:
    lifecycle.move(doc, State.RESOLVED, f"close of step {cmd.at.step}")
    doc["timeline"].setdefault("notified", now)
    doc["timeline"]["resolved"] = now
    doc["updated_at"] = now
    severity = "info" if doc["action"] in RECORD_ONLY_ACTIONS else "warning"
    text = remediation.summary(doc, cmd.unfenced)
    planned = degraded.close_note(doc)  # a degraded node: moved at its checkpoint, or why not
    if planned is not None:
        text, severity = f"{planned[0]} {remediation.node_note(doc, cmd.unfenced)[0]}", planned[1]
    jobs = [str(j["id"]) for j in doc.get("jobs") or [] if isinstance(j, Mapping)]
    job_note = vertex.close_note(doc)  # a Vertex AI job: read back, resubmitted or paged, both jobs named
    if job_note is not None:
        text, severity, jobs, todo = job_note
        notice = remediation.notification(doc, severity, text, jobs=jobs, **({"todo": todo} if todo else {}))
        return Outcome("resolved", incident=doc, notices=[notice], release_slots=True)
    notice = remediation.notification(doc, severity, text, jobs=jobs)
    return Outcome("resolved", incident=doc, notices=[notice], release_slots=True)


def _fail(doc: Draft, cmd: FailStep, now: float) -> Outcome:
    lifecycle.move(doc, State.FAILED, f"fail of step {cmd.at.step}")
    doc["failure"] = {"stage": cmd.stage, "error": cmd.error, "at": now}
    doc["updated_at"] = now
    where, todo = remediation.node_note(doc, cmd.unfenced)
    page = f"{where} Investigate ({cmd.error}); when the node is healthy, {todo}close the incident."
    text = f"Remediation of {notifications.subject(doc)} FAILED at {cmd.stage}"
    return Outcome(
        "failed", incident=doc, notices=[remediation.notification(doc, "critical", text, todo=page)]
    )


def _unconfirmed(doc: Draft, cmd: RecordUnconfirmed, given: Given) -> Outcome:
    now, node = given.now, engine.copy_node(given.node, doc)
    lifecycle.move(doc, State.RESOLVED, f"not confirmed on the node (step {cmd.at.step})")
    why = str(cmd.record.get("why") or "not confirmed on the node")
    doc["corroboration"] = cmd.record
    doc["rejected"] = {"why": why, "at": now}
    doc["timeline"]["resolved"] = now
    doc["held"], doc["escalate_to"] = None, None
    doc["budget_released_at"] = now
    engine.forget_remediation(node, doc["id"])
    budgets = {d: given.budgets.get(d) for d in doc["budget_scopes"]}
    out = Outcome("rejected", incident=doc, node=node, budgets=engine.drop_slots(budgets, doc["id"]))
    if float(node.get("unconfirmed_page_until") or 0) <= now:
        node["unconfirmed_page_until"] = now + _policy(given).window("unconfirmed_page_s")
        where = remediation.node_note(doc, cmd.unfenced)[0]
        out.page = f"incident {doc['id']}: {engine.subject_name(doc)}: {why}. Nothing was done. {where}"
    return out


def _hold_step(doc: Draft, cmd: HoldStep, given: Given) -> Outcome:
    now, node = given.now, engine.copy_node(given.node, doc)
    lifecycle.move(doc, State.HELD, f"{cmd.hold.kind} before a disruptive op of step {cmd.at.step}")
    doc["held"] = {"reason": cmd.hold.why, "since": now, "control": cmd.hold.kind}
    engine.forget_remediation(node, doc["id"])  # nothing was repaired: no cooldown holds its next step
    after = "`pitstop resume`" if cmd.hold.kind == "pause" else "the silence ends"
    page = (
        f"incident {doc['id']}: {engine.subject_name(doc)}: step {cmd.at.step} stopped before its next "
        f"disruptive op, {cmd.hold.why}. The node stays fenced; the incident goes on once {after}, "
        f"or close it: pitstop incidents --close {doc['id']} --unfence --by NAME"
    )
    return Outcome("held", incident=doc, node=node, page=page)


def _unfence_answer(inc: Incident, cmd: RecordUnfenceAnswer, now: float) -> Outcome:
    closure = inc.get("closure")
    if closure is None:
        return _refused(inc, "no person closed this incident")
    doc = draft(inc)
    doc["closure"] = {**closure, "unfence": cmd.answer}
    doc["updated_at"] = now
    return Outcome("changed", incident=doc)


def _refused(inc: Incident, why: str) -> Outcome:
    return Outcome("refused", incident=inc, refused=why)
