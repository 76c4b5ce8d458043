"""Bad input is data: a clear invalid/unrelated event, never an exception, never executed."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from pitstop.core.classify import Classifier

from .helpers import ENVELOPES, assert_valid_event, load_fixture, ops_agent_entry, system_event_entry

CLF = Classifier.default()
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


def test_garbled_xid_line_is_invalid_not_unrelated() -> None:
    ev = CLF.classify(ops_agent_entry("NVRM: Xid (PCI:zzzz): seventy-nine"))
    assert ev["kind"] == "invalid"
    assert "no known Xid format" in ev["reason"]


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
