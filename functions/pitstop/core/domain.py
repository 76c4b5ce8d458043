"""The shapes of Pitstop's data: one TypedDict per record it keeps or passes on.

They are dicts at run time (Firestore stores them, JSON carries them, the schemas in schemas/
validate them), so a document read back is one of these without a copy; what they add is that
``mypy --strict`` checks every key the code reads or writes. A document from outside (Firestore,
a Pub/Sub body) becomes one of these at the adapter's edge, after its shape was checked.

Times are epoch seconds unless a name says otherwise (``observed_at`` is RFC 3339, as logged).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, final

from typing_extensions import ReadOnly

from pitstop.core.states import State

# Free-form JSON: an object whose keys this code does not read, or has not checked yet (a YAML file
# before its schema, a record's payload passed through unread). Each use says why it is free-form;
# everything Pitstop reads has a TypedDict below or in core/policy_types.py.
JsonObject = dict[str, Any]

# -- a fault event: one normalised signal (schemas/fault_event.schema.json) ---------------------


class NodeRef(TypedDict):
    """The VM a signal names: validated Compute Engine names only (safe in paths and reasons)."""

    project: str
    zone: str | None  # None only with ``region``: a regional GKE entry before its zone is resolved
    instance: str
    instance_id: str | None
    cluster: NotRequired[str | None]
    region: NotRequired[str]
    location: NotRequired[str]  # a zonal GKE cluster's zone (its entries name it for every node)


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
    detail: EventDetail  # kind-specific, validated by the schema's ``detail`` properties
    job: NotRequired[JobRef]
    _observed_ts: NotRequired[float]


# -- a driver line's facts (core/xid_line.py, core/sxid_line.py), before they are an event --------


class XidDetail(TypedDict, total=False):
    """What an Xid line says beyond its code (reference/xid-catalog.md §3.2): each key only when
    the line carries it within what a driver can print; the rest is named in ``anomalies``."""

    message: str
    pid: int
    process: str
    anomalies: list[str]
    gpc: int  # 13
    tpc: int
    sm: int
    primary_xid: int  # 45: the Xid it was caused by
    memory: str  # 48: sram | dram
    pending_remap: bool  # 63
    remap_failure: bool  # 64
    link: int  # 74, 144-150
    registers: list[str]
    unit: str  # 94/95, 144-150
    fatal: bool
    intr_info: int
    error_status: int
    rst: bool  # 94/95
    d_rst: bool
    recovery_from: int  # 154
    recovery_to: int
    recovery_label: str
    inferred_from: str  # 79 without an Xid line: "fallen_off_bus_line"
    truncated: bool  # the message was cut before parsing (core/parse.py)
    original_bytes: int


class SxidDetail(TypedDict, total=False):
    """What an NVSwitch SXid line says (core/sxid_line.py)."""

    sxid: int
    switch: int
    switch_pci: str
    severity: str  # fatal | non_fatal
    link: int
    first: bool
    message: str
    anomalies: list[str]
    truncated: bool
    original_bytes: int


class SystemEventDetail(TypedDict, total=False):
    """A Compute Engine system event's facts: its method, status, and maintenance if it is one."""

    method: str
    status_message: str
    maintenance_status: str | None
    maintenance_type: str | None
    window_start: str | None
    window_end: str | None
    completed: bool


class VertexJobRef(TypedDict):
    """A Vertex AI CustomJob a log entry names (core/vertex_log.py): a hint until customJobs.get
    reads it back. ``location`` is None when the entry does not carry it (``ml_job`` entries)."""

    project: str
    location: str | None
    job_id: str
    job: str | None  # projects/P/locations/L/customJobs/ID, when the location is known
    state: str | None  # the state the entry reports (ml.googleapis.com/job_state), a hint
    task: str  # the entry's task: ``service`` (the platform's own messages) or a replica


