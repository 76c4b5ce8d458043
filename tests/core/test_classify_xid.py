"""Every reference driver line, in every carrier and envelope, yields the expected FaultEvent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pitstop.core.classify import Classifier
from pitstop.local.fake_compute import default_id
from tests.helpers import CARRIER_TRUST, CARRIERS, ENVELOPES, assert_valid_event, load_fixture, subset

CASES = load_fixture("xid_lines.yaml")
SXID_CASES = load_fixture("sxid_lines.yaml")
CLF = Classifier.default()


def in_every_carrier_and_envelope(test: Callable[..., None]) -> Callable[..., None]:
    """Run the test once per carrier and envelope the pipeline receives."""
    by_carrier: Callable[..., None] = pytest.mark.parametrize("carrier", sorted(CARRIERS))(test)
    both: Callable[..., None] = pytest.mark.parametrize("envelope", sorted(ENVELOPES))(by_carrier)
    return both


def classified(case: dict[str, Any], carrier: str, envelope: str) -> Any:
    """The fixture's line as one carrier ships it, in one envelope, classified (and schema-valid)."""
    entry = CARRIERS[carrier](case["line"], instance="a3-megagpu-7", insert_id="ins-42")
    ev = CLF.classify(ENVELOPES[envelope](entry))
    assert_valid_event(ev)
    return ev


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
@in_every_carrier_and_envelope
def test_xid_line(case: dict[str, Any], carrier: str, envelope: str) -> None:
    ev = classified(case, carrier, envelope)
    exp = case["expect"]
    assert ev["kind"] == "gpu_xid"
    assert ev["xid"] == exp["xid"]
    assert ev["action"] == exp["action"], ev["reason"]
    if "pci" in exp:
        assert (ev["gpu"] or {}).get("pci") == exp["pci"]
    if "mig" in exp:
        assert ev["gpu"]["mig"] == exp["mig"]
    subset(exp.get("detail", {}), ev["detail"])
    assert ev["node"]["instance"] == "a3-megagpu-7"
    if carrier == "gke_journal":  # a zonal cluster's location, not the node's zone: ingest looks it up
        assert (ev["node"]["zone"], ev["node"]["location"]) == (None, "us-central1-a")
    else:
        assert ev["node"]["zone"] == "us-central1-a"
    assert ev["node"]["project"] == "train-prod"
    assert ev["source"]["insert_id"] == "ins-42"
    assert ev["observed_at"] == "2026-11-21T10:42:31.325309Z"
    assert ev["reason"].startswith(f"Xid {exp['xid']}")
    assert ev["source"]["trust"] == CARRIER_TRUST[carrier]
    assert ("[unverified: " in ev["reason"]) is (CARRIER_TRUST[carrier] == "unverified")
    if envelope != "bare":
        assert ev["source"]["message_id"] == "4711"
    if carrier == "gke_journal":
        assert ev["node"]["cluster"] == "train"
        assert ev["node"]["instance_id"] is None
    else:
        assert ev["node"]["instance_id"] == default_id("train-prod", "us-central1-a", "a3-megagpu-7")


@pytest.mark.parametrize("case", SXID_CASES, ids=[c["id"] for c in SXID_CASES])
@in_every_carrier_and_envelope
def test_sxid_line(case: dict[str, Any], carrier: str, envelope: str) -> None:
    ev = classified(case, carrier, envelope)
    exp = case["expect"]
    assert (ev["kind"], ev["xid"], ev["gpu"]) == ("nvswitch_sxid", None, None)
    assert ev["detail"]["sxid"] == exp["sxid"]
    assert ev["action"] == exp["action"], ev["reason"]
    subset(exp.get("detail", {}), ev["detail"])
    assert ev["node"]["instance"] == "a3-megagpu-7"
    assert ev["reason"].startswith(f"SXid {exp['sxid']}")
    assert ev["source"]["trust"] == CARRIER_TRUST[carrier]
    assert ("severity" in ev["detail"]) is ("anomalies" not in ev["detail"])  # no severity word: flagged


def test_fixture_corpus_marks_provenance() -> None:
    for case in CASES + SXID_CASES:
        assert case["provenance"], case["id"]
        assert isinstance(case["synthetic"], bool), case["id"]
    assert len({c["id"] for c in CASES + SXID_CASES}) == len(CASES) + len(SXID_CASES)


def test_an_undecodable_nvlink_combination_says_so() -> None:
    line = (
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_SRC_TRACK Fatal XC0 i0 Link 5 "
        "(0x00000007 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    ev = CLF.classify(CARRIERS["ops_agent"](line))
    assert ev["detail"]["decoded"] is False
    assert any("0x40 is not in NVIDIA's Xid 144-150 decode table" in a for a in ev["detail"]["anomalies"])


APP_FAULTS = [13, 31, 43, 45, 137]


@pytest.mark.parametrize("xid", APP_FAULTS)
def test_application_faults_never_take_node_action(xid: int) -> None:
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=991, name=python3, Ch 00000010"
    ev = CLF.classify(CARRIERS["ops_agent"](line))
    assert ev["action"] in ("NONE", "RESTART_JOB")
    assert ev["detail"]["app_fault"] is True


def test_unknown_code_says_so() -> None:
    ev = CLF.classify(CARRIERS["ops_agent"]("NVRM: Xid (PCI:0000:01:00): 4242, something"))
    assert ev["action"] == "RESET_GPU"
    assert "not in NVIDIA's catalog" in ev["reason"]


def test_override_replaces_action() -> None:
    clf = Classifier(CLF.xids.with_overrides({79: "REPLACE_NODE"}), CLF.system_events)
    line = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    ev = clf.classify(CARRIERS["ops_agent"](line))
    assert ev["action"] == "REPLACE_NODE"
    assert "override" in ev["reason"]
