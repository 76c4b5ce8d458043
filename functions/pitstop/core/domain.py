"""The shapes of Pitstop's data: one TypedDict per record it keeps or passes on.

They are dicts at run time (Firestore stores them, JSON carries them, the schemas in schemas/
validate them), so a document read back is one of these without a copy; what they add is that
``mypy --strict`` checks every key the code reads or writes. A document from outside (Firestore,
a Pub/Sub body) becomes one of these at the adapter's edge, after its shape was checked.

Times are epoch seconds unless a name says otherwise (``observed_at`` is RFC 3339, as logged).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# -- a fault event: one normalised signal (schemas/fault_event.schema.json) ---------------------


class NodeRef(TypedDict):
    """The VM a signal names: validated Compute Engine names only (safe in paths and reasons)."""

    project: str
    zone: str | None  # None only with ``region``: a regional GKE entry before its zone is resolved
    instance: str
    instance_id: str | None
    cluster: NotRequired[str | None]
    region: NotRequired[str]


class MigRef(TypedDict):
    gi: int
    ci: int | None


class GpuRef(TypedDict):
    pci: str | None
    mig: NotRequired[MigRef | None]


class Source(TypedDict):
    """Where the entry came from and how far it may be believed (core/trust.py)."""

    log_name: str | None
    insert_id: str | None
    message_id: str | None
    trust: str  # trust.VERIFIED | trust.UNVERIFIED
    trust_reason: str | None


class JobRef(TypedDict):
    """The subject of a job-level signal (a hung job): one job of a configured cluster.

    ``job`` is the scheduler's own id (core/names.valid_job_id): Slurm's job id, or the GKE
    adapter's ``kind/namespace/name``.
    """

    project: str
    cluster: str
    job: str


class FaultEvent(TypedDict):
    """One classified log entry or alert notification. ``_observed_ts`` (epoch s) is added by
    ingest before the engine. A job-level signal (``hang``) names a ``job`` and no ``node``."""

    kind: str
    action: str
    xid: int | None
    node: NodeRef | None
    gpu: GpuRef | None
    observed_at: str | None
    source: Source
    reason: str
    detail: dict[str, Any]  # kind-specific, validated by the schema's ``detail`` properties
    job: NotRequired[JobRef]
    _observed_ts: NotRequired[float]


class LocatedEvent(FaultEvent):
    """An event that names a node (what the engine folds into incidents)."""


# -- an incident: one node fault episode ----------------------------------------------------------


class Timeline(TypedDict, total=False):
    """Milestones, each stamped once (core/engine.TIMELINE_KEYS)."""

    detected: float
    classified: float
    fenced: float
    job_requeued: float
    job_running: float
    localised: float  # a hung job's culprits handed to their own node incidents
    corroborated: float
    diagnosed: float
    acted: float
    healthy: float
    validated: float
    notified: float
    resolved: float
    closed: float


class WorkflowRun(TypedDict, total=False):
    """How far the start of the incident's current step got (``state``: core.states.RunState)."""

    step: int
    state: str
    lease_until: float
    execution: str | None
    attempts: int
    started_at: float
    claimed_by: str
    would_start: bool


class Held(TypedDict, total=False):
    """Why an incident waits: a budget (``scope``), a cooldown, or a disabled action."""

    reason: str
    scope: str | None
    since: float
    until: float
    by: str


Escalation = TypedDict("Escalation", {"from": str, "to": str, "at": float, "why": list[str]})


class GpuCounts(TypedDict, total=False):
    pci: str
    first_seen: float
    last_seen: float
    xids: dict[str, int]
    secondary: dict[str, Any]
    recovery_to: int | None


class Evidence(TypedDict):
    """What an incident keeps of one event (for people and the host report)."""

    kind: str
    xid: int | None
    action: str
    gpu: str | None
    observed_at: str | None
    insert_id: str | None
    reason: str
    message: str


class Failure(TypedDict):
    stage: str
    error: str
    at: float


class Closure(TypedDict):
    """A person ended the incident (``pitstop incidents --close``)."""

    by: str
    at: float
    from_state: str
    unfence: bool


class Rejected(TypedDict):
    why: str
    at: float


class Maintenance(TypedDict):
    window_start: str | None
    window_end: str | None
    maintenance_status: str | None