class EventDetail(XidDetail, SxidDetail, SystemEventDetail, total=False):
    """An event's ``detail`` (schemas/fault_event.schema.json): each kind's own facts (an Xid
    line's, an SXid line's, a system event's, an alert's), and what classify adds to them."""

    xid_name: str  # the Xid's rule name (xid-policy.yaml)
    app_fault: bool
    decoded: bool  # a decode table decided the action (False: the code's own rule did)
    counts_toward_lemon: bool  # a non-fatal SXid episode counts toward the node's lemon tally
    alert: AlertDetail  # a Monitoring notification (core/alerts.py)
    hang_incident: str  # a culprit's own incident: the hung job's episode it came from (core/localise.py)
    job: str | None  # ... and that job
    vertex: VertexJobRef  # a vertex_job event's CustomJob (core/vertex_log.py)


@final
class XidLine(TypedDict):
    """A readable Xid line (or an inferred Xid 79): its code, its GPU, and its facts."""

    xid: int
    pci: str | None
    mig: MigRef | None
    detail: XidDetail


@final
class SxidLine(TypedDict):
    sxid: int
    detail: SxidDetail


@final
class LineError(TypedDict):
    """A driver line whose code cannot be read: why."""

    error: str


DriverLine = XidLine | SxidLine | LineError


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


# A Timeline key: a milestone stamped once, in the order an incident passes them (core/engine.TIMELINE_KEYS).
Milestone = Literal[
    "detected",
    "classified",
    "fenced",
    "job_requeued",  # the gang's requeue asked for: early (right after the fence) or once the node is back
    "job_running",  # the gang observed running again (a new run of each job)
    "localised",  # a hung job's culprits handed to their own node incidents
    "corroborated",  # the fault confirmed on the node itself (ring buffer, nvidia-smi, Node condition)
    "diagnosed",
    "acted",
    "healthy",
    "validated",
    "notified",
    "resolved",
    "closed",
]


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
    """Why an incident waits: a budget (``scope``), a cooldown, a disabled action, or the runtime
    control (``control``: ``pause`` or ``silence``, core/control.py; the sweep lets it go on)."""

    reason: str
    scope: str | None
    since: float
    until: float
    by: str
    control: str


class Silenced(TypedDict):
    """The silence a new episode was recorded under, never acted on (core/control.py)."""

    id: str
    scope: str  # node | cluster | block
    value: str
    until: float
    by: str
    reason: str


Escalation = TypedDict("Escalation", {"from": str, "to": str, "at": float, "why": list[str]})


class GpuCounts(TypedDict, total=False):
    pci: str
    first_seen: float
    last_seen: float
    xids: dict[str, int]
    secondary: dict[str, int]  # a secondary Xid -> the primary it names (xid-policy ``tie: primary``)
    recovery_to: int | None


class EventSummary(TypedDict):
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


class UnfenceAnswer(TypedDict):
    """What asking the node's scheduler to take the node back did (services/close.py)."""

    outcome: str  # done | left drained | not needed | sent | refused | not sent
    detail: str


