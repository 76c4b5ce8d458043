"""Back to training at once, back to service only on measured health: the decisions around a repair.

Three questions a remediation step asks, each answered here without I/O:

- **early requeue**: may the gang move before the repair? Policy (``reschedule``) and what the
  scheduler says about its healthy capacity decide; otherwise the old order holds (requeue once
  the node is back) and the incident says why.
- **diagnose**: a REPLACE_NODE on log text alone first runs a short diagnostic on the fenced
  node; confirmed → replace (the finding goes into the host report), else step down to
  REBOOT_NODE. A diagnostic that never finished is no evidence either: step down too, since a
  reboot that does not heal the node fails its validation, which is measured evidence.
- **validate**: after a repair, the node's GPU count, DCGM and an NCCL all_gather with one healthy
  peer under the fabric's own NCCL setup; pass → the node returns; GPUs missing or a DCGM
  hardware failure → REPLACE_NODE (the diagnostic runs first); a busbw shortfall or corrupt
  data (#wrong > 0) against that one peer → a second all_gather against a different healthy
  peer (revalidate): short or wrong again → REPLACE_NODE, clean and at full speed → the node
  returns and the first peer is named as suspect (a finding on neither); anything else pages and
  the node stays fenced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from pitstop.core import degraded
from pitstop.core import diagnose as diag
from pitstop.core import evidence as proof
from pitstop.core import validation as val
from pitstop.core.actions import Action
from pitstop.core.domain import (
    CapacityDoc,
    CheckRun,
    CheckSpec,
    DiagnosisDetail,
    EvidenceGpu,
    GpuCounts,
    Incident,
    Measurement,
    PeerMeasurement,
    Vm,
)
from pitstop.core.evidence import Evidence
from pitstop.core.policy import Policy

DIAGNOSE = "diagnose"
VALIDATE = "validate"
REVALIDATE = "revalidate"  # the second peer's NCCL test after a busbw shortfall or corrupt data
EARLY = "early"
AFTER_REPAIR = "after_repair"
# Measured evidence an incident keeps (``measured``), newest last; bounded like every list on it.
MAX_MEASURED = 8


def check_name(iid: str, step: int, kind: str) -> str:
    """The run's name in the scheduler (a Slurm job name, a pod name): a DNS label, fixed per step."""
    return f"pitstop-{iid}-{step}-{kind}"


def machine_type_of(vm: Vm) -> str:
    """``a3-megagpu-8g`` from Compute's ``machine_type`` URL (or a bare name)."""
    return str(vm.get("machine_type") or "").rsplit("/", 1)[-1]


def gpus_of(vm: Vm) -> int | None:
    """The GPUs the VM has, from its ``guestAccelerators`` (None when it lists none: then a count
    of visible GPUs proves nothing, since Pitstop cannot know how many there should be)."""
    accs = vm.get("guest_accelerators")
    if not isinstance(accs, list):
        return None
    total = 0
    for a in accs:
        n = a.get("accelerator_count") if isinstance(a, Mapping) else None
        if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 64:
            total += n
    return total or None


# -- early requeue ---------------------------------------------------------------------------


def early_requeue(policy_choice: str, capacity: CapacityDoc) -> tuple[bool, str]:
    """Whether to requeue a job now, before the repair, and one line saying why (or why not)."""
    if policy_choice != EARLY:
        return False, "policy reschedule: after_repair (the gang is requeued once the node is back)"
    why = str(capacity.get("why") or "")
    if capacity.get("enough") is True:
        return True, f"healthy capacity for the gang now: {why}"
    return False, f"not enough healthy capacity to move the gang now ({why}): requeued once the node is back"


# -- diagnose before an irreversible action -----------------------------------------------------


def hardware_measured(inc: Incident) -> Measurement | None:
    """The latest measurement on this incident that found a hardware fault, if any."""
    for m in reversed(inc.get("measured") or []):
        if isinstance(m, Mapping) and m.get("hardware_fault"):
            return m
    return None


