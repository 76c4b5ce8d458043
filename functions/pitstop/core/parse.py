"""LogEntry → the facts of a FaultEvent (kind, node, GPU, detail); the action comes later.

Pure and total: every input yields an event, broken ones as ``invalid`` with a reason.
Node identity is validated here because these strings later reach API paths, Slurm
reasons and labels.
"""

from __future__ import annotations

import re
from typing import Any

from pitstop.core import names
from pitstop.core.envelope import Delivery
from pitstop.core.xid_line import MAX_MESSAGE, parse_nvrm

SYSTEM_EVENT_LOG_IDS = ("cloudaudit.googleapis.com%2Fsystem_event", "cloudaudit.googleapis.com/system_event")
RESOURCE_NAME_LABEL = "compute.googleapis.com/resource_name"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)")
_AUDIT_RESOURCE = re.compile(r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)")
_LOG_PROJECT = re.compile(r"projects/([^/]+)/logs/")

Event = dict[str, Any]


def _ts(v: Any) -> str | None:
    return v if isinstance(v, str) and _TIMESTAMP.fullmatch(v) else None


def new_event(kind: str, reason: str, source: dict[str, Any] | None = None, **fields: Any) -> Event:
    """A FaultEvent with every key present (the schema requires them all)."""
    ev: Event = {
        "kind": kind,
        "action": "NONE",
        "xid": None,
        "node": None,
        "gpu": None,
        "observed_at": None,
        "source": source or {"log_name": None, "insert_id": None, "message_id": None},
        "reason": reason,
        "detail": {},
    }
    ev.update(fields)
    return ev


def invalid(reason: str, source: dict[str, Any] | None = None) -> Event:
    return new_event("invalid", reason[:512], source)


def _text_payload(entry: dict[str, Any]) -> str | None:
    jp = entry.get("jsonPayload")
    if isinstance(jp, dict):
        for key in ("message", "MESSAGE"):
            v = jp.get(key)
            if isinstance(v, str):
                return v
    tp = entry.get("textPayload")
    return tp if isinstance(tp, str) else None


def identify_node(entry: dict[str, Any], proto: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """(node, "") or (None, why not). Sources in the order the brief gives them."""
    res = entry.get("resource")
    rl = res.get("labels") if isinstance(res, dict) else None
    rl = rl if isinstance(rl, dict) else {}
    labels = entry.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    audit = None
    if proto is not None and isinstance(proto.get("resourceName"), str):
        audit = _AUDIT_RESOURCE.fullmatch(proto["resourceName"])
    instance = labels.get(RESOURCE_NAME_LABEL) or rl.get("node_name") or (audit.group(3) if audit else None)
    if instance is None:
        return None, "the node cannot be identified (no resource_name label, node_name or audit resourceName)"
    zone = rl.get("zone") or rl.get("location") or (audit.group(2) if audit else None)
    project = rl.get("project_id")
    if project is None:
        lm = _LOG_PROJECT.match(entry.get("logName") or "") if isinstance(entry.get("logName"), str) else None
        project = lm.group(1) if lm else (audit.group(1) if audit else None)
    instance_id = rl.get("instance_id")
    if not names.valid_instance(instance):
        return None, "instance name is not a valid Compute Engine name"
    if not names.valid_zone(zone):
        return None, "zone is missing or not a valid Compute Engine zone"
    if not names.valid_project(project):
        return None, "project is missing or not a valid project id"
    if instance_id is not None and not names.valid_instance_id(instance_id):
        return None, "instance_id is not numeric"
    node: dict[str, Any] = {
        "project": project,
        "zone": zone,
        "instance": instance,
        "instance_id": instance_id,
    }
    cluster = rl.get("cluster_name")
    if cluster is not None:
        if not names.valid_cluster(cluster):
            return None, "cluster_name is not a valid cluster name"
        node["cluster"] = cluster
    return node, ""


def _maintenance_detail(proto: dict[str, Any]) -> dict[str, Any]:
    md = proto.get("metadata")
    md = md if isinstance(md, dict) else {}
    inner = md.get("upcomingMaintenance")
    if isinstance(inner, dict):
        md = {**md, **inner}
    status = proto.get("status")
    status_msg = status.get("message") if isinstance(status, dict) else None
    d: dict[str, Any] = {
        "maintenance_status": md.get("maintenanceStatus")
        if isinstance(md.get("maintenanceStatus"), str)
        else None,
        "maintenance_type": md.get("type") if isinstance(md.get("type"), str) else None,
        "window_start": _ts(md.get("windowStartTime")),
        "window_end": _ts(md.get("windowEndTime")),
        "completed": isinstance(status_msg, str) and "has completed" in status_msg,
    }
    return d


def parse_entry(entry: dict[str, Any], delivery: Delivery | None = None) -> Event:
    log_name = entry.get("logName")
    insert_id = entry.get("insertId")
    source = {
        "log_name": log_name[:512] if isinstance(log_name, str) else None,
        "insert_id": insert_id[:256] if isinstance(insert_id, str) else None,
        "message_id": delivery.message_id if delivery else None,
    }
    observed_at = (
        _ts(entry.get("timestamp"))
        or _ts(entry.get("receiveTimestamp"))
        or (_ts(delivery.publish_time) if delivery else None)
    )
    if isinstance(log_name, str) and log_name.endswith(SYSTEM_EVENT_LOG_IDS):
        proto = entry.get("protoPayload")
        if not isinstance(proto, dict):
            return invalid("system_event entry without a protoPayload", source)
        method = proto.get("methodName")
        if not isinstance(method, str) or not method.startswith("compute.instances."):
            return new_event(
                "unrelated",
                "system event not about a Compute Engine instance",
                source,
                observed_at=observed_at,
            )
        node, why = identify_node(entry, proto)
        if node is None:
            return invalid(why, source)
        detail: dict[str, Any] = {"method": method[:128]}
        status = proto.get("status")
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            detail["status_message"] = status["message"][:MAX_MESSAGE]
        if "aintenance" in method:
            detail.update(_maintenance_detail(proto))
        # "system_event" is provisional: the classifier maps the method to its kind.
        return new_event("system_event", method, source, node=node, observed_at=observed_at, detail=detail)
    text = _text_payload(entry)
    if text is None:
        return new_event(
            "unrelated", "no text payload and not a system event", source, observed_at=observed_at
        )
    parsed = parse_nvrm(text)
    if parsed is None:
        return new_event("unrelated", "not a GPU driver fault line", source, observed_at=observed_at)
    if "error" in parsed:
        return invalid(parsed["error"], source)
    node, why = identify_node(entry, None)
    if node is None:
        return invalid(why, source)
    gpu = None
    if parsed["pci"] is not None:
        gpu = {"pci": parsed["pci"]}
        if parsed["mig"] is not None:
            gpu["mig"] = parsed["mig"]
    return new_event(
        "gpu_xid",
        "",
        source,
        xid=parsed["xid"],
        node=node,
        gpu=gpu,
        observed_at=observed_at,
        detail=parsed["detail"],
    )
