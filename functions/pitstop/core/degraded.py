"""A degraded node is a planned move: is this node the odd one out, and which repair its finding earns.

A ``degraded`` incident comes from a Cloud Monitoring alert (core/alerts.py): one node's GPUs
throttle, or their error counters rise, past the policy's line for the policy's time. Two
questions decided here, without I/O (the data: ``degraded`` in schemas/xid-policy.yaml):

- **the comparison**: the same metric read for the job's other nodes over the same window. The
  node crosses the line while most peers do not → move the gang off it at its checkpoint. At least
  ``gang_wide_share`` of the peers cross it too → a shared cause (a rack's cooling, the job's own
  power cap): moving one node buys nothing, so no move, the fence is lifted, a person is paged. The
  node itself back under the line → the condition has passed: no move. A move needs the node's own
  reading of the named symptom over the line, read back by Pitstop (``Evidence`` of the telemetry
  probe): an alert is a hint anyone who may publish to the alerts topic, or write the DCGM series,
  can produce. No reading for the node (no series, telemetry unreadable), no symptom or one the
  policy has no rule for → ``unconfirmed``: nothing is moved or repaired, the fence is lifted and a
  person is paged. The node over the line with no peer to compare with (a one-node job) → move.
  On GKE the readings are dcgm-exporter's series in Managed Service for Prometheus (``prometheus``
  in the same section, read through its PromQL query API: adapters/prometheus.py); each series'
  samples are reduced here (core/promql.py) to one value per node, and compared as above.
- **the repair by finding**: the node check's hardware finding (the diagnostic's, or for a throttling
  node its hardware slowdown active now) earns the symptom's ``on_finding``
  action (REPLACE_NODE: irreversible, so never without one); no finding, ``otherwise`` (a reset,
  then validation, which steps up to REPLACE_NODE on a measured failure).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from pitstop.core import diagnose as diag
from pitstop.core import evidence as proof
from pitstop.core import resources
from pitstop.core.actions import Action
from pitstop.core.domain import Incident, Measurement, NodeRef, Resume, Timeline
from pitstop.core.evidence import Evidence
from pitstop.core.policy_types import DegradedDoc, PromSymptomDoc, XidPolicyDoc

KIND = "degraded"
Verdict = Literal["move", "gang_wide", "cleared", "unconfirmed"]


@dataclass(frozen=True)
class SymptomRule:
    """How one symptom's peers are read and compared, and its repairs (schemas/xid-policy.yaml)."""

    symptom: str
    metric: str
    filter: str
    aligner: str
    threshold: float
    hold_s: float
    on_finding: str
    otherwise: str


Reduce = Literal["bits_share", "increase", "rate"]


@dataclass(frozen=True)
class PromRule:
    """How one symptom's peers are read on GKE: a PromQL selector over dcgm-exporter's series, and
    how each series' samples reduce to one value (``degraded.prometheus`` in schemas/xid-policy.yaml).

    ``reduce``: ``bits_share``, the share of samples with any bit of ``mask`` set (a bitmap gauge);
    ``increase``, a counter's rise over the window (a reset counts from zero, as PromQL's);
    ``rate``, that rise per second times ``per_s``. A node's value is its worst GPU's.
    """

    symptom: str
    metric: str
    query: str  # a PromQL vector selector; ``{nodes}`` becomes the nodes' names as one anchored regex
    node_label: str
    reduce: Reduce
    threshold: float
    hold_s: float
    step_s: float
    mask: int = 0
    per_s: float = 1.0


def _prom_rule(name: str, r: PromSymptomDoc, node_label: str) -> PromRule:
    reduce = str(r["reduce"])
    if reduce not in ("bits_share", "increase", "rate"):
        raise ValueError(f"degraded.prometheus.{name}.reduce: unknown reduction {reduce!r}")
    return PromRule(
        name,
        str(r["metric"]),
        str(r["query"]),
        node_label,
        reduce,  # type: ignore[arg-type]  # checked just above
        float(r["threshold"]),
        float(r["hold_s"]),
        float(r["step_s"]),
        int(r.get("mask", 0)),
        float(r.get("per_s", 1.0)),
    )


