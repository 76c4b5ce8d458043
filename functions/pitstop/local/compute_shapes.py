"""The records the fake Compute keeps and the REST bodies it answers with (camelCase, as the API
sends them; core/domain.Vm is the product's snake_case reading of the same instance).

Fields are those of the Compute v1 reference (Instance, Operation, InstanceManagedByIgm and the
system-event audit LogEntry) that the fake fills; what it never sends is left out.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pitstop.core.domain import JsonObject
from pitstop.local.gpu_tools.state import GpuEntry, KmsgLine

# -- answers -------------------------------------------------------------------------------------


class ErrorItem(TypedDict):
    message: str
    domain: str
    reason: str


class ErrorDetail(TypedDict):
    code: int
    message: str
    errors: NotRequired[list[ErrorItem]]  # the admin API's own refusals carry none


class ErrorBody(TypedDict):
    """Google's error envelope (reference/fidelity.md §2.1)."""

    error: ErrorDetail


class Maintenance(TypedDict, total=False):
    """``resourceStatus.upcomingMaintenance`` of a VM with host maintenance pending."""

    type: str
    maintenanceStatus: str
    canReschedule: bool
    windowStartTime: str
    windowEndTime: str
    latestWindowStartTime: str
    maintenanceReasons: list[str]


class HostTopology(TypedDict):
    """``resourceStatus.physicalHostTopology`` (Compute v1 Instance reference; the JSON field is
    ``subblock``, as the REST resource ResourceStatusPhysicalHostTopology names it)."""

    cluster: str
    block: str
    subblock: str
    host: str


class ResourceStatus(TypedDict):
    physicalHost: str
    physicalHostTopology: HostTopology
    upcomingMaintenance: NotRequired[Maintenance]


class GuestAccelerator(TypedDict):
    acceleratorType: str
    acceleratorCount: int


class Scheduling(TypedDict):
    provisioningModel: str
    automaticRestart: bool
    onHostMaintenance: str
    preemptible: bool


class MetadataItem(TypedDict):
    key: str
    value: str


class Metadata(TypedDict):
    items: list[MetadataItem]


class InstanceDoc(TypedDict):
    """An Instance as instances.get answers it."""

    kind: str
    id: str
    creationTimestamp: str
    name: str
    status: str
    zone: str
    machineType: str
    selfLink: str
    labels: dict[str, str]
    labelFingerprint: str
    scheduling: Scheduling
    reservationAffinity: dict[str, str]
    resourceStatus: ResourceStatus
    guestAccelerators: NotRequired[list[GuestAccelerator]]
    lastStartTimestamp: NotRequired[str]
    lastStopTimestamp: NotRequired[str]
    metadata: NotRequired[Metadata]


class OperationErrorItem(TypedDict):
    code: str
    message: str


class OperationError(TypedDict):
    errors: list[OperationErrorItem]


class OperationDoc(TypedDict):
    """A zonal Operation; a failed one carries ``error`` and the HTTP fields the client raises from."""

    kind: str
    id: str
    name: str
    operationType: str
    targetLink: str
    targetId: str
    status: str
    progress: int
    insertTime: str
    startTime: str
    zone: str
    selfLink: str
    user: str
    endTime: NotRequired[str]
    error: NotRequired[OperationError]
    httpErrorStatusCode: NotRequired[int]
    httpErrorMessage: NotRequired[str]


class ManagedInstance(TypedDict):
    instance: str
    id: str
    name: str
    instanceStatus: str
    currentAction: str


class ManagedInstances(TypedDict):
    managedInstances: list[ManagedInstance]


# -- the system-event LogEntry a sink would deliver ----------------------------------------------


# "@type" is not an identifier: the functional form names it
AuditLog = TypedDict(
    "AuditLog",
    {
        "@type": str,
        "status": dict[str, str],
        "authenticationInfo": dict[str, str],
        "serviceName": str,
        "methodName": str,
        "resourceName": str,
        "request": NotRequired[dict[str, str]],  # the fake's events carry it; bench's corpus does not
        "metadata": NotRequired[dict[str, str]],  # an upcomingMaintenance's window
    },
)


class LogResource(TypedDict):
    """The monitored resource an entry names: the VM (``gce_instance``)."""

    type: str
    labels: dict[str, str]


class LogOperation(TypedDict):
    id: str
    producer: str
    first: bool
    last: bool


class SystemEvent(TypedDict):
    protoPayload: AuditLog
    insertId: str
    resource: LogResource
    timestamp: str
    severity: str
    logName: str
    operation: LogOperation
    receiveTimestamp: str


# -- the fake's own records ----------------------------------------------------------------------


class PlanStep(TypedDict, total=False):
    """What changes on an instance at a planned time (each key an ``Instance`` attribute)."""

    status: str
    id: str
    created: float
    host: str
    maintenance: Maintenance | None


class Call(TypedDict):
    """A mutating request received (refused and repeated ones too)."""

    method: str
    path: str
    body: JsonObject  # whatever the client sent: tests read the request as Compute got it
    at: float
    request_id: str | None
    replayed: NotRequired[bool]


class Effect(TypedDict):
    """A mutating request that changed something."""

    method: str
    project: str
    zone: str
    instances: list[str]
    request_id: str | None
    operation: str
    at: float


class ArmedFault(TypedDict):
    method: str
    code: int
    reason: str
    left: int
    node: str | None


class InstanceView(TypedDict):
    """One instance as ``/_admin/state`` (and ``pitstop local status``) shows it."""

    name: str
    zone: str
    status: str
    id: str
    host: str
    labels: dict[str, str]
    mig: str | None
    provisioning: str
    maintenance: Maintenance | None
    gpu_state: GpuEntry | None
    kmsg: list[KmsgLine]


class ComputeState(TypedDict):
    instances: list[InstanceView]
    calls: list[Call]
    effects: list[Effect]
    faults: list[ArmedFault]


class GpuStateSet(TypedDict):
    instance: str
    host: str
    state: GpuEntry | None


class KmsgWritten(TypedDict):
    instance: str
    lines: int
