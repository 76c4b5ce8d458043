"""Vertex AI job log entries (resource.type ml_job) → vertex_job events, and the sink filter that
selects them (tests/fixtures/vertex_job_logs.yaml: a real entry and entries of its shape)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pitstop.core import engine, sinks
from pitstop.core.parse import parse_entry
from pitstop.core.vertex_log import parse_vertex_entry, place
from pitstop.local.lql import compile_filter
from tests.helpers import assert_valid_event, load_fixture

CASES = load_fixture("vertex_job_logs.yaml")
FILTER = compile_filter(sinks.read_filter("vertex-jobs.filter"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_each_entry_becomes_its_event(case: dict[str, Any]) -> None:
    ev = parse_vertex_entry(case["entry"], "m-1", case["entry"].get("timestamp"))
    assert_valid_event(ev)
    assert ev["kind"] == case["kind"]
    if case["kind"] == "vertex_job":
        ref = ev["detail"]["vertex"]
        assert ref["state"] == case["state"] and ref["task"] == "service" and ref["project"] == "train-prod"
        assert ref["job_id"] == case["entry"]["resource"]["labels"]["job_id"]
        assert ref["job"] == case.get("job")  # a full resource name only where the entry has a region
        assert ev["action"] == "NONE" and ev["node"] is None and ev["source"]["trust"] == "unverified"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_the_sink_filter_selects_exactly_the_ended_jobs_service_messages(case: dict[str, Any]) -> None:
    assert FILTER(case["entry"]) is case["selected"]


def _failed() -> dict[str, Any]:
    return copy.deepcopy(next(c["entry"] for c in CASES if c["id"] == "failed"))


def _with(path: tuple[str, ...], value: object) -> dict[str, Any]:
    entry = _failed()
    node = entry
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return entry


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (("resource", "labels", "job_id"), "4606/../../x", "job_id is not a CustomJob id"),
        (("resource", "labels", "job_id"), "1" * 21, "job_id is not a CustomJob id"),
        (("resource", "labels", "job_id"), 4606268999515242496, "job_id is not a CustomJob id"),
        (("resource", "labels", "project_id"), "Train Prod", "valid resource.labels.project_id"),
        (("resource", "labels", "location"), "us-central1/customJobs/1", "location is not a region"),
        (("resource", "labels", "task_name"), "service;rm", "neither service nor a replica"),
        (
            ("logName",),
            "projects/other-proj/logs/ml.googleapis.com%2F4606268999515242496",
            "not the job's own log",
        ),
        (("logName",), "projects/train-prod/logs/ml.googleapis.com%2F1", "not the job's own log"),
        (("resource", "type"), "gce_instance", "resource.type ml_job"),
    ],
)
def test_hostile_names_are_refused_with_a_reason(path: tuple[str, ...], value: object, why: str) -> None:
    ev = parse_vertex_entry(_with(path, value))
    assert_valid_event(ev)
    assert ev["kind"] == "invalid" and why in ev["reason"]


def test_a_long_or_odd_message_is_cut_and_never_decides() -> None:
    ev = parse_vertex_entry(_with(("textPayload",), "x" * 200_000))
    assert_valid_event(ev)
    assert ev["kind"] == "vertex_job" and len(ev["detail"]["message"]) <= 512  # the label said FAILED
    entry = _with(("labels",), {})
    entry["textPayload"] = "Job failed."
    assert parse_vertex_entry(entry)["detail"]["vertex"]["state"] == "JOB_STATE_FAILED"
    entry["textPayload"] = "Job failed to stay unbroken? no: the replica said so"
    assert parse_vertex_entry(entry)["kind"] == "unrelated"


# -- from the entry to the episode: parse_entry sends ml_job entries here, place puts the event on its job


def _policy(**vertex: Any) -> Any:
    from pitstop.core import policy

    block = {
        "regions": ["us-central1"],
        "job_service_accounts": ["trainer@train-prod.iam.gserviceaccount.com"],
    }
    return policy.from_doc(
        {"clusters": [{"name": "llm", "scheduler": "vertex", "vertex": {**block, **vertex}}]}
    )


def test_parse_entry_reads_an_ml_job_entry_as_a_vertex_job_event() -> None:
    from pitstop.core.classify import Classifier

    ev = Classifier.default().decide(parse_entry(_failed()))
    assert ev["kind"] == "vertex_job" and ev["detail"]["vertex"]["job_id"] == "4606268999515242496"
    assert "unverified" in ev["reason"]  # a log line names the job only


def test_place_puts_the_event_on_its_cluster_s_job_proposing_the_read_back() -> None:
    ev = place(parse_vertex_entry(_failed()), _policy())
    assert ev["kind"] == "vertex_job" and ev["action"] == "RESCHEDULE_JOB" and ev["node"] is None
    assert ev["job"] == {"project": "train-prod", "cluster": "llm", "job": "4606268999515242496"}
    assert engine.subject_key(ev).startswith("job.train-prod.llm.")
    same = place(parse_vertex_entry(_failed()), _policy(project="train-prod"))
    assert same["job"] == ev["job"]


@pytest.mark.parametrize(
    ("block", "location"),
    [({"project": "other-proj"}, None), ({"regions": ["europe-west4"]}, "us-central1")],
    ids=["another-project", "another-region"],
)
def test_a_job_no_vertex_cluster_takes_is_unrelated(block: dict[str, Any], location: str | None) -> None:
    entry = _failed()
    if location:
        entry["resource"]["labels"]["location"] = location
    ev = place(parse_vertex_entry(entry), _policy(**block))
    assert ev["kind"] == "unrelated" and "no policy cluster" in ev["reason"] and "job" not in ev


def test_place_leaves_every_other_event_as_it_is() -> None:
    other = parse_entry({"textPayload": "hello", "logName": "projects/train-prod/logs/x"})
    assert place(other, _policy()) is other
