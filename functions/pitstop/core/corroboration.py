"""Believe a log line only once the node says so too: corroboration before any disruption.

A LogEntry is unauthenticated input: any principal with ``logging.logEntries.create`` can write
one that looks like a kernel line for any VM, journald's ``_TRANSPORT=kernel`` included (that
field proves what an agent on the VM read, not who called the Logging API). So before a gang
restart or a Compute action taken on log evidence, Pitstop asks the node itself, through the
scheduler (a channel the log writer does not control), what the kernel and the driver report
there now:

- the kernel ring buffer (``dmesg --raw``): an ``NVRM: Xid`` line for one of the incident's Xids
  (or an NVSwitch ``SXid`` line for one of its SXids), with the kernel's own syslog facility (0).
  User space may write ``/dev/kmsg``, but the kernel forces its records to LOG_USER (facility 1),
  so such a line never counts. The ring buffer holds the current boot only.
- ``nvidia-smi -q``: fewer GPUs than the VM has, a GPU lost, a row remap pending or failed, a
  retired page pending (the same findings the diagnostic uses).
- on GKE, the GPU device plugin's ``XidCriticalError`` Node condition for the Xid on the
  current boot (set from NVML events, core/trust.py), or, for any Xid, Pitstop's
  node-problem-detector condition ``PitstopKernelXid`` (infra/gke/npd.yaml: NPD reads /dev/kmsg
  and keeps the boot's first NVRM Xid line as the condition's message), believed only when it
  changed after the VM's last start (an older one is about an earlier boot).

Confirmed: the step goes on. Not confirmed: the node stays fenced, nothing is restarted, no VM
is touched, and a person is paged with what was checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pitstop.core import diagnose as diag
from pitstop.core import trust
from pitstop.core.actions import RECORD_ONLY_ACTIONS
from pitstop.core.catalog import SXID_KIND
from pitstop.core.checks import check_name
from pitstop.core.domain import CheckRun, CheckSpec, EvidenceGpu, Incident, Measurement
from pitstop.core.slurm_wire import GPU_GRANT
from pitstop.core.timefmt import to_epoch

CORROBORATE = "corroborate"
KERNEL_FACILITY = 0
# ``dmesg --raw``: "<prio>[seconds] message", prio = facility * 8 + level (syslog(2), dmesg(1)).
_RAW = re.compile(r"^<(?P<prio>\d{1,4})>\[\s*(?P<ts>\d{1,10}\.\d{1,9})\]\s?(?P<msg>.*)$", re.ASCII)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]{0,40}\):"
    r"\s*(?P<xid>\d{1,4})\b",
    re.ASCII,
)
# The NVSwitch driver's "nvidia-nvswitch<N>: SXid (PCI:<dddd:bb:dd.f>): <code>, ..." (core/sxid_line.py).
_SXID = re.compile(
    r"SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\):\s*(?P<sxid>\d{1,6})\b",
    re.ASCII,
)
MAX_LINES = 20_000  # a ring buffer is a few MiB at most; beyond this the output is not dmesg's


@dataclass(frozen=True)
class KernelXid:
    xid: int  # the Xid, or an NVSwitch's SXid code when ``nvswitch``
    pci: str
    facility: int
    nvswitch: bool = False

    @property
    def name(self) -> str:
        return f"SXid {self.xid}" if self.nvswitch else f"Xid {self.xid}"


def parse_dmesg_raw(text: str) -> tuple[list[KernelXid], int]:
    """The NVRM Xid records of a ``dmesg --raw`` output, and how many of its lines were records."""
    found: list[KernelXid] = []
    records = 0
    for line in text.splitlines()[:MAX_LINES]:
        m = _RAW.match(line[:4096])
        if m is None:
            continue
        records += 1
        x = _XID.search(m["msg"])
        if x is not None:
            found.append(KernelXid(int(x["xid"]), x["pci"].lower(), int(m["prio"]) >> 3))
        elif (sx := _SXID.search(m["msg"])) is not None:
            found.append(KernelXid(int(sx["sxid"]), sx["pci"].lower(), int(m["prio"]) >> 3, nvswitch=True))
    return found, records


def incident_xids(inc: Incident) -> list[int]:
    """Every Xid the incident's lines named, the incident's own first."""
    out: list[int] = []
    first = inc.get("xid")
    if isinstance(first, int):
        out.append(first)
    for g in (inc.get("gpus") or {}).values():
        for code in (g.get("xids") or {}) if isinstance(g, Mapping) else ():
            if str(code).isdigit() and int(code) not in out:
                out.append(int(code))
    return out[:16]


def incident_sxids(inc: Incident) -> list[int]:
    """Every NVSwitch SXid the incident's lines named (counted as ``sxid_<code>``)."""
    counts = inc.get("counts") or {}
    keys = counts if isinstance(counts, Mapping) else {}
    return [int(k[5:]) for k in keys if isinstance(k, str) and k.startswith("sxid_") and k[5:].isdigit()][:16]


