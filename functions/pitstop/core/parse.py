"""LogEntry → the facts of a FaultEvent (kind, node, GPU, detail, trust); the action comes later.

Pure and total: every input yields an event, broken ones as ``invalid`` with a reason. A
driver line is a GPU Xid (``gpu_xid``) or an NVSwitch SXid (``nvswitch_sxid``) whenever its
code can be read, however odd its other fields (core/xid_line.py); a line whose code cannot
be read is ``invalid``, and keeps the node its envelope names, so it is recorded against it.
Node identity is validated here because these strings later reach API paths, Slurm
reasons, node lists and labels. Evidence is checked here too (DESIGN.md, "Believe evidence
only after checking it"):

* a driver line is ``verified`` only from the systemd journal's kernel transport
  (core/trust.py); text syslog and other journal transports are ``unverified``;
* a system event counts only from Compute Engine's own ``system_event`` audit log of the
  entry's project, written by ``compute.googleapis.com`` for ``system@google.com``;
  anything else that claims to be one is ``invalid``.

A GKE entry (``k8s_node``) names the cluster's location, never the node's zone: for a regional
cluster that is a region, and a zonal cluster may place nodes in other zones too (its node
locations: cloud.google.com/kubernetes-engine/docs/concepts/types-of-clusters, multi-zonal). Such
an event keeps ``node.region``, ``node.zone: null`` and, for a zonal cluster, ``node.location``
(the cluster's zone): ingest fills the zone from the node itself (adapters/gke/zone.py) before
the engine sees it (issue 35: the cluster's zone was taken for every node).

One message is cut to 64 KiB (UTF-8) before any pattern sees it, and the event says so.
"""

from __future__ import annotations

import re
from typing import Any, cast

from pitstop.core import names, trust
from pitstop.core.domain import (
    DriverLine,
    EventDetail,
    GpuRef,
    NodeRef,
    Source,
    SxidDetail,
    SxidLine,
    SystemEventDetail,
    XidDetail,
    XidLine,
)
from pitstop.core.entry import (
    MAX_LOG_NAME,
    MAX_RESOURCE_NAME,
    VERTEX_RESOURCE,
    Event,
    Raw,
    _ts,
    bounded_text,
    clean,
    invalid,
    new_event,
    new_source,
)
from pitstop.core.envelope import Delivery
from pitstop.core.sxid_line import parse_sxid
from pitstop.core.xid_line import MAX_LINE, MAX_MESSAGE, parse_nvrm

SYSTEM_EVENT_LOG_ID = "cloudaudit.googleapis.com%2Fsystem_event"  # URL-encoded, as Cloud Logging stores it
COMPUTE_SERVICE = "compute.googleapis.com"
GOOGLE_PRINCIPAL = "system@google.com"
WHY_SYSTEM_EVENT = (
    f"Compute Engine system event: the project's own {SYSTEM_EVENT_LOG_ID} log,"
    f" serviceName {COMPUTE_SERVICE}, principal {GOOGLE_PRINCIPAL}"
)
INTERNAL_ERROR = "internal parser error"  # the last guard; tests assert it never fires
RESOURCE_NAME_LABEL = "compute.googleapis.com/resource_name"
GKE_RESOURCES = ("k8s_node", "k8s_cluster", "k8s_pod", "k8s_container")  # labelled by cluster location
_AUDIT_RESOURCE = re.compile(r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)")
_LOG_PROJECT = re.compile(r"projects/([^/]+)/logs/")
_METHOD = re.compile(r"compute\.instances\.[A-Za-z]{1,64}", re.ASCII)
_ENUM_WORD = re.compile(r"[A-Z][A-Z_]{0,31}", re.ASCII)


def _labels(v: object) -> Raw:
    return v if isinstance(v, dict) else {}


def _audit_match(proto: Raw | None) -> re.Match[str] | None:
    rn = proto.get("resourceName") if proto is not None else None
    if not isinstance(rn, str) or len(rn) > MAX_RESOURCE_NAME:
        return None
    return _AUDIT_RESOURCE.fullmatch(rn)


def _log_project(entry: Raw) -> Any:
    """The project whose log holds the entry (``projects/<p>/logs/...``), or None."""
    ln = entry.get("logName")
    lm = _LOG_PROJECT.match(ln[:MAX_LOG_NAME]) if isinstance(ln, str) else None
    return lm.group(1) if lm else None


