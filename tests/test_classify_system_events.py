"""Compute Engine system events map to the actions DESIGN.md gives them."""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.core.classify import Classifier

from .helpers import ENVELOPES, assert_valid_event, load_fixture, subset, system_event_entry

CASES = load_fixture("system_events.yaml")
CLF = Classifier.default()


@pytest.mark.parametrize("envelope", sorted(ENVELOPES))
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_system_event(case: dict[str, Any], envelope: str) -> None:
    entry = system_event_entry(case)
    ev = CLF.classify(ENVELOPES[envelope](entry))
    assert_valid_event(ev)
    exp = case["expect"]
    assert ev["kind"] == exp["kind"]
    assert ev["action"] == exp["action"], ev["reason"]
    assert ev["xid"] is None
    assert ev["source"]["insert_id"] == entry["insertId"]
    assert ev["observed_at"] == entry["timestamp"]
    if exp["kind"] == "unrelated":
        return
    node = ev["node"]
    for key in ("instance", "zone", "project", "instance_id"):
        if key in exp:
            assert node[key] == exp[key]
    subset(exp.get("detail", {}), ev["detail"])
    assert ev["detail"]["method"] == entry["protoPayload"]["methodName"]


def test_unencoded_log_id_is_accepted() -> None:
    entry = system_event_entry(next(c for c in CASES if c["id"] == "preempted"))
    entry["logName"] = "projects/mock-project/logs/cloudaudit.googleapis.com/system_event"
    assert CLF.classify(entry)["kind"] == "preemption"