def needs_corroboration(inc: Incident, enabled: bool) -> tuple[bool, str]:
    """Whether this step asks the node (or Compute) before it disrupts anything, and why (not)."""
    if inc.get("action") in RECORD_ONLY_ACTIONS:
        return False, "a record-only action disrupts nothing"
    if inc.get("kind") not in ("gpu_xid", SXID_KIND, *SYSTEM_KINDS):
        return False, f"{inc.get('kind')} evidence is not a log line Pitstop acts on"
    if not enabled:
        return False, "corroboration.enabled is false in policy: log evidence is acted on as it is"
    if corroborated_before(inc):
        return False, "already corroborated on the node for this incident"
    return True, "log evidence is unauthenticated: the node is asked before anything is disrupted"


def corroborated_before(inc: Incident) -> bool:
    rec = inc.get("corroboration")
    return isinstance(rec, Mapping) and rec.get("confirmed") is True


def spec(
    inc: Incident, step: int, gpus: int, expected_gpus: int | None, boot_after: float | None = None
) -> CheckSpec:
    """What the scheduler runs on the node: read-only tools, no GPU taken from a running job.

    ``boot_after``: the VM's last start (Compute), against which a GKE Node condition that carries
    no bootID (node-problem-detector's) is dated.
    """
    return {
        "kind": CORROBORATE,
        "name": check_name(inc["id"], step, CORROBORATE),
        "incident": inc["id"],
        "gpus": gpus,
        "expected_gpus": expected_gpus,
        "xids": incident_xids(inc),
        "sxids": incident_sxids(inc),
        "boot_after": boot_after,
    }


@dataclass(frozen=True)
class Verdict:
    confirmed: bool
    why: str
    checked: tuple[str, ...]
    findings: tuple[str, ...] = field(default=())

    def record(self, at: float, step: int) -> Measurement:
        return {
            "kind": CORROBORATE,
            "at": at,
            "step": step,
            "confirmed": self.confirmed,
            "why": self.why[:500],
            "checked": list(self.checked),
            "findings": [f[:200] for f in self.findings[:8]],
        }


def _kernel_findings(xids: Iterable[int], sxids: Iterable[int], text: str | None) -> tuple[list[str], str]:
    if not isinstance(text, str):
        return [], "kernel ring buffer: not read"
    lines, records = parse_dmesg_raw(text)
    want, want_s = set(xids), set(sxids)
    named = [k for k in lines if k.xid in (want_s if k.nvswitch else want)]
    kern = [k for k in named if k.facility == KERNEL_FACILITY]
    user = [k for k in named if k.facility != KERNEL_FACILITY]
    found = [f"kernel ring buffer: {k.name} on {k.pci} (kernel facility)" for k in kern[:4]]
    wanted = f"Xid {sorted(want)}" + (f", SXid {sorted(want_s)}" if want_s else "")
    seen = f"kernel ring buffer: {records} records read, {len(kern)} kernel driver lines for {wanted}"
    if user:
        seen += f"; {len(user)} such lines written from user space (facility != kern) ignored"
    return found, seen


