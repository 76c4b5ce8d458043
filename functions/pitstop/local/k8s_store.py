"""The object store behind the fake Kubernetes API server (local/fake_k8s.py).

It holds what etcd plus the API server's registry hold for a real cluster, with the semantics
clients can observe (reference/gke.md §2 and §7):

- one cluster-wide ``resourceVersion`` counter, bumped by every write and reported on lists;
  an update carrying a stale one is refused with 409 Conflict; a no-op update writes nothing.
- ``metadata.generation`` bumped when anything outside metadata and status changes.
- status subresources: a write to the main resource keeps the stored status, a write to
  ``/status`` changes nothing but the status.
- deletion: ``deletionTimestamp`` first; the object goes when no finalizer is left. Pods are
  deleted gracefully (``DeleteOptions.gracePeriodSeconds``, else the pod's
  ``terminationGracePeriodSeconds``, default 30; 0 for a pod never bound to a node or already
  terminal) and leave only after the fake kubelet ends them. Propagation: ``Foreground`` adds the
  ``foregroundDeletion`` finalizer (the garbage collector in k8s_controllers.py removes it once
  the dependents are gone), ``Background`` leaves dependents to the collector, ``Orphan`` drops
  the owner reference from the dependents (at once, not through an ``orphan`` finalizer). A
  batch/v1 Job deleted without a policy orphans its pods, as the real Job strategy does for
  back-compatibility (``pkg/registry/batch/job/strategy.go`` DefaultGarbageCollectionPolicy).
- a bounded history of watch events; watching from a resourceVersion older than the history
  (or before ``compact()``) is 410 Gone, as after an etcd compaction.

Time: grace periods run on a clock of Kubernetes seconds, ``time_scale`` real seconds each
(0.01 by default, so a 30 s grace period takes 0.3 s). ``time_scale=0`` freezes it: only
``advance()`` moves it, which deterministic tests use.
"""

from __future__ import annotations

import builtins
import copy
import datetime as dt
import itertools
import random
import re
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pitstop.core.domain import JsonObject
from pitstop.local.k8s_patch import fields_match, labels_match

Obj = JsonObject  # a stored Kubernetes object (k8s_patch.Obj): open shape

FIRST_RV = 1000


@dataclass(frozen=True)
class Resource:
    """One served resource type: how it is named in paths, discovery and error messages."""

    kind: str
    plural: str
    group: str
    version: str
    namespaced: bool
    subresources: tuple[str, ...] = ("status",)
    short_names: tuple[str, ...] = ()
    custom: bool = False  # a CRD: strategic merge patch is refused (415)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``jobs.batch``: how the API server names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: tuple[Resource, ...] = (
    Resource("Namespace", "namespaces", "", "v1", False, ("status",), ("ns",)),
    Resource("Node", "nodes", "", "v1", False, ("status",), ("no",)),
    Resource("Pod", "pods", "", "v1", True, ("status", "eviction", "log"), ("po",)),
    Resource("Job", "jobs", "batch", "v1", True),
    Resource("PodDisruptionBudget", "poddisruptionbudgets", "policy", "v1", True, ("status",), ("pdb",)),
    Resource("JobSet", "jobsets", "jobset.x-k8s.io", "v1alpha2", True, custom=True),
    Resource("Workload", "workloads", "kueue.x-k8s.io", "v1beta2", True, ("status",), ("wl",), custom=True),
    # Kueue's Topology (cluster-scoped: its levels' node labels, for Topology Aware Scheduling)
    Resource("Topology", "topologies", "kueue.x-k8s.io", "v1beta2", False, (), custom=True),
    # enforced by local/k8s_admission.py
    Resource(
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "admissionregistration.k8s.io",
        "v1",
        False,
    ),
    Resource(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "admissionregistration.k8s.io",
        "v1",
        False,
        (),
    ),
)
BY_KIND: dict[str, Resource] = {r.kind: r for r in RESOURCES}

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_TERMINAL = ("Succeeded", "Failed")