class Closure(TypedDict):
    """A person ended the incident (``pitstop incidents --close``)."""

    by: str
    at: float
    from_state: str
    unfence: bool | UnfenceAnswer  # asked for; once asked, the scheduler's answer


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
    None, ``node_key`` the job's key: core/engine.subject_key). Read-only: every change is a
    command that core/aggregate.decide decides (on a :class:`Draft`), and the store applies."""

    id: ReadOnly[str]
    node_key: ReadOnly[str]
    node: ReadOnly[NodeRef | None]
    cluster: ReadOnly[str | None]
    scheduler: ReadOnly[str]
    state: ReadOnly[State]  # core.states.State (a document read back holds its string: equal to it)
    mode: ReadOnly[str]
    kind: ReadOnly[str]
    xid: ReadOnly[int | None]
    proposed_action: ReadOnly[str]
    action: ReadOnly[str]
    reason: ReadOnly[str]
    escalations: ReadOnly[list[Escalation]]
    counts: ReadOnly[dict[str, int]]
    gpus: ReadOnly[dict[str, GpuCounts]]
    evidence: ReadOnly[list[EventSummary]]
    first_seen: ReadOnly[float]
    last_seen: ReadOnly[float]
    burst_until: ReadOnly[float]
    timeline: ReadOnly[Timeline]
    step: ReadOnly[int]
    workflow: ReadOnly[WorkflowRun | None]
    held: ReadOnly[Held | None]
    budget_scopes: ReadOnly[list[str]]
    escalate_to: ReadOnly[str | None]
    trust: ReadOnly[str]
    created_at: ReadOnly[float]
    updated_at: ReadOnly[float]
    maintenance: NotRequired[ReadOnly[Maintenance]]
    recent_keys: NotRequired[ReadOnly[list[str]]]
    escalate_why: NotRequired[ReadOnly[list[str]]]
    holds: NotRequired[ReadOnly[list[Held]]]
    closure: NotRequired[ReadOnly[Closure]]
    failure: NotRequired[ReadOnly[Failure]]
    rejected: NotRequired[ReadOnly[Rejected]]
    budget_released_at: NotRequired[ReadOnly[float]]
    job: NotRequired[ReadOnly[JobRef]]  # a job-level episode's subject (kind ``hang``)
    alerts: NotRequired[ReadOnly[list[AlertRef]]]  # the Monitoring alerts it absorbed (kinds hang, degraded)
    alert_ended: NotRequired[ReadOnly[AlertEnd]]
    start_refusals: NotRequired[ReadOnly[int]]  # Workflows refused this step's start (services/sweep.py)
    # what the remediation learned (actuate): the scheduler's jobs and fence, the checks' records
    jobs: NotRequired[ReadOnly[list[JobDoc]]]
    fence: NotRequired[ReadOnly[FenceDoc]]
    resume: NotRequired[ReadOnly[Resume]]
    diagnosis: NotRequired[ReadOnly[Measurement]]
    validation: NotRequired[ReadOnly[Measurement]]
    measured: NotRequired[ReadOnly[list[Measurement]]]
    corroboration: NotRequired[ReadOnly[Measurement]]
    localise: NotRequired[ReadOnly[LocalisePlan]]  # a hung job: whether it is localised, and why (engine)
    localisation: NotRequired[ReadOnly[Localisation]]  # ... its nodes, each round's verdict, the outcome
    silenced: NotRequired[ReadOnly[Silenced]]  # recorded under a silence: never acted on (core/control.py)
    choice: NotRequired[ReadOnly[MoveChoice]]  # wait, move, shrink or hold: the gang's choice, priced
    vertex: NotRequired[ReadOnly[VertexRecord]]  # a Vertex AI job: what its step read back and did


class Draft(TypedDict):
    """The one writer's working copy of an :class:`Incident` (core/aggregate.py and the engine it
    calls): the same fields, writable. tests/core/test_aggregate.py checks the two agree."""

    id: str
    node_key: str
    node: NodeRef | None
    cluster: str | None
    scheduler: str
    state: State  # core.states.State (a document read back holds its string: equal to it)
    mode: str
    kind: str
    xid: int | None
    proposed_action: str
    action: str
    reason: str
    escalations: list[Escalation]
    counts: dict[str, int]
    gpus: dict[str, GpuCounts]
    evidence: list[EventSummary]
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
    jobs: NotRequired[list[JobDoc]]
    fence: NotRequired[FenceDoc]
    resume: NotRequired[Resume]
    diagnosis: NotRequired[Measurement]
    validation: NotRequired[Measurement]
    measured: NotRequired[list[Measurement]]
    corroboration: NotRequired[Measurement]
    localise: NotRequired[LocalisePlan]  # a hung job: whether it is localised, and why (engine)
    localisation: NotRequired[Localisation]  # ... its nodes, each round's verdict, the outcome
    silenced: NotRequired[Silenced]  # recorded under a silence: never acted on (core/control.py)
    choice: NotRequired[MoveChoice]  # wait, move, shrink or hold: the gang's choice, priced
    vertex: NotRequired[VertexRecord]  # a Vertex AI job: what its step read back and did


class LocalisePlan(TypedDict):
    """Whether a hung job's step localises it first, and why (core/localise.Plan.doc)."""

    run: bool
    why: str
    at: float


