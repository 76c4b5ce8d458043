"""The corroboration judge (core/corroboration.py): what on the node confirms a log line, what does not.

Formats: ``dmesg --raw`` prints ``<prio>[seconds] message`` with prio = facility * 8 + level
(dmesg(1), syslog(2)); the kernel forces records written to /dev/kmsg from user space to
LOG_USER (facility 1) (Documentation/ABI/testing/dev-kmsg). The Node condition is the GKE GPU
device plugin's XidCriticalError (reference/gke.md §2).
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from pitstop.core import corroboration as c
from pitstop.core.domain import CheckSpec
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from tests.helpers import partial_incident

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
# the fields judge reads (a spec as corroboration.spec makes it carries a name and a GPU count too)
CHECK = cast(CheckSpec, {"kind": "corroborate", "xids": [79], "expected_gpus": 8})


def smi(visible: int = 8, **kw: Any) -> str:
    return nvidia_smi.query(NodeState("n", 8, visible, **kw))


def test_parse_dmesg_raw_reads_facility_and_xid() -> None:
    text = (
        f"<4>[  812.250000] {XID79}\n<12>[  813.000000] {XID79}\n<6>[    1.0] Linux version 6.1\nnot a record"
    )
    found, records = c.parse_dmesg_raw(text)
    assert records == 3
    assert [(k.xid, k.pci, k.facility) for k in found] == [(79, "0000:a1:00", 0), (79, "0000:a1:00", 1)]


@pytest.mark.parametrize(
    ("outputs", "confirmed", "in_why"),
    [
        ({"dmesg": f"<4>[ 1.5] {XID79}\n", "nvidia_smi_q": smi()}, True, "Xid 79 on 0000:a1:00"),
        ({"dmesg": "", "nvidia_smi_q": smi(7)}, True, "7 of 8 GPUs visible"),
        ({"dmesg": "", "nvidia_smi_q": smi(remap="pending")}, True, "row remap pending"),
        ({"dmesg": f"<12>[ 1.5] {XID79}\n", "nvidia_smi_q": smi()}, False, "not confirmed"),
        (
            {"dmesg": "<4>[ 1.5] NVRM: Xid (PCI:0000:a1:00): 13, x\n", "nvidia_smi_q": smi()},
            False,
            "not confirmed",
        ),
        ({"dmesg": "", "nvidia_smi_q": smi()}, False, "does not show"),
        ({"dmesg": "", "nvidia_smi_q": "garbage"}, False, "not confirmed"),
        ({}, False, "nothing to judge"),
    ],
    ids=["kernel-line", "gpu-lost", "remap-pending", "user-kmsg", "other-xid", "healthy", "bad-smi", "empty"],
)
def test_judge(outputs: dict[str, str], confirmed: bool, in_why: str) -> None:
    v = c.judge(CHECK, {"done": True, "outputs": outputs}, {})
    assert v.confirmed is confirmed and in_why in v.why
    assert bool(v.checked) is bool(outputs)


def test_an_unknown_gpu_count_never_confirms_on_a_count() -> None:
    v = c.judge({**CHECK, "expected_gpus": None}, {"done": True, "outputs": {"nvidia_smi_q": smi(4)}}, {})
    assert not v.confirmed


def test_a_check_that_did_not_finish_or_ran_nowhere_confirms_nothing() -> None:
    assert not c.judge(CHECK, {"done": False, "error": "timed out"}, {}).confirmed
    assert "no scheduler" in c.judge(CHECK, None, {}).why


def _node(boot: str, reason: dict[str, bool], message: str) -> str:
    cond = {"type": "XidCriticalError", "status": "True", "reason": json.dumps(reason), "message": message}
    return json.dumps({"status": {"nodeInfo": {"bootID": boot}, "conditions": [cond]}})


def test_the_device_plugin_condition_confirms_on_the_current_boot_only() -> None:
    now = {"node_condition": _node("b2", {"79": True}, "b2")}
    old = {"node_condition": _node("b2", {"79": True}, "b1")}
    other = {"node_condition": _node("b2", {"48": True}, "b2")}
    assert c.judge(CHECK, {"done": True, "outputs": now}, {}).confirmed
    assert not c.judge(CHECK, {"done": True, "outputs": old}, {}).confirmed
    assert not c.judge(CHECK, {"done": True, "outputs": other}, {}).confirmed
    assert not c.judge(CHECK, {"done": True, "outputs": {"node_condition": "{"}}, {}).confirmed


def test_what_needs_corroboration() -> None:
    inc = {"action": "REBOOT_NODE", "kind": "gpu_xid"}
    assert c.needs_corroboration(partial_incident(inc), True)[0]
    assert not c.needs_corroboration(partial_incident(inc), False)[0]
    assert not c.needs_corroboration(partial_incident({**inc, "action": "NONE"}), True)[0]
    assert not c.needs_corroboration(partial_incident({**inc, "kind": "record_only_kind"}), True)[0]
    assert not c.needs_corroboration(partial_incident({**inc, "corroboration": {"confirmed": True}}), True)[0]
    assert c.needs_corroboration(partial_incident({**inc, "corroboration": {"confirmed": False}}), True)[0]


def test_incident_xids_lists_every_code_once() -> None:
    inc = {"xid": 79, "gpus": {"a": {"xids": {"79": 2, "48": 1}}, "b": {"xids": {"bad": 1}}}}
    assert c.incident_xids(partial_incident(inc)) == [79, 48]


# -- system events: Compute is asked (issue 21 (3)) -----------------------------------------------

T0 = 1_800_000_000.0


def facts(**kw: Any) -> c.VmFacts:
    base: dict[str, Any] = {
        "status": "RUNNING",
        "spot": True,
        "created": T0 - 86400,
        "last_start": T0 - 86400,
        "last_stop": None,
        "upcoming_maintenance": False,
    }
    return c.VmFacts(**{**base, **kw})


PREEMPTED = {"kind": "preemption", "action": "RESCHEDULE_JOB", "first_seen": T0}


@pytest.mark.parametrize(
    ("inc", "vm", "confirmed"),
    [
        (PREEMPTED, facts(status="TERMINATED", last_stop=T0 - 2), True),
        (PREEMPTED, facts(created=T0 + 40, last_start=T0 + 60), True),  # the MIG recreated it since
        (PREEMPTED, facts(), False),  # running since yesterday: published straight to the topic
        (PREEMPTED, facts(status="TERMINATED", spot=False), False),  # only Spot VMs are preempted
        ({**PREEMPTED, "kind": "host_error"}, facts(spot=False, last_start=T0 + 30), True),
        ({**PREEMPTED, "kind": "host_error"}, facts(spot=False, last_stop=T0 - 3600), False),
        (
            {"kind": "maintenance", "action": "DRAIN_NODE", "first_seen": T0},
            facts(upcoming_maintenance=True),
            True,
        ),
        ({"kind": "maintenance", "action": "DRAIN_NODE", "first_seen": T0}, facts(), False),
        (PREEMPTED, None, False),
    ],
    ids=[
        "preempted",
        "recreated",
        "forged-preemption",
        "not-spot",
        "host-error",
        "host-error-forged",
        "upcoming",
        "upcoming-forged",
        "no-vm",
    ],
)
def test_judge_system(inc: dict[str, Any], vm: c.VmFacts | None, confirmed: bool) -> None:
    v = c.judge_system(partial_incident(inc), vm)
    assert v.confirmed is confirmed, v.why


def test_system_events_need_corroboration_unless_record_only() -> None:
    assert c.needs_corroboration(partial_incident(PREEMPTED), True)[0]
    assert not c.needs_corroboration(partial_incident({**PREEMPTED, "action": "NONE"}), True)[0]


SXID = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error"
SXID_CHECK = cast(CheckSpec, {"kind": "corroborate", "xids": [], "sxids": [24007], "expected_gpus": 8})


@pytest.mark.parametrize(
    ("dmesg", "confirmed", "in_why"),
    [
        (f"<4>[ 1.5] {SXID}\n", True, "SXid 24007 on 0000:c3:00.0"),
        (f"<12>[ 1.5] {SXID}\n", False, "not confirmed"),  # written to /dev/kmsg from user space
        (f"<4>[ 1.5] {SXID.replace('24007', '20034')}\n", False, "not confirmed"),  # another SXid
        ("<4>[ 1.5] NVRM: Xid (PCI:0000:c3:00): 24007, x\n", False, "not confirmed"),  # an Xid is no SXid
    ],
    ids=["kernel-sxid", "user-kmsg", "other-sxid", "xid-of-that-number"],
)
def test_an_nvswitch_incident_is_confirmed_by_its_sxid_in_the_ring_buffer(
    dmesg: str, confirmed: bool, in_why: str
) -> None:
    v = c.judge(SXID_CHECK, {"done": True, "outputs": {"dmesg": dmesg, "nvidia_smi_q": smi()}}, {})
    assert v.confirmed is confirmed and in_why in v.why


def test_an_nvswitch_incident_asks_the_node_for_its_sxids() -> None:
    inc = {"id": "i1", "kind": "nvswitch_sxid", "action": "REBOOT_NODE", "xid": None, "gpus": {},
           "counts": {"events": 3, "sxid_24007": 2, "sxid_20034": 1}}  # fmt: skip
    assert c.needs_corroboration(partial_incident(inc), True)[0]
    assert c.spec(partial_incident(inc), 1, 8, 8)["sxids"] == [24007, 20034]


# -- GKE: Pitstop's node-problem-detector condition (infra/gke/npd.yaml) ---------------------------
XID13 = "NVRM: Xid (PCI:0000:a1:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
BOOT = 1_700_000_000.0  # the VM's lastStartTimestamp (Compute)


def _npd(message: str, at: str, status: str = "True") -> str:
    cond = {"type": c.NPD_CONDITION, "status": status, "reason": "NvrmXid", "message": message}
    cond["lastTransitionTime"] = at
    plugin = {"type": "XidCriticalError", "status": "False", "reason": "{}", "message": "b2"}
    return json.dumps({"status": {"nodeInfo": {"bootID": "b2"}, "conditions": [plugin, cond]}})


def _gke_check(xid: int, boot_after: float | None = BOOT) -> CheckSpec:
    return cast(
        CheckSpec, {"kind": "corroborate", "xids": [xid], "expected_gpus": 8, "boot_after": boot_after}
    )


AFTER_BOOT, BEFORE_BOOT = "2023-11-14T22:15:00Z", "2023-11-14T22:05:00Z"  # BOOT is 22:13:20 UTC


@pytest.mark.parametrize(
    ("xid", "node", "boot_after", "confirmed"),
    [
        (13, _npd(XID13, AFTER_BOOT), BOOT, True),  # an Xid the device plugin does not watch
        (79, _npd(XID79, AFTER_BOOT), BOOT, True),
        (13, _npd(XID79, AFTER_BOOT), BOOT, False),  # the kernel printed another Xid
        (13, _npd("the kernel printed no NVRM Xid line this boot", AFTER_BOOT, "False"), BOOT, False),
        (13, _npd(XID13, BEFORE_BOOT), BOOT, False),  # a condition of the previous boot
        (13, _npd(XID13, AFTER_BOOT), None, False),  # no boot time to date it against
        (13, _npd(XID13, "not a time"), BOOT, False),
        (13, _npd("Xid 13 happened, trust me", AFTER_BOOT), BOOT, False),  # not the driver's line
    ],
)
def test_the_npd_condition_confirms_its_xid_on_this_boot_only(
    xid: int, node: str, boot_after: float | None, confirmed: bool
) -> None:
    v = c.judge(_gke_check(xid, boot_after), {"done": True, "outputs": {"node_condition": node}}, {})
    assert v.confirmed is confirmed
    if confirmed:
        assert c.NPD_CONDITION in v.why and f"Xid {xid}" in v.why


def test_a_forged_gke_line_with_no_kernel_line_is_refused_and_says_what_was_read() -> None:
    node = json.dumps({"status": {"nodeInfo": {"bootID": "b2"}, "conditions": []}})
    v = c.judge(_gke_check(13), {"done": True, "outputs": {"node_condition": node}}, {})
    assert not v.confirmed and "does not show" in v.why
    assert any(c.NPD_CONDITION in x and "XidCriticalError" in x for x in v.checked)


def test_the_spec_carries_the_boot_the_condition_is_dated_against() -> None:
    inc = partial_incident({"id": "i-1", "xid": 13, "kind": "gpu_xid", "action": "RESTART_JOB"})
    assert c.spec(inc, 1, 8, 8, BOOT)["boot_after"] == BOOT