class ApiError(Exception):
    """An error the API server answers with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body.update(message=self.message, reason=self.reason, code=self.code)
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(res: Resource, name: str) -> ApiError:
    details = {"name": name, "group": res.group, "kind": res.plural}
    return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found', details)


def conflict(res: Resource, name: str) -> ApiError:
    msg = (
        f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", msg, {"name": name, "group": res.group, "kind": res.plural})


def invalid(res: Resource, name: str, field: str, message: str) -> ApiError:
    cause = {"reason": "FieldValueInvalid", "message": message, "field": field}
    details = {"name": name, "group": res.group, "kind": res.kind, "causes": [cause]}
    return ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: {field}: {message}', details)


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in _TERMINAL


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _comparable(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    out.get("metadata", {}).pop("resourceVersion", None)
    return out


# Admission: (kind, object) -> None, mutating the object before it is stored (defaults, webhooks).
Admission = Callable[[str, Obj], None]
# Validation of one request's write: (old object or None, new object) -> None, or raise ApiError.
Validate = Callable[[Obj | None, Obj], None]


class Store:
    """Objects by kind, with resourceVersions, graceful deletion and a watch history."""

    def __init__(self, *, time_scale: float = 0.01, history: int = 10_000) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objs: dict[str, dict[tuple[str, str], Obj]] = {r.kind: {} for r in RESOURCES}
        self._rv = FIRST_RV
        self._events: deque[Obj] = deque(maxlen=history)
        self._floor = FIRST_RV  # watching from a resourceVersion below this is 410 Gone
        self._t0, self._offset, self.time_scale = time.monotonic(), 0.0, time_scale
        self._deadlines: dict[str, float] = {}  # pod uid -> clock time its grace period ends
        self.admission: list[Admission] = []
        self.closed = False

    # --- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        """Kubernetes seconds since the store started (frozen when ``time_scale`` is 0)."""
        running = (time.monotonic() - self._t0) / self.time_scale if self.time_scale > 0 else 0.0
        return self._offset + running

    def advance(self, seconds: float) -> None:
        with self.lock:
            self._offset += seconds

    def epoch(self) -> float:
        """The store's wall clock in epoch seconds (what its timestamps are written on)."""
        return time.time() + self._offset

    def wall(self, plus: float = 0.0) -> str:
        """An RFC 3339 timestamp on the store's clock, for metadata and conditions."""
        return iso(self.epoch() + plus)

    def grace_over(self, pod: Obj) -> bool:
        uid = pod["metadata"]["uid"]
        return uid in self._deadlines and self.now() >= self._deadlines[uid]

    @property
    def resource_version(self) -> int:
        return self._rv

    # --- reads --------------------------------------------------------------------------------
    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        res = BY_KIND[kind]
        with self.lock:
            obj = self._objs[kind].get(((namespace or "default") if res.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, kind: str, namespace: str | None = None, *, labels: str | None = None, fields: str | None = None
    ) -> list[Obj]:
        with self.lock:
            found = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objs[kind].items())
                if (namespace is None or ns == namespace)
                and labels_match(labels, obj["metadata"].get("labels"))
                and fields_match(fields, obj)
            ]
        return found

    def owned(self, owner_uid: str, kind: str | None = None) -> builtins.list[tuple[str, Obj]]:
        """(kind, object) of every object with an ownerReference to ``owner_uid``."""
        with self.lock:
            return [
                (k, copy.deepcopy(obj))
                for k, objs in self._objs.items()
                if kind is None or k == kind
                for obj in objs.values()
                if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])
            ]

    def uids(self) -> set[str]:
        """The uid of every stored object (what the garbage collector checks owners against)."""
        with self.lock:
            return {o["metadata"]["uid"] for objs in self._objs.values() for o in objs.values()}

    def exists_uid(self, uid: str) -> bool:
        return uid in self.uids()

    # --- writes -------------------------------------------------------------------------------
    def _key(self, res: Resource, obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace") or "default") if res.namespaced else "", meta["name"]

    def _commit(self, kind: str, obj: Obj, old: Obj | None) -> Obj:
        """Store a new version (or remove it once deleted and finalized) and record the event."""
        res, meta = BY_KIND[kind], obj["metadata"]
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        key = self._key(res, obj)
        gone = meta.get("deletionTimestamp") and not meta.get("finalizers")
        if gone and kind == "Pod" and meta.get("deletionGracePeriodSeconds"):
            gone = False  # the kubelet has not ended it yet
        if gone:
            self._objs[kind].pop(key, None)
            self._deadlines.pop(meta["uid"], None)
        else:
            self._objs[kind][key] = obj
        event_type = "DELETED" if gone else "MODIFIED" if old is not None else "ADDED"
        self._events.append({"rv": self._rv, "kind": kind, "type": event_type, "object": obj, "old": old})
        self.changed.notify_all()
        return copy.deepcopy(obj)

    def create(self, kind: str, obj: Obj, validate: Validate | None = None) -> Obj:
        res = BY_KIND[kind]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = res.api_version, kind
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                random.choices(string.ascii_lowercase + string.digits, k=5)
            )
        if not meta.get("name"):
            raise invalid(res, "", "metadata.name", "Required value: name or generateName is required")
        with self.lock:
            if res.namespaced:
                meta["namespace"] = meta.get("namespace") or "default"
                if ("", meta["namespace"]) not in self._objs["Namespace"]:
                    raise not_found(BY_KIND["Namespace"], meta["namespace"])
            else:
                meta.pop("namespace", None)
            if self._key(res, obj) in self._objs[kind]:
                details = {"name": meta["name"], "group": res.group, "kind": res.plural}
                raise ApiError(
                    409, "AlreadyExists", f'{res.qualified} "{meta["name"]}" already exists', details
                )
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=self.wall(), generation=1)
            for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(key, None)
            for hook in self.admission:
                hook(kind, obj)
            _validate_labels(res, obj)
            if validate is not None:
                validate(None, copy.deepcopy(obj))
            return self._commit(kind, obj, None)

    def update(
        self,
        kind: str,
        obj: Obj,
        *,
        subresource: str = "",
        check_rv: bool = True,
        validate: Validate | None = None,
    ) -> Obj:
        """Replace an object (PUT semantics), honouring resourceVersion and the status subresource;
        ``validate`` sees the object as it would be stored (validating admission runs there)."""
        res = BY_KIND[kind]
        with self.lock:
            key = self._key(res, obj)
            old = self._objs[kind].get(key)
            if old is None:
                raise not_found(res, key[1])
            sent_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if check_rv and sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(res, key[1])
            new = _merge_subresource(res, old, copy.deepcopy(obj), subresource)
            _validate_labels(res, new)
            if validate is not None:
                validate(copy.deepcopy(old), copy.deepcopy(new))
            if _comparable(new) == _comparable(old):
                return copy.deepcopy(old)
            if _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
            return self._commit(kind, new, copy.deepcopy(old))

    def mutate(self, kind: str, name: str, namespace: str | None, fn: Callable[[Obj], object]) -> Obj | None:
        """Read-modify-write for controllers: no RV check, status included; None if it is gone."""
        with self.lock:
            obj = self.get(kind, name, namespace)
            if obj is None:
                return None
            fn(obj)
            return self.update(kind, obj, subresource="*", check_rv=False)

    def delete(
        self, kind: str, name: str, namespace: str | None = None, *, options: Obj | None = None
    ) -> Obj:
        res, opts = BY_KIND[kind], options or {}
        with self.lock:
            cur = self.get(kind, name, namespace)
            if cur is None:
                raise not_found(res, name)
            check_preconditions(res, cur, opts.get("preconditions") or {})
            policy = opts.get("propagationPolicy") or ("Orphan" if opts.get("orphanDependents") else None)
            policy = policy or ("Orphan" if kind == "Job" else "Background")
            meta = cur["metadata"]
            if policy == "Orphan":
                self._orphan(meta["uid"])
            elif (
                policy == "Foreground"
                and "foregroundDeletion" not in (meta.get("finalizers") or [])
                and not meta.get("deletionTimestamp")
            ):
                meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
            if kind == "Pod":
                self._start_pod_grace(cur, opts.get("gracePeriodSeconds"))
            meta.setdefault("deletionTimestamp", self.wall())
            old = self._objs[kind][self._key(res, cur)]
            return self._commit(kind, cur, copy.deepcopy(old))

    def _start_pod_grace(self, pod: Obj, requested: Any) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        grace = (
            int(requested) if requested is not None else int(spec.get("terminationGracePeriodSeconds", 30))
        )
        if not spec.get("nodeName") or is_terminal(pod):
            grace = 0
        if meta.get("deletionGracePeriodSeconds") is not None:
            grace = min(grace, int(meta["deletionGracePeriodSeconds"]))
        if meta.get("deletionTimestamp") is None or grace < int(meta.get("deletionGracePeriodSeconds") or 0):
            meta["deletionTimestamp"] = self.wall(grace)
        meta["deletionGracePeriodSeconds"] = grace
        self._deadlines[meta["uid"]] = min(self._deadlines.get(meta["uid"], float("inf")), self.now() + grace)

    def _orphan(self, owner_uid: str) -> None:
        for kind, dep in self.owned(owner_uid):
            refs = dep["metadata"].get("ownerReferences") or []
            dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
            self.update(kind, dep, subresource="*", check_rv=False)

    # --- watch --------------------------------------------------------------------------------
    def events_after(self, kind: str, rv: int) -> builtins.list[Obj]:
        """Events of ``kind`` newer than ``rv``; 410 Gone if the history no longer reaches back."""
        with self.lock:
            floor = self._floor
            if self._events and len(self._events) == self._events.maxlen:
                floor = max(floor, self._events[0]["rv"] - 1)
            if rv < floor:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({floor})")
            return [
                e for e in itertools.dropwhile(lambda e: e["rv"] <= rv, self._events) if e["kind"] == kind
            ]

    def compact(self) -> None:
        """Forget the watch history, as an etcd compaction does: older resourceVersions are Gone."""
        with self.lock:
            self._events.clear()
            self._floor = self._rv