class Deltas(TypedDict):
    """An incident's counts buffered in memory between merges (services/coalesce.py; core/engine
    counts into these exactly as into an incident)."""

    counts: dict[str, int]
    gpus: dict[str, GpuCounts]
    evidence: list[EventSummary]
    last_seen: float
    recent_keys: NotRequired[list[str]]


class CountShard(Deltas):
    """One writer's storm counts of an incident, written whole beside it (core/store.with_shards;
    services/count_shards.py): its totals, and the burst they extend."""

    incident: str
    node: str
    burst_until: float
    at: float


class Resolution(TypedDict):
    """The resolved feed's record of an incident written RESOLVED (core/store.resolution)."""

    incident: str
    node: str | None
    at: float
    expire_at: Any  # a datetime in Firestore (its TTL policy reads it), epoch s in memory


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
    confirmed: NotRequired[bool]  # a node check confirmed it (then it counts toward the lemon rule)


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
    topology: NotRequired[Place]  # where the node sits (cached from Compute when a step claims it)
    localised_at: NotRequired[float]  # a job's document: when its last hang was localised (engine)
    unconfirmed_page_until: NotRequired[float]  # an unconfirmed fault pages again only after this


class NodeFields(TypedDict, total=False):
    """Fields merged into a node document as they are (the store's ``set_node_fields``)."""

    block: str
    localised_at: float


class Slot(TypedDict):
    at: float
    active: bool


class Budget(TypedDict):
    """One blast-radius scope: the incidents holding a slot in it, and when it last paged."""

    scope: str
    slots: dict[str, Slot]
    paged_until: float


class OutboxEntry(TypedDict):
    """A notification recorded before it is published (services/outbox.py)."""

    id: str
    notification: JsonObject  # a Notice or a page as JSON carries it: published unread
    created_at: float
    sent: bool
    sent_at: NotRequired[float]
    message_id: NotRequired[str]
    expire_at: NotRequired[Any]  # a datetime in Firestore (its TTL policy reads it), epoch s in memory
    failed_at: NotRequired[float]
    failures: NotRequired[int]


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
    # both free-form: the runner keeps and replays them unread, each op (or sink, or agent command)
    # owns its own shape (Fenced, Unfenced, ...)
    saved: JsonObject  # what an attempt decided before its first effect (reused by a retry)
    result: JsonObject
    at: float
    error: str
    released_at: float


# -- what remediation reads and keeps beside an incident (core/checks, corroboration, remediation) --


class Accelerator(TypedDict, total=False):
    """One ``guestAccelerators`` entry: how many GPUs of a type the VM has (core/checks.gpus_of)."""

    accelerator_type: str
    accelerator_count: int


class HostTopology(TypedDict, total=False):
    """Where the VM's host sits (``resourceStatus.physicalHostTopology``; the library's ``to_dict``
    keeps the proto's field names, ``subblock`` among them): core/topology.from_vm reads it."""

    cluster: str
    block: str
    subblock: str
    host: str


class Place(TypedDict, total=False):
    """Where a node sits, as its platform says (core/topology.py): Compute's physical host topology,
    a GKE node's ``cloud.google.com/gce-topology-*`` labels, or Slurm's topology (its switches).
    ``nvlink_domain``: the NVLink domain of an NVL72 machine type (A4X: its sub-block, one rack of
    72 GPUs); ``source`` says which platform answered. Cached in the node document (``topology``)."""

    cluster: str
    block: str
    subblock: str
    host: str
    nvlink_domain: str
    machine_type: str
    source: str  # compute | gke | slurm


class OptionCost(TypedDict):
    """One way through a fault, priced (core/tradeoff.py): expected GPU-hours lost, and how."""

    option: str  # wait | move | shrink | hold
    gpu_h: float
    how: str


