"""The shapes of the data files Pitstop loads: policy.yaml, xid-policy.yaml, validation.yaml and
system-events.yaml, each as its JSON schema in schemas/ describes it.

A file is a plain dict once loaded; it becomes one of these only after ``resources.validate``
checked it against its schema (core/resources.load_yaml, core/policy.from_doc), so ``mypy --strict``
can then check every key a lookup reads. Keys the schema does not require are ``NotRequired``.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pitstop.core.domain import LocaliseConfig

# An action word (schemas' ``$defs/action``; core/actions.Action holds the same words).
ActionWord = Literal[
    "NONE", "RESTART_JOB", "DRAIN_NODE", "RESET_GPU", "RESCHEDULE_JOB", "REBOOT_NODE", "REPLACE_NODE"
]
Reschedule = Literal["early", "after_repair"]

# -- policy.yaml (schemas/policy.schema.json) ----------------------------------------------------


class TrustConfig(TypedDict):
    text_syslog: Literal["record", "act"]


class Windows(TypedDict):
    burst_silence_s: float
    tie_s: float
    dedup_ttl_h: float
    alert_flap_s: float
    hang_localise_s: NotRequired[float]
    unconfirmed_page_s: NotRequired[float]


WindowName = Literal[
    "burst_silence_s", "tie_s", "dedup_ttl_h", "alert_flap_s", "hang_localise_s", "unconfirmed_page_s"
]


class Ladder(TypedDict):
    window_h: float
    steps: list[Literal["RESET_GPU", "REBOOT_NODE", "REPLACE_NODE"]]


class LemonRule(TypedDict):
    window_d: float
    remediations: int


class ScopeBudget(TypedDict):
    max_nodes: int
    max_percent: float


class JobRestartBudget(TypedDict):
    max: int
    window_s: float


class Budgets(TypedDict):
    window_s: float
    cluster: ScopeBudget
    zone: ScopeBudget
    block: ScopeBudget
    job_restarts: JobRestartBudget


class ClusterMatch(TypedDict, total=False):
    """Which nodes a cluster entry claims (at least one key)."""

    name_pattern: str  # shell-style, on the instance name
    mig: str  # a MIG's base instance name
    labels: dict[str, str]
    gke_cluster: str
    zones: list[str]


class MigConfig(TypedDict):
    name: str
    zone: str


class SlurmConfig(TypedDict, total=False):
    command_topic: str
    checkpoint_signal: str
    node_name_pattern: str


CheckTools = TypedDict(
    "CheckTools", {"nvidia-smi": list[str], "dcgmi": list[str], "all_gather_perf": list[str]}, total=False
)


class ChecksConfig(TypedDict, total=False):
    """How diagnose and validate run on a Kubernetes cluster's nodes (adapters/gke CheckSettings)."""

    namespace: str
    service: str
    image: str
    nccl_image: str
    tools: CheckTools
    dcgm_setup: str
    nccl_setup: str
    mpirun: list[str]
    peer_wait: str
    deadline_s: int
    ttl_s: int


class GkeConfig(TypedDict):
    location: str
    cluster: NotRequired[str]
    project: NotRequired[str]
    evict_deadline_s: NotRequired[float]
    stuck_terminating_s: NotRequired[float]
    kueue_failed_node_replacement: NotRequired[bool]
    checks: NotRequired[ChecksConfig]


class ClusterDoc(TypedDict):
    """One ``clusters`` entry: ``scheduler`` is ``none`` or a scheduler folder's name, whose block
    the folder's fragment of the policy schema checks (read it with ``Cluster.block``; the blocks
    typed here are the ones code outside their folder reads)."""

    name: str
    scheduler: str
    match: NotRequired[ClusterMatch]  # absent only for a scheduler whose folder says nodes: false
    size: NotRequired[int]
    mig: NotRequired[MigConfig]
    slurm: NotRequired[SlurmConfig]
    gke: NotRequired[GkeConfig]
    reschedule: NotRequired[Reschedule]


class WorkflowConfig(TypedDict):
    name: str
    location: str


class WatchdogConfig(TypedDict):
    deadline_s: dict[str, float]  # an action (or ``default``) -> seconds


class ResumeConfig(TypedDict):
    reschedule: Reschedule


class CorroborationConfig(TypedDict):
    """The policy's ``corroboration`` section (core/corroboration.py, core/ring_buffer.py)."""

    enabled: bool
    line_lag_s: float  # an episode began at its first line's time, at most this before Pitstop heard of it
    clock_slack_s: float  # a kernel line's wall time is known to within this ...
    clock_drift_ppm: float  # ... plus this share of its seconds since boot
    event_max_age_s: float  # a system event older than this when it arrives is recorded, not acted on
    event_margin_s: float  # Compute's record of the event's kind must be this close to the event


