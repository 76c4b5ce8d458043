"""The pure decisions around a repair (pitstop.core.checks), on real output formats.

The outputs are what the GPU stand-ins print (pitstop.local.gpu_tools: nvidia-smi, dcgmi and
nccl-tests formats; tests/core/test_validation.py checks those parsers on published samples).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from typing import Any, cast

import pytest

from pitstop.core import checks
from pitstop.core import policy as policy_mod
from pitstop.core.domain import CheckRun, Vm
from pitstop.core.validation import Fabric
from pitstop.local.gpu_tools import all_gather_perf, dcgmi, nvidia_smi
from tests.helpers import partial_incident

POLICY = policy_mod.from_doc({})


def _run(main: Any, args: list[str], state: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PITSTOP_NODE", "n1")
    monkeypatch.setenv("PITSTOP_GPU_STATE", json.dumps({"n1": state}))
    buf = io.StringIO()
    with redirect_stdout(buf):
        main(args)
    return buf.getvalue()


_MEGA = checks.table_for(POLICY).machine_types["a3-megagpu-8g"].fabric
assert _MEGA is not None
MEGA: Fabric = _MEGA


def _validate_out(
    state: dict[str, Any],
    mp: pytest.MonkeyPatch,
    peer: str | None = "n2",
    fabric: bool = True,
    dcgm: bool = True,
) -> CheckRun:
    """A validation run as the scheduler answers it: by default under the fabric's setup (8 ranks
    per node, -g 1, the setup reported applied); ``fabric=False``: one rank per node driving 8 GPUs."""
    out = {"dcgm": _run(dcgmi.main, ["diag", "-r", "2", "-j"], state, mp)} if dcgm else {}
    if peer:
        g = "1" if fabric else "8"
        out["nccl"] = _run(all_gather_perf.main, ["-b", "1G", "-e", "8G", "-f", "2", "-g", g], state, mp)
        if fabric:
            out["nccl_setup"] = json.dumps(MEGA.as_spec())
    return {"done": True, "outputs": out, "peer": peer, "note": "" if peer else "none idle"}


def test_early_requeue_follows_policy_then_capacity() -> None:
    assert checks.early_requeue("after_repair", {"enough": True})[0] is False
    go, why = checks.early_requeue("early", {"enough": True, "why": "3 idle"})
    assert go and "3 idle" in why
    go, why = checks.early_requeue("early", {"enough": False, "why": "0 idle, needs 2"})
    assert not go and "0 idle, needs 2" in why and "once the node is back" in why
    assert checks.early_requeue("early", {})[0] is False  # no answer is no capacity


def test_check_names_are_dns_labels_fixed_per_step() -> None:
    name = checks.check_name("iabcdefghi", 2, checks.VALIDATE)
    assert name == "pitstop-iabcdefghi-2-validate" and len(name) <= 63 and name.islower()


def test_the_gpu_the_lines_named_most_is_the_evidence() -> None:
    inc = {
        "gpus": {"a": {"pci": "0000:04:00", "xids": {"79": 1}}, "b": {"pci": "0000:8c:00", "xids": {"48": 5}}}
    }
    assert checks.evidence_gpu(partial_incident(inc)) == {"gpu": {"pci": "0000:8c:00"}}
    assert checks.evidence_gpu(partial_incident({"gpus": {}})) == {}


@pytest.mark.parametrize(
    ("state", "verdict", "next_action"),
    [
        ({}, "pass", "RETURN_TO_SERVICE"),
        ({"busbw": 120}, "degraded", "PAGE"),  # one peer: a second is asked (wants_second_peer)
        ({"dcgm": "fail", "dcgm_gpu": 2}, "dcgm_fail", "REPLACE_NODE"),
        ({"dcgm": "warn"}, "dcgm_warn", "PAGE"),
    ],
)
def test_validation_after_a_reboot(
    state: dict[str, Any], verdict: str, next_action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = checks.table_for(POLICY)
    v = checks.judge_validation(
        "REBOOT_NODE", "a3-megagpu-8g", _validate_out(state, monkeypatch), POLICY, table
    )
    assert v.validation.verdict == verdict and v.next == next_action
    rec = v.record(1.0)
    assert rec["hardware_fault"] is (next_action == "REPLACE_NODE") and rec["peer"] == "n2"


@pytest.mark.parametrize("action", ["REBOOT_NODE", "RESET_GPU", "REPLACE_NODE"])
def test_a_node_whose_gpu_stays_lost_is_a_hardware_finding_not_a_page(
    action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: an Xid 79 GPU that does not come back after the reboot. The all_gather on 7 GPUs
    has no rows to judge; the GPU count, read by the validation itself, speaks first: REPLACE_NODE
    (the diagnostic runs first), not a page on "all_gather output unusable"."""
    out = _validate_out({"gpus": 7}, monkeypatch)
    out["outputs"]["nvidia_smi_q"] = _run(nvidia_smi.main, ["-q"], {"gpus": 7}, monkeypatch)
    table = checks.table_for(POLICY)
    v = checks.judge_validation(action, "a3-megagpu-8g", out, POLICY, table, "a3-node-001", 8)
    assert v.validation.verdict == "gpus_missing" and "7 of 8 GPUs" in v.validation.why, v.validation
    assert v.next == (
        "PAGE" if action == "REPLACE_NODE" else "REPLACE_NODE"
    )  # a new host short too: a person
    rec = v.record(1.0)
    assert rec["hardware_fault"] is (action != "REPLACE_NODE") and rec["evidence"]["probe"] == "validation"
    whole = _validate_out({}, monkeypatch)
    whole["outputs"]["nvidia_smi_q"] = _run(nvidia_smi.main, ["-q"], {}, monkeypatch)
    assert checks.judge_validation(action, "a3-megagpu-8g", whole, POLICY, table, "n", 8).validation.passed
    unknown = checks.judge_validation(action, "a3-megagpu-8g", out, POLICY, table, "n", None)
    assert unknown.validation.verdict != "gpus_missing"  # no count of the VM: the count says nothing


