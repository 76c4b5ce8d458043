"""Bad input is data: a clear invalid/unrelated event, never an exception, never executed."""

from __future__ import annotations

import base64
import copy
from typing import Any

import orjson
import pytest

from pitstop.core.classify import Classifier
from pitstop.core.xid_line import MAX_LINE
from tests.helpers import (
    ENVELOPES,
    assert_valid_event,
    load_fixture,
    ops_agent_entry,
    syslog_entry,
    system_event_entry,
)

CLF: Any = Classifier.default()  # its events are read as plain documents here
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'"a string"', "not a JSON object"),
        (b'{"hello": "world"}', "unknown envelope"),
        (b'{"message": {"data": "!!!notbase64", "messageId": "1"}}', "not valid base64"),
        (
            b'{"message": {"data": "' + base64.b64encode(b"[1]") + b'", "messageId": "1"}}',
            "not a JSON object",
        ),
        (b'{"message": {"data": "' + base64.b64encode(b"nope") + b'", "messageId": "1"}}', "not JSON"),
        (b'{"message": {"messageId": "1"}}', "no data"),
        (
            b'{"specversion": "1.0", "type": "google.cloud.storage.object.v1.finalized", "id": "x"}',
            "unsupported",
        ),
        (
            b'{"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished", "data": 5}',
            "no Pub/Sub",
        ),
        (b"\xff\xfe\x00garbage", "malformed JSON"),
    ],
)
def test_broken_payloads(raw: bytes, why: str) -> None:
    ev = CLF.classify_bytes(raw)
    assert_valid_event(ev)
    assert ev["kind"] == "invalid"
    assert ev["action"] == "NONE"
    assert why in ev["reason"]


HOSTILE_NAMES = [
    "node-1; rm -rf /",
    "node-1\nreason=pwned",
    "../../etc/passwd",
    "Node-Upper",
    "a" * 64,
    "node_1",
    "",
    "$(reboot)",
    "node-1 state=resume",
    "all",
    "ALL",
    "All",
    "default",
    "a3-node-[000-003]",
    "a3-node-001,a3-node-002",
    "a3-node-[1]",
    "a3-node-001,",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_instance_names_are_invalid(name: str) -> None:
    ev = CLF.classify(ops_agent_entry(XID79, instance=name))
    assert_valid_event(ev)
    assert ev["kind"] == "invalid"
    assert ev["node"] is None
    assert "instance name" in ev["reason"] or "cannot be identified" in ev["reason"]


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("zone", "us-central1-a/../x", "zone"),
        ("zone", None, "zone"),
        ("project_id", "Bad Project!", "project"),
        ("instance_id", "12ab", "instance_id"),
        ("instance_id", 12345, "instance_id"),
    ],
)
def test_bad_resource_labels(field: str, value: Any, why: str) -> None:
    entry = ops_agent_entry(XID79)
    if value is None:
        del entry["resource"]["labels"][field]
    else:
        entry["resource"]["labels"][field] = value
    ev = CLF.classify(entry)
    assert ev["kind"] == "invalid"
    assert why in ev["reason"]


def test_unidentifiable_node() -> None:
    entry = ops_agent_entry(XID79)
    del entry["labels"]
    ev = CLF.classify(entry)
    assert ev["kind"] == "invalid"
    assert "cannot be identified" in ev["reason"]


def test_hostile_system_event_resource_name() -> None:
    case = next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted")
    entry = system_event_entry(case)
    entry["protoPayload"]["resourceName"] = "projects/p/zones/us-east1-d/instances/x;reboot"
    ev = CLF.classify(entry)
    assert ev["kind"] == "invalid"


@pytest.mark.parametrize(
    "line",
    [
        "systemd[1]: Started Session 42 of user root.",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:03:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
    ],
)
def test_noise_is_unrelated(line: str) -> None:
    for env in ENVELOPES.values():
        ev = CLF.classify(env(ops_agent_entry(line)))
        assert_valid_event(ev)
        assert ev["kind"] == "unrelated"
        assert ev["action"] == "NONE"


def test_long_message_is_truncated() -> None:
    ev = CLF.classify(ops_agent_entry(XID79 + " " + "x" * 5000))
    assert_valid_event(ev)
    assert len(ev["detail"]["message"]) <= 512


def test_input_not_mutated() -> None:
    entry = ops_agent_entry(XID79)
    before = copy.deepcopy(entry)
    CLF.classify(entry)
    assert entry == before


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("all", "Slurm keyword ALL"),
        ("ALL", "Slurm keyword ALL"),
        ("default", "Slurm keyword DEFAULT"),
        ("a3-node-[000-003]", "hostlist"),
        ("a3-node-001,a3-node-002", "hostlist"),
        ("A3-NODE-001", "RFC 1035"),
        ("a" * 64, "longer than 63"),
    ],
)
def test_slurm_expressions_are_never_node_names(name: str, why: str) -> None:
    for make in (ops_agent_entry, syslog_entry):
        ev = CLF.classify(make(XID79, instance=name))
        assert ev["kind"] == "invalid" and ev["action"] == "NONE" and ev["node"] is None
        assert why in ev["reason"]
        assert name not in ev["reason"] or name.lower() in ("all", "default")  # hostile text is not echoed


