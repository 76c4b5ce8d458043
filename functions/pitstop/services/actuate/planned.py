"""A degraded node's planned move: held against the job's other nodes first, repaired by its finding.

Where a degraded incident (a Monitoring alert: core/alerts.py) differs from the drain it shares
the workflow with (workflows/remediate.yaml): its ``corroborate`` reads the alert's metric for
the job's other nodes (Cloud Monitoring, the same channel the alert came through) and its judge
decides, in core/degraded.py, whether this node's own reading shows the symptom and it is the odd
one out (the step goes on: checkpoint, the gang moved at it onto spares, the node diagnosed,
repaired, validated) or not (``stand_down``: the workflow lifts the fence and closes; a gang-wide
cause, or an alert no reading of the node confirms, pages a person). Its ``diagnose``
always runs, and the finding picks the repair: REPLACE_NODE only on a hardware finding.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.core import corroboration, degraded
from pitstop.core import diagnose as diag
from pitstop.core.actions import Action
from pitstop.core.answers import Corroborating, CorroborationJudged
from pitstop.core.checks import DiagnosisVerdict
from pitstop.core.domain import CheckRun, Incident, Measurement
from pitstop.core.ops import Op
from pitstop.core.promql import PromError
from pitstop.services.actuate.context import Step

_UNREADABLE = (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError, PromError)


def planned(inc: Incident) -> bool:
    """A degraded node's incident still on its planned move (its repair not yet chosen)."""
    return corroboration.claim_kind(inc) == degraded.KIND and inc.get("action") == Action.DRAIN_NODE


def compare_peers(s: Step) -> Corroborating:
    """Read the node's and its job peers' telemetry once, and decide the move (recorded).

    Where the readings live follows the cluster's scheduler (``degraded.sources``): a GKE node's
    are dcgm-exporter's series in Managed Service for Prometheus, any other's the Ops Agent's in
    Cloud Monitoring; the rule for the symptom is that source's, the comparison the same."""
    pol = degraded.default_policy()
    cluster = s.deps.policy.cluster_named(str(s.inc.get("cluster") or ""))
    source = pol.source(cluster.scheduler if cluster else None)
    rule = pol.line(degraded.symptom_of(s.inc), source)
    reader = s.deps.prometheus if source == "prometheus" else s.deps.telemetry
    fenced = s.recorded(Op.FENCE)
    jobs = [str(j) for j in fenced.get("jobs", [])] if fenced else []
    peers = degraded.peers_of(s.instance, [s.scheduler.job_info(j, s.ref).nodes for j in jobs])
    values: dict[str, float | None] = {}
    note = ""
    if rule is not None and reader is not None:
        try:
            values = reader.node_values(str(s.node()[0]), rule, [s.instance, *peers], s.deps.clock())
        except _UNREADABLE as exc:  # no reading of the node: nothing moves, a person is paged
            note = f"telemetry unreadable ({type(exc).__name__}: {str(exc)[:120]})"
    peer_values = {p: values.get(p) for p in peers}
    verdict = degraded.compare(
        rule, pol.gang_wide_share, s.instance, values.get(s.instance), peer_values, s.deps.clock()
    )
    record: Measurement = {**verdict.record(s.deps.clock(), s.step), "source": source}
    if note:
        record["why"] = f"{note}; {record['why']}"[:500]
    log.emit("INFO", "degraded node held against its peers", incident=s.iid, verdict=verdict.verdict,
             why=record["why"], jobs=jobs, source=source)  # fmt: skip
    return {"run": False, "peers": record, "jobs": jobs, "why": "a degraded node is compared with its peers"}


def judged(record: Measurement) -> CorroborationJudged:
    """The judge's answer: go on (the planned move), or ``stand_down`` (no move: the workflow
    lifts the fence and closes; the close says why, and pages for a gang-wide cause)."""
    if record.get("confirmed") is True:
        return {"confirmed": True, "why": record["why"]}
    return {"confirmed": False, "stand_down": True, "verdict": record.get("verdict"), "why": record["why"]}


def repair_verdict(s: Step, found: DiagnosisVerdict, result: CheckRun | None) -> DiagnosisVerdict:
    """The repair the node check's finding earns (core/degraded), from the diagnostic's verdict
    and, for a throttling node, the clock event reasons its ``nvidia-smi -q`` shows."""
    symptom = degraded.symptom_of(s.inc)
    out = (result.get("outputs") if result else None) or {}
    smi = diag.parse_nvidia_smi_q(str(out.get("nvidia_smi_q") or ""))
    why = found.why.removesuffix(": stepping down to REBOOT_NODE")
    confirmed, why = degraded.finding(symptom, found.confirmed, why, smi)
    action, why = degraded.repair(degraded.default_policy().rule(symptom), confirmed, why)
    return DiagnosisVerdict(confirmed, action, why, found.detail, found.evidence)
