"""The corroboration judge (core/corroboration.py): what on the node confirms a log line, what does not.

Formats: ``dmesg --raw`` prints ``<prio>[seconds] message`` with prio = facility * 8 + level
(dmesg(1), syslog(2)); the kernel forces records written to /dev/kmsg from user space to
LOG_USER (facility 1) (Documentation/ABI/testing/dev-kmsg). ``seconds`` is printk's time since
boot; ``/proc/uptime``'s first number is the seconds since boot (proc(5)), so a check that reads
``date +%s.%N`` and ``/proc/uptime`` together dates each line. The Node condition is the GKE GPU
device plugin's XidCriticalError (reference/gke.md §2).
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import corroboration as c
from pitstop.core import ring_buffer
from pitstop.core.domain import CheckSpec
from pitstop.local.fake_compute import CREATED_LONG_AGO
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from tests.helpers import partial_incident

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
PCI = "0000:a1:00"
BOOTED = 1_799_990_000.0  # the node booted (epoch s) ...
OPENED = 1_800_000_000.0  # ... and the episode began (its first line, and Pitstop opened it)
CLOCK = f"{OPENED + 60:.9f}\n{OPENED + 60 - BOOTED:.2f} 12345.00\n"  # date +%s.%N; cat /proc/uptime
FRESH = OPENED - BOOTED + 1.5  # a line printed 1.5 s into the episode (seconds since boot)
# the fields judge reads (a spec as corroboration.spec makes it carries a name and a GPU count too)
CHECK = cast(
    CheckSpec,
    {"kind": "corroborate", "xids": [79], "pcis": [PCI], "since": OPENED, "remediated_at": None,
     "expected_gpus": 8},
)  # fmt: skip


def smi(visible: int = 8, **kw: Any) -> str:
    return nvidia_smi.query(NodeState("n", 8, visible, **kw))


def raw(line: str, at: float = FRESH, facility: int = 0) -> str:
    """One ``dmesg --raw`` record: KERN_WARNING (4) at ``at`` seconds since boot."""
    return f"<{facility * 8 + 4}>[{at:12.6f}] {line}\n"


def test_parse_dmesg_raw_reads_facility_and_xid() -> None:
    text = (
        f"<4>[  812.250000] {XID79}\n<12>[  813.000000] {XID79}\n<6>[    1.0] Linux version 6.1\nnot a record"
    )
    found, records = c.parse_dmesg_raw(text)
    assert records == 3
    assert [(k.xid, k.pci, k.facility) for k in found] == [(79, "0000:a1:00", 0), (79, "0000:a1:00", 1)]
    assert [k.ts for k in found] == [812.25, 813.0]


@pytest.mark.parametrize(
    ("outputs", "confirmed", "in_why"),
    [
        ({"dmesg": raw(XID79), "clock": CLOCK, "nvidia_smi_q": smi()}, True, "Xid 79 on 0000:a1:00"),
        ({"dmesg": "", "nvidia_smi_q": smi(7), "gpu_grant": "gpu:8"}, True, "7 of 8 GPUs visible"),
        ({"dmesg": "", "nvidia_smi_q": smi(remap="pending")}, True, "row remap pending"),
        ({"dmesg": raw(XID79, facility=1), "clock": CLOCK, "nvidia_smi_q": smi()}, False, "not confirmed"),
        (
            {"dmesg": raw("NVRM: Xid (PCI:0000:a1:00): 13, x"), "clock": CLOCK, "nvidia_smi_q": smi()},
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
    v = c.judge(CHECK, {"done": True, "outputs": outputs}, {}, "a3-node-001")
    assert v.confirmed is confirmed and in_why in v.why
    assert bool(v.checked) is bool(outputs)
    assert (v.evidence is not None) is confirmed  # evidence only when confirmed, and of the node
    assert v.evidence is None or (v.evidence.node == "a3-node-001" and v.evidence.probe == "node_check")


def test_an_unknown_gpu_count_never_confirms_on_a_count() -> None:
    """Four GPUs attached and seen, none lost: with no expected count, that is no finding."""
    four = nvidia_smi.query(NodeState("n", 4, 4))
    outputs = {"nvidia_smi_q": four, "gpu_grant": "gpu:8"}
    v = c.judge({**CHECK, "expected_gpus": None}, {"done": True, "outputs": outputs}, {})
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


# -- system events: Compute is asked (issue 21 (3)); that event's kind, at its time (issue 35 (3)) ----
# reference/gcp-events.md §1.1: a system event is Google's audit entry with its own ``timestamp``;
# §1.2: ``compute.instances.preempted`` reclaims a Spot VM (it stops), ``hostError`` is a host
# failure that stopped the VM, ``automaticRestart`` the VM restarted after one. Compute's Instance
# keeps lastStopTimestamp and lastStartTimestamp: what confirms that the VM went through it.

T0 = 1_800_000_000.0
M = c.DEFAULTS["event_margin_s"]


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
HOST_ERROR = {**PREEMPTED, "kind": "host_error"}
RESTARTED = {**PREEMPTED, "kind": "lifecycle"}  # compute.instances.automaticRestart


@pytest.mark.parametrize(
    ("inc", "vm", "confirmed"),
    [
        (PREEMPTED, facts(status="TERMINATED", last_stop=T0 - 2), True),
        (
            PREEMPTED,
            facts(created=T0 + 40, last_start=T0 + 60, last_stop=T0 + 1),
            True,
        ),  # the MIG restarted it
        (PREEMPTED, facts(created=T0 + 40, last_start=T0 + 60), False),  # created since, never stopped
        (PREEMPTED, facts(), False),  # running since yesterday: published straight to the topic
        (PREEMPTED, facts(status="TERMINATED", spot=False), False),  # only Spot VMs are preempted
        (PREEMPTED, facts(status="TERMINATED", last_stop=T0 - 7200), False),  # stopped, but not then
        (PREEMPTED, facts(status="STOPPING"), False),  # any status but RUNNING is no record of the event
        (PREEMPTED, facts(last_stop=T0 + M + 1), False),
        (HOST_ERROR, facts(spot=False, last_start=T0 + 30), True),  # restarted after the host error
        (HOST_ERROR, facts(spot=False, status="REPAIRING", last_stop=T0 + 5), True),
        (HOST_ERROR, facts(spot=False, last_stop=T0 - 3600), False),
        (HOST_ERROR, facts(spot=False, status="REPAIRING"), False),
        (RESTARTED, facts(spot=False, last_start=T0 + 20), True),
        (RESTARTED, facts(spot=False, last_stop=T0 + 20), False),  # stopped is not restarted
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
        "restarted-by-its-mig",
        "created-since-is-no-preemption",
        "forged-preemption",
        "not-spot",
        "stopped-long-before",
        "not-running-alone",
        "stopped-past-the-margin",
        "host-error",
        "host-error-repairing",
        "host-error-forged",
        "host-error-status-alone",
        "automatic-restart",
        "automatic-restart-stopped-only",
        "upcoming",
        "upcoming-forged",
        "no-vm",
    ],
)
def test_judge_system(inc: dict[str, Any], vm: c.VmFacts | None, confirmed: bool) -> None:
    v = c.judge_system(partial_incident(inc), vm, M, "a3-node-001")
    assert v.confirmed is confirmed, v.why
    assert (v.evidence is not None) is confirmed
    if v.evidence is not None:
        assert (v.evidence.probe, v.evidence.node) == ("compute", "a3-node-001")
        assert v.record(T0, 1)["evidence"]["event"] == inc["kind"]


NOW = T0 + 10_000


def _event(kind: str, at: float | None, action: str = "RESCHEDULE_JOB") -> Any:
    stamp = None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return {"kind": kind, "action": action, "observed_at": stamp, "reason": "host error"}


@pytest.mark.parametrize(
    ("ev", "acts"),
    [
        (_event("host_error", NOW - 60), True),
        (_event("host_error", NOW + 60), True),  # ahead of our clock: ingest takes it as now
        (_event("host_error", NOW - c.DEFAULTS["event_max_age_s"] - 1), False),  # backdated
        (_event("preemption", CREATED_LONG_AGO - 7200), False),  # before the VM was created
        (_event("host_error", None), False),  # no time of its own
        (_event("host_error", NOW - 7200, "NONE"), False),  # record-only already: left as it is
        (_event("gpu_xid", NOW - 7200, "REBOOT_NODE"), True),  # a log line: corroborated on the node
    ],
    ids=["fresh", "future", "backdated", "before-the-vm", "no-time", "record-only", "not-a-system-event"],
)
def test_a_stale_system_event_is_recorded_not_acted_on(ev: Any, acts: bool) -> None:
    out = c.fresh_only(ev, NOW, c.DEFAULTS["event_max_age_s"])
    assert (out["action"] != "NONE") is acts
    if ev["action"] != "NONE" and not acts:
        assert out["reason"].startswith("stale system event") and out["reason"].endswith("host error")


def test_system_events_need_corroboration_unless_record_only() -> None:
    assert c.needs_corroboration(partial_incident(PREEMPTED), True)[0]
    assert not c.needs_corroboration(partial_incident({**PREEMPTED, "action": "NONE"}), True)[0]


SXID = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error"
SXID_CHECK = cast(
    CheckSpec, {"kind": "corroborate", "xids": [], "sxids": [24007], "since": OPENED, "expected_gpus": 8}
)


@pytest.mark.parametrize(
    ("dmesg", "confirmed", "in_why"),
    [
        (raw(SXID), True, "SXid 24007 on 0000:c3:00.0"),
        (raw(SXID, facility=1), False, "not confirmed"),  # written to /dev/kmsg from user space
        (raw(SXID.replace("24007", "20034")), False, "not confirmed"),  # another SXid
        (raw("NVRM: Xid (PCI:0000:c3:00): 24007, x"), False, "not confirmed"),  # an Xid is no SXid
        (raw(SXID, at=5.0), False, "not confirmed"),  # printed long before the episode began
    ],
    ids=["kernel-sxid", "user-kmsg", "other-sxid", "xid-of-that-number", "old-line"],
)
def test_an_nvswitch_incident_is_confirmed_by_its_sxid_in_the_ring_buffer(
    dmesg: str, confirmed: bool, in_why: str
) -> None:
    outputs = {"dmesg": dmesg, "clock": CLOCK, "nvidia_smi_q": smi()}
    v = c.judge(SXID_CHECK, {"done": True, "outputs": outputs}, {})
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


def _gke_check(
    xid: int, boot_after: float | None = BOOT, since: float = BOOT, remediated: float | None = None
) -> CheckSpec:
    return cast(
        CheckSpec,
        {"kind": "corroborate", "xids": [xid], "pcis": [PCI], "since": since, "remediated_at": remediated,
         "expected_gpus": 8, "boot_after": boot_after},
    )  # fmt: skip


AFTER_BOOT, BEFORE_BOOT = "2023-11-14T22:15:00Z", "2023-11-14T22:05:00Z"  # BOOT is 22:13:20 UTC
CHANGED = BOOT + 100  # AFTER_BOOT


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
        (13, _npd(XID13.replace(PCI, "0000:b5:00"), AFTER_BOOT), BOOT, False),  # on another GPU
    ],
)
def test_the_npd_condition_confirms_its_xid_on_this_boot_only(
    xid: int, node: str, boot_after: float | None, confirmed: bool
) -> None:
    v = c.judge(_gke_check(xid, boot_after), {"done": True, "outputs": {"node_condition": node}}, {})
    assert v.confirmed is confirmed
    if confirmed:
        assert c.NPD_CONDITION in v.why and f"Xid {xid}" in v.why


def test_an_npd_condition_of_an_earlier_fault_of_this_boot_does_not_confirm() -> None:
    """NPD keeps the boot's first Xid line: changed before the episode began, or before the node's
    last remediation (a GPU reset, no reboot), it is about an earlier fault (issue 35 (1))."""
    node = {"node_condition": _npd(XID13, AFTER_BOOT)}
    assert c.judge(_gke_check(13, since=CHANGED - 5), {"done": True, "outputs": node}, {}).confirmed
    assert not c.judge(_gke_check(13, since=CHANGED + 3600), {"done": True, "outputs": node}, {}).confirmed
    late = _gke_check(13, remediated=CHANGED - 2)  # within the clock's slack of the reset: not believed
    assert not c.judge(late, {"done": True, "outputs": node}, {}).confirmed


def test_the_device_plugin_condition_for_an_absorbed_xid_does_not_confirm() -> None:
    """XidCriticalError names Xid 48 this boot, but the action was chosen by Xid 79."""
    check = _asked(_episode((79, PCI, "REBOOT_NODE"), (48, PCI, "RESET_GPU")))
    node = {"node_condition": _node("b2", {"48": True}, "b2")}
    assert not c.judge(check, {"done": True, "outputs": node}, {}).confirmed
    node = {"node_condition": _node("b2", {"79": True}, "b2")}
    assert c.judge(check, {"done": True, "outputs": node}, {}).confirmed


def test_a_forged_gke_line_with_no_kernel_line_is_refused_and_says_what_was_read() -> None:
    node = json.dumps({"status": {"nodeInfo": {"bootID": "b2"}, "conditions": []}})
    v = c.judge(_gke_check(13), {"done": True, "outputs": {"node_condition": node}}, {})
    assert not v.confirmed and "does not show" in v.why
    assert any(c.NPD_CONDITION in x and "XidCriticalError" in x for x in v.checked)


def test_the_spec_carries_the_boot_the_condition_is_dated_against() -> None:
    inc = partial_incident({"id": "i-1", "xid": 13, "kind": "gpu_xid", "action": "RESTART_JOB"})
    assert c.spec(inc, 1, 8, 8, BOOT)["boot_after"] == BOOT


# -- issue 35 (1): the node is asked about the claim that chose the action, nothing wider ---------

XID31 = "NVRM: Xid (PCI:0000:b5:00): 31, pid=2512125, name=python3.10, Ch 00000008, MMU Fault"
OTHER_PCI = "0000:b5:00"


def _summary(xid: int, pci: str, action: str) -> dict[str, Any]:
    """An event's summary as the engine keeps it on the incident (core/engine.summary)."""
    return {"kind": "gpu_xid", "xid": xid, "action": action, "gpu": pci, "observed_at": None,
            "insert_id": None, "reason": f"Xid {xid}", "message": ""}  # fmt: skip


