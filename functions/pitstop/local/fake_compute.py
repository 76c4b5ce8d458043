"""A stateful fake of the Compute Engine REST subset Pitstop uses, for the real google-cloud-compute client.

Faithful where tests depend on it (reference/fidelity.md §2): error bodies and reasons
(404 notFound, 400 resourceInUseByAnotherResource, 412 conditionNotMet for a stale label
fingerprint, 403 rateLimitExceeded / forbidden, 503 backendError), operations that take time
and end DONE (failed ones with ``error``, ``httpErrorStatusCode`` and ``httpErrorMessage`` so
the client raises), instance states moving with time, reportHostAsFaulty's preconditions and
its delayed stop and restart on a new host, MIG recreate (same name, new id), and Spot
preemption / maintenance notices together with the system-event LogEntry a sink would deliver.

Request ids: every mutating method takes a ``requestId`` query parameter, which Compute
documents as "Specify a unique request ID so that if you must retry your request, the server
will know to ignore the request if it has already been completed ... the server can check if
original operation with the same request ID was received, and if so, will ignore the second
request" (google-cloud-compute 1.57.0, ``ResetInstanceRequest.request_id`` and siblings; the
id "must be a valid UUID with the exception that zero UUID is not supported"). The fake
honours that: a repeat of an id it has seen in the same project answers with the original
Operation (its current state) and does nothing again. Compute does not say how long it
remembers an id; other Google Cloud APIs document the same field with "The server will
guarantee that for at least 60 minutes after the first request" (e.g. Network Connectivity's
DeleteHubRequest, Memorystore's DeleteInstanceRequest), so the fake remembers an id for exactly
that long (``REQUEST_ID_WINDOW_S`` of its clock, not scaled) and then forgets it. ``calls`` records
every mutating request received (refused and repeated ones too); ``effects`` only the ones
that changed something, so tests can count effects per VM.

Faults: ``/_admin/faults`` arms an error for the next N mutating requests (optionally only those
on one VM, or of one method), answered with the body Compute gives for that status
(``DEFAULT_ERRORS``, or a named reason); ``pitstop local chaos compute-error`` arms them.

GPU outcomes: ``/_admin/gpu_state`` marks the physical host an instance runs on now with a GPU
state (the keys of pitstop.local.gpu_tools.state.NodeState, or a preset such as ``"degraded"``:
busbw 120 GB/s; ``null`` clears it). The fake keeps a JSON file (``gpu_state_path``, by default
the path in env ``PITSTOP_GPU_STATE``) mapping each instance name to the state of the host it
runs on, rewritten whenever that changes, and the GPU stand-ins read it. A state belongs to the
host, not the VM: a reset keeps the host and so the state; a reportHostAsFaulty or a MIG recreate
moves the VM to a new host, and the node is healthy again.

State advances lazily from a scaled clock on every request: no background threads.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from pitstop.local.compute_shapes import (
    ArmedFault,
    Call,
    ComputeState,
    Effect,
    ErrorBody,
    GpuStateSet,
    GuestAccelerator,
    InstanceDoc,
    KmsgWritten,
    Maintenance,
    ManagedInstance,
    ManagedInstances,
    OperationDoc,
    PlanStep,
    ResourceStatus,
    SystemEvent,
)
from pitstop.local.gpu_tools.state import (
    KMSG_MAX,
    GpuEntry,
    KmsgLine,
    NodeState,
    StateError,
    check_entry,
    check_kmsg_line,
)
from pitstop.local.json_http import serve_json

BASE = "https://www.googleapis.com/compute/v1"
FAULTY_HOST_FAMILIES = ("a4x-", "a4-", "a3-ultragpu", "a3-megagpu", "a3-highgpu-8g")
# Real durations in seconds; the server's time_scale shrinks them for tests and the demo.
DURATIONS = {
    "reset": 30.0,
    "report": 660.0,
    "report_restart": 90.0,
    "recreate": 120.0,
    "maintenance": 180.0,
    "label": 1.0,
    "preempted_restart": 60.0,
}
_IDS = itertools.count(1)
# How long a request id is remembered: the "at least 60 minutes" other Google APIs promise for the
# same field (Compute states no figure). Real seconds of the fake's clock, never time-scaled.
REQUEST_ID_WINDOW_S = 3600.0


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, domain: str = "global") -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.domain = code, reason, message, domain

    def body(self) -> ErrorBody:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}],
            }
        }


def not_found(path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{path}' was not found")


# The fake's VMs exist since before any log line tests and the demo send (2020-01-01T00:00:00Z).
CREATED_LONG_AGO = 1_577_836_800.0


def new_id() -> str:
    return str(4_400_000_000_000_000_000 + random.randrange(10**15))


def default_id(project: str, zone: str, name: str) -> str:
    """A VM's numeric id before any recreate: fixed by its path, so a log entry can carry it
    the way the logging agent does (tests and the demo build entries without asking the fake)."""
    digest = hashlib.sha256(f"{project}/{zone}/{name}".encode()).digest()
    return str(4_400_000_000_000_000_000 + int.from_bytes(digest[:8], "big") % 10**15)


# machine type -> (accelerator type, count), from Compute Engine's GPU machine types page
ACCELERATORS: dict[str, tuple[str, int]] = {
    "a3-highgpu-1g": ("nvidia-h100-80gb", 1),
    "a3-highgpu-2g": ("nvidia-h100-80gb", 2),
    "a3-highgpu-4g": ("nvidia-h100-80gb", 4),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a4x-highgpu-4g": ("nvidia-gb200", 4),
}


@dataclass
class Instance:
    project: str
    zone: str
    name: str
    machine_type: str
    provisioning: str = "RESERVATION_BOUND"
    mig: str | None = None
    status: str = "RUNNING"
    id: str = ""  # default_id(project, zone, name) unless given
    created: float = CREATED_LONG_AGO  # epoch s; a VM the fake (re)creates at run time gets its time
    labels: dict[str, str] = field(default_factory=dict)
    fingerprint: str = "42WmSpB8rSM="
    host: str = field(default_factory=lambda: f"host-{random.randrange(16**8):08x}")
    block: str = "block-1"
    subblock: str = "sub-1"
    cluster: str = "c1"
    plan: list[tuple[float, PlanStep]] = field(default_factory=list)  # (at, changes)
    maintenance: Maintenance | None = None
    reports: int = 0
    # The guest kernel's ring buffer since this boot: [{"msg": ..., "facility": 0}], what the
    # dmesg stand-in prints. A VM that stops (reset, preemption, maintenance, a new host) boots
    # with an empty one.
    kmsg: list[KmsgLine] = field(default_factory=list)
    # Instance.lastStartTimestamp / lastStopTimestamp (Compute API reference, Instance resource):
    # what a published system event is checked against (core/corroboration.judge_system)
    last_start: float | None = None
    last_stop: float | None = None

    def __post_init__(self) -> None:
        self.id = self.id or default_id(self.project, self.zone, self.name)

    @property
    def zone_path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}"

    @property
    def path(self) -> str:
        return f"{self.zone_path}/instances/{self.name}"

    def advance(self, now: float) -> None:
        while self.plan and self.plan[0][0] <= now:
            at, changes = self.plan.pop(0)
            for k, v in changes.items():
                setattr(self, k, v)
            if changes.get("status") in ("STOPPING", "TERMINATED"):
                self.kmsg = []
                self.last_stop = at
            elif changes.get("status") == "RUNNING":
                self.last_start = at

    def busy(self) -> bool:
        return bool(self.plan)

    def accelerators(self) -> list[GuestAccelerator]:
        """``guestAccelerators`` as instances.get shows them: accelerator-optimized types attach their
        GPUs with the machine type (A3 high 1/2/4/8, mega, ultra; A4); a type not listed has none."""
        kind, count = ACCELERATORS.get(self.machine_type, (None, 0))
        if kind is None:
            return []
        return [
            {"acceleratorType": f"{BASE}/{self.zone_path}/acceleratorTypes/{kind}", "acceleratorCount": count}
        ]

    def to_api(self) -> InstanceDoc:
        rs: ResourceStatus = {
            "physicalHost": self.host,
            "physicalHostTopology": {
                "cluster": self.cluster,
                "block": self.block,
                "subblock": self.subblock,
                "host": self.host,
            },
        }
        if self.maintenance:
            rs["upcomingMaintenance"] = self.maintenance
        doc: InstanceDoc = {
            "kind": "compute#instance",
            "id": self.id,
            "creationTimestamp": _rfc3339(self.created),
            "name": self.name,
            "status": self.status,
            "zone": f"{BASE}/projects/{self.project}/zones/{self.zone}",
            "machineType": f"{BASE}/{self.zone_path}/machineTypes/{self.machine_type}",
            "selfLink": f"{BASE}/{self.path}",
            "labels": dict(self.labels),
            "labelFingerprint": self.fingerprint,
            "scheduling": {
                "provisioningModel": self.provisioning,
                "automaticRestart": self.provisioning != "SPOT",
                "onHostMaintenance": "TERMINATE",
                "preemptible": self.provisioning == "SPOT",
            },
            "reservationAffinity": {
                "consumeReservationType": "SPECIFIC_RESERVATION"
                if self.provisioning == "RESERVATION_BOUND"
                else "NO_RESERVATION"
            },
            "resourceStatus": rs,
        }
        if self.accelerators():
            doc["guestAccelerators"] = self.accelerators()
        if self.last_start is not None:
            doc["lastStartTimestamp"] = _rfc3339(self.last_start)
        if self.last_stop is not None:
            doc["lastStopTimestamp"] = _rfc3339(self.last_stop)
        if self.mig:
            doc["metadata"] = {
                "items": [
                    {
                        "key": "created-by",
                        "value": f"{self.zone_path}/instanceGroupManagers/{self.mig}",
                    }
                ]
            }
        return doc


@dataclass
class Operation:
    project: str
    zone: str
    op_type: str
    target: str
    target_id: str
    start: float
    done_at: float
    error: ApiError | None = None
    name: str = field(default_factory=lambda: f"operation-{int(time.time() * 1000)}-{next(_IDS):06d}")

    def to_api(self, now: float) -> OperationDoc:
        done = now >= self.done_at
        doc: OperationDoc = {
            "kind": "compute#operation",
            "id": str(7_000_000_000 + next(_IDS)),
            "name": self.name,
            "operationType": self.op_type,
            "targetLink": f"{BASE}/{self.target}",
            "targetId": self.target_id,
            "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 50,
            "insertTime": _rfc3339(self.start),
            "startTime": _rfc3339(self.start),
            "zone": f"{BASE}/projects/{self.project}/zones/{self.zone}",
            "selfLink": f"{BASE}/projects/{self.project}/zones/{self.zone}/operations/{self.name}",
            "user": "pitstop-actuate@example.iam.gserviceaccount.com",
        }
        if done:
            doc["endTime"] = _rfc3339(self.done_at)
            if self.error is not None:
                doc["error"] = {"errors": [{"code": self.error.reason, "message": self.error.message}]}
                doc["httpErrorStatusCode"] = self.error.code
                doc["httpErrorMessage"] = {
                    400: "BAD REQUEST",
                    409: "CONFLICT",
                    412: "PRECONDITION FAILED",
                    503: "SERVICE UNAVAILABLE",
                }.get(self.error.code, "ERROR")
        return doc


@dataclass
class SeenRequest:
    """A request id Compute has acted on: when it was first seen and the operation it started."""

    first_at: float
    operation: str
    method: str


@dataclass
class Injected:
    """A fault armed for the next ``count`` matching requests (``method`` ``*``: any; ``*mutating``:
    any request that changes something), optionally only for requests on one VM (``instance``)."""

    method: str
    code: int
    reason: str
    message: str
    count: int
    domain: str = "global"
    instance: str | None = None


KNOWN_MESSAGES = {
    "rateLimitExceeded": "Rate Limit Exceeded",
    "forbidden": "Required 'compute.instances.reset' permission",
    "backendError": "Backend Error",
}
# The error each status answers with when a fault names only the status (reference/fidelity.md §2.1):
# (reason, domain, message; ``{path}`` is the target resource's path).
DEFAULT_ERRORS: dict[int, tuple[str, str, str]] = {
    400: ("resourceNotReady", "global", "The resource '{path}' is not ready"),
    403: ("rateLimitExceeded", "usageLimits", "Rate Limit Exceeded"),
    404: ("notFound", "global", "The resource '{path}' was not found"),
    409: ("alreadyExists", "global", "The resource '{path}' already exists"),
    412: ("conditionNotMet", "global", "Labels fingerprint either invalid or resource labels have changed"),
    429: (
        "RESOURCE_EXHAUSTED",
        "global",
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'",
    ),
    500: ("internalError", "global", "Internal Error"),
    503: ("backendError", "global", "Backend Error"),
}


class FakeCompute:
    def __init__(
        self,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
        gpu_state_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.scale, self.clock = time_scale, clock
        path = gpu_state_path if gpu_state_path is not None else os.environ.get("PITSTOP_GPU_STATE")
        self.gpu_state_path = str(path) if path else None
        self.host_gpu: dict[str, GpuEntry] = {}  # physical host -> its GPU state
        self._gpu_written: dict[str, GpuEntry] | None = None
        self.instances: dict[str, Instance] = {}
        self.migs: dict[str, str] = {}  # "project/zone/name" -> base instance name
        self.ops: dict[str, Operation] = {}
        self.calls: list[Call] = []  # every mutating request received, for tests and `local status`
        self.effects: list[Effect] = []  # every mutating request that changed something
        self.request_ids: dict[tuple[str, str], SeenRequest] = {}  # (project, requestId) -> first use
        self.injected: list[Injected] = []
        self.lock = threading.RLock()
        if self.gpu_state_path:
            self._sync_gpu_state()  # a file left by an earlier run describes hosts that are gone

    # -- world setup ---------------------------------------------------------------

    def add_instance(
        self,
        project: str,
        zone: str,
        name: str,
        machine_type: str = "a3-megagpu-8g",
        provisioning: str = "RESERVATION_BOUND",
        mig: str | None = None,
        block: str = "block-1",
        subblock: str = "sub-1",
    ) -> Instance:
        """A VM; ``block`` and ``subblock`` place it (resourceStatus.physicalHostTopology)."""
        inst = Instance(project, zone, name, machine_type, provisioning, mig, block=block, subblock=subblock)
        with self.lock:
            self.instances[inst.path] = inst
            if mig:
                self.migs[f"{project}/{zone}/{mig}"] = mig
        return inst

    def add_from_spec(self, project: str, zone: str, spec: Mapping[str, object]) -> Instance:
        """An instance described in JSON (admin API, cluster file); absent keys take the defaults above."""
        mig = spec.get("mig")
        return self.add_instance(
            project,
            zone,
            _text(spec, "name"),
            _text(spec, "machine_type") if "machine_type" in spec else "a3-megagpu-8g",
            _text(spec, "provisioning") if "provisioning" in spec else "RESERVATION_BOUND",
            None if mig is None else _text(spec, "mig"),
            _text(spec, "block") if "block" in spec else "block-1",
            _text(spec, "subblock") if "subblock" in spec else "sub-1",
        )

    def inject(self, method: str, code: int, reason: str, message: str = "", count: int = 1) -> None:
        msg = message or KNOWN_MESSAGES.get(reason, reason)
        with self.lock:
            self.injected.append(Injected(method, code, reason, msg, count))

    def _dur(self, key: str) -> float:
        return DURATIONS[key] * self.scale

    def _instance(self, project: str, zone: str, name: str) -> Instance:
        path = f"projects/{project}/zones/{zone}/instances/{name}"
        inst = self.instances.get(path)
        if inst is None:
            raise not_found(path)
        inst.advance(self.clock())
        return inst

    def _op(
        self, inst: Instance, op_type: str, seconds: float, error: ApiError | None = None
    ) -> OperationDoc:
        now = self.clock()
        op = Operation(inst.project, inst.zone, op_type, inst.path, inst.id, now, now + seconds, error)
        self.ops[op.name] = op
        return op.to_api(now)

    def arm(
        self,
        code: int,
        count: int = 1,
        method: str = "*mutating",
        instance: str | None = None,
        reason: str | None = None,
    ) -> Injected:
        """Answer the next ``count`` matching requests with ``code`` and Compute's error body for it."""
        default = DEFAULT_ERRORS.get(code)
        if reason is None or (default is not None and reason == default[0]):
            if default is None:
                raise ValueError(f"no default error for HTTP {code}; name its reason")
            reason, domain, message = default
        else:
            domain = "usageLimits" if reason == "rateLimitExceeded" else "global"
            message = KNOWN_MESSAGES.get(reason, reason)
        inj = Injected(method, code, reason, message, count, domain, instance)
        with self.lock:
            self.injected.append(inj)
        return inj

    def _check_injected(self, method: str, path: str = "", instances: tuple[str, ...] = ()) -> None:
        for inj in self.injected:
            if inj.count <= 0:
                continue
            if inj.method == "*mutating":
                if method not in self._MUTATING:
                    continue
            elif inj.method not in (method, "*"):
                continue
            if inj.instance is not None and inj.instance not in instances:
                continue
            inj.count -= 1
            domain = "usageLimits" if inj.reason == "rateLimitExceeded" else inj.domain
            raise ApiError(inj.code, inj.reason, inj.message.replace("{path}", path), domain)

    def armed(self) -> list[ArmedFault]:
        """The faults still armed (for the admin API and `pitstop local status`)."""
        with self.lock:
            return [
                {"method": i.method, "code": i.code, "reason": i.reason, "left": i.count, "node": i.instance}
                for i in self.injected
                if i.count > 0
            ]

    def effects_on(self, instance: str, method: str | None = None) -> list[Effect]:
        """The effects performed on one VM (by name), optionally of one method."""
        with self.lock:
            return [
                e
                for e in self.effects
                if instance in e["instances"] and (method is None or e["method"] == method)
            ]

    @staticmethod
    def _valid_request_id(rid: str) -> None:
        try:
            parsed = uuid.UUID(rid)
        except ValueError:
            parsed = None
        if parsed is None or parsed.int == 0:
            raise ApiError(400, "invalid", f"Invalid value for field 'requestId': '{rid}'. Must be a UUID.")

    def _seen(self, project: str, rid: str | None) -> SeenRequest | None:
        """The earlier request with this id, if Compute would still recognise it."""
        if rid is None:
            return None
        seen = self.request_ids.get((project, rid))
        if seen is not None and self.clock() - seen.first_at > REQUEST_ID_WINDOW_S:
            del self.request_ids[(project, rid)]
            return None
        return seen

    @staticmethod
    def _targets(fn: str, groups: tuple[str, ...], body: Mapping[str, object]) -> list[str]:
        """The VM names a mutating request acts on."""
        if fn == "recreate":
            return [str(ref).rsplit("/", 1)[-1] for ref in _refs(body)]
        return [groups[2]]

    # -- GPU outcomes per physical host ----------------------------------------------

    def set_gpu_state(self, p: str, z: str, i: str, state: object) -> GpuStateSet:
        """Mark the host the instance runs on now with a GPU state (None clears it)."""
        inst = self._instance(p, z, i)
        if state is None:
            self.host_gpu.pop(inst.host, None)
        else:
            try:
                self.host_gpu[inst.host] = check_entry(state)
            except StateError as exc:
                raise ApiError(400, "invalid", f"bad GPU state: {exc}") from exc
        self._sync_gpu_state()
        return {"instance": inst.name, "host": inst.host, "state": self.host_gpu.get(inst.host)}

    def kernel_line(self, p: str, z: str, i: str, msg: object, facility: object) -> KmsgWritten:
        """A line the guest kernel prints (facility 0) or user space writes to /dev/kmsg (1: LOG_USER)."""
        inst = self._instance(p, z, i)
        line = check_kmsg_line({"msg": msg, "facility": facility, "at": self.clock()})
        inst.kmsg = [*inst.kmsg, line][-KMSG_MAX:]
        self._sync_gpu_state()
        return {"instance": inst.name, "lines": len(inst.kmsg)}

    def gpu_states(self) -> dict[str, GpuEntry]:
        """Instance name -> the GPU state of the host it runs on now (instances on healthy hosts left
        out, unless their machine type has another GPU count than the stand-ins' default: an A4X
        VM's host has 4, ACCELERATORS)."""
        with self.lock:
            now = self.clock()
            out: dict[str, GpuEntry] = {}
            for inst in self.instances.values():
                inst.advance(now)
                count = ACCELERATORS.get(inst.machine_type, (None, 0))[1]
                if count and count != NodeState.total_gpus:
                    out[inst.name] = {"total_gpus": count}
                if inst.host in self.host_gpu:
                    out[inst.name] = {**out.get(inst.name, {}), **self.host_gpu[inst.host]}
                if inst.kmsg:  # with the boot that dates its lines (the dmesg and clock stand-ins)
                    out.setdefault(inst.name, {})["kmsg"] = [dict(k) for k in inst.kmsg]
                    out[inst.name]["boot"] = inst.last_start or inst.created
            return out

    def _sync_gpu_state(self) -> None:
        """Rewrite the state file when what it should say changed (atomically: a stand-in reading
        it never sees half a file)."""
        if not self.gpu_state_path:
            return
        states = self.gpu_states()
        if states == self._gpu_written:
            return
        tmp = f"{self.gpu_state_path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(states, f, sort_keys=True)
        os.replace(tmp, self.gpu_state_path)
        self._gpu_written = states

    # -- API methods ---------------------------------------------------------------

    def get_instance(self, p: str, z: str, i: str) -> InstanceDoc:
        return self._instance(p, z, i).to_api()

    def reset(self, p: str, z: str, i: str) -> OperationDoc:
        inst = self._instance(p, z, i)
        if inst.status not in ("RUNNING",):
            raise ApiError(400, "resourceNotReady", f"The resource '{inst.path}' is not ready")
        if inst.busy():
            raise ApiError(
                400,
                "resourceInUseByAnotherResource",
                f"The resource '{inst.path}' is already being used by another operation",
            )
        now, d = self.clock(), self._dur("reset")
        inst.plan = [
            (now, {"status": "STOPPING"}),
            (now + d * 0.3, {"status": "STAGING"}),
            (now + d, {"status": "RUNNING"}),
        ]
        inst.advance(now)
        return self._op(inst, "reset", d)

    def set_labels(self, p: str, z: str, i: str, body: Mapping[str, object]) -> OperationDoc:
        inst = self._instance(p, z, i)
        if body.get("labelFingerprint") != inst.fingerprint:
            raise ApiError(
                412,
                "conditionNotMet",
                "Labels fingerprint either invalid or resource labels have changed",
                "global",
            )
        labels = body.get("labels") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", k)
            and re.fullmatch(r"[-_a-z0-9]{0,63}", v)
            for k, v in labels.items()
        ):
            raise ApiError(400, "invalid", "Invalid value for field 'labels'")
        inst.labels = {str(k): str(v) for k, v in labels.items()}
        inst.fingerprint = f"{random.randrange(16**11):011x}="
        return self._op(inst, "setLabels", self._dur("label"))

    def report_host_as_faulty(self, p: str, z: str, i: str, body: Mapping[str, object]) -> OperationDoc:
        inst = self._instance(p, z, i)
        if not inst.machine_type.startswith(FAULTY_HOST_FAMILIES):
            raise ApiError(
                400, "invalid", f"Machine type {inst.machine_type} does not support reportHostAsFaulty"
            )
        if inst.provisioning != "RESERVATION_BOUND":
            raise ApiError(400, "invalid", "reportHostAsFaulty requires a reservation-bound instance")
        if inst.status != "RUNNING":
            raise ApiError(400, "resourceNotReady", f"Instance {inst.name} is not RUNNING")
        if inst.busy():
            raise ApiError(409, "conflict", "A faulty-host report for this instance is already in progress")
        if body.get("disruptionSchedule") not in ("IMMEDIATE", "FUTURE"):
            raise ApiError(400, "invalid", "Invalid value for field 'disruptionSchedule'")
        if not body.get("faultReasons"):
            raise ApiError(400, "invalid", "Required field 'faultReasons' not specified")
        now, d, r = self.clock(), self._dur("report"), self._dur("report_restart")
        new_host = f"host-{random.randrange(16**8):08x}"
        # The report runs with the VM still RUNNING, then the VM stops and restarts on a healthy host.
        inst.plan = [
            (now + d, {"status": "STOPPING"}),
            (now + d + r * 0.3, {"status": "REPAIRING"}),
            (now + d + r * 0.6, {"status": "STAGING", "host": new_host}),
            (now + d + r, {"status": "RUNNING"}),
        ]
        inst.reports += 1
        return self._op(inst, "reportHostAsFaulty", d)

    def perform_maintenance(self, p: str, z: str, i: str) -> OperationDoc:
        inst = self._instance(p, z, i)
        if not inst.maintenance or not inst.maintenance.get("canReschedule"):
            raise ApiError(
                400, "invalid", "No pending maintenance that can be started early for this instance"
            )
        now, d = self.clock(), self._dur("maintenance")
        inst.plan = [
            (now, {"status": "STOPPING"}),
            (now + d * 0.2, {"status": "TERMINATED"}),
            (now + d * 0.8, {"status": "STAGING", "maintenance": None}),
            (now + d, {"status": "RUNNING"}),
        ]
        inst.advance(now)
        return self._op(inst, "performMaintenance", d)

    def recreate(self, p: str, z: str, mig: str, body: Mapping[str, object]) -> OperationDoc:
        if f"{p}/{z}/{mig}" not in self.migs:
            raise not_found(f"projects/{p}/zones/{z}/instanceGroupManagers/{mig}")
        targets = []
        for ref in _refs(body):
            name = str(ref).rsplit("/", 1)[-1]
            inst = self._instance(p, z, name)
            if inst.mig != mig:
                raise ApiError(400, "invalid", f"Instance {name} is not a member of {mig}")
            targets.append(inst)
        now, d = self.clock(), self._dur("recreate")
        for inst in targets:
            fresh: PlanStep = {
                "status": "STAGING",
                "id": new_id(),
                "created": now + d * 0.4,
                "host": f"host-{random.randrange(16**8):08x}",
            }
            inst.plan = [
                (now, {"status": "STOPPING"}),
                (now + d * 0.4, fresh),
                (now + d, {"status": "RUNNING"}),
            ]
            inst.advance(now)
        path = f"projects/{p}/zones/{z}/instanceGroupManagers/{mig}"
        op = Operation(p, z, "compute.instanceGroupManagers.recreateInstances", path, "0", now, now + d * 0.1)
        self.ops[op.name] = op
        return op.to_api(now)

    def list_managed(self, p: str, z: str, mig: str) -> ManagedInstances:
        if f"{p}/{z}/{mig}" not in self.migs:
            raise not_found(f"projects/{p}/zones/{z}/instanceGroupManagers/{mig}")
        out: list[ManagedInstance] = []
        for inst in self.instances.values():
            if inst.project == p and inst.zone == z and inst.mig == mig:
                inst.advance(self.clock())
                action = "NONE" if inst.status == "RUNNING" and not inst.busy() else "RECREATING"
                out.append(
                    {
                        "instance": f"{BASE}/{inst.path}",
                        "id": inst.id,
                        "name": inst.name,
                        "instanceStatus": inst.status,
                        "currentAction": action,
                    }
                )
        return {"managedInstances": out}

    def get_operation(self, p: str, z: str, name: str) -> OperationDoc:
        op = self.ops.get(name)
        if op is None or op.project != p or op.zone != z:
            raise not_found(f"projects/{p}/zones/{z}/operations/{name}")
        return op.to_api(self.clock())

    # -- what the platform does on its own (driven by tests and the demo) ---------

    def preempt(self, p: str, z: str, i: str) -> SystemEvent:
        """Spot preemption: the VM goes TERMINATED; the MIG (if any) recreates it. Returns the LogEntry."""
        inst = self._instance(p, z, i)
        now = self.clock()
        inst.status, inst.last_stop, inst.kmsg = "TERMINATED", now, []
        if inst.mig:
            d = self._dur("preempted_restart")
            inst.plan = [
                (
                    now + d * 0.5,
                    {"status": "STAGING", "id": new_id(), "created": now + d * 0.5},
                ),
                (now + d, {"status": "RUNNING"}),
            ]
        return self.system_event(inst, "compute.instances.preempted", "Instance was preempted.")

    def schedule_maintenance(self, p: str, z: str, i: str, starts_in_s: float) -> SystemEvent:
        inst = self._instance(p, z, i)
        now = self.clock()
        start, end = _rfc3339(now + starts_in_s), _rfc3339(now + starts_in_s + 3 * 3600)
        inst.maintenance = {
            "type": "SCHEDULED",
            "maintenanceStatus": "PENDING",
            "canReschedule": True,
            "windowStartTime": start,
            "windowEndTime": end,
            "latestWindowStartTime": start,
            "maintenanceReasons": ["PLANNED_UPDATE"],
        }
        entry = self.system_event(inst, "compute.instances.upcomingMaintenance", "Maintenance is scheduled.")
        entry["protoPayload"]["metadata"] = {
            "maintenanceStatus": "PENDING",
            "type": "SCHEDULED",
            "windowStartTime": start,
            "windowEndTime": end,
        }
        return entry

    def system_event(self, inst: Instance, method: str, message: str) -> SystemEvent:
        now = self.clock()
        return {
            "protoPayload": {
                "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                "status": {"message": message},
                "authenticationInfo": {"principalEmail": "system@google.com"},
                "serviceName": "compute.googleapis.com",
                "methodName": method,
                "resourceName": inst.path,
                "request": {"@type": f"type.googleapis.com/{method}"},
            },
            "insertId": f"{random.randrange(36**12):012x}",
            "resource": {
                "type": "gce_instance",
                "labels": {"instance_id": inst.id, "project_id": inst.project, "zone": inst.zone},
            },
            "timestamp": _rfc3339(now),
            "severity": "INFO",
            "logName": f"projects/{inst.project}/logs/cloudaudit.googleapis.com%2Fsystem_event",
            "operation": {
                "id": f"systemevent-{int(now * 1000)}",
                "producer": method,
                "first": True,
                "last": True,
            },
            "receiveTimestamp": _rfc3339(now),
        }

    def snapshot(self) -> ComputeState:
        with self.lock:
            for inst in self.instances.values():
                inst.advance(self.clock())
            return {
                "instances": [
                    {
                        "name": i.name,
                        "zone": i.zone,
                        "status": i.status,
                        "id": i.id,
                        "host": i.host,
                        "labels": i.labels,
                        "mig": i.mig,
                        "provisioning": i.provisioning,
                        "maintenance": i.maintenance,
                        "gpu_state": self.host_gpu.get(i.host),
                        "kmsg": [k.copy() for k in i.kmsg],  # this boot's ring buffer (local/npd.py)
                    }
                    for i in self.instances.values()
                ],
                "calls": list(self.calls),
                "effects": list(self.effects),
                "faults": self.armed(),
            }

    # -- HTTP ----------------------------------------------------------------------

    _ROUTES: list[tuple[str, re.Pattern[str], str]] = [
        ("GET", re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/:]+)"), "get_instance"),
        ("POST", re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/reset"), "reset"),
        (
            "POST",
            re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/setLabels"),
            "set_labels",
        ),
        (
            "POST",
            re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/reportHostAsFaulty"),
            "report_host_as_faulty",
        ),
        (
            "POST",
            re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/performMaintenance"),
            "perform_maintenance",
        ),
        (
            "POST",
            re.compile(
                r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instanceGroupManagers/([^/]+)/recreateInstances"
            ),
            "recreate",
        ),
        (
            "POST",
            re.compile(
                r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instanceGroupManagers/([^/]+)/listManagedInstances"
            ),
            "list_managed",
        ),
        (
            "GET",
            re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)"),
            "get_operation",
        ),
        (
            "POST",
            re.compile(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)/wait"),
            "get_operation",
        ),
    ]
    _WITH_BODY = frozenset({"set_labels", "report_host_as_faulty", "recreate"})
    _MUTATING = frozenset({"reset", "set_labels", "report_host_as_faulty", "perform_maintenance", "recreate"})

    def dispatch(self, method: str, path: str, body: Mapping[str, object]) -> tuple[int, object]:
        """One request; afterwards the GPU state file follows any host a VM moved to meanwhile."""
        try:
            return self._dispatch(method, path, body)
        finally:
            with self.lock:
                self._sync_gpu_state()

    def _dispatch(self, method: str, path: str, body: Mapping[str, object]) -> tuple[int, object]:
        path, _, query = path.partition("?")
        if path.startswith("/_admin/"):
            return self._admin(path, body)
        rids = parse_qs(query).get("requestId") or []
        rid = rids[-1] if rids else None
        for verb, pattern, fn in self._ROUTES:
            m = pattern.fullmatch(path)
            if m and verb == method:
                with self.lock:
                    try:
                        if fn in self._MUTATING:
                            return self._mutate(fn, path, m.groups(), body, rid)
                        self._check_injected(fn)
                        return 200, getattr(self, fn)(*m.groups())
                    except ApiError as e:
                        return e.code, e.body()
        return 404, not_found(path).body()

    def _mutate(
        self, fn: str, path: str, groups: tuple[str, ...], body: Mapping[str, object], rid: str | None
    ) -> tuple[int, OperationDoc | ErrorBody]:
        """One mutating request: recorded, checked for a repeated request id, then performed once."""
        now = self.clock()
        call: Call = {"method": fn, "path": path, "body": dict(body), "at": now, "request_id": rid}
        self.calls.append(call)
        targets = self._targets(fn, groups, body)
        resource = "instanceGroupManagers" if fn == "recreate" else "instances"
        self._check_injected(
            fn, f"projects/{groups[0]}/zones/{groups[1]}/{resource}/{groups[2]}", tuple(targets)
        )
        if rid is not None:
            self._valid_request_id(rid)
        project = groups[0]
        seen = self._seen(project, rid)
        if seen is not None and seen.operation in self.ops:
            call["replayed"] = True  # Compute ignores the repeat and answers with the original operation
            return 200, self.ops[seen.operation].to_api(now)
        args: list[object] = list(groups)
        if fn in self._WITH_BODY:
            args.append(body)
        op: OperationDoc = getattr(self, fn)(*args)
        if rid is not None:
            self.request_ids[(project, rid)] = SeenRequest(now, op["name"], fn)
        self.effects.append(
            {
                "method": fn,
                "project": project,
                "zone": groups[1],
                "instances": targets,
                "request_id": rid,
                "operation": op["name"],
                "at": now,
            }
        )
        return 200, op

    def _admin(self, path: str, body: Mapping[str, object]) -> tuple[int, object]:
        try:
            with self.lock:
                if path == "/_admin/state":
                    return 200, self.snapshot()
                if path == "/_admin/inject":
                    self.inject(
                        _text(body, "method"),
                        _whole(body, "code"),
                        _text(body, "reason"),
                        _text(body, "message", ""),
                        _whole(body, "count", 1),
                    )
                    return 200, {}
                if path == "/_admin/faults":
                    return 200, self._admin_faults(body)
                if path == "/_admin/preempt":
                    return 200, self.preempt(*_vm(body))
                if path == "/_admin/maintenance":
                    return 200, self.schedule_maintenance(*_vm(body), _number(body, "starts_in_s", 3600))
                if path == "/_admin/add":
                    self.add_from_spec(_text(body, "project"), _text(body, "zone"), body)
                    return 200, {}
                if path == "/_admin/kmsg":
                    return 200, self.kernel_line(*_vm(body), body["msg"], body.get("facility", 0))
                if path == "/_admin/gpu_state":
                    if "state" not in body:
                        raise KeyError("state")
                    return 200, self.set_gpu_state(*_vm(body), body["state"])
        except ApiError as e:
            return e.code, e.body()
        except (KeyError, ValueError) as e:
            return 400, {"error": {"code": 400, "message": f"bad admin request: {e}"}}
        return 404, {"error": {"code": 404, "message": "no such admin path"}}

    def _admin_faults(self, body: Mapping[str, object]) -> dict[str, list[ArmedFault]]:
        """Arm a fault (``code``; optional ``times``, ``node``, ``method``, ``reason``) or ``clear`` all."""
        if body.get("clear"):
            self.injected.clear()
        if "code" in body:
            node, reason = body.get("node"), body.get("reason")
            self.arm(
                _whole(body, "code"),
                _whole(body, "times", 1),
                str(body.get("method") or "*mutating"),
                None if node is None else str(node),
                None if reason is None else str(reason),
            )
        return {"armed": self.armed()}


