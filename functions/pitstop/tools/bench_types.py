"""The shapes the benchmarks (``pitstop bench ...``) make and print, as TypedDicts.

What they feed the functions (LogEntries, Pub/Sub push bodies, CloudEvents: reference/gcp-events.md
§3-§4), what an instance writes when it stops (tools/bench_instance.py, tools/bench_calls.py) and
the JSON each bench prints. Dicts at run time, so typing them changes no key and no value.
"""

from __future__ import annotations

from typing import Generic, NotRequired, TypedDict, TypeVar

from pitstop.local.compute_shapes import AuditLog, LogResource

# -- what the benches feed the functions -----------------------------------------------------------


class LogEntry(TypedDict, total=False):
    """A Cloud Logging LogEntry: a kernel line (``jsonPayload`` or ``textPayload``) or a system event."""

    insertId: str
    logName: str
    timestamp: str
    receiveTimestamp: str
    severity: str
    jsonPayload: dict[str, str]  # a journal record: MESSAGE, _TRANSPORT, ...
    textPayload: str
    protoPayload: AuditLog  # a system event (the corpus's carries no ``request``)
    resource: LogResource
    labels: dict[str, str]


class PubsubMessage(TypedDict):
    data: str  # base64 of the JSON document
    messageId: str
    publishTime: str


class PushBody(TypedDict):
    """What a Pub/Sub push subscription POSTs (the bench adds ``subscription`` when it sends)."""

    message: PubsubMessage
    subscription: NotRequired[str]


class CloudEventData(TypedDict):
    message: PubsubMessage


class CloudEvent(TypedDict):
    """Eventarc's messagePublished, in structured JSON."""

    specversion: str
    type: str
    source: str
    id: str
    time: str
    data: CloudEventData


Envelope = LogEntry | PushBody | CloudEvent

# -- what an instance writes to $PITSTOP_BENCH_STATS_DIR/<pid>.json when it stops ------------------


class InstanceFigures(TypedDict):
    """One ingest instance's counts (tools/bench_instance.py)."""

    pid: int
    reads: int
    writes: int
    ops_by_collection: dict[str, int]
    ops_by_site: dict[str, int]
    calls: dict[str, int]  # requests sent to Firestore, by kind (a query billed several reads is one)
    retries: int
    refused_commits: int
    refused_writes: int
    commits: dict[str, int]
    coalesced: int
    coalescer: dict[str, int]
    pages: int
    peak_mib: float


class CallsReport(TypedDict):
    """One notify or actuate instance's calls (tools/bench_calls.py)."""

    pid: int
    peak_mib: float
    calls: list[tuple[str, str, float]]  # (what, outcome, seconds); read back, each a JSON array


# -- what the benches print -------------------------------------------------------------------------

RunT = TypeVar("RunT")


class Report(TypedDict, Generic[RunT]):
    """``pitstop bench ingest|notify|actuate``: one entry per run."""

    benchmark: str
    cpus: int | None
    runs: list[RunT]


class Latency(TypedDict):
    p50: float
    p99: float
    max: float


class OpLatency(TypedDict):
    calls: int
    p50: float
    p99: float


class ClassifyTargets(TypedDict):
    lines_per_s: int
    cost_vs_json_roundtrip: float


class ClassifyCosts(TypedDict):
    classify_lines_per_s: int
    cost_vs_json_roundtrip: float


class ClassifyReport(TypedDict):
    """``pitstop bench classify``."""

    benchmark: str
    lines: int
    cpus: int
    classify_lines_per_s: int
    json_roundtrip_lines_per_s: int
    cost_vs_json_roundtrip: float
    targets: ClassifyTargets
    targets_met: bool
    every_line_distinct: ClassifyCosts
    mix: dict[str, int]  # envelope:... and form:... -> documents
    mix_first_5000: dict[str, int]  # kind -> documents


class PushTally(TypedDict):
    """The push side's counts of a run (tools/bench_fleet.py's ``_Tally``), bench ingest's and notify's."""

    deliveries: int
    refused: int
    timed_out: int
    dead_lettered: int


class FleetMemory(TypedDict):
    """The instances of a run: peak memory (sampled PSS, and the workers' own VmHWM) and cold start."""

    peak_mib_per_instance: float
    peak_mib_by_instance: list[float]
    worker_hwm_mib_max: float
    ready_s_max: float


class RunCpu(TypedDict):
    """CPU seconds over a run's push window (tools/bench_cpu.py): the Firestore emulator's (0 when
    it could not be found), the instances' together, the bench's own, and their sum over the wall."""

    emulator: float
    instances: float
    bench: float
    cores_busy: float


class IngestRun(PushTally, FleetMemory):
    """One run of ``pitstop bench ingest`` (tools/bench_fleet.py)."""

    instances: int
    concurrency: int
    lines: int
    nodes: int
    finished: bool
    lines_per_s: int
    seconds: float
    store_ops_per_line: float
    firestore_reads: int
    firestore_writes: int
    retries: int
    refused_commits: int
    refused_commit_writes: int
    ops_by_collection: dict[str, int]
    ops_by_site: dict[str, int]
    calls: dict[str, int]
    cpu_s: RunCpu
    commits: dict[str, int]
    incidents: int
    held: int
    workflow_starts: int
    starts_per_step_max: int
    duplicate_starts: int
    starts_per_incident_max: int
    incidents_started: int
    lines_counted: int
    every_line_counted: bool
    answers: dict[str, int]
    pages: int
    instances_reporting: int
    lines_pushed: NotRequired[int]  # a run cut short by its deadline: the lines it pushed


class SinkFigures(TypedDict):
    """Posts one sink received against what it should have (from the sink's own records)."""

    expected: int
    sent: int
    duplicates: int
    missing: int
    unexpected: int


class NotifyRun(PushTally, FleetMemory):
    """One run of ``pitstop bench notify`` (tools/bench_notify.py)."""

    instances: int
    concurrency: int
    notifications: int
    distinct: int
    finished: bool
    seconds: float
    notifications_per_s: float
    latency_ms: Latency
    outcomes: dict[str, int]
    sinks: dict[str, SinkFigures]  # webhook, pagerduty
    duplicates_sent: int
    missing: int
    page_posts: int
    metrics_series: int


class ActuateRun(TypedDict):
    """One run of ``pitstop bench actuate`` (tools/bench_actuate.py)."""

    concurrency: int
    remediations: int
    finished: bool
    seconds: float
    calls: int
    calls_per_s: float
    remediations_per_s: float
    latency_ms: Latency
    latency_ms_by_op: dict[str, OpLatency]
    answers: dict[str, int]
    incidents: dict[str, int]  # state -> incidents
    resolved: int
    compute_resets: int
    notices_published: int
    peak_mib: float
    worker_hwm_mib: float
    ready_s: float
