"""Compute Engine through google-cloud-compute (REST), with a configurable endpoint.

Every client honours the endpoint, including the operations client the library uses
internally to poll ExtendedOperations (reference/gcp-events.md §5); Pitstop uses the unary
methods and polls operations itself, so a long reportHostAsFaulty never blocks a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from pitstop.adapters.errors import ActuatorError, from_google

FAULTY_HOST_FAMILIES = ("a4x-", "a4-", "a3-ultragpu", "a3-megagpu", "a3-highgpu-8g")
BEHAVIORS = ("UNRECOVERABLE_GPU_ERROR", "PERFORMANCE", "SILENT_DATA_CORRUPTION", "BEHAVIOR_UNSPECIFIED")


class ComputeAdapter:
    def __init__(self, endpoint: str | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if endpoint:
            kwargs = {
                "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
                "client_options": ClientOptions(api_endpoint=endpoint),
            }
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self.migs = compute_v1.InstanceGroupManagersClient(**kwargs)
        for client in (self.instances, self.migs):  # the library's own poller must use our endpoint too
            client._transport._extended_operations_services["zone_operations"] = self.zone_ops

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except gexc.GoogleAPICallError as exc:
            raise from_google(exc, what) from exc

    def get(self, project: str, zone: str, instance: str) -> dict[str, Any]:
        inst = self._call("instances.get", self.instances.get, project=project, zone=zone, instance=instance)
        doc: dict[str, Any] = compute_v1.Instance.to_dict(inst)
        return doc

    def reset(self, project: str, zone: str, instance: str) -> str:
        op = self._call(
            "instances.reset", self.instances.reset_unary, project=project, zone=zone, instance=instance
        )
        return str(op.name)

    def report_host_as_faulty(
        self, project: str, zone: str, instance: str, behavior: str, description: str
    ) -> str:
        if behavior not in BEHAVIORS:
            raise ActuatorError(400, f"unknown fault behavior {behavior!r}", False)
        req = compute_v1.InstancesReportHostAsFaultyRequest(
            disruption_schedule="IMMEDIATE",
            fault_reasons=[
                compute_v1.InstancesReportHostAsFaultyRequestFaultReason(
                    behavior=behavior, description=description[:256]
                )
            ],
        )
        op = self._call(
            "instances.reportHostAsFaulty",
            self.instances.report_host_as_faulty_unary,
            project=project,
            zone=zone,
            instance=instance,
            instances_report_host_as_faulty_request_resource=req,
        )
        return str(op.name)

    def perform_maintenance(self, project: str, zone: str, instance: str) -> str:
        op = self._call(
            "instances.performMaintenance",
            self.instances.perform_maintenance_unary,
            project=project,
            zone=zone,
            instance=instance,
        )
        return str(op.name)

    def recreate(self, project: str, zone: str, mig: str, instance: str) -> str:
        req = compute_v1.InstanceGroupManagersRecreateInstancesRequest(
            instances=[f"zones/{zone}/instances/{instance}"]
        )
        op = self._call(
            "instanceGroupManagers.recreateInstances",
            self.migs.recreate_instances_unary,
            project=project,
            zone=zone,
            instance_group_manager=mig,
            instance_group_managers_recreate_instances_request_resource=req,
        )
        return str(op.name)

    def set_labels(self, project: str, zone: str, instance: str, updates: Mapping[str, str | None]) -> None:
        """Merge label updates (None removes), with the fingerprint; a stale fingerprint is re-read once."""
        for attempt in range(2):
            inst = self.get(project, zone, instance)
            labels = dict(inst.get("labels") or {})
            for k, v in updates.items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
            req = compute_v1.InstancesSetLabelsRequest(
                label_fingerprint=inst.get("label_fingerprint"), labels=labels
            )
            try:
                self.instances.set_labels_unary(
                    project=project, zone=zone, instance=instance, instances_set_labels_request_resource=req
                )
                return
            except gexc.PreconditionFailed as exc:
                if attempt == 1:
                    raise from_google(exc, "instances.setLabels") from exc
            except gexc.GoogleAPICallError as exc:
                raise from_google(exc, "instances.setLabels") from exc

    def operation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        op = self._call("zoneOperations.get", self.zone_ops.get, project=project, zone=zone, operation=name)
        done = op.status == compute_v1.Operation.Status.DONE
        error = None
        if done and (op.http_error_status_code or (op.error and op.error.errors)):
            msgs = [e.message for e in op.error.errors] if op.error else []
            error = f"{op.http_error_status_code} {op.http_error_message}: {'; '.join(msgs)}".strip()
        return {"done": done, "error": error, "type": op.operation_type}

    @staticmethod
    def report_eligible(inst: Mapping[str, Any]) -> tuple[bool, str]:
        """reportHostAsFaulty's documented preconditions, checked before calling it."""
        machine = str(inst.get("machine_type", "")).rsplit("/", 1)[-1]
        if not machine.startswith(FAULTY_HOST_FAMILIES):
            return False, f"machine type {machine} is not A3 High-8g/Mega/Ultra, A4 or A4X"
        if (inst.get("scheduling") or {}).get("provisioning_model") != "RESERVATION_BOUND":
            return False, "the VM is not reservation-bound"
        if inst.get("status") != "RUNNING":
            return False, f"the VM is {inst.get('status')}, not RUNNING"
        return True, ""

    @staticmethod
    def mig_of(inst: Mapping[str, Any]) -> str | None:
        for item in (inst.get("metadata") or {}).get("items", []):
            if item.get("key") == "created-by" and "/instanceGroupManagers/" in str(item.get("value")):
                return str(item["value"]).rsplit("/", 1)[-1]
        return None
