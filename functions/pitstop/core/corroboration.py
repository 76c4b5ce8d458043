"""Believe a log line only once the node says so too: corroboration before any disruption.

A LogEntry is unauthenticated input: any principal with ``logging.logEntries.create`` can write
one that looks like a kernel line for any VM, journald's ``_TRANSPORT=kernel`` included (that
field proves what an agent on the VM read, not who called the Logging API). So before a gang
restart or a Compute action taken on log evidence, Pitstop asks the node itself, through the
scheduler (a channel the log writer does not control), about the claim that chose the action:

- the kernel ring buffer (``dmesg --raw``): an ``NVRM: Xid`` line for the Xid that chose the
  incident's action (the line that set it, never an Xid another line absorbed into the episode
  named), on that line's GPU, printed by the kernel (facility 0: user space may write
  ``/dev/kmsg``, but the kernel forces its records to LOG_USER) after the episode began and after
  the node's last remediation took effect. The ring buffer counts seconds since boot; the same
  check reads the node's clock, so each line gets a wall time (core/ring_buffer.py). An NVSwitch
  incident asks for its ``SXid`` the same way (the switch's address is not kept: any switch).
- ``nvidia-smi -q``: fewer GPUs than the VM has, a GPU lost, a row remap pending or failed, a
  retired page pending (the same findings the diagnostic uses).
- on GKE, the GPU device plugin's ``XidCriticalError`` Node condition for that Xid on the
  current boot (set from NVML events, core/trust.py), or Pitstop's node-problem-detector
  condition ``PitstopKernelXid`` (infra/gke/npd.yaml: NPD reads /dev/kmsg and keeps the boot's
  first NVRM Xid line as the condition's message) naming that Xid on that GPU, changed after the
  VM's last start, after the episode began and after the last remediation.

Confirmed: the verdict carries the ``Evidence`` (core/evidence.py) of what matched, and the step
goes on, and every disruptive op of the step rests on it (core/aggregate.op_warrant). Not
confirmed: Pitstop's fence is lifted, nothing is restarted, no VM is touched, the incident
resolves as not confirmed, and a person is paged with what was checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pitstop.core import diagnose as diag
from pitstop.core import evidence as proof
from pitstop.core import trust
from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action
from pitstop.core.catalog import SXID_KIND, XidPolicy
from pitstop.core.checks import check_name
from pitstop.core.domain import (
    CheckRun,
    CheckSpec,
    EvidenceGpu,
    FaultEvent,
    Incident,
    Measurement,
    NodeDoc,
    Remediation,
)
from pitstop.core.evidence import Evidence
from pitstop.core.policy_types import CorroborationConfig
from pitstop.core.ring_buffer import (
    KERNEL_FACILITY,
    MAX_LINES,
    Dating,
    KernelXid,
    parse_boot_clock,
    parse_dmesg_raw,
    xid_in,
)
from pitstop.core.slurm_wire import GPU_GRANT
from pitstop.core.timefmt import to_epoch

__all__ = ["KERNEL_FACILITY", "MAX_LINES", "KernelXid", "parse_dmesg_raw"]  # localise reads them here

CORROBORATE = "corroborate"
# What the policy says when none is given (schemas/policy.defaults.yaml ``corroboration``).
DEFAULTS: CorroborationConfig = {
    "enabled": True,
    "line_lag_s": 900.0,
    "clock_slack_s": 10.0,
    "clock_drift_ppm": 50.0,
    "event_max_age_s": 900.0,
    "event_margin_s": 300.0,
}
MAX_GPUS = 8  # GPUs one claim names (a line names one; the same Xid on a few GPUs of one episode)


def incident_xids(inc: Incident) -> list[int]:
    """Every Xid the incident's lines named, the incident's own first (for people: not what is asked)."""
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


# -- what the node is asked: the claim that chose the action ---------------------------------------


@dataclass(frozen=True)
class Claim:
    """The line that chose the incident's action: its Xid (or the episode's SXids) and its GPUs."""

    xids: tuple[int, ...]
    sxids: tuple[int, ...]
    pcis: tuple[str, ...]


def claim(inc: Incident, rules: XidPolicy | None = None) -> Claim:
    """What chose the action: the first line whose own verdict is the episode's proposed action.

    The incident keeps each line's verdict (``evidence``, its first few): the first one whose
    action is the proposed one is the line that chose it (an opener, or the line that raised it).
    Lines absorbed with a weaker verdict (an Xid 31, 13 or 45 beside an Xid 79) never widen what
    is asked. Past the kept summaries, the catalog says which counted Xid earns that action.
    """
    proposed = inc.get("proposed_action") or inc.get("action")
    chosen = [e for e in inc.get("evidence") or [] if isinstance(e, Mapping) and e.get("action") == proposed]
    first = next((e for e in chosen if isinstance(e.get("xid"), int)), None)
    if first is None and (inc.get("kind") == SXID_KIND or any(e.get("kind") == SXID_KIND for e in chosen)):
        return Claim((), tuple(incident_sxids(inc)), ())  # an SXid summary keeps no code: the episode's
    xid = first["xid"] if first is not None else _catalog_xid(inc, str(proposed), rules)
    if xid is None:
        return Claim((), (), ())
    named = [e.get("gpu") for e in chosen if e.get("xid") == xid]
    named += [g.get("pci") for g in (inc.get("gpus") or {}).values() if str(xid) in (g.get("xids") or {})]
    pcis: list[str] = []
    for p in named:
        if isinstance(p, str) and diag.pci_key(p) is not None and p not in pcis:
            pcis.append(p)
    return Claim((int(xid),), (), tuple(pcis[:MAX_GPUS]))


def _catalog_xid(inc: Incident, proposed: str, rules: XidPolicy | None) -> int | None:
    """The counted Xid the catalog answers with ``proposed`` (the incident's own first, if it does)."""
    xids = incident_xids(inc)
    if rules is None:
        return xids[0] if xids and xids[0] == inc.get("xid") else None
    return next((x for x in xids if rules.decide(x, {}).action == proposed), None)


def episode_start(inc: Incident, line_lag_s: float) -> float:
    """When the episode began: its first line's own time, but no earlier than ``line_lag_s`` before
    Pitstop opened it (an entry's timestamp is the writer's to choose)."""
    first = float(inc.get("first_seen") or 0.0)
    opened = float(inc.get("created_at") or first)
    return max(first, opened - line_lag_s)


RESETTING = frozenset({Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE_NODE})


def prior_remediations(node_doc: NodeDoc | None, own: str, keep: int = 3) -> list[Remediation]:
    """The node's latest remediations that reset its GPUs, other incidents' only (newest first).

    A remediation names no GPU, so any of the node's counts for each of its GPUs (stricter)."""
    done = [
        r
        for r in (node_doc["remediations"] if node_doc else [])
        if r.get("incident") != own and r.get("action") in RESETTING
    ]
    return sorted(done, key=lambda r: -float(r["at"]))[:keep]


def remediated_at(prior: Sequence[Remediation], acted: Mapping[str, float | None]) -> float | None:
    """When the last of them took effect: its incident's ``acted`` time, else when it was decided."""
    times = [max(float(r["at"]), float(acted.get(r["incident"]) or 0.0)) for r in prior]
    return max(times, default=None)


def claim_kind(inc: Incident) -> str:
    """The kind of the input that chose the incident's action: its opener, or the event that raised
    it (a forged preemption raising a degraded node's incident is a system event's claim, and is
    asked of Compute, whatever the episode began as). The incident keeps each event's verdict."""
    proposed = inc.get("proposed_action") or inc.get("action")
    for e in inc.get("evidence") or []:
        if isinstance(e, Mapping) and e.get("action") == proposed and isinstance(e.get("kind"), str):
            return str(e["kind"])
    return str(inc.get("kind"))


def needs_corroboration(inc: Incident, enabled: bool) -> tuple[bool, str]:
    """Whether this step asks the node (or Compute) before it disrupts anything, and why (not)."""
    if inc.get("action") in RECORD_ONLY_ACTIONS:
        return False, "a record-only action disrupts nothing"
    kind = claim_kind(inc)
    if kind not in ("gpu_xid", SXID_KIND, *SYSTEM_KINDS):
        return False, f"{kind} evidence is not a log line Pitstop acts on"
    if not enabled:
        return False, "corroboration.enabled is false in policy: log evidence is acted on as it is"
    if corroborated_before(inc):
        return False, "already corroborated on the node for this incident"
    return True, "log evidence is unauthenticated: the node is asked before anything is disrupted"


def corroborated_before(inc: Incident) -> bool:
    rec = inc.get("corroboration")
    return isinstance(rec, Mapping) and rec.get("confirmed") is True


def spec(
    inc: Incident,
    step: int,
    gpus: int,
    expected_gpus: int | None,
    boot_after: float | None = None,
    *,
    rules: XidPolicy | None = None,
    line_lag_s: float = DEFAULTS["line_lag_s"],
    remediated: float | None = None,
) -> CheckSpec:
    """What the scheduler runs on the node: read-only tools, no GPU taken from a running job.

    ``boot_after``: the VM's last start (Compute), against which a GKE Node condition that carries
    no bootID (node-problem-detector's) is dated; ``remediated``: when the node's last remediation
    took effect (a line printed before it was remediated).
    """
    asked = claim(inc, rules)
    return {
        "kind": CORROBORATE,
        "name": check_name(inc["id"], step, CORROBORATE),
        "incident": inc["id"],
        "gpus": gpus,
        "expected_gpus": expected_gpus,
        "xids": list(asked.xids),
        "sxids": list(asked.sxids),
        "pcis": list(asked.pcis),
        "since": episode_start(inc, line_lag_s),
        "remediated_at": remediated,
        "boot_after": boot_after,
    }


@dataclass(frozen=True)
class Verdict:
    confirmed: bool
    why: str
    checked: tuple[str, ...]
    findings: tuple[str, ...] = field(default=())
    evidence: Evidence | None = None  # what matched (None unless confirmed)

    def record(self, at: float, step: int) -> Measurement:
        rec: Measurement = {
            "kind": CORROBORATE,
            "at": at,
            "step": step,
            "confirmed": self.confirmed,
            "why": self.why[:500],
            "checked": list(self.checked),
            "findings": [f[:200] for f in self.findings[:8]],
        }
        if self.evidence is not None:
            rec["evidence"] = self.evidence.record()
        return rec


def _confirmed(found: Sequence[Evidence], checked: Sequence[str]) -> Verdict:
    return Verdict(
        True,
        f"confirmed on the node: {found[0].what}",
        tuple(checked),
        tuple(e.what for e in found),
        found[0],
    )


# -- the node's answers, each read as what it is ---------------------------------------------------


@dataclass(frozen=True)
class _Asked:
    """The check's claim and bounds, as corroboration.spec saved them."""

    node: str
    xids: frozenset[int]
    sxids: frozenset[int]
    pcis: frozenset[tuple[int, int, int]]
    since: float | None
    remediated: float | None
    boot_after: float | None
    cfg: CorroborationConfig

    @classmethod
    def of(cls, check: CheckSpec, node: str, cfg: CorroborationConfig) -> _Asked:
        keys = {diag.pci_key(p) for p in check.get("pcis") or []}
        return cls(
            node,
            frozenset(x for x in check.get("xids") or [] if _int(x)),
            frozenset(x for x in check.get("sxids") or [] if _int(x)),
            frozenset(k for k in keys if k is not None),
            _num(check.get("since")),
            _num(check.get("remediated_at")),
            _num(check.get("boot_after")),
            cfg,
        )

    def wanted(self) -> str:
        what = [f"Xid {x}" for x in sorted(self.xids)] + [f"SXid {x}" for x in sorted(self.sxids)]
        gpus = f" on {len(self.pcis)} named GPU(s)" if self.pcis else ""
        return (" or ".join(what) or "nothing (no line chose the action)") + gpus


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _kernel_findings(a: _Asked, text: str | None, clock: object) -> tuple[list[Evidence], str]:
    if not isinstance(text, str):
        return [], "kernel ring buffer: not read"
    lines, records = parse_dmesg_raw(text)
    named = [k for k in lines if k.xid in (a.sxids if k.nvswitch else a.xids)]
    kern = [k for k in named if k.facility == KERNEL_FACILITY]
    on_gpu = [k for k in kern if k.nvswitch or diag.pci_key(k.pci) in a.pcis]
    boot = parse_boot_clock(clock)
    seen = (
        f"kernel ring buffer: {records} records read; asked for {a.wanted()}: {len(kern)} kernel lines"
        f" name it, {len(on_gpu)} on its GPU"
    )
    if len(named) > len(kern):
        seen += f"; {len(named) - len(kern)} such lines written from user space (facility != kern) ignored"
    if boot is None or a.since is None:
        return [], seen + "; none dated (the node's clock was not read): none counts"
    d = Dating(boot, float(a.cfg["clock_slack_s"]), float(a.cfg["clock_drift_ppm"]))
    fresh = [k for k in on_gpu if d.since(k, a.since) and (a.remediated is None or d.past(k, a.remediated))]
    seen += f", {len(fresh)} printed in this episode (after it began and after the last remediation)"
    return [proof.kernel_line(a.node, k.xid, k.nvswitch, k.pci, d.printed_at(k)) for k in fresh[:4]], seen


def _smi_findings(
    node: str, text: str | None, expected: int | None, named: EvidenceGpu, granted: int | None
) -> tuple[list[Evidence], str]:
    """``granted``: the GPUs the step asked for explicitly (slurm_wire.GPU_GRANT); a count below
    ``expected`` is evidence only then (issue 35, 11: a step without it may see fewer, or none)."""
    if not isinstance(text, str):
        return [], "nvidia-smi -q: not read"
    smi = diag.parse_nvidia_smi_q(text)
    if not smi.ok:
        return [], f"nvidia-smi -q: unreadable ({smi.error})"
    gpu = named.get("gpu")
    pci = gpu.get("pci") if isinstance(gpu, Mapping) else None
    pci = pci if isinstance(pci, str) else None
    counts = granted is not None and expected is not None and granted >= expected
    found = [proof.gpu_state(node, f, pci) for f in diag.smi_findings(smi, expected, pci, counts)]
    found += [proof.gpu_state(node, f"GPU {g.index} ({g.pci}) retired page pending", g.pci)
              for g in smi.gpus if g.retired_pending]  # fmt: skip
    exp = "unknown" if expected is None else str(expected)
    limited = "" if counts else " (no explicit GPU ask: the count is no evidence)"
    return found, f"nvidia-smi -q: {smi.visible} GPUs visible of {exp} expected{limited}"


def _granted(outputs: Mapping[str, str]) -> int | None:
    """The GPU count in ``gpu_grant`` ("gpu:8"), None when the step asked for none explicitly."""
    m = re.fullmatch(r"[a-z][a-z0-9_]{0,31}:([0-9]{1,3})", str(outputs.get(GPU_GRANT) or ""))
    return int(m.group(1)) if m else None


def _condition_findings(a: _Asked, text: object) -> tuple[list[Evidence], str]:
    """The Node's status as the adapter read it (JSON: nodeInfo.bootID and the conditions)."""
    try:
        node = json.loads(text) if isinstance(text, str) and len(text) < 65536 else None
    except ValueError:
        node = None
    if not isinstance(node, Mapping):
        return [], "GKE Node conditions XidCriticalError, PitstopKernelXid: unreadable"
    found = [
        proof.node_condition(a.node, why, x, None, None)
        for x in sorted(a.xids)
        if (why := trust.xid_condition_confirms(node, x))
    ]
    found += _npd_findings(a, node)
    return found[:2], (
        f"GKE Node conditions XidCriticalError (device plugin, current boot) and {NPD_CONDITION}"
        f" (node-problem-detector, changed in this episode) for {a.wanted()}"
    )


NPD_CONDITION = "PitstopKernelXid"  # infra/gke/npd.yaml's kernel-monitor rule file


def _npd_findings(a: _Asked, node: Mapping[str, object]) -> list[Evidence]:
    """NPD's condition names the Xid on its GPU in its kernel line, and changed in this episode.

    NPD puts the matched kernel message in the condition's message and dates the change (node
    wall time: clock_slack_s applies); a condition that changed before the VM last started is
    about an earlier boot, one before the episode began (or before the last remediation) is about
    an earlier fault of this boot (NPD keeps the boot's first Xid line).
    """
    status = node.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    slack = float(a.cfg["clock_slack_s"])
    out: list[Evidence] = []
    for c in conds if isinstance(conds, list) else []:
        if not (isinstance(c, Mapping) and c.get("type") == NPD_CONDITION and c.get("status") == "True"):
            continue
        line = xid_in(str(c.get("message") or ""))
        at = to_epoch(str(c.get("lastTransitionTime") or "")) if c.get("lastTransitionTime") else None
        if line is None or line[0] not in a.xids or diag.pci_key(line[1]) not in a.pcis:
            continue
        if a.boot_after is None or at is None or at <= a.boot_after:
            continue
        if (
            a.since is None
            or at < a.since - slack
            or (a.remediated is not None and at <= a.remediated + slack)
        ):
            continue
        why = (
            f"{NPD_CONDITION} (node-problem-detector, /dev/kmsg): Xid {line[0]} on {line[1]} in this episode"
        )
        out.append(proof.node_condition(a.node, why, line[0], line[1], at))
    return out


def _scheduler_findings(node: str, text: object) -> tuple[list[Evidence], str]:
    """slurmctld's own view: a node whose slurmd stopped answering is broken whatever the log says."""
    state = str(text or "")[:200]
    gone = "NOT_RESPONDING" in state or "*" in state.split(" ", 1)[0]
    found = [proof.scheduler_state(node, f"slurmctld sees the node not responding ({state})")] if gone else []
    return found, f"slurmctld: {state or 'no state'}"


def judge(
    check: CheckSpec,
    result: CheckRun | None,
    named: EvidenceGpu,
    node: str = "",
    cfg: CorroborationConfig | None = None,
) -> Verdict:
    """Confirmed when the node shows the claimed fault now, through a channel the log writer cannot set."""
    if result is None:
        return Verdict(False, "no scheduler could run a check on the node: nothing confirms the log line", ())
    got = result.get("outputs")
    outputs: Mapping[str, str] = got if isinstance(got, Mapping) else {}
    if not result.get("done"):
        err = str(result.get("error") or "the check did not finish")[:200]
        return Verdict(
            False, f"the check on the node did not finish ({err}): nothing confirms the log line", ()
        )
    a = _Asked.of(check, node, cfg or DEFAULTS)
    expected = check.get("expected_gpus")
    expected = expected if isinstance(expected, int) else None
    found: list[Evidence] = []
    checked: list[str] = []
    for part in (
        _kernel_findings(a, outputs.get("dmesg"), outputs.get("clock")) if "dmesg" in outputs else None,
        _smi_findings(node, outputs.get("nvidia_smi_q"), expected, named, _granted(outputs))
        if "nvidia_smi_q" in outputs
        else None,
        _condition_findings(a, outputs.get("node_condition")) if "node_condition" in outputs else None,
        _scheduler_findings(node, outputs.get("slurm_node")) if "slurm_node" in outputs else None,
    ):
        if part is not None:
            found += part[0]
            checked.append(part[1])
    if not checked:
        return Verdict(False, "the check on the node returned nothing to judge", ())
    if found:
        return _confirmed(found, checked)
    return Verdict(
        False,
        "not confirmed on the node: the log line names a fault the node does not show"
        " (forged, replayed, or about an earlier boot); the fence lifted, nothing restarted, a person"
        " is paged",
        tuple(checked),
    )


# -- system events: Compute's own record of that event's kind (schemas/system-events.yaml) ---------
# Anyone who may publish to the events topic (project Editors, the default Compute service account)
# can post one in Google's exact shape, with any timestamp. So a stale one is only recorded
# (``fresh_only``, at ingest), and a fresh one acts only when Compute's instances.get shows the VM
# went through that kind of event, at its time.
SYSTEM_KINDS = ("preemption", "host_error", "maintenance", "lifecycle")
# Which of the VM's own timestamps records each kind (Compute API, Instance: lastStopTimestamp,
# lastStartTimestamp): a preemption stops a Spot VM; a stop for host maintenance stops it (and
# restarts it); a host error stops it and, with automaticRestart, restarts it; an automatic
# restart starts it.
CONFIRMED_BY: Mapping[str, tuple[str, ...]] = {
    "preemption": ("stopped",),
    "maintenance": ("stopped", "started"),
    "host_error": ("stopped", "started"),
    "lifecycle": ("started",),
}


@dataclass(frozen=True)
class VmFacts:
    """What Compute's instances.get says (the service reads it; timestamps as epoch seconds)."""

    status: str
    spot: bool
    created: float | None
    last_start: float | None
    last_stop: float | None
    upcoming_maintenance: bool


def fresh_only(ev: FaultEvent, now: float, max_age_s: float) -> FaultEvent:
    """A system event as it may act: one whose own time is older than ``max_age_s`` (or unknown)
    is recorded, not acted on (its action NONE, the reason says why)."""
    if ev.get("kind") not in SYSTEM_KINDS or ev.get("action") in RECORD_ONLY_ACTIONS:
        return ev
    at = to_epoch(ev.get("observed_at"))
    if at is not None and now - at <= max_age_s:
        return ev
    age = "no time of its own" if at is None else f"its own time is {int(now - at)} s old"
    bound = f"corroboration.event_max_age_s {int(max_age_s)} s"
    why = f"stale system event ({age}; over {bound}): recorded, not acted on"
    return {**ev, "action": Action.NONE, "reason": f"{why}; {ev['reason']}"[:512]}


def _claim_at(inc: Incident) -> float:
    """When the claim that chose the action was observed (the episode's first line otherwise)."""
    kind = claim_kind(inc)
    for e in inc.get("evidence") or []:
        if isinstance(e, Mapping) and e.get("kind") == kind and kind != inc.get("kind"):
            at = to_epoch(e.get("observed_at"))
            if at is not None:
                return at
    return float(inc.get("first_seen") or 0.0)


def judge_system(
    inc: Incident, vm: VmFacts | None, margin_s: float = DEFAULTS["event_margin_s"], node: str = ""
) -> Verdict:
    """Confirmed when Compute's own record of that kind of event lies within ``margin_s`` of it."""
    kind, at = claim_kind(inc), _claim_at(inc)
    if vm is None:
        return Verdict(False, "Compute has no such VM: the system event is about nothing we run", ())
    checked = (
        f"Compute instances.get: {vm.status}, spot={vm.spot}, last start {vm.last_start},"
        f" last stop {vm.last_stop}",
    )
    if inc.get("action") == Action.DRAIN_NODE:  # upcoming maintenance: it must be pending on the VM now
        if vm.upcoming_maintenance:
            ev = proof.compute_record(node, kind, "Compute shows the VM's upcoming maintenance", None)
            return Verdict(True, ev.what, checked, ("upcomingMaintenance",), ev)
        return Verdict(False, "Compute shows no upcoming maintenance on the VM: not confirmed", checked)
    if kind == "preemption" and not vm.spot:
        return Verdict(False, "a preemption of a VM that is not Spot or preemptible: not confirmed", checked)
    stamps = {"stopped": vm.last_stop, "started": vm.last_start}
    near = [
        (what, t)
        for what in CONFIRMED_BY.get(kind, ())
        if (t := stamps[what]) is not None and abs(t - at) <= margin_s
    ]
    if near:
        what, t = near[0]
        said = f"Compute shows the VM {what} {int(t - at):+d} s from the {kind} event"
        return Verdict(
            True,
            said,
            checked,
            tuple(f"{w} at {x}" for w, x in near),
            proof.compute_record(node, kind, said, t),
        )
    nouns = {"stopped": "stop (lastStopTimestamp)", "started": "start (lastStartTimestamp)"}
    asked = " or ".join(nouns[w] for w in CONFIRMED_BY.get(kind, ())) or "record"
    return Verdict(
        False,
        f"Compute shows no {asked} of the VM within {int(margin_s)} s of the {kind} event: not confirmed"
        " (a system event published straight to the topic, or replayed?)",
        checked,
    )