class AlertRef(TypedDict):
    """One Cloud Monitoring alert incident an episode absorbed (core/alerts.py), and its state."""

    id: str
    state: str  # open | closed
    policy: str
    signal: str
    symptom: str | None  # degraded: throttle | ecc | row_remap | nvlink | pcie | ... (what to diagnose)
    opened_at: float | None
    closed_at: float | None


class AlertEnd(TypedDict):
    """The episode's alerts all closed before anything was done: it ended, and the same alert
    opening again before ``flap_until`` reopens it (a flapping alert is one incident)."""

    at: float
    flap_until: float


class Incident(TypedDict):
    """One fault episode of a node, or of a job for a job-level signal (``job`` set, ``node``
    None, ``node_key`` the job's key: core/engine.subject_key). core/engine.new_incident makes
    it; actuate and the sweep move it."""

    id: str
    node_key: str
    node: NodeRef | None
    cluster: str | None
    scheduler: str
    state: str  # core.states.State
    mode: str
    kind: str
    xid: int | None
    proposed_action: str
    action: str
    reason: str
    escalations: list[Escalation]
    counts: dict[str, int]
    gpus: dict[str, GpuCounts]
    evidence: list[Evidence]
    first_seen: float
    last_seen: float
    burst_until: float
    timeline: Timeline
    step: int
    workflow: WorkflowRun | None
    held: Held | None
    budget_scopes: list[str]
    escalate_to: str | None
    trust: str
    created_at: float
    updated_at: float
    maintenance: NotRequired[Maintenance]
    recent_keys: NotRequired[list[str]]
    escalate_why: NotRequired[list[str]]
    holds: NotRequired[list[Held]]
    closure: NotRequired[Closure]
    failure: NotRequired[Failure]
    rejected: NotRequired[Rejected]
    budget_released_at: NotRequired[float]
    job: NotRequired[JobRef]  # a job-level episode's subject (kind ``hang``)
    alerts: NotRequired[list[AlertRef]]  # the Monitoring alerts it absorbed (kinds hang, degraded)
    alert_ended: NotRequired[AlertEnd]
    start_refusals: NotRequired[int]  # Workflows refused this step's start (services/sweep.py)
    # what the remediation learned (actuate): the scheduler's jobs and fence, the checks' records
    jobs: NotRequired[list[dict[str, Any]]]
    fence: NotRequired[dict[str, Any]]
    resume: NotRequired[dict[str, Any]]
    diagnosis: NotRequired[dict[str, Any]]
    validation: NotRequired[dict[str, Any]]
    measured: NotRequired[list[dict[str, Any]]]
    corroboration: NotRequired[dict[str, Any]]
    localise: NotRequired[dict[str, Any]]  # a hung job: whether it is localised, and why (engine)
    localisation: NotRequired[dict[str, Any]]  # ... its nodes, each round's verdict, the outcome


# -- the node, its budgets ----------------------------------------------------------------------


class Remediation(TypedDict):
    at: float
    action: str
    incident: str
    mode: str
    kind: NotRequired[str]  # the incident's kind (a repeat of one kind may escalate: xid-policy ``repeat``)


class Strike(TypedDict):
    """A recorded fault episode that took no action but counts toward the lemon rule."""

    at: float
    incident: str
    kind: str


class NodeDoc(TypedDict):
    """One per node, keyed by project/zone/instance (survives a MIG recreate); one per job for
    job-level episodes (``job`` set, ``node`` None, keyed by core/engine.job_key)."""

    node: NodeRef | None
    job: NotRequired[JobRef]
    latest_incident: str | None
    remediations: list[Remediation]
    last_action_at: dict[str, float]
    strikes: NotRequired[list[Strike]]
    block: NotRequired[str]  # the reservation block, from Compute's physical host topology


class Slot(TypedDict):
    at: float
    active: bool


class Budget(TypedDict):
    """One blast-radius scope: the incidents holding a slot in it, and when it last paged."""

    scope: str
    slots: dict[str, Slot]
    paged_until: float


# -- one recorded effect (core/steps.py) ---------------------------------------------------------


class StepRecord(TypedDict, total=False):
    """An idempotency record: claimed in progress before its effect, done with its result after."""

    state: str  # core.steps: in_progress | done | released
    op: str
    owner: str
    token: str
    payload_hash: str
    attempt: int
    claimed_at: float
    expires_at: float
    saved: dict[str, Any]  # what an attempt decided before its first effect (reused by a retry)
    result: dict[str, Any]
    at: float
    error: str
    released_at: float