def _episode(*lines: tuple[int, str, str], first_seen: float = OPENED, created: float = OPENED) -> Any:
    """An Xid episode as the engine builds it: its first line opened it, the rest were absorbed."""
    gpus: dict[str, Any] = {}
    for xid, pci, _ in lines:
        g = gpus.setdefault(pci.replace(":", "_"), {"pci": pci, "xids": {}})
        g["xids"][str(xid)] = g["xids"].get(str(xid), 0) + 1
    ranks = [
        "NONE",
        "RESTART_JOB",
        "DRAIN_NODE",
        "RESET_GPU",
        "RESCHEDULE_JOB",
        "REBOOT_NODE",
        "REPLACE_NODE",
    ]
    proposed = max((a for _, _, a in lines), key=ranks.index)
    return partial_incident(
        {"id": "iabcdefghi", "kind": "gpu_xid", "xid": lines[0][0], "action": proposed,
         "proposed_action": proposed, "gpus": gpus, "counts": {"events": len(lines)},
         "evidence": [_summary(*ln) for ln in lines], "first_seen": first_seen, "created_at": created}
    )  # fmt: skip


def _asked(inc: Any, remediated: float | None = None) -> CheckSpec:
    return c.spec(inc, 1, 8, 8, remediated=remediated)


def _confirmed(check: CheckSpec, dmesg: str, clock: str = CLOCK) -> bool:
    outputs = {"dmesg": dmesg, "clock": clock, "nvidia_smi_q": smi()}
    return c.judge(check, {"done": True, "outputs": outputs}, {}).confirmed


