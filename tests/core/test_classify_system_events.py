"""Compute Engine system events map to the actions DESIGN.md gives them."""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.core.classify import Classifier
from tests.helpers import (
    ENVELOPES,
    assert_valid_event,
    load_fixture,
    retarget_system_event,
    subset,
    system_event_entry,
)

CASES = load_fixture("system_events.yaml")
CLF: Any = Classifier.default()  # its events are read as plain documents here


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


def test_google_system_events_are_verified() -> None:
    for case in CASES:
        ev = CLF.classify(system_event_entry(case))
        assert ev["source"]["trust"] == "verified", case["id"]
        assert "system@google.com" in ev["source"]["trust_reason"]


PREEMPTED = next(c for c in CASES if c["id"] == "preempted")
AUDIT = "cloudaudit.googleapis.com%2Fsystem_event"


@pytest.mark.parametrize(
    "log_name",
    [
        "projects/mock-project/logs/cloudaudit.googleapis.com/system_event",  # never stored unencoded
        "projects/mock-project/logs/cloudaudit.googleapis.com%2fsystem_event",  # lower-case escape
        f"projects/mock-project/logs/evil-{AUDIT}",
        f"projects/mock-project/logs/x%2F{AUDIT}",
        f"projects/other-project/logs/{AUDIT}",  # another project's log for this project's VM
        f"organizations/123/logs/{AUDIT}",
        f"projects/mock-project/logs/{AUDIT}x",
        f"projects/mock-project/logs/{AUDIT} ",
        "projects/mock-project/logs/cloudaudit.googleapis.com%2Factivity",
        f"/projects/mock-project/logs/{AUDIT}",
    ],
)
def test_only_the_exact_log_name_counts(log_name: str) -> None:
    entry = system_event_entry(PREEMPTED)
    entry["logName"] = log_name
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["kind"] == "invalid" and ev["action"] == "NONE"
    assert ev["source"]["trust"] == "unverified"
    assert "log name must be exactly" in ev["reason"]


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (("authenticationInfo", "principalEmail"), "mallory@example.com", "principalEmail"),
        (("authenticationInfo", "principalEmail"), "SYSTEM@google.com", "principalEmail"),
        (("authenticationInfo", "principalEmail"), "system@google.com.evil.example", "principalEmail"),
        (("authenticationInfo", "principalEmail"), None, "principalEmail"),
        (("authenticationInfo",), "system@google.com", "principalEmail"),
        (("serviceName",), "compute.googleapis.com.evil.example", "serviceName"),
        (("serviceName",), "logging.googleapis.com", "serviceName"),
        (("serviceName",), None, "serviceName"),
    ],
)
def test_author_and_service_must_be_googles(path: tuple[str, ...], value: Any, why: str) -> None:
    entry = system_event_entry(PREEMPTED)
    target = entry["protoPayload"]
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["kind"] == "invalid" and ev["action"] == "NONE"
    assert why in ev["reason"]


def test_log_project_must_be_the_resources_project() -> None:
    entry = system_event_entry(PREEMPTED)
    del entry["resource"]["labels"]["project_id"]
    ev = CLF.classify(entry)
    assert ev["kind"] == "invalid"
    assert "project_id" in ev["reason"]


@pytest.mark.parametrize(
    "method", ["compute.instances.preempted\n@channel", "compute.instances.", "compute.instances.a.b"]
)
def test_odd_method_names_are_unrelated(method: str) -> None:
    entry = system_event_entry(PREEMPTED)
    entry["protoPayload"]["methodName"] = method
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["kind"] == "unrelated" and ev["action"] == "NONE"


def test_a_retargeted_event_stays_googles() -> None:
    entry = retarget_system_event(system_event_entry(PREEMPTED), "a3-node-002")
    ev = CLF.classify(entry)
    assert ev["kind"] == "preemption" and ev["source"]["trust"] == "verified"
    assert ev["node"]["instance"] == "a3-node-002" and ev["node"]["project"] == "train-prod"
