"""The fault trace: one seeded draw of what breaks where and when, shared by every strategy.

Faults carry their own random draws (human delays, recurrence delays), so each strategy sees
the same numbers for the same fault whatever it does. Xid faults also carry the kernel lines
they log, which the Pitstop strategy feeds to the real classifier as LogEntries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TypedDict

from pitstop.local.compute_shapes import AuditLog, LogOperation, LogResource
from pitstop.tools.sim.scenario import Category, Scenario

PROJECT = "train-prod"
ZONE = "us-central1-a"

# Named kernel lines a scenario's bursts may use (formats as the driver logs them; see
# tests/fixtures/xid_lines.yaml for their sources). {pci} is the failing GPU's bus id.
LINES = {
    "xid13": "NVRM: Xid (PCI:{pci}): 13, pid=4211, name=python, Graphics SM Warp Exception on "
    "(GPC 1, TPC 3, SM 0): Out Of Range Address",
    "xid31": "NVRM: Xid (PCI:{pci}): 31, pid=2512125, name=python3, Ch 00000008, intr 00000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE",
    "xid48_dram": "NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
    "xid48_sram": "NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable ECC "
    "error has been detected on GPU in GSP-RISCV location 3",
    "xid63": "NVRM: Xid (PCI:{pci}): 63, pid=1850, Row Remapper: New row marked for remapping, reset gpu "
    "to activate",
    "xid64_remap": "NVRM: Xid (PCI:{pci}): 64, pid='<unknown>', name=<unknown>, Row Remapper Error: (0x1f) "
    "- Row Remapping table is full",
    "xid74": "NVRM: Xid (PCI:{pci}): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected "
    "on link 1",
    "xid79": "NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "xid119": "NVRM: Xid (PCI:{pci}): 119, pid=123417, name=nv-hostengine, Timeout after 6s of waiting "
    "for RPC response from GPU0 GSP! Expected function 10 (FREE) (0xc0000005 0x0).",
}
GPU_PCI = ("0000:1b:00", "0000:3b:00", "0000:5f:00", "0000:61:00", "0000:a1:00", "0000:b5:00")
METHODS = {
    "host_error": "compute.instances.hostError",
    "maintenance": "compute.instances.upcomingMaintenance",
}


class SimNode(TypedDict):
    """A simulated node's Compute Engine identity (every field known: one project and zone)."""

    project: str
    zone: str
    instance: str
    instance_id: str


# -- the LogEntries the trace writes, in Cloud Logging's JSON shape (what the sink router delivers) --


class KernelEntry(TypedDict):
    """A driver line as the Ops Agent's journald receiver ships it."""

    insertId: str
    jsonPayload: dict[str, str]
    labels: dict[str, str]
    logName: str
    resource: LogResource
    severity: str
    timestamp: str


class SystemEventEntry(TypedDict):
    """A Compute Engine system event: an audit log entry."""

    insertId: str
    protoPayload: AuditLog
    resource: LogResource
    timestamp: str
    severity: str
    logName: str
    operation: LogOperation


@dataclass(frozen=True)
class Fault:
    """One fault on one physical node. ``t`` is when it strikes (a maintenance notice: when
    the notice arrives; the window opens ``notice`` seconds later)."""

    id: str
    t: float
    node: int
    category: str
    signal: str  # xid | host_error | maintenance | hang | straggler | none
    burst: tuple[str, ...]
    needs: str  # the weakest action that truly fixes it
    pci: str
    human_s: float  # how long a person takes to notice this one (a straggler: durations.straggler_human)
    recur_s: float  # if left unfixed, it comes back this long after the node returns
    gen: int = 0  # 0: from the trace; n: the n-th recurrence of an unfixed fault


def node_name(i: int) -> str:
    return f"a3-node-{i:05d}"


def node_ref(i: int) -> SimNode:
    return {"project": PROJECT, "zone": ZONE, "instance": node_name(i), "instance_id": str(7_000_000_000 + i)}


def _resource(i: int) -> LogResource:
    return {
        "type": "gce_instance",
        "labels": {"instance_id": str(7_000_000_000 + i), "project_id": PROJECT, "zone": ZONE},
    }


def kernel_entry(line: str, node: int, insert_id: str) -> KernelEntry:
    """A driver line as Pitstop's Ops Agent journald receiver ships it (kernel transport: verified)."""
    return {
        "insertId": insert_id,
        "jsonPayload": {
            "MESSAGE": line,
            "SYSLOG_IDENTIFIER": "kernel",
            "_TRANSPORT": "kernel",
            "PRIORITY": "4",
        },
        "labels": {"compute.googleapis.com/resource_name": node_name(node)},
        "logName": f"projects/{PROJECT}/logs/pitstop-kernel",
        "resource": _resource(node),
        "severity": "WARNING",
        "timestamp": "2026-11-21T10:42:31.325309Z",
    }


def system_event_entry(method: str, node: int, insert_id: str) -> SystemEventEntry:
    """A Compute Engine system event in its real audit-log shape (reference/gcp-events.md §1)."""
    proto: AuditLog = {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "status": {"message": "Instance terminated by Compute Engine."},
        "authenticationInfo": {"principalEmail": "system@google.com"},
        "serviceName": "compute.googleapis.com",
        "methodName": method,
        "resourceName": f"projects/{PROJECT}/zones/{ZONE}/instances/{node_name(node)}",
        "request": {"@type": f"type.googleapis.com/{method}"},
    }
    if method.endswith("upcomingMaintenance"):
        proto["status"] = {"message": "Maintenance is scheduled for this instance."}
        proto["metadata"] = {
            "maintenanceStatus": "PENDING",
            "type": "SCHEDULED",
            "windowStartTime": "2026-11-23T19:00:00Z",
            "windowEndTime": "2026-11-23T22:00:00Z",
        }
    return {
        "insertId": insert_id,
        "protoPayload": proto,
        "resource": _resource(node),
        "timestamp": "2026-11-21T10:42:31.325309Z",
        "severity": "INFO",
        "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "operation": {"id": f"systemevent-{insert_id}", "producer": method, "first": True, "last": True},
    }