def _smi_findings(
    text: str | None, expected: int | None, evidence: EvidenceGpu, granted: int | None
) -> tuple[list[str], str]:
    """``granted``: the GPUs the step asked for explicitly (slurm_wire.GPU_GRANT); a count below
    ``expected`` is evidence only then (issue 35, 11: a step without it may see fewer, or none)."""
    if not isinstance(text, str):
        return [], "nvidia-smi -q: not read"
    smi = diag.parse_nvidia_smi_q(text)
    if not smi.ok:
        return [], f"nvidia-smi -q: unreadable ({smi.error})"
    gpu = evidence.get("gpu")
    pci = gpu.get("pci") if isinstance(gpu, Mapping) else None
    counts = granted is not None and expected is not None and granted >= expected
    found = diag.smi_findings(smi, expected, pci if isinstance(pci, str) else None, counts)
    for g in smi.gpus:
        if g.retired_pending:
            found.append(f"GPU {g.index} ({g.pci}) retired page pending")
    exp = "unknown" if expected is None else str(expected)
    limited = "" if counts else " (no explicit GPU ask: the count is no evidence)"
    return found, f"nvidia-smi -q: {smi.visible} GPUs visible of {exp} expected{limited}"


def _granted(outputs: Mapping[str, str]) -> int | None:
    """The GPU count in ``gpu_grant`` ("gpu:8"), None when the step asked for none explicitly."""
    m = re.fullmatch(r"[a-z][a-z0-9_]{0,31}:([0-9]{1,3})", str(outputs.get(GPU_GRANT) or ""))
    return int(m.group(1)) if m else None


def _condition_findings(xids: Iterable[int], text: object, boot_after: float | None) -> tuple[list[str], str]:
    """The Node's status as the adapter read it (JSON: nodeInfo.bootID and the conditions)."""
    try:
        node = json.loads(text) if isinstance(text, str) and len(text) < 65536 else None
    except ValueError:
        node = None
    if not isinstance(node, Mapping):
        return [], "GKE Node conditions XidCriticalError, PitstopKernelXid: unreadable"
    want = list(xids)
    found = [why for x in want if (why := trust.xid_condition_confirms(node, x))]
    found += _npd_findings(node, want, boot_after)
    return found[:2], (
        "GKE Node conditions XidCriticalError (device plugin, current boot) and"
        f" {NPD_CONDITION} (node-problem-detector, changed after the VM's last start)"
    )


NPD_CONDITION = "PitstopKernelXid"  # infra/gke/npd.yaml's kernel-monitor rule file


def _npd_findings(node: Mapping[str, object], xids: list[int], boot_after: float | None) -> list[str]:
    """NPD's condition names one of the Xids in its kernel line and changed during this boot.

    NPD puts the matched kernel message in the condition's message and dates the change; a
    condition that changed before the VM last started is about an earlier boot (NPD resets its
    conditions to their defaults when it starts, so a True one older than the boot is stale).
    """
    status = node.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    out: list[str] = []
    for c in conds if isinstance(conds, list) else []:
        if not (isinstance(c, Mapping) and c.get("type") == NPD_CONDITION and c.get("status") == "True"):
            continue
        m = _XID.search(str(c.get("message") or "")[:2048])
        at = to_epoch(str(c.get("lastTransitionTime") or "")) if c.get("lastTransitionTime") else None
        if m is None or int(m.group("xid")) not in xids:
            continue
        if boot_after is None or at is None or at <= boot_after:
            continue
        out.append(f"{NPD_CONDITION} (node-problem-detector, /dev/kmsg): Xid {m.group('xid')} this boot")
    return out


def _scheduler_findings(text: object) -> tuple[list[str], str]:
    """slurmctld's own view: a node whose slurmd stopped answering is broken whatever the log says."""
    state = str(text or "")[:200]
    gone = "NOT_RESPONDING" in state or "*" in state.split(" ", 1)[0]
    found = [f"slurmctld sees the node not responding ({state})"] if gone else []
    return found, f"slurmctld: {state or 'no state'}"


def _boot_after(check: CheckSpec) -> float | None:
    got = check.get("boot_after")
    return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) else None