def _project(rl: Raw, log_project: Any, audit: re.Match[str] | None) -> Any:
    project = rl.get("project_id")
    if project is None:
        project = log_project if log_project is not None else (audit.group(1) if audit else None)
    return project


def project_mismatch(log_project: Any, project: Any) -> str | None:
    """Why an entry whose log lives in one project but whose resource names another is no evidence.

    Logging writes an entry into the log of the project the writer named; a folder or organization
    sink routes every project's entries: one project's writer must not speak for another's VMs.
    """
    if isinstance(log_project, str) and project is not None and log_project != project:
        return (
            f"logName is in project {clean(log_project, 64)} but the resource is in {clean(str(project), 64)}"
        )
    return None


def _identify(
    instance: Any,
    zone: Any,
    rtype: Any,
    has_zone_label: bool,
    project: Any,
    log_project: Any,
    instance_id: Any,
    cluster: Any,
) -> tuple[NodeRef | None, str]:
    region = location = None
    if rtype in GKE_RESOURCES and not has_zone_label and names.valid_region(zone):
        # A regional GKE cluster's entries name its region (reference/gke.md §1): the zone is
        # looked up later from the node (adapters/gke/zone.py), before anything acts on it.
        region, zone = zone, None
    elif rtype in GKE_RESOURCES and not has_zone_label and names.valid_zone(zone):
        # A zonal cluster's location is its own zone, not its node's (extra node locations)
        location, region, zone = zone, str(zone).rsplit("-", 1)[0], None
    problem = names.instance_problem(instance)
    if problem is not None:
        return None, problem
    if region is None and not names.valid_zone(zone):
        return None, "zone is missing or not a valid Compute Engine zone"
    if not names.valid_project(project):
        return None, "project is missing or not a valid project id"
    mismatch = project_mismatch(log_project, project)
    if mismatch is not None:
        return None, mismatch
    if instance_id is not None and not names.valid_instance_id(instance_id):
        return None, "instance_id is not numeric"
    node: NodeRef = {
        "project": project,
        "zone": zone,
        "instance": instance,
        "instance_id": instance_id,
    }
    if region is not None:
        node["region"] = region
    if location is not None:
        node["location"] = location
    if cluster is not None:
        if not names.valid_cluster(cluster):
            return None, "cluster_name is not a valid cluster name"
        node["cluster"] = cluster
    return node, ""


# Validated identities by the raw values they came from: a storm names a few nodes a million
# times, and validating each name costs more than the rest of the parse. Bounded; cleared when full.
# Values of other types than str may share a key (1 == True) only with values as invalid as they.
_NODES: dict[tuple[Any, ...], tuple[NodeRef | None, str]] = {}
MAX_NODE_MEMO = 4096


def identify_node(entry: Raw, proto: Raw | None) -> tuple[NodeRef | None, str]:
    """(node, "") or (None, why not). Sources in the order the brief gives them."""
    res = entry.get("resource")
    rl = _labels(res.get("labels") if isinstance(res, dict) else None)
    labels = _labels(entry.get("labels"))
    audit = _audit_match(proto)
    instance = labels.get(RESOURCE_NAME_LABEL) or rl.get("node_name") or (audit.group(3) if audit else None)
    if instance is None:
        return None, "the node cannot be identified (no resource_name label, node_name or audit resourceName)"
    zone = rl.get("zone") or rl.get("location") or (audit.group(2) if audit else None)
    rtype = res.get("type") if isinstance(res, dict) else None
    log_project = _log_project(entry)
    project = _project(rl, log_project, audit)
    key = (
        instance,
        zone,
        rtype,
        "zone" in rl,
        project,
        log_project,
        rl.get("instance_id"),
        rl.get("cluster_name"),
    )
    try:
        hit = _NODES.get(key)
    except TypeError:  # a list or object where a name belongs: judged, not remembered
        hit = _identify(*key)
    else:
        if hit is None:
            if len(_NODES) >= MAX_NODE_MEMO:
                _NODES.clear()
            hit = _NODES[key] = _identify(*key)
    node, why = hit
    return (node.copy() if node else None), why


