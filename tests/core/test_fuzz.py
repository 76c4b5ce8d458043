"""Parsing is total: arbitrary bytes, JSON, entries, lines and envelopes never raise, every
result fits the schema and serialises, and trust is never granted where it was not earned."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import parse
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.core.parse import INTERNAL_ERROR, SYSTEM_EVENT_LOG_ID
from pitstop.core.xid_line import parse_nvrm
from tests.helpers import ENVELOPES, assert_valid_event, journald_entry, ops_agent_entry, syslog_entry

CLF: Any = Classifier.default()  # its events are read as plain documents here

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
    max_leaves=25,
)
entry_keys = st.sampled_from(
    [
        "logName",
        "insertId",
        "protoPayload",
        "jsonPayload",
        "textPayload",
        "resource",
        "labels",
        "timestamp",
        "message",
        "specversion",
        "data",
        "type",
    ]
)
entry_like = st.dictionaries(entry_keys, json_values, max_size=8)

# Text as hostile as Python strings get: any code point, lone surrogates included.
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=120)
digits = st.text(alphabet="0123456789", min_size=1, max_size=6000)
hexdigits = st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=600)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | any_text | digits
anything = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(any_text, kids, max_size=3)
)


def check(ev: FaultEvent) -> Any:
    """Everything any event must satisfy."""
    assert_valid_event(ev)
    assert INTERNAL_ERROR not in ev["reason"], ev["reason"]  # the last guard never fired
    orjson.dumps(ev)  # storable and printable: no lone surrogate, no integer past 64 bits
    if ev["action"] != "NONE":
        assert ev["node"] is not None
    return ev


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(raw: bytes) -> None:
    check(CLF.classify_bytes(raw))


@settings(max_examples=400, deadline=None)
@given(json_values | entry_like)
def test_arbitrary_json(value: Any) -> None:
    check(CLF.classify_bytes(json.dumps(value)))
    for wrap in ENVELOPES.values():
        if isinstance(value, dict):
            check(CLF.classify(wrap(value)))


driver_text = st.text(
    alphabet=st.sampled_from(list("NVRMXidPC:0123456789abcdef(),. -='<>GUIunkowp")), max_size=80
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["NVRM: Xid ", "NVRM: Xid (PCI:0000:3b:00): ", "NVRM: GPU ", ""]), driver_text)
def test_driver_like_lines(prefix: str, body: str) -> None:
    parse_nvrm(prefix + body)
    check(CLF.classify(ops_agent_entry(prefix + body)))


# Every numeric slot of every line format, filled with digit strings of any length.
NUMERIC_LINES = [
    "NVRM: Xid (PCI:0000:a1:00): {d}, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:a1:00): 79, pid={d}, name=x, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:{d} GPU-CI:{d}): 31, pid=1, name=p, MMU Fault",
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC {d}, TPC {d}, SM {d}): x",
    "NVRM: Xid (PCI:0000:ed:00): 45, pid=1, name=p, Ch 0000000c caused by previous Xid {d}",
    "NVRM: Xid (PCI:0000:c1:00): 74, NVLink: fatal error detected on link {d}(0x0, 0x0)",
    "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i{d} Link -{d} (0x0)",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NUMERIC_LINES), digits)
def test_numbers_of_any_size(template: str, d: str) -> None:
    line = template.format(d=d)
    parse_nvrm(line)
    check(CLF.classify(ops_agent_entry(line)))


@settings(max_examples=200, deadline=None)
@given(hexdigits, hexdigits)
def test_recovery_codes_of_any_size(old: str, new: str) -> None:
    line = f"NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x{old} (a) to 0x{new} (b)"
    check(CLF.classify(ops_agent_entry(line)))


@settings(max_examples=300, deadline=None)
@given(any_text | st.text(max_size=3000))
def test_arbitrary_text_lines(line: str) -> None:
    assert parse_nvrm(line) is None or isinstance(parse_nvrm(line), dict)
    for make in (ops_agent_entry, syslog_entry):
        check(CLF.classify(make(line)))
    assert check(CLF.classify(syslog_entry(line)))["source"]["trust"] == "unverified"


journal_fields = st.dictionaries(
    st.sampled_from(
        [
            "MESSAGE",
            "_TRANSPORT",
            "SYSLOG_FACILITY",
            "SYSLOG_IDENTIFIER",
            "PRIORITY",
            "_PID",
            "message",
            "_HOSTNAME",
        ]
    ),
    st.sampled_from(["kernel", "syslog", "Kernel", "kernel ", "0", "1", 0]) | anything,
    max_size=8,
)
xid_texts = st.sampled_from(
    [
        "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot)",
    ]
)


@settings(max_examples=500, deadline=None)
@given(journal_fields, st.none() | xid_texts, st.dictionaries(entry_keys, anything, max_size=4))
def test_arbitrary_journald_entries(
    fields: dict[str, Any], message: str | None, extra: dict[str, Any]
) -> None:
    entry = journald_entry("NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus.")
    entry["jsonPayload"] = dict(fields)
    if message is not None:
        entry["jsonPayload"]["MESSAGE"] = message
    for e in (entry, {**entry, **{k: v for k, v in extra.items() if k != "jsonPayload"}}):
        ev = check(CLF.classify(e))
        jp = e["jsonPayload"]
        facility_ok = jp.get("SYSLOG_FACILITY") in (None, "0")  # absent or the kernel's own
        earned = "MESSAGE" in jp and jp.get("_TRANSPORT") == "kernel" and facility_ok
        if ev["source"]["trust"] == "verified":
            assert earned
        elif ev["kind"] == "gpu_xid":
            assert not earned


audit = st.fixed_dictionaries(
    {
        "protoPayload": st.fixed_dictionaries(
            {
                "serviceName": st.sampled_from(["compute.googleapis.com", "Compute.googleapis.com"])
                | anything,
                "methodName": st.sampled_from(["compute.instances.preempted", "compute.instances.hostError"])
                | anything,
                "authenticationInfo": st.fixed_dictionaries(
                    {
                        "principalEmail": st.sampled_from(["system@google.com", "mallory@example.com"])
                        | anything
                    }
                )
                | anything,
                "resourceName": st.just("projects/p-proj1/zones/us-east1-d/instances/vm-1") | anything,
            }
        ),
        "logName": st.sampled_from(
            [
                f"projects/p-proj1/logs/{SYSTEM_EVENT_LOG_ID}",
                f"projects/p-proj2/logs/{SYSTEM_EVENT_LOG_ID}",
                f"projects/p-proj1/logs/evil-{SYSTEM_EVENT_LOG_ID}",
            ]
        )
        | anything,
        "resource": st.fixed_dictionaries(
            {
                "type": st.just("gce_instance"),
                "labels": st.fixed_dictionaries(
                    {"project_id": st.just("p-proj1") | anything, "zone": st.just("us-east1-d")}
                ),
            }
        ),
        "insertId": anything,
        "timestamp": st.just("2026-11-21T10:42:31Z") | anything,
    }
)


@settings(max_examples=500, deadline=None)
@given(audit)
def test_system_events_count_only_from_google(entry: dict[str, Any]) -> None:
    for wrap in ENVELOPES.values():
        try:
            wrapped = wrap(entry)
        except (TypeError, ValueError):  # json.dumps in the helper refuses some Python-only values
            wrapped = entry
        ev = check(CLF.classify(wrapped))
        if (
            ev["kind"] in ("preemption", "host_error", "maintenance", "lifecycle")
            or ev["source"]["trust"] == "verified"
        ):
            p = entry["protoPayload"]
            assert entry["logName"] == f"projects/p-proj1/logs/{SYSTEM_EVENT_LOG_ID}"
            assert entry["resource"]["labels"]["project_id"] == "p-proj1"
            assert p["serviceName"] == "compute.googleapis.com"
            assert p["authenticationInfo"]["principalEmail"] == "system@google.com"


envelopes = st.one_of(
    st.fixed_dictionaries(
        {
            "message": st.fixed_dictionaries(
                {
                    "data": any_text
                    | st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode())
                    | anything,
                    "messageId": anything,
                    "publishTime": anything,
                }
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "specversion": anything,
            "type": st.just("google.cloud.pubsub.topic.v1.messagePublished") | anything,
            "id": anything,
            "time": anything,
            "data": anything | st.fixed_dictionaries({"message": anything}),
        }
    ),
    st.fixed_dictionaries(
        {
            "specversion": st.just("1.0"),
            "type": st.just("google.cloud.pubsub.topic.v1.messagePublished"),
            "data_base64": any_text | st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
        }
    ),
)


@settings(max_examples=500, deadline=None)
@given(envelopes)
def test_arbitrary_envelopes(env: dict[str, Any]) -> None:
    check(CLF.classify(env))


@settings(max_examples=200, deadline=None)
@given(anything)
def test_envelopes_around_arbitrary_entries(inner: Any) -> None:
    payload = {"jsonPayload": inner, "logName": inner} if not isinstance(inner, dict) else inner
    for wrap in ENVELOPES.values():
        try:
            wrapped = wrap(payload)
        except (TypeError, ValueError):
            continue
        check(CLF.classify(wrapped))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=100))
def test_arbitrary_instance_labels(name: str) -> None:
    line = "NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus."
    ev = check(CLF.classify(ops_agent_entry(line, instance=name)))
    if ev["node"] is not None:
        assert ev["node"]["instance"] == name
        assert name.lower() not in ("all", "default") and not set(name) & set("[],")


# -- degrade, never drop (issue 22) ------------------------------------------------------------------

# Anything before a driver line: collector headers, dmesg times, thread tags, or text (no parentheses,
# so no second driver line hides in it).
prefixes = st.sampled_from(
    ["", "kernel: ", "[ 1843.308145] ", "[ T1946] ", "Nov 21 10:42:31 a3-node-007 kernel: [680111.646286] "]
) | st.text(st.characters(codec="utf-8", exclude_characters="()"), max_size=40)
# What the parentheses may hold: real forms, hostile numbers, or any text without a ")".
wheres = st.sampled_from(
    ["PCI:0000:3b:00", "0000:3B:00.0", "PCI:0018:01:00 GPU-I:02 GPU-CI:01", "PCI:0000:a1:20", "PCI:zzzz", ""]
) | st.text(st.characters(codec="utf-8", exclude_characters=")"), max_size=60)
# Whatever follows the code: pid and name of any size and text, then any message.
rests = st.builds(
    lambda pid, name, msg: f"pid={pid}, name={name}, {msg}",
    st.text(alphabet="0123456789'<unknown>N/A", max_size=300),
    st.text(max_size=100).filter(lambda t: "," not in t),
    st.text(max_size=2000),
) | st.text(max_size=2000)
names = st.sampled_from(["a3-node-001", "a3-megagpu-7", "gke-train-pool-1-abcd"])


@settings(max_examples=400, deadline=None)
@given(prefixes, wheres, st.integers(1, 9999), rests, names, st.sampled_from(sorted(ENVELOPES)))
def test_a_readable_xid_code_on_a_named_node_is_always_a_fault(
    prefix: str, where: str, code: int, rest: str, node: str, envelope: str
) -> None:
    line = f"{prefix}NVRM: Xid ({where}): {code}, {rest}"
    for make in (ops_agent_entry, syslog_entry):
        ev = check(CLF.classify(ENVELOPES[envelope](make(line, instance=node))))
        assert (ev["kind"], ev["xid"]) == ("gpu_xid", code), ev["reason"]
        assert ev["node"]["instance"] == node


@settings(max_examples=400, deadline=None)
@given(
    prefixes,
    st.sampled_from(["", "nvidia-nvswitch0: ", "nvidia-nvswitch17: ", "nvidia-nvswitch99999999: "]),
    wheres,
    st.integers(1, 99_999),
    st.sampled_from(["Fatal, Link 28 ", "Non-fatal, Link 4 ", "Fatal, ", "Severity 1 ", "", "Link -9 "]),
    st.text(max_size=500),
    names,
)
def test_a_readable_sxid_code_on_a_named_node_is_always_a_fault(
    prefix: str, device: str, where: str, code: int, head: str, rest: str, node: str
) -> None:
    line = f"{prefix}{device}SXid ({where}): {code}, {head}{rest}"
    ev = check(CLF.classify(ops_agent_entry(line, instance=node)))
    assert (ev["kind"], ev["detail"].get("sxid")) == ("nvswitch_sxid", code), ev["reason"]
    assert ev["node"]["instance"] == node and ev["gpu"] is None


SAMPLE_LINES = [
    "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 31, pid=4211, name=python, Ch 00000010, MMU Fault",
    "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
    "nvidia-nvswitch2: SXid (PCI:0000:87:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV (First)",
    "NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
]


@settings(max_examples=300, deadline=None)
@given(
    prefixes | st.sampled_from(["fallen off the bus ", "SXid ", "nvidia-nvswitch3: "]),
    st.sampled_from(SAMPLE_LINES),
)
def test_remembered_parses_are_the_parse(prefix: str, line: str) -> None:
    """A storm's repeated line is parsed once: what is remembered (keyed past the line's prefix)
    is exactly what parsing the whole text gives, and no caller's changes reach the next one."""
    text = prefix + line
    first = parse._driver_line(text)
    assert first == parse._read_driver_line(text)
    if first is not None and "detail" in first:
        mutable = cast(dict[str, Any], first)  # a caller's own changes, even keys no line has
        mutable["detail"]["mutated"] = True
        (mutable.get("mig") or {})["gi"] = 99
    assert parse._driver_line(text) == parse._read_driver_line(text)