def judge(check: CheckSpec, result: CheckRun | None, evidence: EvidenceGpu) -> Verdict:
    """Confirmed when the node shows the fault now through a channel the log writer cannot set."""
    if result is None:
        return Verdict(False, "no scheduler could run a check on the node: nothing confirms the log line", ())
    got = result.get("outputs")
    outputs: Mapping[str, str] = got if isinstance(got, Mapping) else {}
    if not result.get("done"):
        err = str(result.get("error") or "the check did not finish")[:200]
        return Verdict(
            False, f"the check on the node did not finish ({err}): nothing confirms the log line", ()
        )
    xids = [int(x) for x in check.get("xids") or [] if isinstance(x, int)]
    sxids = [int(x) for x in check.get("sxids") or [] if isinstance(x, int)]
    expected = check.get("expected_gpus")
    expected = expected if isinstance(expected, int) else None
    findings: list[str] = []
    checked: list[str] = []
    for part in (
        _kernel_findings(xids, sxids, outputs.get("dmesg")) if "dmesg" in outputs else None,
        _smi_findings(outputs.get("nvidia_smi_q"), expected, evidence, _granted(outputs))
        if "nvidia_smi_q" in outputs
        else None,
        _condition_findings(xids, outputs.get("node_condition"), _boot_after(check))
        if "node_condition" in outputs
        else None,
        _scheduler_findings(outputs.get("slurm_node")) if "slurm_node" in outputs else None,
    ):
        if part is not None:
            findings += part[0]
            checked.append(part[1])
    if not checked:
        return Verdict(False, "the check on the node returned nothing to judge", ())
    if findings:
        return Verdict(True, f"confirmed on the node: {findings[0]}", tuple(checked), tuple(findings))
    return Verdict(
        False,
        "not confirmed on the node: the log line names a fault the node does not show"
        " (forged, or about an earlier boot); fenced, nothing restarted, a person is paged",
        tuple(checked),
    )


# System events (schemas/system-events.yaml): anyone who may publish to the events topic (project
# Editors, the default Compute service account) can post one, so Compute itself is asked whether
# the VM went through it.
SYSTEM_KINDS = ("preemption", "host_error", "maintenance", "lifecycle")
EVENT_MARGIN_S = 300.0  # clocks of Logging and Compute, and the time a stop takes to be recorded


@dataclass(frozen=True)
class VmFacts:
    """What Compute's instances.get says (the service reads it; timestamps as epoch seconds)."""

    status: str
    spot: bool
    created: float | None
    last_start: float | None
    last_stop: float | None
    upcoming_maintenance: bool


def judge_system(inc: Incident, vm: VmFacts | None) -> Verdict:
    """Confirmed when Compute shows the VM went through what the event says, around its time."""
    kind, first = str(inc.get("kind")), float(inc.get("first_seen") or 0.0)
    if vm is None:
        return Verdict(False, "Compute has no such VM: the system event is about nothing we run", ())
    checked = (f"Compute instances.get: {vm.status}, spot={vm.spot}",)
    if inc.get("action") == "DRAIN_NODE":  # upcoming maintenance: it must be pending on the VM now
        if vm.upcoming_maintenance:
            return Verdict(
                True, "Compute shows the VM's upcoming maintenance", checked, ("upcomingMaintenance",)
            )
        return Verdict(False, "Compute shows no upcoming maintenance on the VM: not confirmed", checked)
    if kind == "preemption" and not vm.spot:
        return Verdict(False, "a preemption of a VM that is not Spot or preemptible: not confirmed", checked)
    since = first - EVENT_MARGIN_S
    moved = [
        what
        for what, at in (("stopped", vm.last_stop), ("started", vm.last_start), ("created", vm.created))
        if at is not None and at >= since
    ]
    if vm.status not in ("RUNNING",):
        moved.insert(0, f"is {vm.status}")
    if moved:
        return Verdict(
            True, f"Compute shows the VM {', '.join(moved)} around the event", checked, tuple(moved)
        )
    return Verdict(
        False,
        "Compute shows the VM running without a stop or restart since before the event: not confirmed"
        " (a system event published straight to the topic?)",
        checked,
    )
