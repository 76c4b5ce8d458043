"""Localising a hung job (core/localise.py): the culprit among 16 nodes, from the outputs the GPU
stand-ins print (the same tables and texts the real tools print), and once per job per window.

The engine part runs the real classifier on a real-format Monitoring notification (helpers.job_alert).
"""

from __future__ import annotations

import json
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import engine, localise, policy
from pitstop.core.catalog import default_xid_policy
from pitstop.core.classify import Classifier
from pitstop.core.domain import CheckRun, FaultEvent, Incident, LocaliseConfig, NodeDoc, NodeRef
from pitstop.core.envelope import unwrap
from pitstop.core.states import State
from pitstop.local.gpu_tools import all_gather_perf, nvidia_smi
from pitstop.local.gpu_tools.state import NodeState
from tests.helpers import alert_delivery, job_alert

NODES = [f"a3-node-{i:03d}" for i in range(16)]
NODE_XIDS = localise.node_fault_xids(default_xid_policy())
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 16, "match": {"name_pattern": "a3-node-*"}}
T0 = 1_800_000_000.0


def sweep_result(states: dict[str, NodeState], codes: dict[str, int] | None = None) -> CheckRun:
    """What the agent answers for a sweep: each node's nvidia-smi -q and dmesg --raw outputs."""
    outputs: dict[str, str] = {}
    for n in NODES:
        s = states.get(n, NodeState(n))
        outputs[localise.output_key("nvidia_smi_q", n)] = nvidia_smi.query(s)
        outputs[localise.output_key("dmesg", n)] = "<6>[    1.000000] Linux version 6.8.0\n"
    for key in codes or {}:
        outputs[key] = ""
    return {"done": True, "outputs": outputs, "exit_codes": codes or {}}


def links_result(busbw: dict[str, float]) -> CheckRun:
    """What the agent answers for the ring's NCCL tests: each pair at its slower node's busbw."""
    outputs: dict[str, str] = {}
    for a, b in localise.ring_pairs(NODES):
        ring = min(busbw.get(a, 190.0), busbw.get(b, 190.0))
        text = all_gather_perf.table(NodeState(a, busbw=ring), 32 << 20, 256 << 20, 2, [a, b])
        outputs[localise.output_key("nccl", localise.pair_name((a, b)))] = text
    return {"done": True, "outputs": outputs}


def test_a_stuck_gpu_on_one_of_16_nodes_is_the_culprit() -> None:
    bad = NODES[11]
    v = localise.judge_sweep(NODES, sweep_result({bad: NodeState(bad, hung=True)}), 25, NODE_XIDS)
    assert v.culprits == (bad,)
    assert list(v.findings) == [bad] and "7 of 8 GPUs visible" in v.findings[bad][0]


def test_a_node_whose_nvidia_smi_does_not_answer_is_the_culprit() -> None:
    bad = NODES[3]
    key = localise.output_key("nvidia_smi_q", bad)
    v = localise.judge_sweep(NODES, sweep_result({}, {key: localise.TIMED_OUT}), 25, NODE_XIDS)
    assert v.culprits == (bad,) and "did not answer in time" in v.findings[bad][0]


def test_a_kernel_xid_of_a_node_fault_names_its_node_but_an_application_xid_does_not() -> None:
    res = sweep_result({})
    res["outputs"][localise.output_key("dmesg", NODES[7])] += (
        "<4>[ 99.000000] NVRM: Xid (PCI:0000:04:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"
    )
    for n in NODES:  # Xid 13 on every node: the job's own fault, printed everywhere
        res["outputs"][localise.output_key("dmesg", n)] += (
            "<4>[ 98.0] NVRM: Xid (PCI:0000:04:00): 13, Graphics\n"
        )
    v = localise.judge_sweep(NODES, res, 25, NODE_XIDS)
    assert v.culprits == (NODES[7],) and "Xid 79" in v.findings[NODES[7]][0]


def _node_status(boot: str, reason: str | None, message: str) -> str:
    """The Node's status as the GKE adapter reads it: bootID and the device plugin's condition
    (GoogleCloudPlatform/container-engine-accelerators health_checker.go: reason a JSON map of the
    Xids, message the bootID it was seen on)."""
    conds = [] if reason is None else [{"type": "XidCriticalError", "status": "True", "reason": reason,
                                        "message": message}]  # fmt: skip
    return json.dumps({"status": {"nodeInfo": {"bootID": boot}, "conditions": conds}})


def test_on_gke_a_node_fault_xid_in_the_nodes_condition_of_this_boot_names_its_node() -> None:
    """GKE's sweep pods cannot read /dev/kmsg: the kernel's Xid comes from the Node's condition."""
    bad, old, app = NODES[5], NODES[6], NODES[7]
    result = sweep_result({})
    out = result["outputs"]
    out[localise.output_key(localise.NODE_CONDITION, bad)] = _node_status("b-2", '{"79":true}', "b-2")
    out[localise.output_key(localise.NODE_CONDITION, old)] = _node_status("b-3", '{"79":true}', "b-1")
    out[localise.output_key(localise.NODE_CONDITION, app)] = _node_status("b-4", '{"13":true}', "b-4")
    out[localise.output_key(localise.NODE_CONDITION, NODES[8])] = "{not json"
    v = localise.judge_sweep(NODES, result, 25, NODE_XIDS)
    assert v.culprits == (bad,) and "Xid 79" in v.findings[bad][0]  # an earlier boot's or an app's: no


