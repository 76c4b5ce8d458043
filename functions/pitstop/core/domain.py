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
    fence: NotRequired[FenceDoc]
    resume: NotRequired[dict[str, Any]]
    diagnosis: NotRequired[Measurement]
    validation: NotRequired[Measurement]
    measured: NotRequired[list[Measurement]]
    corroboration: NotRequired[Measurement]
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


# -- what remediation reads and keeps beside an incident (core/checks, corroboration, remediation) --


class Accelerator(TypedDict, total=False):
    """One ``guestAccelerators`` entry: how many GPUs of a type the VM has (core/checks.gpus_of)."""

    accelerator_type: str
    accelerator_count: int


class HostTopology(TypedDict, total=False):
    """Where the VM's host sits in its reservation (``cluster/block``: core/remediation.block_of)."""

    cluster: str
    block: str
    sub_block: str
    host: str


class UpcomingMaintenance(TypedDict, total=False):
    """A pending host maintenance; ``can_reschedule``: Pitstop may start it now (performMaintenance)."""

    can_reschedule: bool
    window_start_time: str
    window_end_time: str
    latest_window_start_time: str
    maintenance_status: str
    type_: str


class ResourceStatus(TypedDict, total=False):
    """The VM's physical host, its place, and any maintenance pending on it."""

    physical_host: str
    physical_host_topology: HostTopology
    upcoming_maintenance: UpcomingMaintenance


class VmScheduling(TypedDict, total=False):
    """Whether the VM is Spot or preemptible (a preemption event is then expected)."""

    provisioning_model: str
    preemptible: bool


class Vm(TypedDict, total=False):
    """A Compute Engine instance as instances.get answers it (adapters/compute.py: the API's
    fields in snake_case; only those Pitstop reads)."""

    id: str
    name: str
    status: str
    machine_type: str
    creation_timestamp: str
    last_start_timestamp: str
    last_stop_timestamp: str
    guest_accelerators: list[Accelerator]
    resource_status: ResourceStatus
    scheduling: VmScheduling


class VmBefore(TypedDict):
    """What the VM was before a repair call, for verify (core/remediation.verified)."""

    id: str | None
    host: str | None
    status: str | None


class CheckSpec(TypedDict):
    """A check a scheduler runs on a fenced node (corroborate, diagnose, validate); saved with
    its step before the scheduler is asked, so a retry starts the same run."""

    kind: str
    name: str  # core/checks.check_name: a DNS label, fixed per step
    incident: str
    gpus: int
    expected_gpus: NotRequired[int | None]
    dcgm_level: NotRequired[int]
    message_bytes: NotRequired[int]
    peer: NotRequired[bool]
    xids: NotRequired[list[int]]
    sxids: NotRequired[list[int]]
    boot_after: NotRequired[float | None]  # the VM's last start (epoch s): a GKE condition older says nothing


class CheckRun(TypedDict, total=False):
    """A check run's state as recorded (core/scheduling.CheckResult as a document)."""

    done: bool
    outputs: dict[str, str]
    peer: str | None
    error: str | None
    note: str | None


class CapacityDoc(TypedDict, total=False):
    """What the scheduler said about the gang's healthy capacity (core/scheduling.Capacity)."""

    enough: bool
    why: str
    need: int | None
    free: int | None


class JobRestarts(TypedDict):
    """A job's disruption budget: the runs Pitstop requeued within the window (run key -> at)."""

    runs: dict[str, float]


class CallFields(TypedDict, total=False):
    """The Compute call a repair makes, and its arguments (core/remediation.choose_call)."""

    method: str
    behavior: str
    description: str
    mig: str
    why_not_report: str


class Notice(TypedDict):
    """An incident notification (core/remediation.notification): what notify renders and sends."""

    id: str
    kind: str
    severity: str
    summary: str
    incident: dict[str, Any]  # the incident's fields a reader needs (remediation.NOTIFIED_FIELDS)
    durations_s: dict[str, float | None]
    resume_s: float | None
    repair_s: float | None
    jobs: NotRequired[list[str]]
    todo: NotRequired[str]


class EvidenceGpu(TypedDict, total=False):
    """The GPU the incident's lines named most, for a check to look at (core/checks.evidence_gpu)."""

    gpu: GpuRef


class AlertDetail(TypedDict):
    """A Monitoring notification as its event keeps it (``detail.alert``; core/alerts.py)."""

    incident_id: str
    state: str  # open | closed
    signal: str  # the policy's pitstop_signal label: hang | degraded
    symptom: str | None
    policy: str
    condition: str | None
    metric_type: str | None
    metric_labels: dict[str, str]
    resource_type: str | None
    resource_labels: dict[str, str]
    observed_value: str | None
    threshold_value: str | None
    started_at: float | None
    ended_at: float | None
    summary: str | None


class AlertEventDetail(TypedDict):
    alert: AlertDetail


class GpuAt(TypedDict):
    index: int | None  # nvidia-smi's index of the GPU the log named
    pci: str | None


class DiagnosisDetail(TypedDict, total=False):
    """What a diagnostic read on the node (core/diagnose.diagnose), kept in its record."""

    gpus_visible: int | None
    gpus_expected: int | None
    evidence_gpu: GpuAt
    dcgm: str | None  # DCGM's verdict word
    findings: list[str]
    config_findings: list[str]
    unreadable: list[str]


class Measurement(DiagnosisDetail, total=False):
    """What a check on the node found, kept on the incident (``corroboration``, ``diagnosis``,
    ``validation``, and each in ``measured``, newest last): one shape for the three kinds."""

    kind: str  # corroborate | diagnose | validate
    at: float
    step: int
    confirmed: bool | None
    hardware_fault: bool
    why: str
    checked: list[str]  # corroborate: the channels read
    action: str  # diagnose: what the step does now
    next: str  # validate: RETURN_TO_SERVICE, REPLACE_NODE or PAGE
    peer: str | None
    note: str
    passed: bool
    verdict: str
    busbw_gbps: float | None
    expected_gbps: float | None
    threshold_gbps: float | None
    message_bytes: int | None
    dcgm_failed: list[str]


class FenceDoc(TypedDict, total=False):
    """How the scheduler fenced the node (core/scheduling.FenceAnswer.doc), kept on the incident."""

    previous_state: str
    previous_reason: str
    already_drained_by_other: bool
    reason: str  # the reason Pitstop's own fence carries


class JobRunDoc(TypedDict, total=False):
    restarts: int | None
    start_time: str | None


class Fenced(TypedDict, total=False):
    """The fence op's recorded result: the jobs on the node and the runs the fault hit, handed to
    the next step when this one escalates before its unfence."""

    fenced: str
    jobs: list[str]
    runs: dict[str, JobRunDoc]
    fence: FenceDoc


class Unfenced(TypedDict, total=False):
    """The unfence op's recorded result; ``left_drained``: a fence that is not Pitstop's, left."""

    unfenced: str
    resumed: bool
    left_drained: str