class DiagnoseConfig(TypedDict):
    enabled: bool
    dcgm_level: int


class ExpectedBaseline(TypedDict):
    """An operator's own NCCL baseline for a machine type (policy ``validation.expected``)."""

    busbw_gbps: float
    message_bytes: NotRequired[int]
    gpus: NotRequired[int]


class ValidationConfig(TypedDict):
    enabled: bool
    actions: list[Literal["DRAIN_NODE", "RESET_GPU", "REBOOT_NODE", "REPLACE_NODE"]]
    dcgm_level: int
    busbw_fraction: float
    require_peer: bool
    expected: dict[str, ExpectedBaseline]  # machine type -> baseline


class StoreConfig(TypedDict):
    collection_prefix: str
    flush_interval_s: float
    cache_ttl_s: float
    control_cache_s: float


class PenaltyConfig(TypedDict):
    block: float
    cluster: float


class MovesConfig(TypedDict):
    """The policy's ``moves`` section (core/tradeoff.py): a gang's choice at a fault, priced."""

    enabled: bool
    restart_s: float
    horizon_s: float
    capacity_wait_s: float
    penalty: PenaltyConfig
    min_history: int
    repair_s: dict[str, float]  # an action (or ``default``) -> seconds
    nvlink_domain_families: list[str]
    probation_s: float  # a spare just back from a Pitstop repair ranks after others of its span


class CheckpointAdviceConfig(TypedDict):
    """The policy's ``checkpoint_advice`` section (core/checkpointing.py, `pitstop report`)."""

    default_failures_per_1000_node_days: float
    min_checkpoints: int
    gpus_per_node: int


class PolicyDoc(TypedDict):
    """policy.yaml merged over schemas/policy.defaults.yaml, as validated (core/policy.from_doc)."""

    version: Literal[1]
    mode: Literal["observe", "enforce"]
    enabled_actions: list[ActionWord]
    xid_overrides: dict[str, ActionWord]  # an Xid code (digits) -> its action
    trust: TrustConfig
    windows: Windows
    ladder: Ladder
    lemon: LemonRule
    cooldowns: dict[str, float]  # an action -> seconds
    budgets: Budgets
    clusters: list[ClusterDoc]
    workflow: WorkflowConfig
    watchdog: WatchdogConfig
    store: StoreConfig
    resume: ResumeConfig
    corroboration: CorroborationConfig
    diagnose: DiagnoseConfig
    validation: ValidationConfig
    localise: NotRequired[LocaliseConfig]
    moves: NotRequired[MovesConfig]
    checkpoint_advice: NotRequired[CheckpointAdviceConfig]


# -- xid-policy.yaml (schemas/xid-policy.schema.json) ---------------------------------------------


class DecisionDoc(TypedDict):
    action: ActionWord
    reason: str


class UnknownRuleDoc(TypedDict):
    name: str
    bucket: str
    reason: str


# A refine clause's condition: a parsed fact (core/domain.XidDetail's keys, schema ``$defs/if``)
# -> the value it must have, one of a list, or ``any`` (present, whatever its value).
IfValue = int | bool | str | list[int] | list[str]


class RefineIf(TypedDict, total=False):
    gpc: IfValue
    tpc: IfValue
    sm: IfValue
    primary_xid: IfValue
    memory: IfValue
    pending_remap: IfValue
    remap_failure: IfValue
    link: IfValue
    unit: IfValue
    fatal: IfValue
    rst: IfValue
    d_rst: IfValue
    recovery_from: IfValue
    recovery_to: IfValue
    recovery_label: IfValue
    error_status: IfValue
    intr_info: IfValue
    inferred_from: IfValue
    process: IfValue


RefineDoc = TypedDict(
    "RefineDoc", {"if": RefineIf, "action": NotRequired[ActionWord], "reason": NotRequired[str]}
)


class XidRuleDoc(TypedDict):
    codes: list[int]
    name: str
    bucket: str
    reason: str
    action: NotRequired[ActionWord]
    app_fault: NotRequired[bool]
    decode: NotRequired[Literal["xid74", "nvlink5"]]
    tie: NotRequired[Literal["primary", "recovery"]]
    refine: NotRequired[list[RefineDoc]]


class RecoveryDoc(DecisionDoc):
    label: str


class Xid74Doc(TypedDict):
    classes: dict[str, DecisionDoc]  # an error class -> its action
    registers: dict[str, dict[str, list[int]]]  # R0..R6 -> class -> bit positions


