"""Localise a hang: which node of a hung job, if any, is the culprit (pure decisions, no I/O).

A hung job's incident is on the job (core/alerts.py: its heartbeat stopped). Restarting the gang
blindly lands it on the same bad node; waiting for a person costs the whole gang. So Pitstop asks
every node of the job at once, through its scheduler, the same seconds-long questions the
corroboration asks one node (``dmesg --raw``, ``nvidia-smi -q``: core/corroboration.py), and
compares each node with its peers:

- **sweep** (every node, in parallel): a tool that did not answer (a stuck GPU hangs NVML), GPUs
  lost or fewer visible than on the job's other nodes, a row remap pending or failed, a kernel
  Xid the catalog calls a node fault (GKE, whose check pods cannot read the ring buffer: the Node's
  XidCriticalError condition of its current boot instead; there the gang is stopped first, as its
  pods hold the GPUs the checks need: adapters/gke/gang.py). Findings on more than
  ``max_culprit_percent`` of the nodes are not one node's fault (a driver, the software, the
  fabric): nothing is fenced.
- **links** (only when the sweep finds nothing): an NCCL bus-bandwidth test between ring
  neighbours, n pairs for n nodes (not n²). A pair below ``link_fraction`` of the pairs' upper
  quartile (what the healthy links reach, even when up to three in four are slow) is slow; a
  node in two slow pairs (both its ring links) is the culprit. A lone slow pair
  cannot say which end is at fault: both are named to the person, neither is fenced.

One localisation per job per ``windows.hang_localise_s``: a job that hangs again soon after is
not swept again (the engine records the decision on the job's document, in the same
transaction that opens the incident).

Who may be localised at all (issue 35 (2)): the heartbeat alert is Monitoring's own, but its
series is anyone's to write (``monitoring.timeSeries.create``: every node and pod service
account), so one point for any running job and silence make a genuine absence alert. A hang acts
only for a job that **opted in** (the scheduler says so: the job's Slurm comment names
``pitstop:heartbeat``, a GKE workload carries the label ``pitstop.dev/heartbeat: "true"``; only
its owner sets either) and whose heartbeat series Pitstop reads back itself **was established**
(``heartbeat_min_points`` points over ``heartbeat_min_span_s`` before it stopped, within
``heartbeat_lookback_s``); else a page, nothing checked or restarted. And the gang is restarted
only on what the sweep or the ring links found on its nodes (each culprit's ``Evidence``): nothing
found is a page, not a restart in place (a scheduler whose checks stopped the gang first, GKE,
gets it back as it was).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pitstop.core import corroboration, trust
from pitstop.core import diagnose as diag
from pitstop.core import evidence as proof
from pitstop.core import validation as val
from pitstop.core.actions import NODE_ACTIONS
from pitstop.core.catalog import XidPolicy
from pitstop.core.checks import check_name
from pitstop.core.domain import (
    CheckRun,
    FaultEvent,
    GangCheckSpec,
    Incident,
    LocaliseConfig,
    LocalisePlan,
    LocaliseRound,
    NodeDoc,
    NodeRef,
)
from pitstop.core.evidence import Evidence
from pitstop.core.scheduling import JobState

SWEEP = "sweep"
LINKS = "links"
MAX_NODES = 512  # nodes one localisation sweeps (a 4,096-GPU job); a bigger job is paged, not swept
SMI, DMESG, NCCL = "nvidia_smi_q", "dmesg", "nccl"
# GKE: the Node's status as the adapter reads it for corroboration (JSON: bootID, conditions). Its
# check pods cannot read /dev/kmsg (no CAP_SYSLOG: Pod Security baseline), so the kernel's Xids come
# from the device plugin's XidCriticalError condition (core/trust.py) instead of dmesg.
NODE_CONDITION = "node_condition"
# A job in these states is not hung: its heartbeat stopped because it ended, was suspended or waits
# in the queue (a finished or cancelled job stops beating exactly like a hung one; the alert cannot
# tell them apart, the scheduler can). Nothing is checked, restarted or paged; the owner gets a note.
NOT_HUNG = frozenset(
    {JobState.PENDING, JobState.SUSPENDED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
)
TIMED_OUT = 124  # the exit code the agent gives a tool that ran out of time (timeout(1)'s)


def output_key(tool: str, where: str) -> str:
    """The key of one tool's output on one node (or pair ``a+b``) in a check's result."""
    return f"{tool}@{where}"


def pair_name(pair: Sequence[str]) -> str:
    return f"{pair[0]}+{pair[1]}"


# -- once per job per window -------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    run: bool
    why: str
    page: bool = False  # hung again within the window: a person decides

    def doc(self, at: float) -> LocalisePlan:
        return {"run": self.run, "why": self.why, "at": at}


def plan(job_doc: NodeDoc, cfg: LocaliseConfig, window_s: float, now: float) -> Plan:
    """Whether this hang is localised: policy on, and no localisation of the job within the window."""
    if not cfg.get("enabled", True):
        return Plan(False, "localise.enabled is false in policy: the job owner is notified")
    last = job_doc.get("localised_at")
    if isinstance(last, int | float) and now - float(last) < window_s:
        ago = int(now - float(last))
        return Plan(
            False,
            f"this job was localised {ago} s ago (windows.hang_localise_s {int(window_s)} s):"
            " not again; a person decides",
            page=True,
        )
    return Plan(True, "every node of the job is checked at once, then its ring links if need be")


# -- whether a hang alert may lead to anything: the job opted in, its own series was established ---

HEARTBEAT_OPT_IN = "pitstop:heartbeat"  # in a Slurm job's comment (adapters/slurm.py)
HEARTBEAT_LABEL = "pitstop.dev/heartbeat"  # "true" on a GKE workload (adapters/gke)


@runtime_checkable
class Heartbeats(Protocol):
    """Where Pitstop reads a job's heartbeat series back (adapters/monitoring.TelemetryReader)."""

    def heartbeat_points(self, project: str, cluster: str, job: str, start: float, end: float) -> list[float]:
        """Each point's time (epoch s) within [start, end]."""
        ...


