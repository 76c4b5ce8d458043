"""The degraded node's planned move as pure decisions (core/degraded.py): the comparison with the
job's other nodes, the repair its finding earns, the closing words; and the policy data they read
(schemas/xid-policy.yaml ``degraded``) against the alert policies Monitoring evaluates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import degraded
from pitstop.core.domain import Incident
from pitstop.core.resources import DataFileError, load_yaml, schema_dir
from pitstop.core.slurm_wire import expand_hostlist

ROOT = Path(__file__).resolve().parents[2]
POL = degraded.default_policy()
THROTTLE = POL.symptoms["throttle"]
ECC = POL.symptoms["ecc"]


# -- the comparison: one row per case a platform engineer would ask about ---------------------


@pytest.mark.parametrize(
    ("rule", "node_value", "peers", "verdict", "alike"),
    [
        # a straggler: this node throttles 60 % of the time, its three peers hardly at all
        (THROTTLE, 0.6, {"b": 0.0, "c": 0.02, "d": 0.1}, "move", ()),
        # one peer crosses too, but fewer than half of them: still this node's fault
        (THROTTLE, 0.6, {"b": 0.4, "c": 0.0, "d": 0.0}, "move", ("b",)),
        # every peer throttles alike (the rack's cooling, the job's power cap): no move
        (THROTTLE, 0.5, {"b": 0.5, "c": 0.45}, "gang_wide", ("b", "c")),
        # exactly half alike is gang-wide (gang_wide_share 0.5 is inclusive)
        (THROTTLE, 0.5, {"b": 0.5, "c": 0.0}, "gang_wide", ("b",)),
        # the line is strict (> threshold), as the alert policy's COMPARISON_GT
        (THROTTLE, 0.6, {"b": 0.25, "c": 0.25}, "move", ()),
        # the node is back under the line: the condition has passed
        (THROTTLE, 0.1, {"b": 0.0}, "cleared", ()),
        # an ECC trend on one node only
        (ECC, 40.0, {"b": 0.0, "c": 2.0}, "move", ()),
        # no peers to compare with (a one-node job, or none running): the node's own reading decides
        (THROTTLE, 0.6, {}, "move", ()),
        # peers whose telemetry is missing are not counted; none left: the node's own reading decides
        (THROTTLE, 0.6, {"b": None, "c": None}, "move", ()),
        # the node's own reading missing: the alert alone is no evidence (issue 35 (4)), a page
        (THROTTLE, None, {"b": 0.0}, "unconfirmed", ()),
        (THROTTLE, None, {"b": 0.9}, "unconfirmed", ()),
        (ECC, None, {}, "unconfirmed", ()),
    ],
)
def test_the_comparison_with_the_jobs_other_nodes(
    rule: degraded.SymptomRule,
    node_value: float | None,
    peers: dict[str, float | None],
    verdict: str,
    alike: tuple[str, ...],
) -> None:
    v = degraded.compare(rule, POL.gang_wide_share, "a", node_value, peers, 100.0)
    assert (v.verdict, v.alike, v.move) == (verdict, alike, verdict == "move")
    assert v.why and ("no move" in v.why or "nothing moved" in v.why) == (verdict != "move")
    assert (v.evidence is not None) is v.move  # a move rests on the node's own reading
    if v.evidence is not None:
        assert (v.evidence.probe, v.evidence.node, v.evidence.symptom, v.evidence.at) == (
            "telemetry", "a", rule.symptom, 100.0)  # fmt: skip
        assert v.record(100.0, 1)["evidence"]["symptom"] == rule.symptom


def test_the_node_itself_among_its_peers_is_not_its_own_peer() -> None:
    v = degraded.compare(THROTTLE, 0.5, "a", 0.6, {"a": 0.6, "b": 0.0})
    assert v.verdict == "move" and v.alike == ()


def test_a_symptom_without_a_rule_moves_nothing_and_pages() -> None:
    """Issue 35 (4): a missing or unknown ``pitstop_symptom`` has no rule: the alert alone (anyone
    who may publish to the alerts topic can send one) moves nothing; the close pages."""
    for node_value in (None, 0.9):
        v = degraded.compare(None, 0.5, "a", node_value, {"b": 0.0})
        assert (v.verdict, v.move, v.evidence) == ("unconfirmed", False, None) and "no rule" in v.why
    rec = v.record(1.0, 1)
    text, sev = degraded.close_note(_inc(corroboration=rec)) or ("", "")
    assert sev == "critical" and "NOT moved" in text
    assert degraded.stood_down(_inc(corroboration=rec)) == "unconfirmed"


def test_the_record_says_what_it_was_decided_on() -> None:
    rec = degraded.compare(THROTTLE, 0.5, "a", 0.6, {"b": 0.6}).record(100.0, 1)
    assert rec["kind"] == "peers" and rec["confirmed"] is False and rec["verdict"] == "gang_wide"
    assert rec["peers"] == {"b": 0.6} and rec["node_value"] == 0.6 and rec["alike"] == ["b"]


# -- the repair by finding: irreversible only on a hardware finding ---------------------------


@pytest.mark.parametrize(
    ("rule", "finding", "action"),
    [
        (THROTTLE, True, "REPLACE_NODE"),
        (THROTTLE, False, "REBOOT_NODE"),
        (ECC, True, "REPLACE_NODE"),
        (ECC, False, "REBOOT_NODE"),
        (ECC, None, "REBOOT_NODE"),  # a diagnostic that never finished is no finding
        (None, True, "REPLACE_NODE"),
        (None, False, "REBOOT_NODE"),
    ],
)
def test_the_repair_follows_the_finding(
    rule: degraded.SymptomRule | None, finding: bool | None, action: str
) -> None:
    got, why = degraded.repair(rule, finding, "row remap pending")
    assert got == action and "row remap pending" in why


# -- what the incident says when it closes ----------------------------------------------------


def _inc(**over: Any) -> Incident:
    base = {
        "kind": "degraded",
        "node": {"instance": "a3-node-009"},
        "action": "REPLACE_NODE",
        "reason": "r",
        "timeline": {"fenced": 1.0},
    }
    return cast(Incident, {**base, **over})  # the fields close_note reads


def test_closing_words_for_each_outcome() -> None:
    gang = _inc(corroboration={"kind": "peers", "confirmed": False, "verdict": "gang_wide", "why": "w"})
    text, sev = degraded.close_note(gang) or ("", "")
    assert sev == "critical" and "NOT moved" in text
    cleared = _inc(corroboration={"kind": "peers", "confirmed": False, "verdict": "cleared", "why": "w"})
    assert (degraded.close_note(cleared) or ("", ""))[1] == "info"
    moved = _inc(corroboration={"kind": "peers", "confirmed": True}, resume={"mode": "early",
                 "requeued": [{"job": "7", "why": "x"}]})  # fmt: skip
    text, sev = degraded.close_note(moved) or ("", "")
    assert sev == "warning" and "moved onto spares" in text and "job 7" in text
    waited = _inc(resume={"mode": "after_repair", "requeued": [], "waiting": [{"job": "7", "why": "x"}]})
    assert "NO SPARE" in (degraded.close_note(waited) or ("", ""))[0]
    assert degraded.close_note(cast(Incident, {"kind": "gpu_xid", "node": {"instance": "n"}})) is None
    assert degraded.close_note(_inc(timeline={})) is None  # never fenced: nothing moved, the usual words
    assert degraded.stood_down(moved) is None and degraded.stood_down(gang) == "gang_wide"


def test_the_symptom_comes_from_the_incidents_alerts() -> None:
    assert degraded.symptom_of(cast(Incident, {"alerts": [{"symptom": None}, {"symptom": "ecc"}]})) == "ecc"
    assert degraded.symptom_of(cast(Incident, {})) is None


def test_peers_are_every_other_node_of_the_jobs_once() -> None:
    assert degraded.peers_of("b", [("a", "b"), ("b", "c", "a")]) == ["a", "c"]


# -- a job's nodes as Slurm prints them -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        (
            "a3-node-[001-003,007],login1",
            ("a3-node-001", "a3-node-002", "a3-node-003", "a3-node-007", "login1"),
        ),
        ("a3-node-012", ("a3-node-012",)),
        ("a3-node-[009-011]", ("a3-node-009", "a3-node-010", "a3-node-011")),
        ("", ()),
        ("(null)", ()),
        ("x[3-1]", ()),  # a range backwards is not a host list
        ("x[1-99999]", ()),  # more hosts than any cluster: refused, not expanded
        (None, ()),
    ],
)
def test_slurm_host_lists(text: Any, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == hosts


# -- the data: valid, and the same line as the alert Monitoring evaluates ------------------


def _alert_condition(stem: str) -> dict[str, Any]:
    doc = json.loads((ROOT / "infra" / "monitoring" / "telemetry" / f"{stem}.json").read_text())
    cond: dict[str, Any] = doc["conditions"][0]["conditionThreshold"]
    return cond


@pytest.mark.parametrize(("symptom", "stem"), [("throttle", "gpu-throttle"), ("ecc", "gpu-ecc-trend")])
def test_the_policy_reads_what_the_alert_fired_on(symptom: str, stem: str) -> None:
    rule, cond = POL.symptoms[symptom], _alert_condition(stem)
    assert f'metric.type="{rule.metric}"' in cond["filter"]
    assert rule.filter.replace(" ", "") in cond["filter"].replace(" ", "")
    assert rule.threshold == cond["thresholdValue"]
    assert rule.aligner == cond["aggregations"][0]["perSeriesAligner"]
    window = float(cond["duration"].rstrip("s")) or float(
        cond["aggregations"][0]["alignmentPeriod"].rstrip("s")
    )
    assert rule.hold_s == window


def test_a_bad_degraded_section_is_refused_with_its_path(tmp_path: Path) -> None:
    text = (
        (schema_dir() / "xid-policy.yaml").read_text().replace("gang_wide_share: 0.5", "gang_wide_share: 2")
    )
    bad = tmp_path / "xid-policy.yaml"
    bad.write_text(text)
    with pytest.raises(DataFileError, match="degraded/gang_wide_share"):
        load_yaml(bad, "xid-policy.schema.json")


# -- the finding of a throttling node: its hardware holds the clocks down now ---------------------


def _smi(reason: str | None) -> Any:
    from pitstop.core.diagnose import parse_nvidia_smi_q
    from pitstop.local.gpu_tools.nvidia_smi import query
    from pitstop.local.gpu_tools.state import NodeState

    return parse_nvidia_smi_q(
        query(NodeState(node="n", throttle=0.6 if reason else 0.0, throttle_reason=reason or "thermal"))
    )


@pytest.mark.parametrize(
    ("symptom", "reason", "confirmed", "found"),
    [
        ("throttle", "thermal", False, True),  # HW (thermal) slowdown active: the hardware at fault
        ("throttle", "power", False, False),  # SW power cap: a setting, no finding
        ("throttle", None, False, False),
        ("ecc", "thermal", False, False),  # a slowdown is no finding for an ECC trend
        ("ecc", None, True, True),  # the diagnostic's own finding (a row remap pending) stands
    ],
)
def test_a_throttling_nodes_finding(symptom: str, reason: str | None, confirmed: bool, found: bool) -> None:
    got, why = degraded.finding(symptom, confirmed, "diag", _smi(reason))
    assert got is found
    assert ("Thermal Slowdown active" in why) == (found and not confirmed)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([None, THROTTLE, ECC]),
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
    st.dictionaries(st.sampled_from("bcdefg"), st.one_of(st.none(), st.floats(0, 100, allow_nan=False))),
)
def test_a_move_always_rests_on_the_nodes_own_reading_over_the_line(
    rule: degraded.SymptomRule | None, node_value: float | None, peers: dict[str, float | None]
) -> None:
    """Property (issue 35 (4)): whatever the peers read, no rule or no reading of the node never moves
    a gang, and a move always carries the node's reading over the rule's line as its evidence."""
    v = degraded.compare(rule, POL.gang_wide_share, "a", node_value, peers, 1.0)
    if rule is None or node_value is None or node_value <= rule.threshold:
        assert not v.move and v.evidence is None
    if v.move:
        assert v.evidence is not None and node_value is not None and rule is not None
        assert node_value > rule.threshold and v.evidence.node == "a"