def needs_diagnosis(inc: Incident, policy: Policy) -> tuple[bool, str]:
    if inc.get("kind") == degraded.KIND and inc.get("action") == Action.DRAIN_NODE:
        if not policy.diagnose["enabled"]:
            return False, "diagnose.enabled is false in policy: the degraded node is only drained"
        return True, "a degraded node, the gang off it: the node check's finding picks its repair"
    if inc.get("action") != Action.REPLACE_NODE:
        return False, "a diagnostic runs only before REPLACE_NODE"
    if not policy.diagnose["enabled"]:
        return False, "diagnose.enabled is false in policy"
    found = hardware_measured(inc)
    if found is not None:
        return True, f"REPLACE_NODE after a measurement ({found.get('why')}): the node is examined first"
    return True, "REPLACE_NODE on log text alone: the node is examined first"


def diagnose_spec(
    inc: Incident, step: int, policy: Policy, gpus: int, expected_gpus: int | None
) -> CheckSpec:
    """``gpus``: what the check asks the scheduler for; ``expected_gpus``: what the VM has (None:
    unknown, and then no count of visible GPUs confirms anything)."""
    return {
        "kind": DIAGNOSE,
        "name": check_name(inc["id"], step, DIAGNOSE),
        "incident": inc["id"],
        "dcgm_level": int(policy.diagnose["dcgm_level"]),
        "gpus": gpus,
        "expected_gpus": expected_gpus,
    }


def evidence_gpu(inc: Incident) -> EvidenceGpu:
    """The GPU the log lines named most, as ``{"gpu": {"pci": ...}}`` for the diagnostic."""
    gpus = [g for g in (inc.get("gpus") or {}).values() if isinstance(g, Mapping) and g.get("pci")]
    if not gpus:
        return {}

    def hits(g: GpuCounts) -> int:
        xids = g.get("xids") or {}
        return sum(int(v) for v in xids.values() if isinstance(v, int)) if isinstance(xids, Mapping) else 0

    return {"gpu": {"pci": str(max(gpus, key=hits)["pci"])}}


@dataclass(frozen=True)
class DiagnosisVerdict:
    confirmed: bool
    action: str  # what this step does now: REPLACE_NODE, or REBOOT_NODE after a step-down
    why: str
    detail: DiagnosisDetail
    evidence: Evidence | None = None  # the diagnostic's finding, when confirmed

    def record(self, at: float) -> Measurement:
        rec: Measurement = {
            "kind": DIAGNOSE,
            "at": at,
            "confirmed": self.confirmed,
            "hardware_fault": self.confirmed,
            "action": self.action,
            "why": self.why,
        }
        if self.evidence is not None:
            rec["evidence"] = self.evidence.record()
        # DiagnosisDetail is Measurement's base, so the merge is one (mypy merges no partial TypedDicts)
        return cast(Measurement, {**rec, **self.detail})


def judge_diagnosis(
    inc: Incident,
    result: CheckRun | None,
    expected_gpus: int | None,
    table: val.ValidationTable | None = None,
) -> DiagnosisVerdict:
    """Confirm the replacement from what the node itself says, or step down (or page) and say why.

    A replacement that a measurement asked for (validation found the repaired node short) and the
    diagnostic does not confirm pages a person: rebooting again would only measure the same again.
    """
    measured = hardware_measured(inc)
    if not result or not result.get("done"):
        why = "the diagnostic did not finish" + (
            f" ({result.get('error')})" if result and result.get("error") else ""
        )
        return _not_confirmed(f"{why}: no evidence either way", measured, {})
    out = result.get("outputs") or {}
    smi = diag.parse_nvidia_smi_q(str(out.get("nvidia_smi_q") or ""))
    nvlink = diag.parse_nvlink_status(str(out["nvlink"])) if out.get("nvlink") is not None else None
    dcgm = val.parse_dcgm_diag(str(out["dcgm"])) if out.get("dcgm") is not None else None
    ref = inc.get("node")
    node = ref["instance"] if ref else ""
    d = diag.diagnose(evidence_gpu(inc), smi, dcgm, expected_gpus, nvlink, table, node)
    if d.confirmed:
        return DiagnosisVerdict(True, Action.REPLACE_NODE, d.why, d.detail, d.evidence)
    return _not_confirmed(d.why.removesuffix(": stepping down to REBOOT_NODE"), measured, d.detail)