def test_an_absorbed_harmless_xid_does_not_widen_what_the_node_is_asked() -> None:
    """A forged Xid 79 entry beside a routine Xid 31 the kernel did print: the node is asked about
    Xid 79 on its GPU only, so the real Xid 31 line confirms nothing (issue 35 (1))."""
    inc = _episode((79, PCI, "REBOOT_NODE"), (31, OTHER_PCI, "RESTART_JOB"))
    check = _asked(inc)
    assert (check["xids"], check["pcis"]) == ([79], [PCI])
    assert not _confirmed(check, raw(XID31))
    assert _confirmed(check, raw(XID79))


def test_the_line_that_raised_the_action_is_the_claim() -> None:
    """An Xid 13 opened the episode (RESTART_JOB); an Xid 79 raised it: the node is asked for 79."""
    inc = _episode((13, OTHER_PCI, "RESTART_JOB"), (79, PCI, "REBOOT_NODE"))
    assert (_asked(inc)["xids"], _asked(inc)["pcis"]) == ([79], [PCI])


def test_the_claimed_xid_on_another_gpu_does_not_confirm() -> None:
    check = _asked(_episode((79, PCI, "REBOOT_NODE")))
    assert not _confirmed(check, raw(XID79.replace(PCI, OTHER_PCI)))


