"""Compute Engine through google-cloud-compute (REST), with a configurable endpoint.

Every client honours the endpoint, including the operations client the library uses
internally to poll ExtendedOperations (reference/gcp-events.md §5); Pitstop uses the unary
methods and polls operations itself, so a long reportHostAsFaulty never blocks a request.

Every mutating method takes a ``request_id`` (pitstop.core.ids.request_id: deterministic per
incident, step and operation) and sends it as the request's ``requestId``. Compute Engine
documents the field on each of these requests: "Specify a unique request ID so that if you
must retry your request, the server will know to ignore the request if it has already been
completed" (compute_v1 ``ResetInstanceRequest.request_id`` and siblings; it must be a valid,
non-zero UUID). A retried call with the same id is recognised and not acted on again. The id
is required (keyword-only, no default): an effect without one could not be deduplicated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from pitstop.adapters import retry
from pitstop.adapters.errors import ActuatorError, from_google
from pitstop.core.domain import Vm
from pitstop.core.ids import derived_request_id

FAULTY_HOST_FAMILIES = ("a4x-", "a4-", "a3-ultragpu", "a3-megagpu", "a3-highgpu-8g")
# setLabels refused for a stale fingerprint (412): read the labels again and send once more, at once.
STALE_FINGERPRINT = retry.Policy(lambda exc: isinstance(exc, gexc.PreconditionFailed), attempts=2)
BEHAVIORS = ("UNRECOVERABLE_GPU_ERROR", "PERFORMANCE", "SILENT_DATA_CORRUPTION", "BEHAVIOR_UNSPECIFIED")


class OperationState(TypedDict):
    """A zone operation as :meth:`ComputeAdapter.operation` reads it."""

    done: bool
    error: str | None  # why a finished operation failed (its HTTP status and messages)
    type: str


class ComputeAdapter:
    def __init__(self, endpoint: str | None = None) -> None:
        # an endpoint (the local stand-in) is called anonymously; None: Google's, as the function's identity
        creds = AnonymousCredentials() if endpoint else None  # type: ignore[no-untyped-call]
        opts = ClientOptions(api_endpoint=endpoint) if endpoint else None
        self.instances = compute_v1.InstancesClient(credentials=creds, client_options=opts)
        self.zone_ops = compute_v1.ZoneOperationsClient(credentials=creds, client_options=opts)
        self.migs = compute_v1.InstanceGroupManagersClient(credentials=creds, client_options=opts)
        for client in (self.instances, self.migs):  # the library's own poller must use our endpoint too
            client._transport._extended_operations_services["zone_operations"] = self.zone_ops

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except gexc.GoogleAPICallError as exc:
            raise from_google(exc, what) from exc

    @staticmethod
    def _request_id(what: str, request_id: str) -> dict[str, str]:
        """The request's ``request_id`` field, checked: Compute accepts only a non-zero UUID."""
        try:
            parsed = uuid.UUID(request_id)
        except (ValueError, TypeError, AttributeError):
            raise ActuatorError(400, f"{what}: request id {request_id!r} is not a UUID", False) from None
        if parsed.int == 0:
            raise ActuatorError(400, f"{what}: the zero UUID is not a valid request id", False)
        return {"request_id": str(parsed)}

    def get(self, project: str, zone: str, instance: str) -> Vm:
        """The instance in snake_case: proto-plus ``to_dict`` of the library's ``Instance`` message,
        so each field has the type the message declares (the ones Pitstop reads are in ``Vm``)."""
        inst = self._call("instances.get", self.instances.get, project=project, zone=zone, instance=instance)
        return cast(Vm, compute_v1.Instance.to_dict(inst))

    def reset(self, project: str, zone: str, instance: str, *, request_id: str) -> str:
        what = "instances.reset"
        req = compute_v1.ResetInstanceRequest(
            project=project, zone=zone, instance=instance, **self._request_id(what, request_id)
        )
        op = self._call(what, self.instances.reset_unary, request=req)
        return str(op.name)

    def report_host_as_faulty(
        self,
        project: str,
        zone: str,
        instance: str,
        behavior: str,
        description: str,
        *,
        request_id: str,
    ) -> str:
        what = "instances.reportHostAsFaulty"
        if behavior not in BEHAVIORS:
            raise ActuatorError(400, f"unknown fault behavior {behavior!r}", False)
        body = compute_v1.InstancesReportHostAsFaultyRequest(
            disruption_schedule="IMMEDIATE",
            fault_reasons=[
                compute_v1.InstancesReportHostAsFaultyRequestFaultReason(
                    behavior=behavior, description=description[:256]
                )
            ],
        )
        req = compute_v1.ReportHostAsFaultyInstanceRequest(
            project=project,
            zone=zone,
            instance=instance,
            instances_report_host_as_faulty_request_resource=body,
            **self._request_id(what, request_id),
        )
        op = self._call(what, self.instances.report_host_as_faulty_unary, request=req)
        return str(op.name)

    def perform_maintenance(self, project: str, zone: str, instance: str, *, request_id: str) -> str:
        what = "instances.performMaintenance"
        req = compute_v1.PerformMaintenanceInstanceRequest(
            project=project, zone=zone, instance=instance, **self._request_id(what, request_id)
        )
        op = self._call(what, self.instances.perform_maintenance_unary, request=req)
        return str(op.name)

    def recreate(self, project: str, zone: str, mig: str, instance: str, *, request_id: str) -> str:
        what = "instanceGroupManagers.recreateInstances"
        body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(
            instances=[f"zones/{zone}/instances/{instance}"]
        )
        req = compute_v1.RecreateInstancesInstanceGroupManagerRequest(
            project=project,
            zone=zone,
            instance_group_manager=mig,
            instance_group_managers_recreate_instances_request_resource=body,
            **self._request_id(what, request_id),
        )
        op = self._call(what, self.migs.recreate_instances_unary, request=req)
        return str(op.name)

    def set_labels(
        self,
        project: str,
        zone: str,
        instance: str,
        updates: Mapping[str, str | None],
        *,
        request_id: str,
    ) -> None:
        """Merge label updates (None removes), with the fingerprint; a stale fingerprint is re-read once.

        The re-read attempt sends an id derived from ``request_id``: the first request was
        refused (412) and changed nothing, so the second is a new request, not a repeat.
        """
        what = "instances.setLabels"
        ids = iter([request_id, derived_request_id(request_id, "fingerprint-retry")])

        def attempt() -> None:
            inst = self.get(project, zone, instance)
            labels = dict(inst.get("labels", {}))
            for k, v in updates.items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
            body = compute_v1.InstancesSetLabelsRequest(
                label_fingerprint=inst.get("label_fingerprint"), labels=labels
            )
            req = compute_v1.SetLabelsInstanceRequest(
                project=project,
                zone=zone,
                instance=instance,
                instances_set_labels_request_resource=body,
                **self._request_id(what, next(ids)),
            )
            self.instances.set_labels_unary(request=req)

        try:
            retry.call(attempt, STALE_FINGERPRINT)
        except gexc.GoogleAPICallError as exc:
            raise from_google(exc, what) from exc

    def operation(self, project: str, zone: str, name: str) -> OperationState:
        op = self._call("zoneOperations.get", self.zone_ops.get, project=project, zone=zone, operation=name)
        done = op.status == compute_v1.Operation.Status.DONE
        error = None
        if done and (op.http_error_status_code or (op.error and op.error.errors)):
            msgs = [e.message for e in op.error.errors] if op.error else []
            error = f"{op.http_error_status_code} {op.http_error_message}: {'; '.join(msgs)}".strip()
        return {"done": done, "error": error, "type": str(op.operation_type)}

    @staticmethod
    def report_eligible(inst: Vm) -> tuple[bool, str]:
        """reportHostAsFaulty's documented preconditions, checked before calling it."""
        machine = str(inst.get("machine_type", "")).rsplit("/", 1)[-1]
        if not machine.startswith(FAULTY_HOST_FAMILIES):
            return False, f"machine type {machine} is not A3 High-8g/Mega/Ultra, A4 or A4X"
        if inst.get("scheduling", {}).get("provisioning_model") != "RESERVATION_BOUND":
            return False, "the VM is not reservation-bound"
        if inst.get("status") != "RUNNING":
            return False, f"the VM is {inst.get('status')}, not RUNNING"
        return True, ""

    @staticmethod
    def mig_of(inst: Mapping[str, object]) -> str | None:
        """The MIG that created the VM, from its ``created-by`` metadata item (a name, or None)."""
        meta = inst.get("metadata")
        items = meta.get("items") if isinstance(meta, Mapping) else None
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, Mapping) or item.get("key") != "created-by":
                continue
            value = item.get("value")
            if "/instanceGroupManagers/" in str(value):
                return str(value).rsplit("/", 1)[-1]
        return None