def opted_in_comment(comment: object) -> bool:
    """A Slurm job's ``--comment`` names the opt-in as one of its comma- or space-separated words."""
    words = str(comment or "")[:1024].replace(",", " ").split()
    return HEARTBEAT_OPT_IN in words


@dataclass(frozen=True)
class Gate:
    go: bool
    why: str
    points: int = 0
    span_s: float = 0.0


def heartbeat_gate(
    job: str, opted_in: bool, points: Sequence[float] | None, cfg: LocaliseConfig, until: float
) -> Gate:
    """Whether a hang alert for ``job`` may be checked and acted on: it opted in, and the series Pitstop
    read back (epoch times of its points; None: unreadable) was established before ``until`` (the
    alert's opening). Otherwise a page only."""
    page = "the alert alone checks and restarts nothing; a person is paged"
    if not opted_in:
        return Gate(False, f"job {job} did not opt in to hang remediation ({HEARTBEAT_OPT_IN}): {page}")
    if points is None:
        return Gate(False, f"job {job}'s heartbeat series could not be read back: {page}")
    before = sorted(p for p in points if p <= until)
    n, span = len(before), (before[-1] - before[0]) if before else 0.0
    want_n, want_s = int(cfg["heartbeat_min_points"]), float(cfg["heartbeat_min_span_s"])
    if n < want_n or span < want_s:
        return Gate(
            False,
            f"job {job}'s own heartbeat series holds {n} points over {int(span)} s before it stopped"
            f" (established: {want_n} over {int(want_s)} s): not a job that stopped beating; {page}",
            n,
            span,
        )
    return Gate(
        True, f"job {job} opted in; its heartbeat: {n} points over {int(span)} s, then silence", n, span
    )


# -- what runs --------------------------------------------------------------------------------