class Layouts(TypedDict):
    """A value per intrInfo layout: v1 before driver R575, v2 from R575."""

    v1: int
    v2: int


class PromoteDoc(TypedDict):
    status: list[int]
    bit: Layouts
    to: str


class Nvlink5UnitDoc(TypedDict):
    names: list[str]
    status: NotRequired[dict[str, list[int]]]  # bucket -> the statuses (or bits) in it
    exact: NotRequired[bool]
    any: NotRequired[str]
    reason: NotRequired[dict[str, list[int]]]  # bucket -> link-down reasons
    subcode: NotRequired[Layouts]
    promote: NotRequired[PromoteDoc]


class Nvlink5Doc(TypedDict):
    actions: dict[str, ActionWord]  # bucket -> action
    units: list[Nvlink5UnitDoc]


class DecodeDoc(TypedDict):
    xid74: Xid74Doc
    nvlink5: Nvlink5Doc


class RepeatDoc(TypedDict):
    within_h: float
    action: ActionWord
    reason: str


class SxidFatalDoc(DecisionDoc):
    repeat: NotRequired[RepeatDoc]


class SxidNonFatalDoc(DecisionDoc):
    counts_toward_lemon: NotRequired[bool]


class SxidDoc(TypedDict):
    fatal: SxidFatalDoc
    non_fatal: SxidNonFatalDoc
    unknown: DecisionDoc


class SymptomDoc(TypedDict):
    """How a degraded symptom is read from Cloud Monitoring, and its repairs (core/degraded.py)."""

    metric: str
    filter: str
    aligner: Literal["ALIGN_RATE", "ALIGN_DELTA", "ALIGN_MAX", "ALIGN_MEAN"]
    threshold: float
    hold_s: float
    on_finding: ActionWord
    otherwise: ActionWord


class PromSymptomDoc(TypedDict):
    """How a degraded symptom is read from Managed Service for Prometheus (core/degraded.PromRule)."""

    metric: str
    query: str
    reduce: Literal["bits_share", "increase", "rate"]
    threshold: float
    hold_s: float
    step_s: float
    mask: NotRequired[int]
    per_s: NotRequired[float]


class PrometheusDoc(TypedDict):
    node_label: str
    symptoms: dict[str, PromSymptomDoc]


class DegradedDoc(TypedDict):
    gang_wide_share: float
    symptoms: dict[str, SymptomDoc]
    sources: NotRequired[dict[str, Literal["monitoring", "prometheus"]]]  # scheduler -> telemetry
    prometheus: NotRequired[PrometheusDoc]


class XidPolicyDoc(TypedDict):
    version: Literal[1]
    buckets: dict[str, ActionWord]
    unknown: UnknownRuleDoc
    rules: list[XidRuleDoc]
    recovery_actions: dict[str, RecoveryDoc]  # Xid 154's recovery code (digits) -> its action
    recovery_unknown: DecisionDoc
    gpu_unknown: dict[str, ActionWord]
    gke_device_plugin_xids: list[int]
    decode: DecodeDoc
    sxid: SxidDoc
    degraded: DegradedDoc


# -- validation.yaml (schemas/validation.schema.json) ---------------------------------------------


class FabricDoc(TypedDict):
    name: str
    ranks_per_node: int
    profile: str
    library_path: str
    env: dict[str, str]
    sources: list[str]
    profile_env: NotRequired[dict[str, str]]


class MachineTypeDoc(TypedDict):
    gpus: int
    busbw_gbps: float | None  # None: no published figure
    message_bytes: int
    source: str
    note: str
    transport: NotRequired[str]
    fabric: NotRequired[FabricDoc]


class ValidationDefaults(TypedDict):
    busbw_fraction: float
    dcgm_level: int
    diagnose_dcgm_level: int


class DcgmDoc(TypedDict):
    config_only_tests: list[str]
    source: str


class ValidationDoc(TypedDict):
    version: Literal[1]
    defaults: ValidationDefaults
    dcgm: DcgmDoc
    machine_types: dict[str, MachineTypeDoc]


# -- system-events.yaml (schemas/system-events.schema.json) ---------------------------------------


class SystemEventDoc(TypedDict):
    kind: Literal["preemption", "host_error", "maintenance", "lifecycle"]
    action: ActionWord
    reason: str
    completed: NotRequired[DecisionDoc]


class SystemEventsDoc(TypedDict):
    version: Literal[1]
    methods: dict[str, SystemEventDoc]  # an audit log methodName -> its rule