def _text(body: Mapping[str, object], key: str, default: str | None = None) -> str:
    """A string field of an admin request or a cluster file (absent and no default: KeyError)."""
    v = body[key] if default is None else body.get(key, default)
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string")
    return v


def _whole(body: Mapping[str, object], key: str, default: int | None = None) -> int:
    """An integer field (a number or its text, as ``int()`` reads it)."""
    v = body[key] if default is None else body.get(key, default)
    if not isinstance(v, int | float | str):
        raise ValueError(f"{key} must be a number")
    return int(v)


def _number(body: Mapping[str, object], key: str, default: float) -> float:
    v = body.get(key, default)
    if not isinstance(v, int | float | str):
        raise ValueError(f"{key} must be a number")
    return float(v)


def _vm(body: Mapping[str, object]) -> tuple[str, str, str]:
    """The (project, zone, instance) an admin request names."""
    return _text(body, "project"), _text(body, "zone"), _text(body, "instance")


def _refs(body: Mapping[str, object]) -> list[object]:
    """recreateInstances' ``instances``: the instance URLs (a missing or empty list: none)."""
    refs = body.get("instances")
    return list(refs) if isinstance(refs, list) else []


def serve(fake: FakeCompute, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    def dispatch(method: str, path: str, raw: bytes) -> tuple[int, Any]:
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return 400, ApiError(400, "parseError", "Parse Error").body()
        return fake.dispatch(method, path, body if isinstance(body, dict) else {})

    server = serve_json(dispatch, "fake-compute", host, port)
    return server, f"http://{host}:{server.server_address[1]}"