def ring_pairs(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Each node with its ring neighbour (sorted order): n pairs for n > 2, one for 2, none for 1."""
    ring = sorted(set(nodes))
    if len(ring) < 2:
        return []
    if len(ring) == 2:
        return [(ring[0], ring[1])]
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def sweep_spec(iid: str, step: int, job: str, nodes: Sequence[str], cfg: LocaliseConfig) -> GangCheckSpec:
    return {
        "kind": SWEEP,
        "name": check_name(iid, step, SWEEP),
        "incident": iid,
        "job": job,
        "nodes": sorted(set(nodes)),
        "timeout_s": int(cfg["tool_timeout_s"]),
    }


def links_spec(iid: str, step: int, job: str, nodes: Sequence[str], cfg: LocaliseConfig) -> GangCheckSpec:
    return {
        "kind": LINKS,
        "name": check_name(iid, step, LINKS),
        "incident": iid,
        "job": job,
        "nodes": sorted(set(nodes)),
        "pairs": [pair_name(p) for p in ring_pairs(nodes)],  # "a+b": Firestore keeps no nested arrays
        "message_bytes": int(cfg["link_bytes"]),
        "timeout_s": int(cfg["link_timeout_s"]),
    }


# -- judging ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one round found: culprits to fence, or nothing (with the suspects a person should see)."""

    kind: str
    culprits: tuple[str, ...]
    why: str
    checked: tuple[str, ...]
    findings: Mapping[str, Sequence[str]] = field(default_factory=dict)
    suspects: tuple[str, ...] = ()
    measured: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        """What each culprit's own tools (or ring links) showed: what its node incident rests on."""
        return tuple(
            proof.sweep_finding(n, str(self.findings[n][0]), None)
            for n in self.culprits
            if self.findings.get(n)
        )

    def record(self, at: float) -> LocaliseRound:
        rec: LocaliseRound = {
            "kind": self.kind,
            "at": at,
            "culprits": list(self.culprits),
            "why": self.why[:500],
            "checked": list(self.checked),
            "findings": {n: [f[:200] for f in fs[:4]] for n, fs in list(self.findings.items())[:32]},
            "suspects": list(self.suspects),
            "measured": dict(list(self.measured.items())[:MAX_NODES]),
        }
        if self.culprits:
            rec["evidence"] = [e.record() for e in self.evidence][:32]
        return rec


def _cap(n: int, percent: float) -> int:
    """How many culprits a round may name before it calls the fault systemic (at least one)."""
    return max(1, math.floor(n * percent / 100))


def _tool_failed(key: str, outputs: Mapping[str, str], codes: Mapping[str, int]) -> str | None:
    """Why a tool gave nothing to judge on this node: it timed out, failed, or never ran there."""
    text = outputs.get(key)
    code = codes.get(key)
    tool = "nvidia-smi -q" if key.startswith(SMI) else "dmesg"
    if code == TIMED_OUT:
        return f"{tool} did not answer in time (a stuck GPU hangs NVML)"
    if not isinstance(text, str) or not text.strip():
        rc = code if code is not None else "unknown"
        return f"{tool} gave no output (exit {rc}): the node did not run the check"
    return None


def node_findings(
    node: str,
    outputs: Mapping[str, str],
    codes: Mapping[str, int],
    expected_gpus: int | None,
    node_xids: frozenset[int],
) -> list[str]:
    """What one node shows that its peers do not (its own tools' answers)."""
    found: list[str] = []
    smi_key, dmesg_key = output_key(SMI, node), output_key(DMESG, node)
    failed = _tool_failed(smi_key, outputs, codes)
    if failed is not None:
        found.append(failed)
    else:
        smi = diag.parse_nvidia_smi_q(str(outputs[smi_key]))
        found += (
            diag.smi_findings(smi, expected_gpus, None)
            if smi.ok
            else [f"nvidia-smi -q unreadable ({smi.error})"]
        )
    if _tool_failed(dmesg_key, outputs, codes) is None:
        xids, _ = corroboration.parse_dmesg_raw(str(outputs[dmesg_key]))
        for x in xids:
            if x.facility == corroboration.KERNEL_FACILITY and not x.nvswitch and x.xid in node_xids:
                found.append(f"kernel ring buffer: Xid {x.xid} on {x.pci}")
                break
    found += condition_findings(outputs.get(output_key(NODE_CONDITION, node)), node_xids)
    return found


def condition_findings(text: object, node_xids: frozenset[int]) -> list[str]:
    """A node-fault Xid in the Node's XidCriticalError condition of its current boot (GKE)."""
    if not isinstance(text, str) or not text or len(text) > 65536:
        return []
    try:
        node = json.loads(text)
    except ValueError:
        return []
    if not isinstance(node, Mapping):
        return []
    for x in sorted(node_xids):
        why = trust.xid_condition_confirms(node, x)
        if why:
            return [why]
    return []


def node_fault_xids(xids: XidPolicy) -> frozenset[int]:
    """The Xids the catalog (with the policy's overrides) answers with a node action."""
    return frozenset(x for x, rule in xids.rules.items() if rule.action in NODE_ACTIONS)


def _expected_gpus(nodes: Sequence[str], outputs: Mapping[str, str]) -> int | None:
    """The GPU count most of the job's nodes show: a node with fewer visible is short of its peers."""
    counts: Counter[int] = Counter()
    for n in nodes:
        text = outputs.get(output_key(SMI, n))
        if isinstance(text, str) and text.strip():
            smi = diag.parse_nvidia_smi_q(text)
            if smi.ok and smi.attached is not None:
                counts[smi.attached] += 1
    return counts.most_common(1)[0][0] if counts else None


def judge_sweep(
    nodes: Sequence[str],
    result: CheckRun | None,
    max_culprit_percent: float,
    node_xids: Iterable[int],
) -> Verdict:
    """The nodes whose own tools show a fault their peers do not; none when it looks systemic."""
    checked = (f"{SWEEP}: dmesg --raw and nvidia-smi -q on {len(nodes)} nodes",)
    if not result or not result.get("done"):
        err = (result or {}).get("error") or "the sweep did not finish"
        return Verdict(
            SWEEP, (), f"the node checks did not finish ({str(err)[:200]}): nothing found", checked
        )
    outputs = result.get("outputs") if isinstance(result.get("outputs"), Mapping) else {}
    codes = result.get("exit_codes") if isinstance(result.get("exit_codes"), Mapping) else {}
    expected = _expected_gpus(nodes, outputs or {})
    xids = frozenset(node_xids)
    findings = {
        n: f for n in sorted(nodes) if (f := node_findings(n, outputs or {}, codes or {}, expected, xids))
    }
    if not findings:
        return Verdict(SWEEP, (), f"no node shows a fault ({len(nodes)} checked)", checked)
    cap = _cap(len(nodes), max_culprit_percent)
    if len(findings) > cap:
        why = (
            f"{len(findings)} of {len(nodes)} nodes show findings (more than {cap}): not one node's fault"
            " (driver, software or fabric); nothing fenced"
        )
        return Verdict(SWEEP, (), why, checked, findings, tuple(findings))
    first = next(iter(findings.items()))
    why = f"{', '.join(findings)}: {first[1][0]}" + (
        f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    )
    return Verdict(SWEEP, tuple(findings), why, checked, findings)


def pair_busbw(text: str | None) -> float | None:
    """The bus bandwidth a pair's NCCL test reached at its largest message (None: no result)."""
    if not isinstance(text, str):
        return None
    res = val.parse_all_gather(text)
    if not res.ok or not res.rows:
        return None
    return max(res.rows, key=lambda r: r.size_bytes).busbw


def split_pair(name: str) -> tuple[str, str]:
    a, _, b = name.partition("+")
    return a, b


def judge_links(
    pairs: Sequence[Sequence[str]],
    result: CheckRun | None,
    link_fraction: float,
    max_culprit_percent: float,
) -> Verdict:
    """Slow ring links against the pairs' upper quartile; a node in two slow pairs is the culprit."""
    nodes = sorted({n for p in pairs for n in p})
    checked = (f"{LINKS}: NCCL busbw between {len(pairs)} ring-neighbour pairs",)
    if not pairs:
        return Verdict(LINKS, (), "a one-node job has no links to test", ())
    if not result or not result.get("done"):
        err = (result or {}).get("error") or "the link test did not finish"
        return Verdict(LINKS, (), f"the link test did not finish ({str(err)[:200]}): nothing found", checked)
    outputs = result.get("outputs") if isinstance(result.get("outputs"), Mapping) else {}
    measured = {pair_name(p): pair_busbw((outputs or {}).get(output_key(NCCL, pair_name(p)))) for p in pairs}
    values = [v for v in measured.values() if v is not None]
    if not values:
        return Verdict(LINKS, (), "no pair returned a result: nothing to compare", checked, measured=measured)
    median = statistics.quantiles(values, n=4, method="inclusive")[2] if len(values) > 1 else values[0]
    line = link_fraction * median
    slow = [p for p in pairs if (b := measured[pair_name(p)]) is None or b < line]
    if not slow:
        why = f"every pair within {link_fraction:.0%} of the pairs' upper quartile, {median:.1f} GB/s"
        return Verdict(LINKS, (), why, checked, measured=measured)
    per_node = Counter(n for p in slow for n in p)
    culprits = tuple(sorted(n for n, c in per_node.items() if c >= 2))
    findings = {
        n: [f"ring links {', '.join(pair_name(p) for p in slow if n in p)} below {line:.1f} GB/s"]
        for n in sorted(per_node)
    }
    suspects = tuple(sorted(per_node))
    cap = _cap(len(nodes), max_culprit_percent)
    if len(culprits) > cap or len(slow) > 2 * cap:  # each culprit slows its two ring links
        why = f"{len(slow)} of {len(pairs)} pairs slow: the fabric, not one node; nothing fenced"
        return Verdict(LINKS, (), why, checked, findings, suspects, measured)
    if not culprits:
        why = f"one slow pair ({', '.join(pair_name(p) for p in slow)}): either end; nothing fenced"
        return Verdict(LINKS, (), why, checked, findings, suspects, measured)
    why = f"{', '.join(culprits)}: both ring links below {link_fraction:.0%} of the pairs' {median:.1f} GB/s"
    return Verdict(LINKS, culprits, why, checked, findings, suspects, measured)


# -- the conclusion ---------------------------------------------------------------------------


def culprit_event(inc: Incident, node: NodeRef, action: str, why: str, step: int) -> FaultEvent:
    """The FaultEvent that opens the culprit's own node incident (the engine takes it from there).

    Its source is Pitstop's own measurement through the scheduler (not a log line anyone can
    write), hence verified; its id is fixed per hang incident, step and node, so a retried
    conclusion is a duplicate delivery, not a second incident.
    """
    job = inc.get("job")
    return {
        "kind": "localised",
        "action": action,
        "xid": None,
        "node": node,
        "gpu": None,
        "observed_at": None,
        "source": {
            "log_name": "pitstop/localise",
            "insert_id": f"{inc['id']}-{step}-{node['instance']}",
            "message_id": None,
            "trust": "verified",
            "trust_reason": "measured by Pitstop's own checks through the scheduler",
        },
        "reason": f"localised as the culprit of hung job {job['job'] if job else None}: {why}"[:512],
        "detail": {"hang_incident": inc["id"], "job": job["job"] if job else None},
    }


def page_text(
    job: str, nodes: Sequence[str], rounds: Sequence[LocaliseRound], restart: str, unchecked: str = ""
) -> str:
    """What the person is told when nothing was found: every node and every check, and the restart."""
    if not nodes:
        lines = [f"Hung job {job}: its nodes could not be checked ({unchecked or 'no answer'})."]
    else:
        lines = [f"Hung job {job}: no culprit fenced on its {len(nodes)} nodes ({', '.join(nodes[:64])})."]
    for r in rounds:
        lines.append(f"- {'; '.join(r.get('checked') or [])}: {r.get('why')}")
        if r.get("suspects"):
            lines.append(f"  suspects: {', '.join(r['suspects'])}")
    lines.append(f"The gang: {restart}. If it hangs again, look at the job itself (its software or data).")
    return "\n".join(lines)[:4000]


def not_hung_text(job: str, state: str) -> str:
    """The owner's note for a heartbeat that stopped because the job is not running."""
    return (
        f"Job {job} is {state}: its heartbeat stopped because it is not running, not because it hung. "
        "Nothing was checked, restarted or fenced."
    )