def check_preconditions(res: Resource, cur: Obj, pre: Obj) -> None:
    meta = cur["metadata"]
    if pre.get("uid") and pre["uid"] != meta["uid"]:
        msg = f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}"
        raise ApiError(409, "Conflict", msg, {"name": meta["name"], "group": res.group, "kind": res.plural})
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
        msg = (
            f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
            f"ResourceVersion in object meta: {meta['resourceVersion']}"
        )
        raise ApiError(409, "Conflict", msg, {"name": meta["name"], "group": res.group, "kind": res.plural})


def _merge_subresource(res: Resource, old: Obj, new: Obj, subresource: str) -> Obj:
    """What a write through the main resource or ``/status`` may change ("*": everything, internal)."""
    if subresource == "status":
        merged = copy.deepcopy(old)
        merged["status"] = new.get("status", {})
        return merged
    meta = new.setdefault("metadata", {})
    for key in ("uid", "creationTimestamp", "name", "namespace", "generation"):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
    if subresource != "*":
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        if "status" in res.subresources:
            new["status"] = copy.deepcopy(old.get("status", {}))
    new["apiVersion"], new["kind"] = res.api_version, res.kind
    return new


def _validate_labels(res: Resource, obj: Obj) -> None:
    for key, value in (obj["metadata"].get("labels") or {}).items():
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            msg = (
                f"Invalid value: {value!r}: a valid label must be an empty string or consist of alphanumeric "
                "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
            )
            raise invalid(res, obj["metadata"].get("name", ""), f"metadata.labels: {key}", msg)