def test_findings_on_many_nodes_are_systemic_and_nothing_is_fenced() -> None:
    sick = {n: NodeState(n, hung=True) for n in NODES[:6]}
    v = localise.judge_sweep(NODES, sweep_result(sick), 25, NODE_XIDS)
    assert v.culprits == () and v.suspects == tuple(NODES[:6]) and "not one node's fault" in v.why


def test_a_clean_sweep_finds_nothing_and_an_unfinished_one_is_no_evidence() -> None:
    assert localise.judge_sweep(NODES, sweep_result({}), 25, NODE_XIDS).culprits == ()
    v = localise.judge_sweep(NODES, {"done": False, "error": "agent gone"}, 25, NODE_XIDS)
    assert v.culprits == () and "did not finish" in v.why


def test_the_ring_test_is_n_pairs_and_finds_the_slow_link_among_16() -> None:
    pairs = localise.ring_pairs(NODES)
    assert len(pairs) == 16 and {n for p in pairs for n in p} == set(NODES)
    assert localise.ring_pairs(NODES[:2]) == [(NODES[0], NODES[1])] and localise.ring_pairs(NODES[:1]) == []
    bad = NODES[5]
    v = localise.judge_links(pairs, links_result({bad: 38.0}), 0.7, 25)
    assert v.culprits == (bad,)
    assert v.measured[localise.pair_name((NODES[4], bad))] == pytest.approx(38.0)
    assert v.measured[localise.pair_name((NODES[8], NODES[9]))] == pytest.approx(190.0)


def test_a_lone_slow_pair_names_both_ends_but_fences_neither() -> None:
    two = NODES[:2]
    v = localise.judge_links(localise.ring_pairs(two), {"done": True, "outputs": {}}, 0.7, 25)
    assert v.culprits == () and "no pair returned" in v.why
    pairs = localise.ring_pairs(NODES)
    res = links_result({})
    res["outputs"][localise.output_key("nccl", localise.pair_name(pairs[3]))] = ""  # that pair never finished
    v = localise.judge_links(pairs, res, 0.7, 25)
    assert v.culprits == () and v.suspects == tuple(sorted(pairs[3])) and "either end" in v.why


def test_a_slow_fabric_is_not_one_node() -> None:
    v = localise.judge_links(
        localise.ring_pairs(NODES), links_result(dict.fromkeys(NODES[::3], 40.0)), 0.7, 25
    )
    assert v.culprits == () and "fabric" in v.why


def test_the_page_lists_every_node_and_check() -> None:
    sweep = localise.judge_sweep(NODES, sweep_result({}), 25, NODE_XIDS).record(T0)
    links = localise.judge_links(localise.ring_pairs(NODES), links_result({}), 0.7, 25).record(T0)
    text = localise.page_text("4242", NODES, [sweep, links], "requeued in place (run 0)")
    assert all(n in text for n in NODES)
    assert "dmesg --raw and nvidia-smi -q on 16 nodes" in text and "16 ring-neighbour pairs" in text


def _hang(incident: str, message: str, at: float) -> FaultEvent:
    delivery = unwrap(alert_delivery(job_alert("open", incident, int(at) - 120, None), message_id=message))
    ev = Classifier.default().from_delivery(delivery, alert_delivery({})["source"])
    assert ev["kind"] == "hang"
    return ev


def test_one_localisation_per_job_per_window() -> None:
    pol = policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]})
    window = pol.window("hang_localise_s")
    first = engine.apply_event(_hang("0.a", "1", T0), None, None, {}, pol, T0, "1")
    assert first.incident is not None and first.node is not None
    assert first.incident["localise"]["run"] is True and first.node["localised_at"] == T0
    # the first episode ended (its culprit fenced, the gang restarted)
    ended = cast(Incident, dict(first.incident, state=State.RESOLVED, timeline={"resolved": T0 + 60}))
    later = T0 + window / 2
    second = engine.apply_event(_hang("0.b", "2", later), first.node, ended, {}, pol, later, "2")
    assert second.result == "opened" and second.incident is not None
    assert second.incident["localise"]["run"] is False and "not again" in second.incident["localise"]["why"]
    assert second.page is not None and "not again" in second.page  # a person decides
    assert second.node is not None and second.node["localised_at"] == T0
    after = T0 + window + 1
    third = engine.apply_event(
        _hang("0.c", "3", after),
        second.node,
        cast(Incident, dict(second.incident, state=State.RESOLVED)),
        {},
        pol,
        after,
        "3",
    )
    assert third.incident is not None and third.incident["localise"]["run"] is True