class MoveChoice(TypedDict, total=False):
    """The choice made for a gang at a fault and its numbers (core/tradeoff.Weighed.doc): kept on
    the incident (``choice``) and said in its notification."""

    decision: str  # wait | move | shrink | hold
    why: str  # one sentence with the numbers ("moved to sub-block 2: 14 GPU-h expected vs 61 ...")
    options: list[OptionCost]
    job: str
    nodes: int
    gpus: int
    spares: list[str]
    tier: str  # where the spares sit relative to the gang: subblock | block | cluster | unknown
    repair_s: float
    repair_from: str  # measured (N incidents) | default
    restart_s: float
    penalty: float  # the fraction of throughput the move costs for the rest of the run
    native: str | None  # the scheduler's own restart that the gang was left to
    page: bool  # a person was paged (an NVLink domain without a spare)
    stay_on: list[str]  # an NVL72 gang that waits: its nodes, where a requeue before the repair pins it
    at: float


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
    labels: dict[str, str]
    label_fingerprint: str  # setLabels sends it back: a change since the read is refused (412)


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
    # corroborate: the GPUs the Xid that chose the action named (PCI), when the episode began and
    # when the node's last remediation took effect (epoch s): a kernel line outside says nothing
    pcis: NotRequired[list[str]]
    since: NotRequired[float]
    remediated_at: NotRequired[float | None]
    fabric: NotRequired[FabricSpec | None]  # validate: the fabric's NCCL setup (Fabric.as_spec)
    exclude_peers: NotRequired[list[str]]  # revalidate: peers already measured against


class CheckRun(TypedDict, total=False):
    """A check run's state as recorded (core/scheduling.CheckResult as a document)."""

    done: bool
    outputs: dict[str, str]
    peer: str | None
    error: str | None
    note: str | None
    exit_codes: dict[str, int]  # per tool (124: it ran out of time)


# -- a hung job's localisation (core/localise.py) ---------------------------------------------------


class LocaliseConfig(TypedDict):
    """The policy's ``localise`` section (schemas/policy.schema.json)."""

    enabled: bool
    culprit_action: str
    max_culprit_percent: float
    link_fraction: float
    link_bytes: int
    tool_timeout_s: float
    link_timeout_s: float
    heartbeat_min_points: int  # a hang acts only on a series this long before it stopped ...
    heartbeat_min_span_s: float  # ... over at least this many seconds
    heartbeat_lookback_s: float  # how far back Pitstop reads it


class GangCheckSpec(TypedDict):
    """A check on every node of a running job (the sweep, or the ring links' NCCL test), saved with
    its step before the scheduler is asked."""

    kind: str  # core/localise.SWEEP | LINKS
    name: str
    incident: str
    job: str
    nodes: list[str]
    timeout_s: int
    pairs: NotRequired[list[str]]  # links: "a+b" (Firestore keeps no nested arrays)
    message_bytes: NotRequired[int]
    gpus: NotRequired[int]


class VertexRecord(TypedDict, total=False):
    """What a Vertex AI job's step found and did (services/actuate/resubmit.py, core/vertex.judge):
    the job as ``customJobs.get`` returned it, its verdict, and its resubmission (or why none)."""

    job: str | None  # the job read back (its resource name); None: no such job in the cluster's regions
    state: str | None  # its JobState then
    klass: str  # infrastructure | user | unknown | not_ended | hung | not_found
    rule: str | None  # the schemas/vertex-errors.yaml row that decided
    reason: str  # the verdict's why
    error_code: int | None
    error_message: str
    strategy: str
    vertex_retried: bool  # Vertex retried internal errors itself (scheduling.disableRetries false)
    restart_job_on_worker_restart: bool
    lineage: str | None  # the first job of its line of resubmissions: the job-restart budget's key
    checkpoint: str | None  # where the resubmission resumes from
    outcome: Literal["resubmit", "resubmitted", "left"]  # decided; done; nothing done (``why``)
    cancel: bool  # a hung job: cancelled before its resubmission
    why: str  # why this outcome
    page: bool  # a person must decide
    resubmitted_as: str  # the new job
    created: bool  # this step created it (False: found again by its labels)