@dataclass(frozen=True)
class DegradedPolicy:
    gang_wide_share: float
    symptoms: Mapping[str, SymptomRule]
    prometheus: Mapping[str, PromRule] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # scheduler -> where its nodes' DCGM lives

    @classmethod
    def from_doc(cls, doc: DegradedDoc) -> DegradedPolicy:
        rules = {
            name: SymptomRule(
                name,
                str(r["metric"]),
                str(r["filter"]),
                str(r["aligner"]),
                float(r["threshold"]),
                float(r["hold_s"]),
                str(r["on_finding"]),
                str(r["otherwise"]),
            )
            for name, r in doc["symptoms"].items()
        }
        prom = doc.get("prometheus")
        label = str((prom["node_label"] if prom else None) or "Hostname")
        proms = {n: _prom_rule(n, r, label) for n, r in (prom["symptoms"] if prom else {}).items()}
        return cls(float(doc["gang_wide_share"]), rules, proms, dict(doc.get("sources") or {}))

    def rule(self, symptom: object) -> SymptomRule | None:
        return self.symptoms.get(symptom) if isinstance(symptom, str) else None

    def source(self, scheduler: str | None) -> str:
        """Where a cluster's node telemetry is read: ``monitoring`` (Cloud Monitoring's timeSeries,
        the Ops Agent's DCGM metrics) unless the policy names another for its scheduler."""
        return self.sources.get(scheduler or "", "monitoring")

    def line(self, symptom: object, source: str) -> SymptomRule | PromRule | None:
        """The comparison rule for a symptom read from ``source`` (None: the alert stands alone)."""
        if source == "prometheus":
            return self.prometheus.get(symptom) if isinstance(symptom, str) else None
        return self.rule(symptom)


class Telemetry(Protocol):
    """Where the peers' readings come from (adapters/monitoring.py: Cloud Monitoring's timeSeries.list
    with a SymptomRule; adapters/prometheus.py: Managed Service for Prometheus with a PromRule)."""

    def node_values(
        self, project: str, rule: Any, nodes: Sequence[str], now: float
    ) -> dict[str, float | None]:
        """Each node's reading of the rule's metric over its window (None: no series for it)."""
        ...


@functools.cache
def default_policy() -> DegradedPolicy:
    """The ``degraded`` section of the XID policy, validated by its schema."""
    doc = resources.load_yaml(resources.schema_dir() / "xid-policy.yaml", "xid-policy.schema.json")
    return DegradedPolicy.from_doc(cast(XidPolicyDoc, doc)["degraded"])  # the schema checked it


@dataclass(frozen=True)
class PeerVerdict:
    """move | gang_wide | cleared | unconfirmed, one sentence why, and the readings it was decided
    on; a move carries the node's own reading as ``evidence``."""

    verdict: Verdict
    why: str
    node_value: float | None
    peers: Mapping[str, float | None]
    alike: tuple[str, ...] = ()
    evidence: Evidence | None = None

    @property
    def move(self) -> bool:
        return self.verdict == "move"

    def record(self, now: float, step: int) -> Measurement:
        """What the incident keeps (its ``corroboration``: the signal held against the peers, or not)."""
        rec: Measurement = {
            "kind": "peers",
            "confirmed": self.move,
            "verdict": self.verdict,
            "why": self.why[:500],
            "node_value": self.node_value,
            "peers": dict(self.peers),
            "alike": list(self.alike),
            "at": now,
            "step": step,
        }
        if self.evidence is not None:
            rec["evidence"] = self.evidence.record()
        return rec


def symptom_of(inc: Incident) -> str | None:
    """The symptom of a degraded incident's first alert that named one (throttle, ecc, ...)."""
    for ref in inc.get("alerts") or ():
        if isinstance(ref, Mapping) and isinstance(ref.get("symptom"), str):
            return str(ref["symptom"])
    return None


def _fmt(v: float) -> str:
    return f"{v:.3g}"


PAGED = "nothing moved or repaired; a person is paged"


def compare(
    rule: SymptomRule | PromRule | None,
    share: float,
    node: str,
    node_value: float | None,
    peers: Mapping[str, float | None],
    read_at: float | None = None,
) -> PeerVerdict:
    """Decide the planned move from the node's own reading and its job peers' (None: unreadable).

    ``read_at``: when Pitstop read them (the time of a move's evidence)."""
    known = {p: v for p, v in sorted(peers.items()) if p != node and v is not None}
    if rule is None:
        why = f"no rule in policy reads this symptom for the node: the alert alone is no evidence; {PAGED}"
        return PeerVerdict("unconfirmed", why, node_value, peers)
    line = f"{rule.metric.rsplit('/', 1)[-1]} > {_fmt(rule.threshold)} over {int(rule.hold_s)} s"
    if node_value is None:
        why = f"no reading of {node}'s own {rule.symptom} series ({line}): the alert alone is no evidence"
        why += f"; {PAGED}"
        return PeerVerdict("unconfirmed", why, node_value, peers)
    if node_value <= rule.threshold:
        why = (
            f"{node} reads {_fmt(node_value)} now, under the line ({line}): the condition has passed, no move"
        )
        return PeerVerdict("cleared", why, node_value, peers)
    reading = proof.telemetry_reading(
        node, rule.symptom, f"{node} reads {_fmt(node_value)} ({line})", read_at
    )
    if not known:
        why = f"{node} reads {_fmt(node_value)} ({line}), no other node of the job to compare with"
        why += ": a planned move"
        return PeerVerdict("move", why, node_value, peers, evidence=reading)
    alike = tuple(p for p, v in known.items() if v > rule.threshold)
    frac = len(alike) / len(known)
    if frac >= share:
        why = (
            f"{len(alike)} of the job's {len(known)} other nodes cross the same line ({line}): a shared "
            f"cause (cooling of their rack, the job's power cap, a clock setting), not {node}: no move"
        )
        return PeerVerdict("gang_wide", why, node_value, peers, alike)
    why = (
        f"{node} reads {_fmt(node_value)} ({line}) while {len(known) - len(alike)} of the job's"
        f" {len(known)} other nodes do not (highest {_fmt(max(known.values()))}): it holds the gang"
        " back, move at the checkpoint"
    )
    return PeerVerdict("move", why, node_value, peers, alike, reading)