def _maintenance_detail(proto: Raw) -> SystemEventDetail:
    md = _labels(proto.get("metadata"))
    inner = md.get("upcomingMaintenance")
    if isinstance(inner, dict):
        md = {**md, **inner}
    status = proto.get("status")
    status_msg = status.get("message") if isinstance(status, dict) else None

    def word(v: Any) -> str | None:
        return v if isinstance(v, str) and _ENUM_WORD.fullmatch(v) else None

    return {
        "maintenance_status": word(md.get("maintenanceStatus")),
        "maintenance_type": word(md.get("type")),
        "window_start": _ts(md.get("windowStartTime")),
        "window_end": _ts(md.get("windowEndTime")),
        "completed": isinstance(status_msg, str) and "has completed" in status_msg[:MAX_LINE],
    }


def system_event_problem(entry: Raw, proto: Raw) -> str | None:
    """Why an entry that claims to be a Compute Engine system event is not Google's; None if it is."""
    res = entry.get("resource")
    project = _labels(res.get("labels") if isinstance(res, dict) else None).get("project_id")
    if not names.valid_project(project):
        return "system event without a valid resource.labels.project_id"
    if entry.get("logName") != f"projects/{project}/logs/{SYSTEM_EVENT_LOG_ID}":
        return (
            "not Compute Engine's system event log: the log name must be exactly"
            f" projects/<the entry's project>/logs/{SYSTEM_EVENT_LOG_ID}"
        )
    if proto.get("serviceName") != COMPUTE_SERVICE:
        return (
            f"system event not written by Compute Engine: protoPayload.serviceName is not {COMPUTE_SERVICE}"
        )
    auth = proto.get("authenticationInfo")
    if not isinstance(auth, dict) or auth.get("principalEmail") != GOOGLE_PRINCIPAL:
        return (
            "system event not authored by Google: protoPayload.authenticationInfo.principalEmail"
            f" is not {GOOGLE_PRINCIPAL}"
        )
    return None


def _system_event(entry: Raw, source: Source, observed_at: str | None) -> Event:
    proto = entry.get("protoPayload")
    if not isinstance(proto, dict):
        source["trust_reason"] = "no protoPayload: not an audit log entry"
        return invalid("system event entry without a protoPayload object", source)
    problem = system_event_problem(entry, proto)
    if problem is not None:
        source["trust_reason"] = problem
        return invalid(problem, source, observed_at=observed_at)
    source["trust"], source["trust_reason"] = trust.VERIFIED, WHY_SYSTEM_EVENT
    method = proto.get("methodName")
    if not isinstance(method, str) or not _METHOD.fullmatch(method):
        why = "system event not about a Compute Engine instance"
        return new_event("unrelated", why, source, observed_at=observed_at)
    node, why = identify_node(entry, proto)
    if node is None:
        return invalid(why, source, observed_at=observed_at)
    detail: SystemEventDetail = {"method": method}
    status = proto.get("status")
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        detail["status_message"] = clean(status["message"], MAX_MESSAGE)
    if "aintenance" in method:
        detail.update(_maintenance_detail(proto))
    # "system_event" is provisional: the classifier maps the method to its kind.
    facts = _as_detail(detail)
    return new_event("system_event", method, source, node=node, observed_at=observed_at, detail=facts)


# Parsed driver lines by their text: a storm repeats one line verbatim (a journal MESSAGE has no
# time in it) hundreds of thousands of times. Short lines only, bounded, cleared when full; each
# caller gets its own copy of the facts, so the remembered ones never change.
_LINES: dict[str, DriverLine | None] = {}
MAX_LINE_MEMO, MAX_MEMO_TEXT = 1024, 512


def _copy(parsed: DriverLine | None) -> DriverLine | None:
    if parsed is None or "error" in parsed:
        return parsed if parsed is None else parsed.copy()
    if "sxid" in parsed:
        sxid = parsed.copy()
        sxid["detail"] = parsed["detail"].copy()
        return sxid
    out = parsed.copy()
    out["detail"] = parsed["detail"].copy()
    if out["mig"] is not None:
        out["mig"] = out["mig"].copy()
    return out


_MARKERS = ("NVRM", "nvidia-nvswitch", "SXid")  # where the parsers' patterns can start


