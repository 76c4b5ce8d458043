"""The incident engine's rules, on plain documents (no database)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from pitstop.core import engine, policy
from pitstop.core.classify import Classifier
from pitstop.core.domain import (
    Budget,
    Draft,
    FaultEvent,
    Incident,
    NodeDoc,
    NodeRef,
    Remediation,
    Source,
    WorkflowRun,
)
from pitstop.core.states import State
from tests.helpers import load_fixture, ops_agent_entry, system_event_entry

CLF = Classifier.default()
T0 = 1_800_000_000.0
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected in the FB"
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
XID63 = "NVRM: Xid (PCI:0000:1b:00): 63, Row Remapper: New row marked for remapping, reset gpu to activate"


def pol(**over: Any) -> policy.Policy:
    doc: dict[str, Any] = {"mode": "enforce", "clusters": [CLUSTER]}
    doc.update(over)
    return policy.from_doc(doc)


def ev(line: str, node: str = "a3-node-001", ts: float = T0, iid: str | None = None) -> FaultEvent:
    e = CLF.classify(ops_agent_entry(line, instance=node, insert_id=iid or f"{node}-{line[:30]}-{ts}"))
    e["_observed_ts"] = ts
    return e


def held_of(inc: Any) -> Any:
    """What holds an incident (it must be held)."""
    assert inc is not None and inc["held"] is not None, inc
    return inc["held"]


class World:
    """Documents as the store would hold them, updated from each outcome."""

    def __init__(self, p: policy.Policy) -> None:
        self.p = p
        self.nodes: dict[str, NodeDoc] = {}
        self.incidents: dict[str, Draft] = {}
        self.budgets: dict[str, Budget] = {}

    def feed(self, e: FaultEvent, now: float | None = None) -> engine.Outcome:
        now = e["_observed_ts"] if now is None else now
        key = engine.node_key(cast(NodeRef, e["node"]))
        node = self.nodes.get(key)
        latest_id = node.get("latest_incident") if node else None
        latest = self.incidents.get(latest_id) if latest_id else None
        out = engine.apply_event(e, node, latest, self.budgets, self.p, now, engine.event_key(e))
        self.save(out)
        return out

    def save(self, out: engine.Outcome) -> None:
        for inc in (out.closed, out.incident):
            if inc is not None:
                self.incidents[inc["id"]] = engine.as_incident(inc)
        if out.node is not None and out.result != "ignored":
            self.nodes[engine.node_key(cast(NodeRef, out.node["node"]))] = out.node
        self.budgets.update(out.budgets)

    def resolve(self, iid: str, at: float) -> None:
        inc = self.incidents[iid]
        inc["state"] = State.RESOLVED
        inc["timeline"]["resolved"] = at
        self.budgets.update(engine.release_slots(self.budgets, iid))


def test_node_fault_opens_incident_and_starts_once() -> None:
    w = World(pol())
    out = w.feed(ev(XID79))
    assert out.result == "opened"
    assert out.start_step == 1
    inc = out.incident
    assert inc is not None
    assert inc["state"] == "OPEN" and inc["action"] == "REBOOT_NODE"
    assert inc["cluster"] == "train" and inc["scheduler"] == "slurm"
    assert inc["budget_scopes"] == ["cluster-train", "zone-us-central1-a"]
    assert inc["timeline"]["detected"] == T0
    assert len(inc["id"]) == 10
    again = w.feed(ev(XID79, ts=T0 + 1))
    assert again.result == "absorbed" and again.start_step is None
    assert w.incidents[inc["id"]]["counts"] == {"events": 2, "xid_79": 2}


def test_observe_mode_decides_but_starts_nothing() -> None:
    w = World(pol(mode="observe"))
    out = w.feed(ev(XID79))
    assert out.result == "opened" and out.start_step is None
    assert out.incident is not None
    assert out.incident["workflow"] == {"step": 1, "state": "observe", "would_start": True, "execution": None}


def test_raise_never_lower() -> None:
    w = World(pol())
    first = w.feed(ev(XID48))
    assert first.incident is not None and first.incident["action"] == "RESET_GPU"
    raised = w.feed(ev(XID79, ts=T0 + 5))
    assert raised.result == "raised" and raised.start_step == 2
    inc = w.incidents[first.incident["id"]]
    assert inc["action"] == "REBOOT_NODE"
    assert inc["escalations"][0]["from"] == "RESET_GPU"
    lower = w.feed(ev(XID48, ts=T0 + 6))
    assert lower.result == "absorbed"
    assert w.incidents[first.incident["id"]]["action"] == "REBOOT_NODE"


def test_raise_during_remediation_is_recorded_not_started() -> None:
    w = World(pol())
    first = w.feed(ev(XID48))
    assert first.incident is not None
    w.incidents[first.incident["id"]]["state"] = State.ACTING
    out = w.feed(ev(XID79, ts=T0 + 5))
    assert out.result == "raised" and out.start_step is None
    assert w.incidents[first.incident["id"]]["escalate_to"] == "REBOOT_NODE"


def test_none_without_episode_is_ignored() -> None:
    w = World(pol())
    out = w.feed(ev(XID63))
    assert out.result == "ignored"
    assert w.incidents == {}


def test_record_only_burst_ends_after_silence() -> None:
    w = World(pol())
    first = w.feed(ev(XID13))
    assert first.result == "opened" and first.incident is not None
    assert first.incident["action"] == "RESTART_JOB"
    w.resolve(first.incident["id"], T0 + 10)  # the workflow notified the job owner and closed it
    for i in range(1, 50):
        assert w.feed(ev(XID13, ts=T0 + i * 2)).result == "absorbed"
    # 3 minutes of silence end the burst; the next line is a new episode
    later = w.feed(ev(XID13, ts=T0 + 98 + 181))
    assert later.result == "opened" and later.start_step == 1
    assert later.incident is not None and later.incident["id"] != first.incident["id"]


ROOMY = {"cluster": {"max_nodes": 4, "max_percent": 50}}


def test_observe_mode_episode_closes_when_burst_ends() -> None:
    w = World(pol(mode="observe", budgets=ROOMY))
    first = w.feed(ev(XID79))
    assert first.incident is not None
    assert w.feed(ev(XID79, ts=T0 + 100)).result == "absorbed"
    later = w.feed(ev(XID79, ts=T0 + 100 + 181))
    assert later.result == "opened"
    assert later.closed is not None and later.closed["id"] == first.incident["id"]
    assert later.closed["state"] == "RESOLVED"


def test_ladder_steps_up_after_recent_remediation() -> None:
    w = World(pol())
    first = w.feed(ev(XID48))
    assert first.incident is not None
    w.resolve(first.incident["id"], T0 + 600)
    again = w.feed(ev(XID48, ts=T0 + 3600))
    assert again.result == "opened" and again.incident is not None
    assert again.incident["action"] == "REBOOT_NODE"
    assert "after RESET_GPU" in again.incident["reason"]


def test_ladder_forgets_after_window() -> None:
    w = World(pol())
    first = w.feed(ev(XID48))
    assert first.incident is not None
    w.resolve(first.incident["id"], T0 + 600)
    again = w.feed(ev(XID48, ts=T0 + 25 * 3600))
    assert again.incident is not None and again.incident["action"] == "RESET_GPU"


def test_lemon_host_is_replaced() -> None:
    w = World(pol())
    key = "train-prod.us-central1-a.a3-node-001"
    w.nodes[key] = engine.new_node(ev(XID48)["node"])
    w.nodes[key]["remediations"] = cast(  # records of an older shape: no ``mode``
        list[Remediation],
        [{"at": T0 - d * 86400, "action": "RESET_GPU", "incident": f"old{d}"} for d in (1.5, 3, 6)],
    )
    out = w.feed(ev(XID48))
    assert out.incident is not None and out.incident["action"] == "REPLACE_NODE"
    assert "lemon host: 3 remediations" in out.incident["reason"]


def test_late_lines_are_absorbed_but_new_fault_after_resolution_is_not() -> None:
    w = World(pol(budgets=ROOMY))
    first = w.feed(ev(XID79))
    assert first.incident is not None
    w.resolve(first.incident["id"], T0 + 300)
    late = w.feed(ev(XID79, ts=T0 + 200), now=T0 + 400)
    assert late.result == "absorbed"
    fresh = w.feed(ev(XID79, ts=T0 + 900))
    assert fresh.result == "opened"
    assert (
        fresh.incident is not None and fresh.incident["action"] == "REPLACE_NODE"
    )  # the reboot did not help


def test_cooldown_holds_repeat_and_pages() -> None:
    w = World(pol(ladder={"window_h": 24, "steps": ["REPLACE_NODE"]}))
    first = w.feed(ev(XID79))
    assert first.incident is not None
    assert first.incident["action"] == "REBOOT_NODE"
    w.resolve(first.incident["id"], T0 + 60)
    again = w.feed(ev(XID79, ts=T0 + 600))
    assert again.result == "held" and again.incident is not None
    assert "cooldown" in held_of(again.incident)["reason"]
    assert again.page is not None


def test_job_action_in_cooldown_is_suppressed_quietly() -> None:
    w = World(pol())
    case = next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted")
    entry = system_event_entry(case)
    entry["protoPayload"]["resourceName"] = "projects/train-prod/zones/us-central1-a/instances/a3-node-002"
    entry["resource"]["labels"].update({"zone": "us-central1-a", "project_id": "train-prod"})
    entry["logName"] = "projects/train-prod/logs/cloudaudit.googleapis.com%2Fsystem_event"  # the VM's project
    e1 = CLF.classify(entry)
    e1["_observed_ts"] = T0
    first = w.feed(e1)
    assert first.incident is not None and first.incident["action"] == "RESCHEDULE_JOB"
    w.resolve(first.incident["id"], T0 + 30)
    entry["insertId"] = "another"
    entry["protoPayload"]["methodName"] = "compute.instances.automaticRestart"
    e2 = CLF.classify(entry)
    e2["_observed_ts"] = T0 + 60
    out = w.feed(e2)
    assert out.result == "suppressed" and out.page is None and out.start_step is None


def test_blast_radius_holds_and_pages_once_then_closes_itself() -> None:
    w = World(pol())  # cluster of 8 at 10 % -> 1 node per 30 minutes
    outs = [w.feed(ev(XID79, node=f"a3-node-00{i}", ts=T0 + i)) for i in range(1, 6)]
    assert [o.result for o in outs] == ["opened", "held", "held", "held", "held"]
    assert [o.page is not None for o in outs] == [False, True, False, False, False]
    assert sum(o.start_step is not None for o in outs) == 1
    held = outs[1].incident
    assert held is not None and held_of(held)["scope"] == "cluster-train"
    # the first finishes; its slot still counts until the window slides past it
    assert outs[0].incident is not None
    w.resolve(outs[0].incident["id"], T0 + 600)
    retry = engine.release_held(held, w.nodes[held["node_key"]], w.budgets, w.p, T0 + 900, "sweep", False)
    assert retry.result == "still_held" and "holds" not in (retry.incident or {})
    retry = engine.release_held(held, w.nodes[held["node_key"]], w.budgets, w.p, T0 + 1801, "sweep", False)
    assert retry.result == "released" and retry.start_step == 1
    assert retry.incident is not None  # the hold is remembered: what, since, until, who let go
    (hold,) = retry.incident["holds"]
    assert hold["scope"] == "cluster-train" and hold["since"] == T0 + 2 and hold["until"] == T0 + 1801
    assert hold["by"] == "sweep"


def test_operator_release_bypasses_budget() -> None:
    w = World(pol())
    w.feed(ev(XID79, node="a3-node-001"))
    held = w.feed(ev(XID79, node="a3-node-002", ts=T0 + 1)).incident
    assert held is not None and held["state"] == "HELD"
    out = engine.release_held(held, w.nodes[held["node_key"]], w.budgets, w.p, T0 + 2, "alice", True)
    assert out.result == "released" and out.start_step == 1
    assert out.incident is not None and out.incident["escalations"][-1]["why"] == ["released by alice"]


def test_disabled_action_is_held_for_a_human() -> None:
    w = World(pol(enabled_actions=["RESET_GPU", "RESTART_JOB"]))
    out = w.feed(ev(XID79))
    assert out.result == "held" and out.page is not None
    assert out.incident is not None and "not enabled" in held_of(out.incident)["reason"]


@pytest.mark.parametrize(
    ("size", "pct", "cap"), [(8, 10, 1), (8, 25, 2), (100, 10, 4), (None, 10, 4), (3, 1, 1)]
)
def test_budget_cap(size: int | None, pct: float, cap: int) -> None:
    p = pol(budgets={"cluster": {"max_nodes": 4, "max_percent": pct}})
    assert p.budget_cap("cluster", size) == cap


def test_secondary_45_tied_to_primary_on_same_gpu() -> None:
    w = World(pol())
    primary = "NVRM: Xid (PCI:0000:ed:00): 119, pid=1, name=x, Timeout waiting for RPC from GSP!"
    secondary = "NVRM: Xid (PCI:0000:ed:00): 45, pid=1, name=python3, Ch 0000000c caused by previous Xid 119"
    first = w.feed(ev(primary))
    assert first.incident is not None
    w.feed(ev(secondary, ts=T0 + 3))
    gpu = w.incidents[first.incident["id"]]["gpus"]["0000_ed_00"]
    assert gpu["xids"] == {"119": 1, "45": 1}
    assert gpu["secondary"] == {"45": 119}


def test_incident_ids_are_deterministic_and_short() -> None:
    a = engine.incident_id("p.z.n", "trigger-1")
    assert a == engine.incident_id("p.z.n", "trigger-1")
    assert a != engine.incident_id("p.z.n", "trigger-2")
    assert len(a) == 10 and a.isalnum()


def test_stronger_line_of_the_same_burst_reopens_a_record_only_incident() -> None:
    w = World(pol())
    xid94 = "NVRM: Xid (PCI:0000:1b:00): 94, Contained: SM (0x1). RST: No, D-RST: No"
    first = w.feed(ev(xid94, ts=T0 + 2))
    assert first.incident is not None and first.incident["action"] == "RESTART_JOB"
    w.resolve(first.incident["id"], T0 + 5)  # its notify-only workflow finished
    late = w.feed(ev(XID48, ts=T0 + 1), now=T0 + 6)  # logged first, delivered last
    assert late.result == "raised" and late.start_step == 2
    inc = w.incidents[first.incident["id"]]
    assert inc["state"] == "OPEN" and inc["action"] == "RESET_GPU" and "resolved" not in inc["timeline"]
    assert len(w.incidents) == 1


def test_reservation_block_budget_applies_once_the_block_is_known() -> None:
    w = World(
        pol(
            budgets={
                "cluster": {"max_nodes": 8, "max_percent": 100},
                "block": {"max_nodes": 2, "max_percent": 25},
            }
        )
    )
    for i in range(1, 4):
        e = ev(XID79, node=f"a3-node-00{i}")
        ref = cast(NodeRef, e["node"])
        w.nodes[engine.node_key(ref)] = {**engine.new_node(ref), "block": "c1/block-7"}
    outs = [w.feed(ev(XID79, node=f"a3-node-00{i}", ts=T0 + i)) for i in range(1, 4)]
    assert [o.result for o in outs] == ["opened", "opened", "held"]
    held = outs[2].incident
    assert held is not None and held_of(held)["scope"].startswith("block-")
    assert outs[0].incident is not None and any(
        s.startswith("block-") for s in outs[0].incident["budget_scopes"]
    )


def _worsening(w: World, node: str = "a3-node-001", ts: float = T0) -> str:
    """An incident whose first step (RESET_GPU) is being verified when a fault asks for a reboot."""
    first = w.feed(ev(XID48, node=node, ts=ts))
    assert first.incident is not None and first.start_step == 1
    iid = str(first.incident["id"])
    w.incidents[iid]["state"] = State.VERIFYING
    assert w.feed(ev(XID79, node=node, ts=ts + 5)).result == "raised"
    assert w.incidents[iid]["escalate_to"] == "REBOOT_NODE"
    return iid


def _step_up(w: World, iid: str, now: float) -> engine.Outcome:
    inc = w.incidents[iid]
    out = engine.step_up(inc, w.nodes[inc["node_key"]], w.budgets, w.p, now)
    w.save(out)
    return out


def test_step_up_decides_like_a_raise_from_an_event() -> None:
    # the same stronger fault, once while the incident is still OPEN (ingest raises it) and once
    # while its workflow works on the node (actuate's close steps up): the same next step
    by_event = World(pol())
    first = by_event.feed(ev(XID48))
    assert first.incident is not None
    raised = by_event.feed(ev(XID79, ts=T0 + 5), now=T0 + 60)
    by_close = World(pol())
    iid = _worsening(by_close)
    stepped = _step_up(by_close, iid, T0 + 60)
    assert stepped.result == raised.result == "raised"
    assert stepped.start_step == raised.start_step == 2
    a, b = cast(Mapping[str, Any], by_event.incidents[first.incident["id"]]), by_close.incidents[iid]
    fields = ("state", "action", "step", "workflow", "budget_scopes", "held")
    assert {k: a[k] for k in fields} == {k: cast(Mapping[str, Any], b)[k] for k in fields}
    assert b["state"] == "OPEN" and b["escalate_to"] is None
    assert b["escalations"][-1]["why"] == ["a stronger fault arrived during remediation"]
    node = by_close.nodes[b["node_key"]]
    assert [r["action"] for r in node["remediations"]] == ["RESET_GPU", "REBOOT_NODE"]
    assert node["last_action_at"]["REBOOT_NODE"] == T0 + 60


def test_step_up_in_observe_mode_starts_nothing() -> None:
    w = World(pol())
    iid = _worsening(w)
    w.p = pol(mode="observe")  # the operator switched to observe while the first step ran
    out = _step_up(w, iid, T0 + 60)
    assert out.result == "raised" and out.start_step is None
    assert out.incident is not None
    assert out.incident["workflow"] == {"step": 2, "state": "observe", "would_start": True, "execution": None}


def test_step_up_past_a_budget_is_held_and_pages() -> None:
    w = World(pol(budgets={"cluster": {"max_nodes": 8, "max_percent": 100}, "block": {"max_nodes": 1}}))
    iid = _worsening(w, node="a3-node-001")
    # acting on the first node taught Pitstop its reservation block; another node of the
    # block has taken the block's only slot since
    key = w.incidents[iid]["node_key"]
    w.nodes[key]["block"] = "c1/block-7"
    other = ev(XID79, node="a3-node-002", ts=T0 + 10)
    ref = cast(NodeRef, other["node"])
    w.nodes[engine.node_key(ref)] = {**engine.new_node(ref), "block": "c1/block-7"}
    assert w.feed(other).result == "opened"
    out = _step_up(w, iid, T0 + 60)
    assert out.result == "held" and out.start_step is None
    assert out.page is not None and "block-" in out.page
    inc = w.incidents[iid]
    assert inc["state"] == "HELD" and held_of(inc)["scope"].startswith("block-")
    assert inc["action"] == "REBOOT_NODE" and inc["step"] == 1
    assert [r["action"] for r in w.nodes[key]["remediations"]] == ["RESET_GPU"]


def test_a_hold_writes_its_budget_only_when_it_pages() -> None:
    """A full budget holds every new node action; the first hold of a window pages and writes the
    budget's ``paged_until`` (its write is conditioned, so one page per window), the next holds
    write no budget: a storm's holds, decided at once by many instances, would otherwise all
    contend on the one budget document."""
    w = World(pol(budgets={"cluster": {"max_nodes": 1, "max_percent": 100}}))
    assert w.feed(ev(XID79, node="a3-node-001")).result == "opened"
    first = w.feed(ev(XID79, node="a3-node-002", ts=T0 + 1))
    assert first.result == "held" and first.page is not None
    assert first.budgets["cluster-train"]["paged_until"] > T0 + 1
    second = w.feed(ev(XID79, node="a3-node-003", ts=T0 + 2))
    assert second.result == "held" and second.page is None
    assert second.budgets == {}
    assert held_of(second.incident)["scope"] == "cluster-train"


def test_step_up_to_a_disabled_action_is_held_for_a_human() -> None:
    w = World(pol())
    iid = _worsening(w)
    w.p = pol(enabled_actions=["RESET_GPU", "RESTART_JOB"])
    out = _step_up(w, iid, T0 + 60)
    assert out.result == "held" and out.page is not None and out.start_step is None
    assert out.incident is not None and "not enabled" in held_of(out.incident)["reason"]


def test_step_up_without_a_stronger_action_changes_nothing() -> None:
    w = World(pol())
    first = w.feed(ev(XID79))
    assert first.incident is not None
    inc = w.incidents[first.incident["id"]]
    out = engine.step_up(inc, w.nodes[inc["node_key"]], w.budgets, w.p, T0 + 60)
    assert out.result == "ignored" and out.start_step is None and out.node is None


# -- how incidents end: FAILED, closed by a person, failed by the watchdog ----------------------


def _started(w: World, node: str = "a3-node-001", ts: float = T0, line: str = XID79) -> str:
    """An incident whose step 1 execution was started (and claimed) for ``node``."""
    out = w.feed(ev(line, node=node, ts=ts))
    assert out.incident is not None and out.start_step == 1
    iid = str(out.incident["id"])
    name = f"projects/p/locations/l/workflows/w/executions/ex-{iid}"
    cast(WorkflowRun, w.incidents[iid]["workflow"]).update(
        {"state": "started", "execution": name, "started_at": ts, "claimed_by": f"ex-{iid}"}
    )
    return iid


def _failed(w: World, iid: str, at: float) -> engine.Outcome:
    inc = w.incidents[iid]
    name = engine.watched_execution(inc)
    assert name is not None
    out = engine.fail_stuck(inc, w.nodes[inc["node_key"]], w.budgets, name, "ended SUCCEEDED", at)
    w.save(out)
    return out


def test_failed_incident_counts_new_faults_without_acting() -> None:
    w = World(pol())
    iid = _started(w, line=XID48)
    w.incidents[iid]["state"] = State.ACTING
    assert _failed(w, iid, T0 + 60).result == "failed"
    for i, line in enumerate((XID48, XID79, XID79)):
        out = w.feed(ev(line, ts=T0 + 100 + i))
        assert out.result == "absorbed" and out.start_step is None and out.page is None
        assert out.incident is not None and out.incident["id"] == iid
    inc = w.incidents[iid]
    assert inc["state"] == "FAILED" and inc["action"] == "RESET_GPU" and inc["step"] == 1
    assert inc["counts"]["events"] == 4 and inc["proposed_action"] == "REBOOT_NODE"
    # nor does a step-up revive it (an overrunning execution's close after the watchdog failed it)
    inc["escalate_to"] = "REBOOT_NODE"
    assert _step_up(w, iid, T0 + 200).result == "ignored"
    assert w.incidents[iid]["state"] == "FAILED"


def test_watchdog_failure_pages_and_the_fenced_node_keeps_its_budget_slot() -> None:
    """Issue 21 (11): the failed incident's node stays fenced, so its slot counts past the window;
    it used to expire with it, and each failure let one more node be fenced."""
    w = World(pol())  # cluster of 8 at 10 %: one node per 30-minute window
    iid = _started(w)
    w.incidents[iid]["state"] = State.FENCED
    out = _failed(w, iid, T0 + 120)
    assert out.incident is not None and out.incident["failure"]["stage"] == "watchdog"
    assert out.page is not None and "stays fenced" in out.page and f"--close {iid}" in out.page
    assert all(s["slots"][iid]["active"] for s in w.budgets.values())
    other = w.feed(ev(XID79, node="a3-node-002", ts=T0 + 1801))  # the window slid past its claim
    assert other.result == "held" and other.start_step is None


def test_watchdog_leaves_an_incident_its_execution_moved_on() -> None:
    w = World(pol())
    iid = _started(w)
    inc = w.incidents[iid]
    name = engine.watched_execution(inc)
    assert name is not None and name.endswith(f"/ex-{iid}")
    node = w.nodes[inc["node_key"]]
    for state in ("RESOLVED", "FAILED", "HELD"):
        gone: Incident = {**inc, "state": State(state)}
        assert engine.fail_stuck(gone, node, w.budgets, name, "x", T0 + 60).result == "ignored"
    next_step: Incident = {**inc, "workflow": {"step": 2, "state": "started", "execution": name + "-2"}}
    assert engine.fail_stuck(next_step, node, w.budgets, name, "x", T0 + 60).result == "ignored"
    # another execution of the step claimed it: that one is watched
    other: Incident = {**inc, "workflow": {**cast(WorkflowRun, inc["workflow"]), "claimed_by": "ex-other"}}
    assert engine.watched_execution(other) == name.rsplit("/", 1)[0] + "/ex-other"


def test_a_person_closes_a_failed_incident_and_a_later_fault_opens_a_new_one() -> None:
    w = World(pol())
    iid = _started(w)
    w.incidents[iid]["state"] = State.VERIFYING
    _failed(w, iid, T0 + 60)
    inc = w.incidents[iid]
    out = engine.close_by_person(inc, w.nodes[inc["node_key"]], w.budgets, "alice", T0 + 600, True)
    w.save(out)
    assert out.result == "closed" and out.start_step is None
    closed = w.incidents[iid]
    assert closed["state"] == "RESOLVED" and closed["timeline"]["closed"] == T0 + 600
    assert closed["closure"] == {"by": "alice", "at": T0 + 600, "from_state": "FAILED", "unfence": True}
    assert "resolved" not in closed["timeline"]  # MTTR is not a person's close
    late = w.feed(ev(XID79, ts=T0 + 300))  # logged before the close: a late line of the episode
    assert late.result == "absorbed" and w.incidents[iid]["state"] == "RESOLVED"
    fresh = w.feed(ev(XID79, ts=T0 + 2000))
    assert fresh.result == "opened" and fresh.incident is not None and fresh.incident["id"] != iid


def test_close_by_person_takes_open_held_and_failed_but_not_a_running_step() -> None:
    w = World(pol())
    w.feed(ev(XID79, node="a3-node-001"))
    held = w.feed(ev(XID79, node="a3-node-002", ts=T0 + 1)).incident
    assert held is not None and held["state"] == "HELD"
    out = engine.close_by_person(held, w.nodes[held["node_key"]], w.budgets, "bob", T0 + 5, False)
    assert out.result == "closed" and out.incident is not None
    assert out.incident["closure"]["from_state"] == "HELD" and out.incident["held"] is None
    pending = w.feed(ev(XID79, node="a3-node-003", ts=T0 + 2)).incident  # held too: one slot
    assert pending is not None
    iid = _started(World(pol()), node="a3-node-004")
    for state, started, ok in (
        ("OPEN", False, True),
        ("OPEN", True, False),
        ("FENCED", True, False),
        ("ACTING", True, False),
        ("VERIFYING", True, False),
        ("RESOLVED", True, False),
    ):
        wf: WorkflowRun = {"step": 1, "state": "started" if started else "pending", "execution": None}
        inc: Incident = {**pending, "id": iid, "state": State(state), "workflow": wf}
        got = engine.close_by_person(inc, engine.new_node(pending["node"]), {}, "bob", T0 + 9, False)
        assert (got.result == "closed") is ok, (state, started)


def test_the_other_bucket_takes_no_names_room_whatever_the_order() -> None:
    """Summed count shards may bring OTHER before a table is full: it still names as many as one
    merge would, and stays bounded (the 10,000-GPU forgery test saw 31 named after the shards)."""
    table: dict[str, int] = {engine.OTHER: 5}
    for i in range(engine.MAX_GPUS + 10):
        key = engine.bounded_key(table, f"gpu-{i}", engine.MAX_GPUS)
        table[key] = table.get(key, 0) + 1
    assert len(table) == engine.MAX_GPUS + 1 and table[engine.OTHER] == 5 + 10
    assert engine.bounded_key(table, engine.OTHER, engine.MAX_GPUS) == engine.OTHER
    assert engine.bounded_key({}, engine.OTHER, 0) == engine.OTHER  # never a name


def test_an_incident_counts_at_most_32_gpus_and_32_xid_codes_by_name() -> None:
    w = World(pol())
    base = ev(XID79)
    first = w.feed(base)
    assert first.incident is not None
    iid = first.incident["id"]
    for i in range(200):  # forged lines: a new GPU and a new Xid code each
        e = cast(
            FaultEvent,
            dict(base, xid=1000 + i, gpu={"pci": f"0000:{i // 256:02x}:{i % 256:02x}", "mig": None}),
        )
        e["source"] = cast(Source, dict(base["source"], insert_id=f"forged-{i}"))
        w.feed(e)
    inc = w.incidents[iid]
    assert inc["counts"]["events"] == 201
    assert sum(n for k, n in inc["counts"].items() if k != "events") == 201
    assert len(inc["counts"]) <= engine.MAX_XIDS + 2 and inc["counts"]["other"] > 0
    assert len(inc["gpus"]) == engine.MAX_GPUS + 1 and inc["gpus"]["other"]["pci"] == "other"
    assert sum(sum(g["xids"].values()) for g in inc["gpus"].values()) == 201
    assert all(len(g["xids"]) <= engine.MAX_XIDS + 1 for g in inc["gpus"].values())
    # coalesced counts merge under the same bounds
    deltas = engine.empty_deltas()
    for i in range(100):
        e = cast(FaultEvent, dict(base, xid=3000 + i, gpu={"pci": f"0001:00:{i:02x}", "mig": None}))
        e["source"] = cast(Source, dict(base["source"], insert_id=f"storm-{i}"))
        engine.count_into(deltas, e, T0 + 1, w.p)
    assert len(deltas["recent_keys"]) <= engine.MAX_DELTA_KEYS
    engine.merge_deltas(inc, deltas, w.p)
    assert inc["counts"]["events"] == 301 and len(inc["gpus"]) == engine.MAX_GPUS + 1
    assert len(inc["counts"]) <= engine.MAX_XIDS + 2