def test_a_culprit_is_handed_to_one_node_incident_however_often_the_conclusion_is_retried() -> None:
    from pitstop.adapters.memory_store import MemoryStore

    pol = policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]})
    hang = engine.apply_event(_hang("0.a", "1", T0), None, None, {}, pol, T0, "1").incident
    assert hang is not None
    node: NodeRef = {"project": "p", "zone": "us-central1-a", "instance": NODES[5], "instance_id": "42"}
    ev = localise.culprit_event(hang, node, "REBOOT_NODE", "both ring links slow", 1)
    assert (ev["kind"], ev["source"]["trust"], ev["node"]) == ("localised", "verified", node)
    store = MemoryStore()
    first = store.apply(ev, pol, T0 + 10)
    again = store.apply(
        localise.culprit_event(hang, node, "REBOOT_NODE", "both ring links slow", 1), pol, T0 + 20
    )
    assert first.result == "opened" and first.incident is not None and first.start_step == 1
    assert first.incident["action"] == "REBOOT_NODE" and first.incident["trust"] == "verified"
    assert again.result == "duplicate" and again.duplicate_of == first.incident["id"]


def test_localisation_switched_off_only_notifies_and_an_unchecked_job_says_why() -> None:
    off = localise.plan(cast(NodeDoc, {}), cast(LocaliseConfig, {"enabled": False}), 3600, T0)
    assert (off.run, off.page) == (False, False) and "localise.enabled is false" in off.why
    again = localise.plan(
        cast(NodeDoc, {"localised_at": T0 - 10}), cast(LocaliseConfig, {"enabled": True}), 3600, T0
    )
    assert (again.run, again.page) == (False, True)
    text = localise.page_text(
        "4242", [], [], "requeued in place (run 0)", "the gke scheduler cannot check a job's nodes"
    )
    assert "could not be checked (the gke scheduler cannot check a job's nodes)" in text


# -- issue 35 (2): only a job that opted in, whose own series was established, is acted on ----------

CFG = policy.from_doc({}).localise  # heartbeat_min_points 10, heartbeat_min_span_s 600


@pytest.mark.parametrize(
    ("comment", "opted"),
    [
        ("pitstop:heartbeat", True),
        ("team=ml, pitstop:heartbeat", True),
        ("run 7 pitstop:heartbeat", True),
        ("", False),
        (None, False),
        ("pitstop:heartbeats", False),  # a word, not a prefix
        ("no-pitstop:heartbeat", False),
        ("x" * 2000 + " pitstop:heartbeat", False),  # past what is read: Slurm keeps comments short anyway
    ],
)
def test_a_slurm_job_opts_in_by_its_comment(comment: str | None, opted: bool) -> None:
    assert localise.opted_in_comment(comment) is opted


@pytest.mark.parametrize(
    ("opted_in", "points", "go", "words"),
    [
        (True, [T0 - 1200 + 30 * i for i in range(40)], True, "40 points over 1170 s"),
        (False, [T0 - 1200 + 30 * i for i in range(40)], False, "did not opt in"),
        (True, None, False, "could not be read back"),
        (True, [T0 - 200], False, "holds 1 points"),  # one forged point, then silence
        (True, [T0 - 400 + 30 * i for i in range(12)], False, "over 330 s"),  # too short a span
        (True, [T0 - 3000, T0 - 60], False, "holds 2 points"),  # two points far apart
        (True, [T0 + 1 + 30 * i for i in range(40)], False, "holds 0 points"),  # after the alert opened
    ],
)
def test_the_heartbeat_gate(opted_in: bool, points: list[float] | None, go: bool, words: str) -> None:
    gate = localise.heartbeat_gate("4242", opted_in, points, CFG, T0)
    assert gate.go is go and words in gate.why, gate.why
    assert go or "restarts nothing; a person is paged" in gate.why


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(T0 - 7200, T0 + 7200, allow_nan=False), max_size=60), st.booleans())
def test_the_gate_opens_only_on_an_established_series_before_the_alert(
    points: list[float], opted: bool
) -> None:
    """Property: whatever points anyone wrote, the gate opens only for a job that opted in and whose
    points before the alert number heartbeat_min_points over heartbeat_min_span_s."""
    before = sorted(p for p in points if p <= T0)
    established = len(before) >= CFG["heartbeat_min_points"] and (
        bool(before) and before[-1] - before[0] >= CFG["heartbeat_min_span_s"]
    )
    assert localise.heartbeat_gate("j", opted, points, CFG, T0).go is (opted and established)


def test_a_culprit_carries_what_its_own_tools_showed_as_evidence() -> None:
    v = localise.judge_sweep(NODES, sweep_result({NODES[3]: NodeState(NODES[3], hung=True)}), 25.0, NODE_XIDS)
    assert v.culprits == (NODES[3],)
    (ev,) = v.evidence
    assert (ev.probe, ev.node, ev.symptom) == ("sweep", NODES[3], "hang") and ev.what == v.findings[NODES[3]][
        0
    ]
    assert v.record(T0)["evidence"][0]["node"] == NODES[3]
    clean = localise.judge_sweep(NODES, sweep_result({}), 25.0, NODE_XIDS)
    assert clean.evidence == () and "evidence" not in clean.record(T0)