def test_allish_names_are_still_names() -> None:
    for name in ("all-nodes", "ball", "alla", "default-pool-1"):
        ev = CLF.classify(ops_agent_entry(XID79, instance=name))
        assert ev["kind"] == "gpu_xid" and ev["node"]["instance"] == name


HEAD = "NVRM: Xid (PCI:0000:a1:00): "
OFF_BUS = "GPU has fallen off the bus."
NO_GPU = object()  # the event names no GPU: its PCI address is not one a GPU can have
A1, B3 = "0000:a1:00", "0000:3b:00"

# Degrade, never drop (issue 22): a line whose Xid code can be read is a fault whatever else it
# carries. Each row: the line, its Xid, its action, the GPU the event names (NO_GPU: none), a
# fact that must be left out, and a word of the anomaly that says why.
DEGRADED = [
    (HEAD + "79, pid=" + "9" * 5000 + ", name=x, " + OFF_BUS, 79, "REBOOT_NODE", A1, "pid", "pid"),
    (HEAD + "79, pid=4194305, name=x, " + OFF_BUS, 79, "REBOOT_NODE", A1, "pid", "pid 4194305"),
    # the GSP timeout with an 8-digit pid (beyond PID_MAX_LIMIT): still a GPU reset
    (HEAD + "119, pid=15822503, name=nv-hostengine, Timeout waiting for RPC from GSP!", 119, "RESET_GPU",
     A1, "pid", "15822503"),
    (HEAD + "79, pid=abc, name=x, " + OFF_BUS, 79, "REBOOT_NODE", A1, "pid", "not a process id"),
    ("NVRM: Xid (PCI:0000:a1:20): 79, " + OFF_BUS, 79, "REBOOT_NODE", NO_GPU, None, "PCI device"),
    ("NVRM: GPU 0000:91:ff.0: " + OFF_BUS, 79, "REBOOT_NODE", NO_GPU, None, "PCI device"),
    ("NVRM: Xid (PCI:zzzz): 79, " + OFF_BUS, 79, "REBOOT_NODE", NO_GPU, None, "not readable"),
    # an application fault on an unknown GPU stays an application fault (no node action)
    ("NVRM: Xid (PCI:0000:18:20): 69, pid=1, name=p, Graphics class error", 69, "RESTART_JOB", NO_GPU, None,
     "PCI device"),
    # a GPU-scoped action on an unknown GPU becomes the node-level one for that code
    ("NVRM: Xid (PCI:0000:18:20): 119, Timeout waiting for RPC from GSP!", 119, "REBOOT_NODE", NO_GPU, None,
     "PCI device"),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:256): 43, pid=1, name=p, Ch 1", 43, "NONE", B3, None, "gi 256"),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:" + "7" * 400 + "): 43, Ch 1", 43, "NONE", B3, None,
     "ci 777"),
    (HEAD + "13, Graphics SM Warp Exception on (GPC 99999, TPC 3, SM 0): x", 13, "RESTART_JOB", A1,
     "gpc", "gpc 99999"),
    (HEAD + "13, Graphics SM Warp Exception on (GPC 1, TPC " + "3" * 600 + "): x", 13, "RESTART_JOB",
     A1, "tpc", "(600 chars)"),
    (HEAD + "45, pid=1, name=p, Ch 0000000c caused by previous Xid 0", 45, "NONE", A1, "primary_xid",
     "primary xid 0"),
    (HEAD + "74, NVLink: fatal error detected on link 4096", 74, "RESET_GPU", A1, "link", "link 4096"),
    (HEAD + "149, NETIR Fatal XC0 i0 Link -2 (0x0)", 149, "RESET_GPU", A1, "link", "link -2"),
    (HEAD + "154, GPU recovery action changed from 0x0 (None) to 0x100000000 (Big)", 154, "RESET_GPU",
     A1, "recovery_to", "recovery to"),
    (HEAD + "154, GPU recovery action changed from 0x" + "f" * 400 + " (x) to 0x1 (y)", 154, "RESET_GPU",
     A1, "recovery_from", "recovery from"),
    (HEAD + "79, pid=1, name=" + "p" * 200 + ", " + OFF_BUS, 79, "REBOOT_NODE", A1, None,
     "process name"),
    (HEAD + "79, pid=1, name=x, " + OFF_BUS + " " + "y" * 600, 79, "REBOOT_NODE", A1, None,
     "cut to 512"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "xid", "action", "pci", "left_out", "why"),
    DEGRADED,
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_an_odd_field_degrades_the_event_never_drops_it(
    line: str, xid: int, action: str, pci: object, left_out: str | None, why: str
) -> None:
    for make in (ops_agent_entry, syslog_entry):
        ev = CLF.classify(make(line, instance="a3-node-007"))
        assert_valid_event(ev)
        orjson.dumps(ev)
        assert (ev["kind"], ev["xid"]) == ("gpu_xid", xid), ev["reason"]
        assert ev["node"]["instance"] == "a3-node-007"
        assert ev["action"] == action, ev["reason"]
        assert (ev["gpu"] is None) if pci is NO_GPU else (ev["gpu"]["pci"] == pci)
        assert left_out is None or left_out not in ev["detail"]
        assert any(why in a for a in ev["detail"]["anomalies"]), ev["detail"]["anomalies"]
        assert "implausible fields" in ev["reason"]
        assert all(len(a) <= 160 for a in ev["detail"]["anomalies"])