def test_a_line_printed_before_the_episode_began_does_not_confirm() -> None:
    """An old real line of this boot, its entry replayed with a new insertId (dedup forgets after 24 h)."""
    check = _asked(_episode((79, PCI, "REBOOT_NODE")))
    assert not _confirmed(check, raw(XID79, at=OPENED - BOOTED - 3600))
    assert _confirmed(check, raw(XID79, at=OPENED - BOOTED - 5))  # inside the clock's allowance


def test_a_backdated_entry_does_not_move_the_episode_start_back() -> None:
    """The entry's timestamp is the writer's: the episode began no earlier than line_lag_s before
    Pitstop opened it."""
    inc = _episode((79, PCI, "REBOOT_NODE"), first_seen=OPENED - 86400 * 3)
    check = _asked(inc)
    assert check["since"] == OPENED - c.DEFAULTS["line_lag_s"]
    assert not _confirmed(check, raw(XID79, at=OPENED - BOOTED - 86400))


def test_a_line_printed_before_the_last_remediation_never_reconfirms() -> None:
    """After a GPU reset (no reboot) the real old line stays in the ring buffer: replayed, it must
    not confirm again, however the episode's start was set (issue 35 (1))."""
    reset_at = OPENED - 120
    inc = _episode((79, PCI, "REBOOT_NODE"), first_seen=OPENED - 600)
    check = _asked(inc, remediated=reset_at)
    assert not _confirmed(check, raw(XID79, at=reset_at - BOOTED - 30))  # the line the reset was for
    assert not _confirmed(check, raw(XID79, at=reset_at - BOOTED + 5))  # within the allowance: missed
    assert _confirmed(check, raw(XID79, at=reset_at - BOOTED + 60))  # printed again since


