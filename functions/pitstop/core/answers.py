"""What the services answer and hand on: each actuate op's answer, notifications, workflow arguments.

Each actuate op's answer is a contract with workflows/remediate.yaml, which reads some of its keys
(named per type below: a key the workflow reads is required, or absent only where the workflow
reads it with ``map.get``). The effects' answers are also their step records' ``result``s, read
back by later ops (services/actuate/context.Step.recorded), so a key added to one is kept in the
record as well. Shapes shared with an incident (its ``fence``, ``resume``) come from core/domain.py.

A value that really is free-form JSON at an edge is a :data:`JsonObject`: an HTTP body or a Pub/Sub
message before its shape is checked, or an answer as it leaves as JSON (its readers are the
workflow's expressions and people, not Python).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pitstop.core.domain import (
    AlertRef,
    CheckSpec,
    Closure,
    Fenced,
    GangCheckSpec,
    Held,
    JobRef,
    JobRunDoc,
    LocaliseRound,
    Maintenance,
    Measurement,
    NodeRef,
    Notice,
    Unfenced,
    VertexRecord,
    VmBefore,
)
from pitstop.core.ops import Plan
from pitstop.core.states import State

# -- the workflow's calls: claim, and the probes it polls ---------------------------------------------


class ClaimAnswer(TypedDict):
    """claim: ``ours`` (else the workflow returns ``stale`` with ``why``), ``plan`` picks its branch."""

    ours: bool
    why: str
    plan: Plan
    action: str


class Done(TypedDict):
    """Every probe the workflow polls (``wait`` in remediate.yaml): ``done`` ends the poll."""

    done: bool


class JobsDone(Done):
    running: list[str]  # the fenced jobs still on the node


class Verified(Done):
    vm: str | None  # the VM's status
    scheduler_ok: bool


class Resumed(Done):
    running: bool  # every requeued job runs a new run


# -- checks on the node (corroborate, diagnose, validate) -----------------------------------------------


class CheckStarted(TypedDict):
    """A check op's answer: ``run`` (the workflow polls and judges only a check that runs) and why.

    A run started has its ``check`` (the spec saved before the scheduler was asked), the ``peer``
    and ``note`` the scheduler gave. ``requeued_to_free``: the jobs requeued to free the node first.
    """

    run: bool
    why: str | None
    check: NotRequired[CheckSpec]
    peer: NotRequired[str | None]
    note: NotRequired[str | None]
    requeued_to_free: NotRequired[list[str]]


class Corroborating(CheckStarted):
    """corroborate: a node check, Compute's own answer (``system``), nothing to ask (``unavailable``),
    or a degraded node held against its peers (``peers``, the ``jobs`` read)."""

    system: NotRequired[Measurement]
    unavailable: NotRequired[bool]
    peers: NotRequired[Measurement]
    jobs: NotRequired[list[str]]


class Validating(CheckStarted):
    machine_type: NotRequired[str]


class CorroborationJudged(TypedDict):
    """judge_corroboration: ``stand_down`` (read with ``map.get``): no move, the workflow returns the node."""

    confirmed: bool | None
    why: str | None
    stand_down: NotRequired[bool]
    verdict: NotRequired[str | None]


class DiagnosisJudged(TypedDict):
    action: str  # what the step does now
    confirmed: bool | None
    why: str | None


class ValidationJudged(TypedDict):
    outcome: Literal["skipped", "pass", "step_up"]
    why: str | None
    verdict: NotRequired[str]


# -- the checkpoint, the gang's moves --------------------------------------------------------------------


class Checkpointed(TypedDict):
    """checkpoint: ``wait_s`` bounds the workflow's ``jobs_done`` poll."""

    signalled: list[str]
    signal: str | None
    wait_s: float


class JobWhy(TypedDict):
    job: str
    why: str


class EarlyResume(TypedDict):
    """reschedule_early's answer, kept as the incident's ``resume``: who moved before the repair."""

    mode: str  # core/checks.EARLY | AFTER_REPAIR
    requeued: list[JobWhy]
    waiting: list[JobWhy]
    skipped: NotRequired[list[JobWhy]]