def _not_confirmed(why: str, measured: Measurement | None, detail: DiagnosisDetail) -> DiagnosisVerdict:
    if measured is not None:
        return DiagnosisVerdict(
            False,
            val.PAGE,
            f"{why}, though {measured.get('kind')} measured: {measured.get('why')}; a person decides"
            " whether to replace the host (the node stays fenced)",
            detail,
        )
    return DiagnosisVerdict(False, Action.REBOOT_NODE, f"{why}: stepping down to REBOOT_NODE", detail)


# -- validate before returning to service ------------------------------------------------------


def needs_validation(inc: Incident, policy: Policy, has_scheduler: bool) -> tuple[bool, str]:
    cfg = policy.validation
    if not cfg["enabled"]:
        return False, "validation.enabled is false in policy"
    if inc.get("action") not in cfg["actions"]:
        return False, f"validation.actions does not list {inc.get('action')}"
    if not has_scheduler:
        return False, "the node is in no scheduler to run a validation through"
    return True, "the node returns to service only on measured health"


def table_for(policy: Policy, table: val.ValidationTable | None = None) -> val.ValidationTable:
    base = table or val.default_validation_table()
    expected = policy.validation["expected"]
    return base.with_overrides(expected) if expected else base


def validate_spec(
    inc: Incident,
    step: int,
    policy: Policy,
    machine_type: str,
    table: val.ValidationTable,
    gpus: int | None = None,
) -> CheckSpec:
    exp = table.expectation(machine_type)
    return {
        "kind": VALIDATE,
        "name": check_name(inc["id"], step, VALIDATE),
        "incident": inc["id"],
        "dcgm_level": int(policy.validation["dcgm_level"]),
        "gpus": gpus if gpus is not None else exp.gpus if exp else 8,
        "message_bytes": exp.message_bytes if exp else 8 << 30,
        "peer": True,
        "fabric": exp.fabric.as_spec() if exp and exp.fabric else None,
        "expected_gpus": gpus,  # what the VM has (None: unknown, and then no count says anything)
    }


def revalidate_spec(first: CheckSpec, step: int, measured_peers: list[str]) -> CheckSpec:
    """The second NCCL test after a shortfall: the same node, size and setup, another peer (the
    scheduler picks it the way it picked the first, never one in ``exclude_peers``); no DCGM."""
    return {
        **first,
        "kind": REVALIDATE,
        "name": check_name(first["incident"], step, REVALIDATE),
        "exclude_peers": sorted(set(measured_peers)),
    }


@dataclass(frozen=True)
class ValidationVerdict:
    validation: val.Validation
    next: str  # RETURN_TO_SERVICE, REPLACE_NODE, or PAGE
    peer: str | None
    note: str
    off_fabric: str | None = None  # why the NCCL figure was not the fabric's (None: it was)
    peers: tuple[PeerMeasurement, ...] = ()
    evidence: Evidence | None = None  # a hardware finding of the validation's own (GPUs missing)

    @property
    def wants_second_peer(self) -> bool:
        """Against one peer, corrupt data (under any NCCL setup: wrong data is wrong), or a busbw
        shortfall measured the fabric's way: ask another peer."""
        verdict = self.validation.verdict
        return self.peer is not None and (
            verdict == "corrupt" or (verdict == "degraded" and self.off_fabric is None)
        )

    def record(self, at: float) -> Measurement:
        rec: Measurement = {
            "kind": VALIDATE,
            "at": at,
            "hardware_fault": self.next == Action.REPLACE_NODE,
            "next": self.next,
            "peer": self.peer,
            "note": self.note,
            "off_fabric": self.off_fabric,
            "nccl_peers": list(self.peers),
            **self.validation.as_record(),
        }
        if self.evidence is not None:
            rec["evidence"] = self.evidence.record()
        return rec