def test_undated_lines_confirm_nothing() -> None:
    check = _asked(_episode((79, PCI, "REBOOT_NODE")))
    for clock in ("", "garbage\n1 2\n", f"{OPENED}\n", "1e400\n5\n", f"{OPENED}\n-5 3\n"):
        assert not _confirmed(check, raw(XID79), clock), clock


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        f"{OPENED}",
        f"{OPENED}\n{OPENED}\n1",
        "99\n5 5",
        f"{OPENED}\n{1e12} 5",
        "\n".join(["1"] * 1000),
    ],
)
def test_a_hostile_clock_reading_is_no_date(text: str) -> None:
    assert ring_buffer.parse_boot_clock(text) is None


def test_the_clock_reading_gives_the_boot_time() -> None:
    assert ring_buffer.parse_boot_clock(CLOCK) == pytest.approx(BOOTED)


def test_the_last_remediation_is_another_incidents_reset_as_it_took_effect() -> None:
    node: Any = {"remediations": [
        {"at": 100.0, "action": "RESET_GPU", "incident": "iold", "mode": "enforce"},
        {"at": 200.0, "action": "DRAIN_NODE", "incident": "idrain", "mode": "enforce"},  # no reset
        {"at": 300.0, "action": "REBOOT_NODE", "incident": "iabcdefghi", "mode": "enforce"},  # its own
    ]}  # fmt: skip
    prior = c.prior_remediations(node, "iabcdefghi")
    assert [r["incident"] for r in prior] == ["iold"]
    assert c.remediated_at(prior, {"iold": 160.0}) == 160.0  # the reset happened after the decision
    assert c.remediated_at(prior, {"iold": None}) == 100.0
    assert c.remediated_at([], {}) is None


