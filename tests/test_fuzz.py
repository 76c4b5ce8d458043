"""Parsing is total: arbitrary bytes and JSON never raise, and every result fits the schema."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core.classify import Classifier
from pitstop.core.xid_line import parse_nvrm

from .helpers import ENVELOPES, assert_valid_event, ops_agent_entry

CLF = Classifier.default()

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


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(raw: bytes) -> None:
    assert_valid_event(CLF.classify_bytes(raw))


@settings(max_examples=400, deadline=None)
@given(json_values | entry_like)
def test_arbitrary_json(value: Any) -> None:
    assert_valid_event(CLF.classify_bytes(json.dumps(value)))
    for wrap in ENVELOPES.values():
        if isinstance(value, dict):
            assert_valid_event(CLF.classify(wrap(value)))


driver_text = st.text(
    alphabet=st.sampled_from(list("NVRMXidPC:0123456789abcdef(),. -='<>GUIunkowp")), max_size=80
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["NVRM: Xid ", "NVRM: Xid (PCI:0000:3b:00): ", "NVRM: GPU ", ""]), driver_text)
def test_driver_like_lines(prefix: str, body: str) -> None:
    parse_nvrm(prefix + body)
    assert_valid_event(CLF.classify(ops_agent_entry(prefix + body)))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=100))
def test_arbitrary_instance_labels(name: str) -> None:
    line = "NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus."
    ev = CLF.classify(ops_agent_entry(line, instance=name))
    assert_valid_event(ev)
    if ev["node"] is not None:
        assert ev["node"]["instance"] == name