def gpus_missing(
    action: str, node: str, out: Mapping[str, str], expected: int | None, peer: str | None, note: str
) -> ValidationVerdict | None:
    """The validation's own GPU count, judged before any test: fewer GPUs visible than the VM has,
    or one lost, is a hardware finding (an NCCL test on such a node has no rows to judge, and a
    person would page on that). None: the count is whole, unknown or unreadable."""
    if expected is None or not isinstance(out.get("nvidia_smi_q"), str):
        return None
    smi = diag.parse_nvidia_smi_q(str(out["nvidia_smi_q"]))
    if not smi.ok or (smi.visible >= expected and not smi.lost):
        return None
    lost = f" (lost: {', '.join(smi.lost)})" if smi.lost else ""
    why = (
        f"the repaired node shows {smi.visible} of {expected} GPUs{lost}: GPUs missing are a hardware finding"
    )
    v = val.Validation(False, val.GPUS_MISSING, why)
    return ValidationVerdict(
        v, val.next_action(action, v), peer, note, evidence=proof.validation_finding(node, why)
    )


def _applied(out: Mapping[str, str]) -> Mapping[str, object] | None:
    """The NCCL setup the scheduler reports it ran the test with (``nccl_setup``, JSON)."""
    try:
        doc = json.loads(out.get("nccl_setup") or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def judge_validation(
    action: str,
    machine_type: str,
    result: CheckRun | None,
    policy: Policy,
    table: val.ValidationTable,
    node: str = "",
    expected_gpus: int | None = None,
) -> ValidationVerdict:
    """Judge the repaired node from its GPU count, DCGM and NCCL outputs; fail closed on anything
    missing. GPUs missing (``expected_gpus``: what the VM has) decide first: REPLACE_NODE.

    A busbw shortfall or corrupt data against one peer is not judged here: corrupt data, or a
    shortfall measured the fabric's way, asks for a second peer (``wants_second_peer``, then
    ``judge_second_peer``); a shortfall measured otherwise pages (``off_fabric`` says why).
    """
    cfg = policy.validation
    if not result or not result.get("done"):
        why = "validation did not finish" + (
            f" ({result.get('error')})" if result and result.get("error") else ""
        )
        v = val.Validation(False, "incomplete", why + ": the node stays fenced")
        return ValidationVerdict(v, val.PAGE, None, "")
    out = result.get("outputs") or {}
    peer = str(result.get("peer")) if result.get("peer") else None
    note = str(result.get("note") or "")
    if (missing := gpus_missing(action, node, out, expected_gpus, peer, note)) is not None:
        return missing
    dcgm = val.parse_dcgm_diag(str(out.get("dcgm") or ""))
    if out.get("nccl") is None:
        v = _dcgm_only(dcgm, note, bool(cfg["require_peer"]), table.config_only_tests)
        return ValidationVerdict(v, val.next_action(action, v), peer, note)
    nccl = val.parse_all_gather(str(out["nccl"]))
    v = val.validate(machine_type, nccl, dcgm, float(cfg["busbw_fraction"]), table)
    exp = table.expectation(machine_type)
    off = val.off_fabric(exp, nccl, _applied(out)) if exp and v.verdict == "degraded" else None
    peers: tuple[PeerMeasurement, ...] = ({"peer": peer, "busbw_gbps": v.busbw, "verdict": v.verdict},)
    if off is not None:  # the figure says nothing of the host: said where a person reads it
        v = dataclasses.replace(v, why=f"{v.why}; but {off}: no evidence against the host")
        note = f"{note}; " if note else ""
        note += f"busbw short, but {off}: no evidence against the host"
    return ValidationVerdict(v, val.next_action(action, v), peer, note, off, peers)


def _against(v: val.Validation, peer: str | None) -> str:
    """What one NCCL run showed against ``peer``, in the incident's words."""
    if v.verdict == "corrupt":
        return f"wrong data against {peer} ({v.why})"
    return (
        f"busbw {v.busbw:.2f} GB/s against {peer}" if v.busbw is not None else f"busbw short against {peer}"
    )


def judge_second_peer(
    action: str,
    machine_type: str,
    first: ValidationVerdict,
    result: CheckRun | None,
    policy: Policy,
    table: val.ValidationTable,
) -> ValidationVerdict:
    """The first peer's shortfall or corrupt data, judged with the second peer's all_gather.

    Short or wrong against both (a shortfall each time measured the fabric's way) → the host is
    at fault (REPLACE_NODE after a repair). Clean and at full speed with the second → the node
    returns to service: it passed DCGM and ran at the fabric's speed with a healthy peer, so the
    first peer (or the path between) is named as suspect in the incident, a finding against
    neither. No second peer, a run that did not finish, or a figure not measured the fabric's
    way → a page, the node stays fenced.
    """
    p1, v1 = first.peer, first.validation
    exp = table.expectation(machine_type)
    said1 = _against(v1, p1)

    def page(why: str, peers: tuple[PeerMeasurement, ...] = first.peers) -> ValidationVerdict:
        v = val.Validation(
            False,
            f"{v1.verdict}_one_peer",
            f"{said1}; {why}: a finding on neither, a person decides",
            v1.busbw,
            v1.expected,
            v1.threshold,
            v1.message_bytes,
            v1.dcgm_verdict,
        )
        return ValidationVerdict(v, val.PAGE, p1, why, first.off_fabric, peers)

    if exp is None or not result or not result.get("done"):
        err = f" ({result.get('error')})" if result and result.get("error") else ""
        return page(f"the second peer's measurement did not finish{err}")
    p2 = str(result.get("peer")) if result.get("peer") else None
    if p2 is None or p2 == p1:
        return page(f"no second healthy peer to measure against ({result.get('note') or 'none free'})")
    out = result.get("outputs") or {}
    nccl = val.parse_all_gather(str(out.get("nccl") or ""))
    v2 = val.judge_busbw(
        machine_type, exp, float(policy.validation["busbw_fraction"]), nccl, str(v1.dcgm_verdict)
    )
    peers = (*first.peers, PeerMeasurement(peer=p2, busbw_gbps=v2.busbw, verdict=v2.verdict))
    off2 = val.off_fabric(exp, nccl, _applied(out)) if v2.verdict in ("degraded", "pass") else None
    if off2 is not None:
        return page(f"the second measurement ({p2}) was not the fabric's: {off2}", peers)
    if v2.verdict in val.PEER_VERDICTS:
        return _against_both(action, first, v2, p2, peers)
    if v2.verdict == "pass":
        bad = "but clean data and full speed" if v1.verdict == "corrupt" else "but full speed"
        note = f"{said1} {bad} against {p2}: {p1} or the path to it is suspect; a finding on neither"
        v = dataclasses.replace(v2, why=f"{v2.why} (with {p2}); {note}")
        return ValidationVerdict(v, val.RETURN_TO_SERVICE, p2, note, None, peers)
    return page(f"the second measurement ({p2}) says nothing: {v2.why}", peers)


def _against_both(
    action: str,
    first: ValidationVerdict,
    v2: val.Validation,
    p2: str,
    peers: tuple[PeerMeasurement, ...],
) -> ValidationVerdict:
    """Short or wrong with two different healthy peers: the host's, whichever peer it runs with."""
    p1, v1 = first.peer, first.validation
    if v1.verdict == v2.verdict == "degraded":
        why = (
            f"{_against(v1, p1)} and {v2.busbw:.2f} GB/s against {p2}, both under the fabric's"
            f" setup: the host is short whichever peer it runs with ({v1.why})"
        )
        note = f"short against {p1} and {p2}"
    else:
        why = f"{_against(v1, p1)} and {_against(v2, p2)}: the host fails whichever peer it runs with"
        note = f"{v1.verdict} against {p1}, {v2.verdict} against {p2}"
    v = dataclasses.replace(v1, why=why)
    return ValidationVerdict(v, val.next_action(action, v, peer_corroborated=True), p1, note, None, peers)


def _dcgm_only(
    dcgm: val.DcgmResult, note: str, require_peer: bool, config_only: frozenset[str]
) -> val.Validation:
    """No healthy peer was free for the NCCL test: DCGM alone decides, unless policy requires a peer."""
    why_peer = note or "no healthy peer was free for the NCCL test"
    if require_peer:
        return val.Validation(
            False, "no_peer", f"{why_peer}; validation.require_peer is true", dcgm_verdict=dcgm.verdict
        )
    gate = val.dcgm_gate(dcgm, config_only)
    if gate is not None:
        return gate
    return val.Validation(
        True, "pass", f"DCGM pass; busbw not measured: {why_peer}", dcgm_verdict=dcgm.verdict
    )