XIDS = st.integers(0, 200)
GPUS = st.sampled_from(["0000:a1:00", "0000:b5:00", "0000:04:00", "0000:8c:00"])


@st.composite
def _absorbed_and_ring(draw: st.DrawFn) -> tuple[Any, str]:
    """An Xid 79 episode on GPU a1 with any absorbed lines (any Xid, any GPU, weaker verdicts), and
    a ring buffer of any kernel lines that are not Xid 79 on a1 printed in the episode."""
    absorbed = draw(st.lists(st.tuples(XIDS, GPUS, st.sampled_from(["NONE", "RESTART_JOB", "RESET_GPU"])),
                             max_size=6))  # fmt: skip
    inc = _episode((79, PCI, "REBOOT_NODE"), *absorbed)
    lines = []
    for xid, pci, facility, at in draw(
        st.lists(
            st.tuples(XIDS, GPUS, st.sampled_from([0, 1, 3]), st.floats(0, OPENED - BOOTED + 600)),
            max_size=12,
        )
    ):
        fresh = at >= OPENED - BOOTED - c.DEFAULTS["clock_slack_s"] - 1
        if xid == 79 and pci == PCI and facility == 0 and fresh:
            continue  # the claim itself, printed in the episode: that one does confirm
        lines.append(raw(f"NVRM: Xid (PCI:{pci}): {xid}, x", at=at, facility=facility))
    return inc, "".join(lines)


@settings(max_examples=300, deadline=None)
@given(_absorbed_and_ring())
def test_nothing_but_the_claim_printed_in_the_episode_confirms(case: tuple[Any, str]) -> None:
    """Property (issue 35 (1)): for any absorbed Xid set and any ring buffer without the chosen Xid
    on the chosen GPU printed after the episode began → not confirmed."""
    inc, dmesg = case
    assert not _confirmed(_asked(inc), dmesg)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(XIDS, GPUS), max_size=6), st.floats(0, 3000), st.floats(0, 3000))
def test_the_claim_printed_after_the_reset_always_confirms(
    absorbed: list[tuple[int, str]], reset_ago: float, printed_after: float
) -> None:
    """... and the claim itself, printed on its GPU after the episode began and past the last
    remediation by more than the clock's allowance, confirms whatever else was absorbed."""
    inc = _episode((79, PCI, "REBOOT_NODE"), *[(x, p, "RESTART_JOB") for x, p in absorbed])
    reset = OPENED - reset_ago
    allowance = c.DEFAULTS["clock_slack_s"] + 1.0  # + 50 ppm of < 20,000 s since boot
    printed = max(reset + allowance, OPENED) + printed_after
    assert _confirmed(_asked(inc, remediated=reset), raw(XID79, at=printed - BOOTED))


STAMPS = st.one_of(st.none(), st.floats(T0 - 86400, T0 + 86400, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["preemption", "host_error", "maintenance", "lifecycle"]),
    st.sampled_from(["RUNNING", "TERMINATED", "STOPPING", "REPAIRING", "STAGING", "SUSPENDED"]),
    st.booleans(),
    STAMPS,
    STAMPS,
    STAMPS,
)
def test_only_computes_record_of_that_kind_near_the_event_confirms(
    kind: str, status: str, spot: bool, created: float | None, start: float | None, stop: float | None
) -> None:
    """Property (issue 35 (3)): whatever the VM's status and creation time, a system event is confirmed
    only by the VM's own stop or start of the kind that event leaves, within the margin of it."""
    inc = partial_incident({"kind": kind, "action": "RESCHEDULE_JOB", "first_seen": T0})
    vm = facts(status=status, spot=spot, created=created, last_start=start, last_stop=stop)
    near = {w: t is not None and abs(t - T0) <= M for w, t in (("stopped", stop), ("started", start))}
    expected = any(near[w] for w in c.CONFIRMED_BY[kind]) and (spot or kind != "preemption")
    assert c.judge_system(inc, vm, M).confirmed is expected