class Localisation(TypedDict, total=False):
    """What a hung job's localisation found, kept on its incident (services/actuate/localise.py)."""

    job: str
    nodes: list[str]
    started_at: float
    rounds: list[LocaliseRound]  # the last four
    culprits: list[str]
    incidents: dict[str, str]  # culprit node -> its own node incident
    outcome: str  # culprits | nothing_found | not_running
    page: str


class LocaliseRound(TypedDict):
    """One localisation round's verdict as recorded (core/localise.Verdict.record)."""

    kind: str
    at: float
    culprits: list[str]
    why: str
    checked: list[str]
    findings: dict[str, list[str]]
    suspects: list[str]
    measured: dict[str, float | None]
    evidence: NotRequired[list[EvidenceRecord]]  # each culprit's finding (core/evidence.py, sweep probe)


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
    incident: NotifiedIncident  # the incident's fields a reader needs (remediation.NOTIFIED_FIELDS)
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


class EvidenceRecord(TypedDict):
    """What one of Pitstop's own probes found, as the incident keeps it (core/evidence.Evidence)."""

    probe: str  # node_check | compute | telemetry | sweep | diagnostic | validation
    node: str
    what: str
    at: float | None  # when the finding was printed or observed (epoch s)
    gpu: str | None  # PCI address
    xid: int | None
    sxid: int | None
    symptom: str | None
    event: str | None  # a system event's kind


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
    node_value: float | None  # peers (a degraded node held against its gang: core/degraded.py)
    peers: dict[str, float | None]
    alike: list[str]
    source: str  # peers: where the readings came from (monitoring | prometheus)
    off_fabric: str | None  # validate: why the NCCL figure was not measured the fabric's way
    nccl_peers: list[PeerMeasurement]  # validate: each NCCL measurement, first peer first
    evidence: EvidenceRecord  # what a probe matched, when it confirmed (core/evidence.py)


class PeerMeasurement(TypedDict):
    """One NCCL all_gather of a validation: the peer, its busbw (None: no figure) and verdict."""

    peer: str | None
    busbw_gbps: float | None
    verdict: str


class FenceDoc(TypedDict, total=False):
    """How the scheduler fenced the node (core/scheduling.FenceAnswer.doc), kept on the incident."""

    previous_state: str
    previous_reason: str
    already_drained_by_other: bool
    reason: str  # the reason Pitstop's own fence carries


class JobRunDoc(TypedDict, total=False):
    restarts: int | None
    start_time: str | None


class JobDoc(TypedDict):
    """A job on the fenced node as the incident keeps it (core/scheduling.JobInfo.doc)."""

    id: str
    state: str  # core/scheduling.JobState
    restarts: NotRequired[int | None]
    start_time: NotRequired[str | None]


class JobMove(TypedDict):
    """One job a resume requeued, left waiting or skipped, and why."""

    job: str
    why: str


class Resume(TypedDict, total=False):
    """How the gang was restarted (services/actuate: gang.reschedule_early, localise)."""

    mode: str  # early | after_repair | spares | in_place
    requeued: list[JobMove] | list[str]  # a hung job's resume names its jobs alone
    waiting: list[JobMove]
    skipped: list[JobMove]
    why: str


class FabricSpec(TypedDict):
    """A machine type's NCCL setup as a validate check carries it (core/validation.Fabric.as_spec)."""

    name: str
    ranks_per_node: int
    profile: str
    profile_env: dict[str, str]
    library_path: str
    env: dict[str, str]


class NotifiedIncident(TypedDict):
    """The incident's fields a notification carries (core/remediation.NOTIFIED_FIELDS; None: unset)."""

    id: str
    node: NodeRef | None
    cluster: str | None
    kind: str
    xid: int | None
    action: str
    state: str
    reason: str
    counts: dict[str, int]
    failure: Failure | None
    rejected: Rejected | None
    resume: Resume | None
    diagnosis: Measurement | None
    validation: Measurement | None
    choice: MoveChoice | None
    job: JobRef | None
    vertex: VertexRecord | None


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