def entries(f: Fault) -> list[KernelEntry] | list[SystemEventEntry]:
    """The LogEntries a fault writes, in order, each with its own insertId."""
    if f.signal == "xid":
        return [
            kernel_entry(LINES[name].format(pci=f.pci), f.node, f"{f.id}-{k}")
            for k, name in enumerate(f.burst)
        ]
    if f.signal in METHODS:
        return [system_event_entry(METHODS[f.signal], f.node, f"{f.id}-0")]
    return []


def category_rates(scn: Scenario) -> dict[str, float]:
    """Faults per node per second, by category: the table's counts per node-day, rescaled to
    a preset's total when the scenario names one. Stragglers keep their own rate: they interrupt
    nothing, so a failure rate (Kokolis et al.'s) does not count them."""
    faults = scn["faults"]
    basis = faults["basis"]["nodes"] * faults["basis"]["days"]
    per_node_day = {name: c["count"] / basis for name, c in faults["categories"].items()}
    rate = faults["rate"]
    if rate != "llama3":
        failing = {k for k, c in faults["categories"].items() if c["signal"] != "straggler"}
        total = sum(v for k, v in per_node_day.items() if k in failing)
        target = faults["presets_per_1000_node_days"][rate] / 1000.0
        per_node_day = {
            k: v * target / total if total and k in failing else v for k, v in per_node_day.items()
        }
    return {k: v / 86400.0 for k, v in per_node_day.items()}


def _draw_needs(rnd: random.Random, needs: dict[str, float] | None) -> str:
    if not needs:
        return "RESTART_JOB"
    total = sum(needs.values())
    x = rnd.random() * total
    for action, w in needs.items():
        x -= w
        if x < 0:
            return action
    return next(reversed(needs))


def _human_s(scn: Scenario, u: float, signal: str = "xid") -> float:
    lo, hi = scn["durations"]["straggler_human" if signal == "straggler" else "human_detect"]
    return float(lo + (hi - lo) * u) * 60.0


def _needs(scn: Scenario, fid: str, cat: Category, rnd: random.Random) -> str:
    """What truly fixes the fault. Xids draw from the trace's own sequence; a hang or a straggler
    from a sequence of its own (a fault class added to the table leaves the others' draws alone)."""
    if cat["signal"] == "xid":
        return _draw_needs(rnd, cat.get("needs"))
    if cat["signal"] in ("hang", "straggler"):
        return _draw_needs(random.Random(f"{scn['seed']}:{fid}:needs"), cat.get("needs"))  # noqa: S311
    return "RESTART_JOB"


def generate(scn: Scenario) -> list[Fault]:
    """Poisson arrivals over every physical node (job nodes and spares) for the scenario's days."""
    rnd = random.Random(scn["seed"])  # noqa: S311 - a reproducible trace, not a secret
    rates = category_rates(scn)
    names = sorted(rates)
    weights = [rates[n] for n in names]
    physical = scn["fleet"]["nodes"] + scn["fleet"]["spares"]
    total = sum(weights) * physical
    horizon = scn["days"] * 86400.0
    recur_mean = scn["faults"]["recur_mean_h"] * 3600.0
    out: list[Fault] = []
    t = 0.0
    while total > 0:
        t += rnd.expovariate(total)
        if t >= horizon:
            break
        name = rnd.choices(names, weights)[0]
        cat = scn["faults"]["categories"][name]
        bursts = cat.get("bursts") or [[]]
        burst = tuple(bursts[rnd.randrange(len(bursts))])
        needs = _needs(scn, f"f{len(out)}", cat, rnd)
        out.append(
            Fault(
                id=f"f{len(out)}",
                t=t,
                node=rnd.randrange(physical),
                category=name,
                signal=cat["signal"],
                burst=burst,
                needs=needs,
                pci=GPU_PCI[rnd.randrange(len(GPU_PCI))],
                human_s=_human_s(scn, rnd.random(), cat["signal"]),
                recur_s=rnd.expovariate(1.0 / recur_mean),
            )
        )
    return out


def recurrence(f: Fault, scn: Scenario, at: float) -> Fault:
    """The same defect showing again on the same node, with draws of its own (deterministic)."""
    rnd = random.Random(f"{scn['seed']}:{f.id}:{f.gen + 1}")  # noqa: S311 - reproducible
    recur_mean = scn["faults"]["recur_mean_h"] * 3600.0
    return replace(
        f,
        id=f"{f.id}r{f.gen + 1}",
        t=at,
        human_s=_human_s(scn, rnd.random(), f.signal),
        recur_s=rnd.expovariate(1.0 / recur_mean),
        gen=f.gen + 1,
    )


def expected_count(scn: Scenario) -> dict[str, float]:
    """Mean number of trace faults per category (for checking the trace against the table)."""
    physical = scn["fleet"]["nodes"] + scn["fleet"]["spares"]
    return {k: r * physical * scn["days"] * 86400.0 for k, r in category_rates(scn).items()}