def _driver_line(text: str) -> DriverLine | None:
    """A GPU driver (NVRM) or NVSwitch driver (SXid) line, parsed; None if it is neither.

    Remembered by the text from its first driver marker on: what precedes it (a syslog header,
    the kernel's time) changes from line to line and no pattern reads it, except the words
    "fallen off the bus", which keep the whole line as the key.
    """
    if "NVRM" not in text and "SXid" not in text:
        return None  # most noise: no parser would read it
    anchor = len(text)
    for marker in _MARKERS:  # the first marker: each search stops where the best so far starts
        i = text.find(marker, 0, anchor)
        if i >= 0:
            anchor = i
    key = text[anchor:] if anchor and "fallen off the bus" not in text[:anchor] else text
    if len(key) > MAX_MEMO_TEXT:
        return _read_driver_line(key)
    if key not in _LINES:
        if len(_LINES) >= MAX_LINE_MEMO:
            _LINES.clear()
        _LINES[key] = _read_driver_line(key)
    return _copy(_LINES[key])


def _read_driver_line(text: str) -> DriverLine | None:
    """The parse itself. A line that mentions both drivers is whichever has a code that can be read."""
    parsed = parse_nvrm(text)
    if (parsed is None or "error" in parsed) and "SXid" in text:
        sxid = parse_sxid(text)
        if sxid is not None and (parsed is None or "error" not in sxid):
            return sxid
    return parsed


def _as_detail(facts: XidDetail | SxidDetail | SystemEventDetail) -> EventDetail:
    """A driver line's facts as its event's kind-specific ``detail`` (the same dict)."""
    return cast(EventDetail, facts)  # one kind's keys of the schema's ``detail``


def _fault_event(parsed: XidLine | SxidLine, node: NodeRef, source: Source, **fields: Any) -> Event:
    if "sxid" in parsed:  # an NVSwitch: it names no GPU; its own address stays in the detail
        return new_event(
            "nvswitch_sxid", "", source, node=node, detail=_as_detail(parsed["detail"]), **fields
        )
    gpu: GpuRef | None = None
    if parsed["pci"] is not None:
        gpu = {"pci": parsed["pci"]}
        if parsed["mig"] is not None:
            gpu["mig"] = parsed["mig"]
    detail = _as_detail(parsed["detail"])
    return new_event("gpu_xid", "", source, xid=parsed["xid"], node=node, gpu=gpu, detail=detail, **fields)


def _text_event(entry: Raw, source: Source, observed_at: str | None) -> Event:
    prov = trust.text_provenance(entry)
    source["trust"], source["trust_reason"] = prov.trust, prov.reason
    if prov.text is None:
        why = "no text payload and not a system event"
        return new_event("unrelated", why, source, observed_at=observed_at)
    text, original = bounded_text(prov.text)
    cut: EventDetail = {"truncated": True, "original_bytes": original} if original else {}
    parsed = _driver_line(text)
    if parsed is None:
        why = "not a GPU driver fault line"
        return new_event("unrelated", why, source, observed_at=observed_at, detail=cut)
    node, why = identify_node(entry, None)
    if "error" in parsed:  # undecodable, but still recorded against the node the envelope names
        return invalid(parsed["error"], source, observed_at=observed_at, node=node, detail=cut)
    if node is None:
        return invalid(why, source, observed_at=observed_at, detail=cut)
    if original:  # the same facts as ``cut``
        parsed["detail"].update({"truncated": True, "original_bytes": original})
    return _fault_event(parsed, node, source, observed_at=observed_at)


def _claims_system_event(entry: Raw) -> bool:
    """Anything that looks like an audit entry is judged as a system event, strictly."""
    ln = entry.get("logName")
    named = isinstance(ln, str) and ("cloudaudit" in ln or "system_event" in ln)
    return "protoPayload" in entry or named


def _parse(entry: Raw, delivery: Delivery | None) -> Event:
    source = new_source(
        entry.get("logName"), entry.get("insertId"), delivery.message_id if delivery else None
    )
    observed_at = (
        _ts(entry.get("timestamp"))
        or _ts(entry.get("receiveTimestamp"))
        or (_ts(delivery.publish_time) if delivery else None)
    )
    if _claims_system_event(entry):
        return _system_event(entry, source, observed_at)
    if _labels(entry.get("resource")).get("type") == VERTEX_RESOURCE:
        from pitstop.core import vertex_log  # it builds its events with this module's helpers

        return vertex_log.parse_vertex_entry(entry, source["message_id"], observed_at)
    return _text_event(entry, source, observed_at)


def parse_entry(entry: Raw, delivery: Delivery | None = None) -> Event:
    """One LogEntry → one event; never raises."""
    try:
        return _parse(entry, delivery)
    except Exception as exc:  # the last guard of "never raises"; the fuzz tests keep it idle
        return invalid(f"{INTERNAL_ERROR}: {type(exc).__name__}")