def finding(symptom: str | None, confirmed: bool, why: str, smi: diag.SmiResult) -> tuple[bool, str]:
    """The node check's hardware finding: the diagnostic's own (GPUs lost, a row remap pending or
    failed, NVLink down, DCGM failing) or, for a throttling node, its hardware holding the clocks
    down now (HW slowdown, thermal or power brake: not a power cap someone set)."""
    slow = diag.slowdown_findings(smi) if symptom == "throttle" and smi.ok else []
    if confirmed or not slow:
        return confirmed, why
    return True, "the node's hardware holds its clocks down: " + "; ".join(slow)


def repair(rule: SymptomRule | None, finding: bool | None, why: str) -> tuple[str, str]:
    """The node's repair once the gang is off it: (action, why). Irreversible only on a finding."""
    on_finding = rule.on_finding if rule else Action.REPLACE_NODE
    otherwise = rule.otherwise if rule else Action.REBOOT_NODE
    if finding is True:
        return on_finding, f"the node check found the hardware at fault ({why}): {on_finding}"
    return otherwise, f"no hardware finding ({why}): {otherwise}, then validation decides"


def stood_down(inc: Incident) -> str | None:
    """``gang_wide`` or ``cleared`` when the comparison decided against a move; None otherwise."""
    rec: Measurement = inc.get("corroboration") or {}
    if inc.get("kind") != KIND or rec.get("kind") != "peers" or rec.get("confirmed"):
        return None
    return str(rec.get("verdict") or "cleared")


def close_note(inc: Incident) -> tuple[str, str] | None:
    """A degraded incident's closing words and their severity (None: not a degraded incident).

    No move: why (a gang-wide cause is a page: a person checks what the nodes share). A move: the
    gang onto spares at its checkpoint, or, with no spare, what it waited for instead.
    """
    timeline: Timeline = inc.get("timeline") or {}
    if inc.get("kind") != KIND or not timeline.get("fenced"):
        return None  # not a degraded node's move (or one that never began): the usual words
    node = cast(NodeRef, inc["node"])["instance"]  # a degraded episode is a node's
    rec: Measurement = inc.get("corroboration") or {}
    why = str(rec.get("why") or "")
    verdict = stood_down(inc)
    if verdict == "gang_wide":
        return f"{node}: degraded alert, NOT moved: {why}. A person checks what the nodes share.", "critical"
    if verdict == "unconfirmed":
        return (
            f"{node}: degraded alert, NOT moved: {why}. A person checks the node and the alert.",
            "critical",
        )
    if verdict is not None:
        return f"{node}: degraded alert, not moved: {why}.", "info"
    resume: Resume = inc.get("resume") or {}
    moved = [r["job"] for r in resume.get("requeued") or [] if isinstance(r, Mapping)]
    if resume.get("mode") == "early" and moved:
        how = f"planned move: job {', '.join(moved)} checkpointed and moved onto spares at that checkpoint"
    elif resume.get("waiting"):
        how = (
            "NO SPARE for the gang: today's drain instead (the job checkpointed, the node drained and"
            " repaired, the job requeued once it was back)"
        )
    else:
        how = "planned move: no job was running on the node"
    return f"{node}: degraded ({why or inc.get('reason')}); {how}; repair {inc['action']}.", "warning"


def peers_of(node: str, job_nodes: Sequence[Sequence[str]]) -> list[str]:
    """The node's peers: every other node of the jobs it runs, once each."""
    return sorted({n for nodes in job_nodes for n in nodes if n != node})


__all__ = [
    "KIND",
    "DegradedPolicy",
    "PeerVerdict",
    "PromRule",
    "SymptomRule",
    "Telemetry",
    "close_note",
    "compare",
    "default_policy",
    "finding",
    "peers_of",
    "repair",
    "stood_down",
    "symptom_of",
]