class LocalisedResume(TypedDict):
    """A hung job's restart, kept as the incident's ``resume``: past its culprits, or in place."""

    mode: Literal["spares", "in_place"]
    requeued: list[str]
    why: str


class Rescheduled(TypedDict):
    requeued: list[str]
    skipped: list[JobWhy]


class Freed(TypedDict, total=False):
    """The jobs requeued so a check has the node's GPUs (nothing: no key)."""

    requeued_to_free: list[str]


# -- the repair ------------------------------------------------------------------------------------------


class ActPlan(TypedDict):
    """What act decided before its call, saved first so a retry makes the same call
    (core/remediation.choose_call's fields, and the VM as it was for verify)."""

    method: str
    before: VmBefore
    behavior: NotRequired[str]
    description: NotRequired[str]
    mig: NotRequired[str]
    why_not_report: NotRequired[str]
    verify_wait_s: NotRequired[float]  # wait_for_platform: read by the workflow with ``map.get``


class Acted(ActPlan):
    """act: ``operation`` None makes the workflow skip the operation poll."""

    operation: str | None


# -- how a step ends --------------------------------------------------------------------------------------


class Escalated(TypedDict):
    """escalate: any ``outcome`` but ``continue`` ends the execution (the next step took over)."""

    outcome: str
    handed_over: bool


class Closed(TypedDict):
    """close: its ``outcome`` is the execution's; ``durations_s`` once resolved."""

    outcome: str
    durations_s: NotRequired[dict[str, float | None]]


class FailAnswer(TypedDict):
    """fail: ``outcome`` is the execution's. Not recorded (``recorded`` False): what the incident is."""

    outcome: str
    stage: str
    error: str
    state: NotRequired[str]
    why: NotRequired[str]
    recorded: NotRequired[bool]


# -- a hung job's localisation ---------------------------------------------------------------------------


class Seen(TypedDict):
    """What the job was when localise first looked (saved first: a retry sees what the first saw)."""

    jobs: list[str]
    runs: dict[str, JobRunDoc]
    state: str  # core/scheduling.JobState


class GangCheckStarted(TypedDict):
    run: bool
    check: GangCheckSpec
    nodes: list[str]
    stopped: bool  # the scheduler stopped the gang to check it: the conclusion resumes it
    why: NotRequired[str]


class Localising(Seen):
    """localise: ``run`` (the workflow polls ``sweep`` only then). Stopped: ``runs`` is the run it
    resumes as (``seen_runs``: what it was)."""

    run: bool
    why: NotRequired[str]
    check: NotRequired[GangCheckSpec]
    nodes: NotRequired[list[str]]
    stopped: NotRequired[bool]
    seen_runs: NotRequired[dict[str, JobRunDoc]]
    refused: NotRequired[bool]  # not opted in, or no established heartbeat: nothing checked (a page)


class Linking(TypedDict):
    """links: the sweep judged; ``run``: the link test started (the workflow polls ``links_done``)."""

    run: bool
    why: NotRequired[str | None]
    sweep: NotRequired[LocaliseRound]
    skipped: NotRequired[LocaliseRound]
    check: NotRequired[GangCheckSpec]
    nodes: NotRequired[list[str]]
    stopped: NotRequired[bool]


class Concluded(TypedDict):
    """conclude: ``nothing_found`` or ``resumed`` present ends the execution (no node to repair)."""

    outcome: Literal["culprits", "nothing_found", "not_running", "unconfirmed"]
    culprits: NotRequired[list[str]]
    incidents: NotRequired[dict[str, str]]  # culprit node -> its own node incident
    resumed: NotRequired[bool]
    requeued: NotRequired[bool]
    why: NotRequired[str]
    state: NotRequired[str]


class Resubmission(TypedDict):
    """resubmit: a Vertex AI job resubmitted from its checkpoint, or left (``why``; a page if a
    person must decide). The workflow goes on to close either way."""

    outcome: Literal["resubmitted", "left"]
    job: str | None
    why: str
    resubmitted_as: NotRequired[str]


# -- what a handler answers, and what actuate replies ------------------------------------------------------