def test_the_process_name_and_message_stay_bounded() -> None:
    ev = CLF.classify(ops_agent_entry(HEAD + "79, pid=1, name=" + "p" * 200 + ", " + OFF_BUS + "y" * 600))
    assert ev["detail"]["process"] == "p" * 64 and len(ev["detail"]["message"]) == 512


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (HEAD + "0, something", "xid 0 is out of range"),
        (HEAD + "12345, something", "xid 12345 is out of range"),
        (HEAD + "9" * 5000 + ", something", "(5000 chars) is out of range"),
        ("NVRM: Xid (PCI:zzzz): seventy-nine", "no known Xid format"),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 1234567, Fatal, Link 1 x",
            "sxid 1234567 is out of range",
        ),
        ("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): Fatal", "no known SXid format"),
    ],
    ids=lambda v: v[:40],
)
def test_an_unreadable_code_is_invalid_and_keeps_its_node(line: str, why: str) -> None:
    for make in (ops_agent_entry, syslog_entry):
        ev = CLF.classify(make(line, instance="a3-node-007"))
        assert_valid_event(ev)
        assert ev["kind"] == "invalid" and ev["action"] == "NONE"
        assert why in ev["reason"], ev["reason"]
        assert ev["node"] is not None and ev["node"]["instance"] == "a3-node-007"  # recorded against it
        orjson.dumps(ev)


def test_numbers_at_their_limits_are_accepted() -> None:
    ev = CLF.classify(ops_agent_entry(HEAD + "79, pid=4194304, name=x, GPU has fallen off the bus."))
    assert ev["kind"] == "gpu_xid" and ev["detail"]["pid"] == 4194304
    ev = CLF.classify(ops_agent_entry("NVRM: Xid (PCI:ffff:ff:1f): 9999, pid=0, name=x, new"))
    assert ev["kind"] == "gpu_xid" and ev["xid"] == 9999 and ev["gpu"]["pci"] == "ffff:ff:1f"


@pytest.mark.parametrize("digits", ["\u0667\u0669", "\uff17\uff19", "7\u0669"])
def test_non_ascii_digits_are_not_numbers(digits: str) -> None:
    ev = CLF.classify(ops_agent_entry(HEAD + digits + ", GPU has fallen off the bus."))
    assert ev["kind"] in ("invalid", "gpu_xid")
    assert ev["xid"] != 79 or ev["detail"].get("inferred_from")  # only the off-the-bus words may say 79


@pytest.mark.parametrize(
    "stamp",
    [
        "9999-99-99T99:99:99Z",
        "2026-02-30T10:00:00Z",
        "0001-01-01T00:00:00+23:59",
        "2026-11-21T10:42:31+99:00",
    ],
)
def test_impossible_timestamps_are_dropped(stamp: str) -> None:
    entry = ops_agent_entry(XID79)
    entry["timestamp"] = entry["receiveTimestamp"] = stamp
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["observed_at"] is None


@pytest.mark.parametrize(
    ("body", "cut"),
    [
        ("x" * (MAX_LINE - len(XID79) - 1), False),  # exactly 64 KiB
        ("x" * (MAX_LINE - len(XID79)), True),  # one byte more
        ("\u00e9" * 40_000, True),  # two bytes a character: cut on a character boundary
        ("\U0001f525" * 20_000, True),
    ],
)
def test_messages_over_64_kib_are_cut_and_say_so(body: str, cut: bool) -> None:
    ev = CLF.classify(ops_agent_entry(XID79 + " " + body))
    assert_valid_event(ev)
    assert ev["kind"] == "gpu_xid" and ev["xid"] == 79
    assert bool(ev["detail"].get("truncated")) is cut
    if cut:
        assert ev["detail"]["original_bytes"] == len((XID79 + " " + body).encode())
        assert "cut before parsing" in ev["reason"]


def test_lone_surrogates_become_valid_utf8() -> None:
    entry = ops_agent_entry(XID79[:-1] + " \ud800 tail")
    entry["insertId"] = "ins-\udfff"
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert "\ud800" not in ev["detail"]["message"]
    orjson.dumps(ev)


def test_a_log_of_another_project_may_not_speak_for_our_vm() -> None:
    """Issue 21 (2): through a folder or organization sink, a writer in project B logs an entry whose
    resource names project A's VM; the logName says where it was written, and it must agree."""
    entry = ops_agent_entry(XID79)
    ours = entry["resource"]["labels"]["project_id"]
    assert CLF.classify(entry)["kind"] == "gpu_xid"
    entry["logName"] = entry["logName"].replace(f"projects/{ours}/", "projects/someone-elses/")
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["kind"] == "invalid" and ev["action"] == "NONE"
    assert f"logName is in project someone-elses but the resource is in {ours}" in ev["reason"]
