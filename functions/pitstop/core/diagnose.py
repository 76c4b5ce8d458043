"""Diagnose before an irreversible action: does the node itself confirm what the log line claimed?

REPLACE_NODE takes a host out for days. When the evidence is log text alone, a short diagnostic on
the fenced node (``nvidia-smi -q``, ``nvidia-smi nvlink --status``, ``dcgmi diag -r 1 -j``) must
confirm it; otherwise the incident steps down to REBOOT_NODE and records why. Parsers are total.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from pitstop.core import evidence as proof
from pitstop.core.domain import DiagnosisDetail, EvidenceGpu
from pitstop.core.evidence import Evidence
from pitstop.core.validation import DcgmResult, ValidationTable, default_validation_table

# ---------------------------------------------------------------- nvidia-smi -q

_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_GPU_HEADER = re.compile(r"^GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\s*$")
_LOST = re.compile(
    r"Unable to determine the device handle for (?:GPU\s*\d*:?\s*)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2})(?:\.[0-7])?:\s*(?P<why>.*)",
    re.IGNORECASE,
)


def pci_key(pci: object) -> tuple[int, int, int] | None:
    """(domain, bus, device) from "0000:10:1c", "00000000:10:1C.0" or "PCI:0000:10:1c"; else None."""
    if not isinstance(pci, str):
        return None
    parts = pci.strip().lower().removeprefix("pci:").split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        dom, bus, dev = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return (dom, bus, dev) if dom < 1 << 32 and bus < 256 and dev < 32 else None


@dataclass(frozen=True)
class GpuHealth:
    """One GPU block of ``nvidia-smi -q``; None = the field was not printed (or N/A)."""

    index: int  # position in the output: nvidia-smi lists GPUs in index order
    pci: str
    product: str | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pending: bool | None = None
    slowdown: tuple[str, ...] = ()  # hardware clock event reasons active now (HW_SLOWDOWN_REASONS)


# ``Clocks Event Reasons`` (R535 on; "Clocks Throttle Reasons" before) that say the hardware or its
# cooling holds the clocks down, as opposed to a setting (SW Power Cap, Applications Clocks, Sync
# Boost) or idleness: NVML's clocks event reasons,
# https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html (HW Slowdown: "temperature
# being too high, External Power Brake Assertion ..., Power draw is too high").
HW_SLOWDOWN_REASONS = frozenset(
    {"HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown"}
)
_CLOCK_SECTIONS = frozenset({"Clocks Event Reasons", "Clocks Throttle Reasons"})


@dataclass(frozen=True)
class SmiResult:
    ok: bool
    attached: int | None = None
    gpus: tuple[GpuHealth, ...] = ()
    lost: tuple[str, ...] = ()  # PCI ids nvidia-smi could not open ("GPU is lost")
    driver: str | None = None
    error: str | None = None

    @property
    def visible(self) -> int:
        """GPUs the driver can use: the attached count minus the lost ones, else the blocks printed."""
        base = self.attached if self.attached is not None else len(self.gpus)
        return max(0, base - len(self.lost))


def _yes_no(v: str) -> bool | None:
    return {"yes": True, "no": False}.get(v.strip().lower())


def _int(v: str) -> int | None:
    v = v.strip()
    return int(v) if re.fullmatch(r"[0-9]{1,11}", v) else None


class _GpuFields(TypedDict, total=False):
    """What one GPU block printed (GpuHealth's fields after its index and address)."""

    product: str
    remapped_correctable: int | None
    remapped_uncorrectable: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    retired_pending: bool | None
    slowdown: tuple[str, ...]


def _remap(fields: _GpuFields, key: str, value: str) -> None:
    """One line of a ``Remapped Rows`` section (its other lines say nothing diagnosis reads)."""
    if key == "Correctable Error":
        fields["remapped_correctable"] = _int(value)
    elif key == "Uncorrectable Error":
        fields["remapped_uncorrectable"] = _int(value)
    elif key == "Pending":
        fields["remap_pending"] = _yes_no(value)
    elif key == "Remapping Failure Occurred":
        fields["remap_failure"] = _yes_no(value)


def _gpu_block(index: int, pci: str, lines: list[str]) -> GpuHealth:
    """Fields of one GPU block; the section a key sits in decides what it means ("Pending")."""
    fields: _GpuFields = {}
    section = ""
    for line in lines:
        depth = len(line) - len(line.lstrip())
        m = _KV.match(line)
        if not m:  # a section title ("    Remapped Rows") has no colon
            section = line.strip() if depth <= 4 else section
            continue
        key, value = m["key"].strip(), m["value"]
        if depth <= 4:
            section = key if not value else ""
            if key == "Product Name":
                fields["product"] = value[:100]
        elif section == "Remapped Rows":
            _remap(fields, key, value)
        elif section == "Retired Pages" and key == "Pending Page Blacklist":
            fields["retired_pending"] = _yes_no(value)
        elif section in _CLOCK_SECTIONS and key in HW_SLOWDOWN_REASONS and value.lower() == "active":
            fields["slowdown"] = (*fields.get("slowdown", ()), key)
    return GpuHealth(index, pci, **fields)


def parse_nvidia_smi_q(text: str) -> SmiResult:
    """Parse ``nvidia-smi -q`` for what diagnosis needs: GPU count, lost GPUs, row remapping."""
    if not isinstance(text, str):
        return SmiResult(False, error="output is not text")
    attached: int | None = None
    driver: str | None = None
    lost: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if m := _LOST.search(line):
            lost.append(m["pci"].lower())
        elif m := _GPU_HEADER.match(line):
            blocks.append((m["pci"], []))
        elif blocks and line.startswith((" ", "\t")):
            blocks[-1][1].append(line.expandtabs(4))
        elif (kv := _KV.match(line)) and not kv["indent"]:
            if kv["key"] == "Attached GPUs":
                attached = _int(kv["value"])
            elif kv["key"] == "Driver Version":
                driver = kv["value"][:40]
    gpus = tuple(_gpu_block(i, pci, body) for i, (pci, body) in enumerate(blocks))
    if attached is None and not gpus and not lost:
        if "No devices were found" in text:  # nvidia-smi's words when the driver sees no GPU at all
            return SmiResult(True, 0)
        return SmiResult(False, error="no 'Attached GPUs' and no GPU blocks: not nvidia-smi -q output")
    return SmiResult(True, attached, gpus, tuple(dict.fromkeys(lost)), driver)


# ---------------------------------------------------------------- nvidia-smi nvlink --status

_NV_GPU = re.compile(r"^GPU (?P<idx>\d+): ")
_NV_LINK = re.compile(r"^\s+Link (?P<link>\d+): (?P<state>.+?)\s*$")


@dataclass(frozen=True)
class NvlinkResult:
    ok: bool
    active: Mapping[int, int] = field(default_factory=dict)  # GPU index -> links up
    inactive: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # GPU index -> links down
    error: str | None = None


def parse_nvlink_status(text: str) -> NvlinkResult:
    """Parse ``nvidia-smi nvlink --status``: a link prints a speed, or "<inactive>" when down."""
    if not isinstance(text, str):
        return NvlinkResult(False, error="output is not text")
    active: dict[int, int] = {}
    inactive: dict[int, list[int]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        if m := _NV_GPU.match(line):
            gpu = int(m["idx"])
            active.setdefault(gpu, 0)
            inactive.setdefault(gpu, [])
        elif (m := _NV_LINK.match(line)) and gpu is not None:
            state = m["state"].lower()
            if "inactive" in state or state.startswith("0 gb/s"):
                inactive[gpu].append(int(m["link"]))
            elif "gb/s" in state:
                active[gpu] += 1
    if not active:
        return NvlinkResult(False, error="no 'GPU n:' lines: not nvidia-smi nvlink --status output")
    return NvlinkResult(True, active, {g: tuple(v) for g, v in inactive.items()})


# ---------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Diagnosis:
    """confirmed: the node's own state backs the planned replacement; why: one human sentence."""

    confirmed: bool
    why: str
    detail: DiagnosisDetail = field(default_factory=lambda: DiagnosisDetail())
    evidence: Evidence | None = None  # the first hardware finding, when confirmed


def _evidence_gpu(evidence: EvidenceGpu, smi: SmiResult) -> tuple[int | None, str | None]:
    """The GPU the log named, as (index, pci), from the event's gpu.pci matched to nvidia-smi."""
    gpu = evidence.get("gpu")
    pci = gpu.get("pci") if isinstance(gpu, Mapping) else None
    key = pci_key(pci)
    if key is None:
        return None, None
    for g in smi.gpus:
        if pci_key(g.pci) == key:
            return g.index, g.pci
    return None, pci if isinstance(pci, str) else None


def smi_findings(
    smi: SmiResult, expected_gpus: int | None, pci: str | None, count_is_evidence: bool = True
) -> list[str]:
    """``count_is_evidence`` False: the tool ran where it may see only some GPUs (a job step without
    an explicit GPU ask), so a low count says nothing; a GPU the driver reports lost still does."""
    out: list[str] = []
    if count_is_evidence and expected_gpus is not None and smi.visible < expected_gpus:
        lost = f" (lost: {', '.join(smi.lost)})" if smi.lost else ""
        out.append(f"{smi.visible} of {expected_gpus} GPUs visible{lost}")
    elif pci and pci_key(pci) in {pci_key(p) for p in smi.lost}:
        out.append(f"GPU {pci} is lost")
    elif not count_is_evidence and smi.lost:
        out.append(f"GPUs lost: {', '.join(smi.lost)}")
    for g in smi.gpus:
        if g.remap_failure:
            out.append(f"GPU {g.index} ({g.pci}) row remapping failed")
        if g.remap_pending:
            out.append(f"GPU {g.index} ({g.pci}) row remap pending")
    return out


def slowdown_findings(smi: SmiResult) -> list[str]:
    """GPUs the hardware holds below their clocks now (a throttling straggler's finding)."""
    return [f"GPU {g.index} ({g.pci}) {', '.join(g.slowdown)} active" for g in smi.gpus if g.slowdown]


def _nvlink_findings(nvlink: NvlinkResult | None) -> list[str]:
    """Links down on a GPU whose peers have more up: a fault, not a PCIe part without NVLink."""
    if nvlink is None or not nvlink.ok:
        return []
    most = max(len(nvlink.inactive.get(g, ())) + n for g, n in nvlink.active.items())
    return [
        f"GPU {g} NVLink {n} of {most} links up (down: {','.join(map(str, nvlink.inactive.get(g, ())))})"
        for g, n in sorted(nvlink.active.items())
        if n < most
    ]


def _dcgm_findings(
    dcgm: DcgmResult | None, table: ValidationTable, index: int | None
) -> tuple[list[str], list[str]]:
    """(hardware failures, configuration-only failures); the GPU the log named comes first."""
    if dcgm is None or not dcgm.ok:
        return [], []
    hw: list[tuple[bool, str]] = []
    cfg: list[str] = []
    for t in dcgm.failing:
        named = index is not None and index in t.gpus
        text = f"DCGM {t.name} failed on GPU {','.join(map(str, t.gpus)) or '?'}"
        if t.name in table.config_only_tests:
            cfg.append(text)
        else:
            hw.append((not named, text + (" (the GPU the log named)" if named else "")))
    return [text for _, text in sorted(hw)], cfg


def diagnose(
    inc_evidence: EvidenceGpu,
    nvidia_smi: SmiResult,
    dcgm: DcgmResult | None,
    expected_gpus: int | None,
    nvlink: NvlinkResult | None = None,
    table: ValidationTable | None = None,
    node: str = "",
) -> Diagnosis:
    """Confirm a replacement from the node itself, or say why not (then step down to REBOOT_NODE).

    ``expected_gpus`` is what the VM has (its guestAccelerators); None when unknown, and then no
    count confirms anything (a healthy 4-GPU VM must never look like an 8-GPU one missing four).
    Confirmed by: fewer GPUs visible than expected or the named GPU lost (fallen off the bus), a row
    remap failure or pending remap, NVLink links down, or a DCGM hardware test failing (on the named
    GPU or another: the host is the unit replaced). Not by: DCGM warnings, configuration-only DCGM
    checks, or diagnostic output that could not be read, which is no evidence either way.
    """
    table = table or default_validation_table()
    index, pci = _evidence_gpu(inc_evidence, nvidia_smi) if nvidia_smi.ok else (None, None)
    found = smi_findings(nvidia_smi, expected_gpus, pci) if nvidia_smi.ok else []
    found += _nvlink_findings(nvlink)
    hw, cfg = _dcgm_findings(dcgm, table, index)
    found += hw
    detail: DiagnosisDetail = {
        "gpus_visible": nvidia_smi.visible if nvidia_smi.ok else None,
        "gpus_expected": expected_gpus,
        "evidence_gpu": {"index": index, "pci": pci},
        "dcgm": dcgm.verdict if dcgm else None,
        "findings": found,
        "config_findings": cfg,
        "unreadable": [
            name
            for name, r in (("nvidia-smi", nvidia_smi), ("dcgmi", dcgm), ("nvlink", nvlink))
            if r is not None and not r.ok
        ],
    }
    if found:
        why = "diagnostic confirms a hardware fault: " + "; ".join(found)
        return Diagnosis(True, why, detail, proof.diagnostic_finding(node, found[0], pci))
    why = "diagnostic found no hardware fault"
    if detail["unreadable"]:
        why += f" it could read ({', '.join(detail['unreadable'])} output unusable)"
    if cfg:
        why += f"; only configuration checks failed ({'; '.join(cfg)})"
    elif dcgm is not None and dcgm.verdict == "warn":
        why += "; DCGM only warned"
    return Diagnosis(False, why + ": stepping down to REBOOT_NODE", detail)


__all__ = [
    "Diagnosis",
    "GpuHealth",
    "NvlinkResult",
    "SmiResult",
    "diagnose",
    "parse_nvidia_smi_q",
    "parse_nvlink_status",
    "pci_key",
]
