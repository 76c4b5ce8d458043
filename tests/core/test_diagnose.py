"""Diagnose before replacing: real nvidia-smi samples, each confirming finding, the step-down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core.diagnose import (
    Diagnosis,
    SmiResult,
    diagnose,
    parse_nvidia_smi_q,
    parse_nvlink_status,
    pci_key,
)
from pitstop.core.domain import EvidenceGpu
from pitstop.core.validation import DcgmResult, parse_dcgm_diag

FIX = Path(__file__).parents[1] / "fixtures" / "validation"
ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SMI = (FIX / "nvidia_smi_q_a100_row_remap_pending.txt").read_text()
SAMPLE_NVLINK = (FIX / "nvidia_smi_nvlink_status_h100.txt").read_text()
DCGM_PASS = parse_dcgm_diag((FIX / "dcgmi_diag_v3_pass_8gpu.txt").read_text())
EVIDENCE: EvidenceGpu = {"gpu": {"pci": "0000:0b:00"}}  # as core.xid_line normalises a PCI id
# The message nvidia-smi prints for a GPU that fell off the bus (quoted in many public notes).
LOST = (
    "Unable to determine the device handle for GPU 0000:05:00.0: GPU is lost.  "
    "Reboot the system to recover this GPU"
)


def healthy_smi(n: int = 8, lost: int = 0) -> str:
    lines = ["Driver Version                            : 550.90.07", "", f"Attached GPUs  : {n}"]
    for i, bus in enumerate(["04", "05", "0B", "0C", "84", "85", "8B", "8C"][:n]):
        if i < n - lost:
            lines += [
                f"GPU 00000000:{bus}:00.0",
                "    Product Name   : NVIDIA H100 80GB HBM3",
                "    Remapped Rows",
            ]
            lines += ["        Pending                    : No", "        Remapping Failure Occurred : No"]
        else:
            lines.append(LOST.replace("05:00.0", f"{bus.lower()}:00.0"))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ parsers


def test_parse_real_nvidia_smi_q_sample() -> None:
    r = parse_nvidia_smi_q(SAMPLE_SMI)
    assert r.ok and r.attached == 8 and r.driver == "510.73.08" and r.lost == () and r.visible == 8
    (g,) = r.gpus  # the author elided the other seven blocks
    assert (g.index, g.pci, g.product) == (0, "00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert (g.remapped_correctable, g.remapped_uncorrectable) == (1, 0)
    assert (g.remap_pending, g.remap_failure, g.retired_pending) == (True, False, None)


def test_pending_outside_remapped_rows_is_not_a_remap() -> None:
    text = "Attached GPUs : 1\nGPU 00000000:04:00.0\n    Clocks Event Reasons\n        Pending   : Yes\n"
    (g,) = parse_nvidia_smi_q(text).gpus
    assert g.remap_pending is None


def test_lost_gpu_is_not_visible() -> None:
    r = parse_nvidia_smi_q(healthy_smi(8, lost=1))
    assert r.ok and r.attached == 8 and len(r.gpus) == 7 and r.lost == ("0000:8c:00",) and r.visible == 7


def test_parse_real_nvlink_sample_and_inactive_links() -> None:
    r = parse_nvlink_status(SAMPLE_NVLINK)
    assert r.ok and r.active == {0: 2} and r.inactive == {0: ()}
    down = "GPU 0: H100\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\nGPU 1: H100\n\t Link 0: 26.562 GB/s\n"
    d = parse_nvlink_status(down + "\t Link 1: 26.562 GB/s\n")
    assert d.active == {0: 1, 1: 2} and d.inactive == {0: (1,), 1: ()}


@pytest.mark.parametrize("text", ["", "NVIDIA-SMI has failed because it couldn't communicate", "GPU 0000"])
def test_garbage_nvidia_smi(text: str) -> None:
    assert not parse_nvidia_smi_q(text).ok
    assert not parse_nvlink_status(text).ok


def test_no_devices_at_all_is_zero_visible() -> None:
    r = parse_nvidia_smi_q("No devices were found\n")
    assert r.ok and r.visible == 0 and not parse_nvlink_status("No devices were found").ok


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("GPU 0123456789abcdef:.\n\t YesNoPendingRemapped Rows²")), max_size=300
    )
)
def test_nvidia_smi_parsers_are_total(text: str) -> None:
    r = parse_nvidia_smi_q(text)
    assert r.ok or r.error
    n = parse_nvlink_status(text)
    assert n.ok or n.error


@pytest.mark.parametrize(
    ("pci", "key"),
    [
        ("0000:10:1c", (0, 0x10, 0x1C)),
        ("00000000:10:1C.0", (0, 0x10, 0x1C)),
        ("PCI:0000:0b:00", (0, 0x0B, 0)),
        ("10:1c", None),
        ("0000:zz:00", None),
        ("0000:100:00", None),
        (None, None),
    ],
)
def test_pci_key(pci: Any, key: Any) -> None:
    assert pci_key(pci) == key


# ------------------------------------------------------------------ the decision


def test_fallen_off_the_bus_is_confirmed() -> None:
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi(8, lost=1)), DCGM_PASS, 8)
    assert d.confirmed and "7 of 8 GPUs visible" in d.why and "0000:8c:00" in d.why
    assert d.detail["gpus_visible"] == 7
    gone = diagnose(EVIDENCE, SmiResult(True, 6, ()), None, 8)  # nvidia-smi lists only 6
    assert gone.confirmed and "6 of 8" in gone.why


def test_row_remap_failure_and_pending_are_confirmed() -> None:
    failed = healthy_smi().replace("Remapping Failure Occurred : No", "Remapping Failure Occurred : Yes", 1)
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(failed), DCGM_PASS, 8)
    assert d.confirmed and "GPU 0 (00000000:04:00.0) row remapping failed" in d.why
    p = diagnose(EVIDENCE, parse_nvidia_smi_q(SAMPLE_SMI), DCGM_PASS, 8)
    assert p.confirmed and "row remap pending" in p.why


def test_dcgm_failure_on_the_named_gpu_is_confirmed_first() -> None:
    doc = json.loads((FIX / "dcgmi_diag_v4_issue215_fragment.txt").read_text().rstrip().rstrip(","))
    doc["results"][2]["status"] = "Fail"
    doc["results"][6]["status"] = "Fail"
    wrapped = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [doc]}]}}
    dcgm = parse_dcgm_diag(json.dumps(wrapped))
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi()), dcgm, 8)  # 0b:00 is GPU 2
    assert d.confirmed and d.detail["evidence_gpu"] == {"index": 2, "pci": "00000000:0B:00.0"}
    assert "DCGM diagnostic failed on GPU 2,6 (the GPU the log named)" in d.why


def test_nvlink_down_is_confirmed() -> None:
    nv = parse_nvlink_status(
        "GPU 0: H100\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
        "GPU 1: H100\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n"
    )
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi()), DCGM_PASS, 8, nvlink=nv)
    assert d.confirmed and "GPU 0 NVLink 1 of 2 links up (down: 1)" in d.why


def test_nothing_found_steps_down_to_reboot() -> None:
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi()), DCGM_PASS, 8)
    assert isinstance(d, Diagnosis) and not d.confirmed
    assert d.why == "diagnostic found no hardware fault: stepping down to REBOOT_NODE"
    assert d.detail["findings"] == [] and d.detail["gpus_visible"] == 8


def test_configuration_failures_and_warnings_do_not_confirm() -> None:
    v3 = (FIX / "dcgmi_diag_v3_pass_8gpu.txt").read_text()
    i = v3.index('"Persistence Mode"')
    cfg = parse_dcgm_diag(v3[:i] + v3[i:].replace('"PASS"', '"FAIL"', 1))
    assert cfg.verdict == "fail"
    d = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi()), cfg, 8)
    assert not d.confirmed and "only configuration checks failed (DCGM Persistence Mode" in d.why
    warn = DcgmResult(True, "warn")
    w = diagnose(EVIDENCE, parse_nvidia_smi_q(healthy_smi()), warn, 8)
    assert not w.confirmed and "DCGM only warned" in w.why


def test_unreadable_output_is_no_evidence_either_way() -> None:
    d = diagnose(EVIDENCE, parse_nvidia_smi_q("garbage"), parse_dcgm_diag("garbage"), 8)
    assert not d.confirmed and "nvidia-smi, dcgmi output unusable" in d.why
    assert d.detail["gpus_visible"] is None


# ------------------------------------------------------------------ stand-ins, round trip


def run_tool(tool: str, args: list[str], state: dict[str, Any]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "functions"), PITSTOP_NODE="a3m-7")
    env["PITSTOP_GPU_STATE"] = json.dumps(state)
    p = subprocess.run(
        [sys.executable, "-m", f"pitstop.local.gpu_tools.{tool}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return p.returncode, p.stdout


def diagnose_node(state: dict[str, Any]) -> Diagnosis:
    _, smi = run_tool("nvidia_smi", ["-q"], state)
    _, nv = run_tool("nvidia_smi", ["nvlink", "--status"], state)
    _, dcgm = run_tool("dcgmi", ["diag", "-r", "1", "-j"], state)
    return diagnose(
        {"gpu": {"pci": "0000:0b:00"}},
        parse_nvidia_smi_q(smi),
        parse_dcgm_diag(dcgm),
        8,
        nvlink=parse_nvlink_status(nv),
    )


def test_round_trip_healthy_node_is_not_confirmed() -> None:
    d = diagnose_node({})
    assert not d.confirmed and d.detail["gpus_visible"] == 8 and d.detail["dcgm"] == "pass"
    assert d.detail["evidence_gpu"]["index"] == 2


@pytest.mark.parametrize(
    ("state", "finding"),
    [
        ({"gpus": 7}, "7 of 8 GPUs visible (lost: 0000:8c:00)"),
        ({"remap": "failure", "remap_gpu": 3}, "GPU 3 (00000000:0C:00.0) row remapping failed"),
        ({"remap": "pending", "remap_gpu": 1}, "row remap pending"),
        ({"nvlink_down": [5]}, "GPU 5 NVLink 12 of 18 links up"),
        ({"dcgm": "fail", "dcgm_gpu": 2}, "DCGM software failed on GPU 2 (the GPU the log named)"),
    ],
)
def test_round_trip_faults_are_confirmed(state: dict[str, Any], finding: str) -> None:
    d = diagnose_node({"a3m-7": state})
    assert d.confirmed and finding in d.why


def test_round_trip_no_gpus_at_all() -> None:
    code, out = run_tool("nvidia_smi", ["-q"], {"a3m-7": {"gpus": 0}})
    assert code == 6
    d = diagnose({"gpu": {"pci": "0000:0b:00"}}, parse_nvidia_smi_q(out), None, 8)
    assert d.confirmed and "0 of 8 GPUs visible" in d.why