def test_a_replaced_node_that_fails_validation_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    table = checks.table_for(POLICY)
    v = checks.judge_validation(
        "REPLACE_NODE", "a3-megagpu-8g", _validate_out({"busbw": 120}, monkeypatch), POLICY, table
    )
    assert v.validation.verdict == "degraded" and v.next == "PAGE"


def test_an_operator_baseline_replaces_the_published_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    pol = policy_mod.from_doc({"validation": {"expected": {"a3-megagpu-8g": {"busbw_gbps": 125.0}}}})
    v = checks.judge_validation(
        "RESET_GPU", "a3-megagpu-8g", _validate_out({"busbw": 120}, monkeypatch), pol, checks.table_for(pol)
    )
    assert v.validation.passed and v.validation.threshold == 112.5


def test_no_peer_lets_dcgm_decide_or_pages_when_policy_requires_one(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate_out({}, monkeypatch, peer=None)
    v = checks.judge_validation("RESET_GPU", "a3-megagpu-8g", out, POLICY, checks.table_for(POLICY))
    assert v.validation.passed and "busbw not measured: none idle" in v.validation.why
    bad = _validate_out({"dcgm": "fail"}, monkeypatch, peer=None)
    assert (
        checks.judge_validation("RESET_GPU", "a3-megagpu-8g", bad, POLICY, checks.table_for(POLICY)).next
        == "REPLACE_NODE"
    )
    strict = policy_mod.from_doc({"validation": {"require_peer": True}})
    v = checks.judge_validation("RESET_GPU", "a3-megagpu-8g", out, strict, checks.table_for(strict))
    assert v.validation.verdict == "no_peer" and v.next == "PAGE"


def test_a_shortfall_measured_the_fabrics_way_against_one_peer_asks_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    v = checks.judge_validation(
        "REBOOT_NODE",
        "a3-megagpu-8g",
        _validate_out({"busbw": 120}, monkeypatch),
        POLICY,
        checks.table_for(POLICY),
    )
    assert v.wants_second_peer and v.next == "PAGE" and v.off_fabric is None
    assert v.record(1.0)["nccl_peers"] == [{"peer": "n2", "busbw_gbps": 120.0, "verdict": "degraded"}]
    first = {"kind": "validate", "name": "pitstop-iabcdefghi-1-validate", "incident": "iabcdefghi", "gpus": 8}
    again = checks.revalidate_spec(cast(Any, {**first, "fabric": MEGA.as_spec()}), 1, ["n2"])
    assert again["kind"] == "revalidate" and again["name"] == "pitstop-iabcdefghi-1-revalidate"
    assert again["exclude_peers"] == ["n2"] and again["fabric"] == MEGA.as_spec()


@pytest.mark.parametrize(
    ("why", "run"),
    [
        ("one rank per node driving 8 GPUs", {"fabric": False}),
        ("no setup reported by the scheduler", {"drop_setup": True}),
    ],
)
def test_a_shortfall_not_measured_the_fabrics_way_pages_without_a_second_peer(
    why: str, run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _validate_out({"busbw": 120}, monkeypatch, fabric=run.get("fabric", True))
    if run.get("drop_setup"):
        out["outputs"].pop("nccl_setup")
    v = checks.judge_validation("REBOOT_NODE", "a3-megagpu-8g", out, POLICY, checks.table_for(POLICY))
    assert v.validation.verdict == "degraded" and v.next == "PAGE" and not v.wants_second_peer, why
    assert v.off_fabric and "no evidence against the host" in v.note, why


def _second(
    state: dict[str, Any] | None, mp: pytest.MonkeyPatch, peer: str | None = "n3", fabric: bool = True
) -> CheckRun | None:
    if state is None:
        return None
    return _validate_out(state, mp, peer=peer, fabric=fabric, dcgm=False)


SHORT, WRONG = {"busbw": 120}, {"wrong": 3}  # the first peer's run: a shortfall, or wrong data


@pytest.mark.parametrize(
    ("first", "action", "second", "peer", "fabric", "next_action", "verdict", "words"),
    [
        # short against both peers, each the fabric's way: the host is at fault
        (
            SHORT,
            "REBOOT_NODE",
            {"busbw": 120},
            "n3",
            True,
            "REPLACE_NODE",
            "degraded",
            "against n3, both under",
        ),
        (SHORT, "RESET_GPU", {"busbw": 121}, "n3", True, "REPLACE_NODE", "degraded", "whichever peer"),
        # a replaced node short against both: a person (no second replacement on its own)
        (SHORT, "REPLACE_NODE", {"busbw": 120}, "n3", True, "PAGE", "degraded", "against n3"),
        # full speed with the second: the node returns, the first peer is named as suspect
        (SHORT, "REBOOT_NODE", {}, "n3", True, "RETURN_TO_SERVICE", "pass", "n2 or the path to it"),
        # no second peer, or the first again: a page, nothing condemned
        (SHORT, "REBOOT_NODE", {}, None, True, "PAGE", "degraded_one_peer", "no second healthy peer"),
        (
            SHORT,
            "REBOOT_NODE",
            {"busbw": 120},
            "n2",
            True,
            "PAGE",
            "degraded_one_peer",
            "no second healthy peer",
        ),
        # the second run did not finish, or was not the fabric's: a page
        (SHORT, "REBOOT_NODE", None, "n3", True, "PAGE", "degraded_one_peer", "did not finish"),
        (
            SHORT,
            "REBOOT_NODE",
            {"busbw": 120},
            "n3",
            False,
            "PAGE",
            "degraded_one_peer",
            "was not the fabric's",
        ),
        (SHORT, "REBOOT_NODE", {}, "n3", False, "PAGE", "degraded_one_peer", "was not the fabric's"),
        # issue 21: wrong data (nccl-tests' #wrong > 0) against the first peer, under any NCCL
        # setup (wrong data is wrong however it was measured); wrong against both: the host's
        (WRONG, "REBOOT_NODE", {"wrong": 2}, "n3", True, "REPLACE_NODE", "corrupt", "wrong data against n3"),
        (WRONG, "RESET_GPU", {"wrong": 2}, "n3", False, "REPLACE_NODE", "corrupt", "whichever peer"),
        # wrong against one, short against the other (the fabric's way): the host fails with both
        (
            WRONG,
            "REBOOT_NODE",
            {"busbw": 120},
            "n3",
            True,
            "REPLACE_NODE",
            "corrupt",
            "120.00 GB/s against n3",
        ),
        # a replaced node returning wrong data again: a person
        (WRONG, "REPLACE_NODE", {"wrong": 2}, "n3", True, "PAGE", "corrupt", "wrong data against n3"),
        # clean and at full speed with the second: the node returns, the first peer is suspect
        (WRONG, "REBOOT_NODE", {}, "n3", True, "RETURN_TO_SERVICE", "pass", "n2 or the path to it"),
        # clean, but not the fabric's way; or unfinished; or no second peer: a page, nothing condemned
        (WRONG, "REBOOT_NODE", {}, "n3", False, "PAGE", "corrupt_one_peer", "was not the fabric's"),
        (WRONG, "REBOOT_NODE", None, "n3", True, "PAGE", "corrupt_one_peer", "did not finish"),
        (WRONG, "REBOOT_NODE", {}, None, True, "PAGE", "corrupt_one_peer", "no second healthy peer"),
    ],
)
def test_the_second_peer_decides_what_a_shortfall_or_wrong_data_means(
    first: dict[str, Any],
    action: str,
    second: dict[str, Any] | None,
    peer: str | None,
    fabric: bool,
    next_action: str,
    verdict: str,
    words: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = checks.table_for(POLICY)
    run = _validate_out(first, monkeypatch, fabric=first is SHORT)  # wrong data: even one rank per node
    v1 = checks.judge_validation(action, "a3-megagpu-8g", run, POLICY, table)
    assert v1.wants_second_peer and v1.next == "PAGE", v1  # one peer's result condemns nothing
    v = checks.judge_second_peer(
        action, "a3-megagpu-8g", v1, _second(second, monkeypatch, peer, fabric), POLICY, table
    )
    assert (v.next, v.validation.verdict) == (next_action, verdict), v
    assert words in v.validation.why, v.validation.why
    rec = v.record(2.0)
    assert rec["hardware_fault"] is (next_action == "REPLACE_NODE")
    busbw, said = (120.0, "degraded") if first is SHORT else (190.0, "corrupt")
    assert rec["nccl_peers"][0] == {"peer": "n2", "busbw_gbps": busbw, "verdict": said}
    if next_action == "RETURN_TO_SERVICE":
        assert v.validation.passed and v.peer == "n3" and "n2" in v.note


def test_corrupt_data_with_no_peer_named_asks_no_second_and_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _validate_out({"wrong": 3}, monkeypatch)
    out["peer"] = None
    v = checks.judge_validation("REBOOT_NODE", "a3-megagpu-8g", out, POLICY, checks.table_for(POLICY))
    assert v.validation.verdict == "corrupt" and v.next == "PAGE" and not v.wants_second_peer


def test_unfinished_or_garbled_validation_fails_closed() -> None:
    table = checks.table_for(POLICY)
    assert checks.judge_validation("RESET_GPU", "a3-megagpu-8g", None, POLICY, table).next == "PAGE"
    garbled: CheckRun = {
        "done": True,
        "outputs": {"dcgm": "Segmentation fault", "nccl": "#  size"},
        "peer": "n2",
    }
    v = checks.judge_validation("RESET_GPU", "a3-megagpu-8g", garbled, POLICY, table)
    assert v.validation.verdict == "bad_output" and v.next == "PAGE"


@pytest.mark.parametrize(
    ("state", "confirmed"),
    [
        ({}, False),
        ({"gpus": 7}, True),
        ({"remap": "failure", "remap_gpu": 1}, True),
        ({"nvlink_down": [3]}, True),
        ({"dcgm": "warn"}, False),
    ],
)
def test_diagnosis(state: dict[str, Any], confirmed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    out = {
        "nvidia_smi_q": _run(nvidia_smi.main, ["-q"], state, monkeypatch),
        "nvlink": _run(nvidia_smi.main, ["nvlink", "--status"], state, monkeypatch),
        "dcgm": _run(dcgmi.main, ["diag", "-r", "1", "-j"], state, monkeypatch),
    }
    inc = {"gpus": {"g": {"pci": "0000:04:00", "xids": {"79": 1}}}}
    d = checks.judge_diagnosis(partial_incident(inc), {"done": True, "outputs": out}, 8)
    assert d.confirmed is confirmed
    assert d.action == ("REPLACE_NODE" if confirmed else "REBOOT_NODE")
    assert d.record(1.0)["hardware_fault"] is confirmed


def test_a_diagnostic_that_did_not_finish_steps_down() -> None:
    d = checks.judge_diagnosis(partial_incident({}), {"done": False, "error": "node not responding"}, 8)
    assert not d.confirmed and d.action == "REBOOT_NODE" and "node not responding" in d.why


def test_what_needs_a_diagnostic_or_a_validation() -> None:
    assert checks.needs_diagnosis(partial_incident({"action": "REPLACE_NODE"}), POLICY)[0] is True
    assert checks.needs_diagnosis(partial_incident({"action": "REBOOT_NODE"}), POLICY)[0] is False
    measured = {"action": "REPLACE_NODE", "measured": [{"hardware_fault": True, "why": "busbw 120"}]}
    need, why = checks.needs_diagnosis(
        partial_incident(measured), POLICY
    )  # REPLACE always passes the diagnostic
    assert need is True and "after a measurement (busbw 120)" in why
    assert checks.needs_validation(partial_incident({"action": "RESET_GPU"}), POLICY, True)[0] is True
    assert checks.needs_validation(partial_incident({"action": "RESCHEDULE_JOB"}), POLICY, True)[0] is False
    assert checks.needs_validation(partial_incident({"action": "RESET_GPU"}), POLICY, False)[0] is False
    off = policy_mod.from_doc({"validation": {"enabled": False}})
    assert checks.needs_validation(partial_incident({"action": "RESET_GPU"}), off, True)[0] is False


def test_the_expected_gpu_count_is_the_vms_own() -> None:
    vm: Vm = {"guest_accelerators": [{"accelerator_type": "x/nvidia-h100-80gb", "accelerator_count": 4}]}
    assert checks.gpus_of(vm) == 4
    # what Compute must never send is still read safely (its answer is typed only at the edge)
    assert checks.gpus_of({}) is None and checks.gpus_of(cast(Vm, {"guest_accelerators": "8"})) is None
    odd = cast(Vm, {"guest_accelerators": [{"accelerator_count": True}, {"accelerator_count": 999}]})
    assert checks.gpus_of(odd) is None


def test_an_unknown_gpu_count_never_confirms_on_what_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    out = {"nvidia_smi_q": _run(nvidia_smi.main, ["-q"], {"total_gpus": 4, "gpus": 4}, monkeypatch)}
    d = checks.judge_diagnosis(partial_incident({}), {"done": True, "outputs": out}, None)
    assert d.confirmed is False and d.action == "REBOOT_NODE"
    assert (
        checks.judge_diagnosis(partial_incident({}), {"done": True, "outputs": out}, 8).confirmed is True
    )  # 4 of 8