OpAnswer = (
    ClaimAnswer
    | Done
    | JobsDone
    | Verified
    | Resumed
    | CheckStarted
    | Corroborating
    | Validating
    | CorroborationJudged
    | DiagnosisJudged
    | ValidationJudged
    | Checkpointed
    | EarlyResume
    | Rescheduled
    | Fenced
    | Unfenced
    | Acted
    | Escalated
    | Closed
    | FailAnswer
    | Localising
    | Linking
    | Concluded
    | Resubmission
)


class Superseded(TypedDict):
    """An effect asked for a step a newer one replaced: the execution winds down."""

    outcome: Literal["superseded"]
    current_step: int
    operation: None


class Refused(TypedDict):
    """actuate's refusal: ``retryable`` with 429/503 (the workflow asks again), else final."""

    error: str
    retryable: NotRequired[bool]
    in_progress: NotRequired[bool]  # another attempt holds the op's record


Reply = OpAnswer | Superseded | Refused


class Decided(TypedDict, total=False):
    """What an op decided before its first effect, saved in its step record (a retry reuses it)."""

    check: CheckSpec  # corroborate, diagnose, validate
    recheck: CheckSpec  # revalidate
    machine_type: str  # validate
    gpus: int | None
    plan: ActPlan  # act
    vertex: VertexRecord  # resubmit: the job's verdict, taken before its cancel or resubmission


class GangDecided(TypedDict, total=False):
    check: GangCheckSpec  # localise, links
    seen: Seen


# -- notifications -------------------------------------------------------------------------------------------


class PageIncident(TypedDict):
    """The incident's fields a page carries (core/remediation.page_notification); None: it has none."""

    id: str | None
    node: NodeRef | None
    job: JobRef | None  # a hang's subject
    cluster: str | None
    action: str | None
    state: str | None
    held: Held | None


class Page(TypedDict):
    """A page for a decision (an incident held for a budget or a cooldown, a start that failed)."""

    id: str
    kind: Literal["page"]
    severity: Literal["critical"]
    summary: str
    incident: PageIncident


# What the outbox records and publishes to the notifications topic.
Notification = Notice | Page


class Delivery(TypedDict, total=False):
    """What one sink did with a notification (notify's record of it, replayed on redelivery)."""

    status: int  # the channel's HTTP status
    event_action: str  # PagerDuty: trigger | resolve
    dedup_key: str
    skipped: str  # nothing to send on this channel, and why
    rejected: int  # the channel refused the body for good (PagerDuty 400)
    metrics_series: int  # metrics: the series written
    replayed: bool  # done by an earlier delivery


# -- a workflow execution's start ----------------------------------------------------------------------------


class WorkflowArgument(TypedDict):
    """What one execution of remediate.yaml is given about its incident (it reads ``incident_id``
    and ``step``; the rest is for the person who opens the execution)."""

    incident_id: str
    step: int
    action: str
    kind: str
    xid: int | None
    node: NodeRef | None  # None for a job's episode (kind hang): ``job`` names it
    job: JobRef | None
    cluster: str | None
    scheduler: str
    reason: str
    maintenance: Maintenance | None
    alerts: list[AlertRef] | None


# -- the coalescer's cached view of an incident --------------------------------------------------------------


class SlimRun(TypedDict):
    """Of an incident's ``workflow``: enough to see that a start was lost."""

    step: int | None
    state: str | None
    lease_until: float | None


class SlimTimeline(TypedDict):
    resolved: float | None


class SlimIncident(TypedDict):
    """What ingest's cache keeps of a node's latest incident (services/count_shards.slim): what
    engine.absorbs and the coalescing rule read, and no more. Each field is read from the stored
    incident with ``get`` (None where it has none)."""

    id: str | None
    state: State | None
    action: str  # every incident has one (core/engine.new_incident)
    mode: str | None
    burst_until: float | None
    closure: Closure | None
    node_key: str | None
    trust: str | None
    evidence_room: int  # buffered evidence past it would be dropped (core/engine.evidence_room)
    events: int  # lines committed (services/coalesce.DIRECT_LINES)
    timeline: SlimTimeline
    workflow: SlimRun | None
