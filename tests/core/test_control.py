"""The runtime control (core/control.py): the document's changes, and what a pause, a cluster's mode
and a silence do to the real engine's decisions, through the memory store and the sweep's rules."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import control, ids, policy
from pitstop.core.aggregate import LeaseStart
from pitstop.core.classify import Classifier
from pitstop.core.control import Control, ControlDoc, ControlError, Stamp
from pitstop.core.domain import FaultEvent, Incident
from pitstop.core.resources import DataFileError
from pitstop.core.states import RunState, State
from pitstop.services.sweep import close_bursts, release_held
from tests.helpers import ops_agent_entry

T0 = 1_800_000_000.0
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
TRAIN = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}
EVAL = {"name": "eval", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "b3-*"}}


def who(at: float = T0, by: str = "alice", reason: str = "firmware roll") -> Stamp:
    return {"by": by, "at": at, "reason": reason}


def pol(doc: ControlDoc | None = None, mode: str = "enforce") -> policy.Policy:
    base = policy.from_doc({"mode": mode, "clusters": [TRAIN, EVAL]})
    return base.with_control(Control.of(doc))


def event(node: str, at: float = T0) -> FaultEvent:
    e = Classifier.default().classify(ops_agent_entry(XID79, instance=node, insert_id=uuid.uuid4().hex))
    e["_observed_ts"] = at
    return e


def pages(store: MemoryStore, iid: str) -> list[str]:
    return [
        str(e["notification"]["summary"])
        for e in store.docs.outbox.values()
        if e["notification"]["kind"] == "page" and cast(Any, e["notification"]["incident"])["id"] == iid
    ]


def fault(store: MemoryStore, p: policy.Policy, node: str, at: float = T0) -> Any:
    out = store.apply(event(node, at), p, at)
    assert out.incident is not None
    return out


# -- the document -----------------------------------------------------------------------------------


def test_every_change_is_audited_with_who_when_and_why_and_versioned() -> None:
    doc, c1 = control.pause(None, None, who(T0))
    doc, c2 = control.set_mode(doc, "train", "enforce", who(T0 + 1, "bob", "enforce train first"))
    doc, c3 = control.silence(doc, "node", "a3-node-007", 4 * 3600, who(T0 + 2, reason="rack 7 work"))
    doc, c4 = control.resume(doc, None, who(T0 + 3, "carol", "done"))
    assert [c["version"] for c in (c1, c2, c3, c4)] == [1, 2, 3, 4] and doc["version"] == 4
    assert [(c["verb"], c["by"], c["reason"]) for c in (c1, c2, c4)] == [
        ("pause", "alice", "firmware roll"),
        ("mode", "bob", "enforce train first"),
        ("resume", "carol", "done"),
    ]
    assert (
        c3["scope"] == "node a3-node-007" and "until" in c3["detail"] and c4["detail"] == "lifted: everything"
    )
    got = Control.of(doc)
    assert got.pause("train") is None and got.mode("train", "observe") == "enforce"
    assert [s["value"] for s in got.silences(T0 + 10)] == ["a3-node-007"]
    assert got.silences(T0 + 5 * 3600) == []  # over after its four hours
    lines = control.changes_lines([c4, c1])
    assert lines[0].endswith("by alice: firmware roll") and "resume" in lines[1]


def test_changes_that_cannot_be_made_are_refused_and_change_nothing() -> None:
    with pytest.raises(ControlError, match="nothing is paused"):
        control.resume(None, None, who())
    doc, _ = control.pause(None, "train", who())
    with pytest.raises(ControlError, match="already paused"):
        control.pause(doc, "train", who())
    with pytest.raises(ControlError, match="no pause of its own"):
        control.resume(doc, "eval", who())
    with pytest.raises(ControlError, match="no active silence"):
        control.expire(doc, "s0000000", who())
    with pytest.raises(ControlError, match="not a reservation block"):
        control.silence(doc, "block", "a b", 60, who())
    with pytest.raises(ControlError, match="instance"):
        control.silence(doc, "node", "ALL", 60, who())  # Slurm would read it as every node
    assert doc["version"] == 1


def test_a_cluster_resumed_under_everythings_pause_says_it_is_still_paused() -> None:
    doc, _ = control.pause(None, None, who())
    doc, _ = control.pause(doc, "train", who())
    doc, change = control.resume(doc, "train", who(T0 + 1))
    assert change["detail"].startswith("still paused (everything)")
    assert Control.of(doc).pause("train") is not None


def test_an_ended_silence_stays_listed_a_week_then_goes() -> None:
    doc, c = control.silence(None, "cluster", "train", 3600, who())
    sid = c["detail"].split()[0]
    doc, _ = control.expire(doc, sid, who(T0 + 60, reason="roll done early"))
    assert Control.of(doc).silences(T0 + 120) == []
    assert [s["ended"]["reason"] for s in Control.of(doc).silences(T0 + 120, ended=True)] == [
        "roll done early"
    ]
    doc, _ = control.pause(doc, None, who(T0 + 8 * 86400))  # any later change tidies
    assert Control.of(doc).silences(T0 + 8 * 86400, ended=True) == []


def test_a_document_that_does_not_match_its_schema_is_refused() -> None:
    with pytest.raises(DataFileError, match="paused"):
        Control.of({"paused": {"by": "x"}})  # no time, no reason
    with pytest.raises(DataFileError):
        Control.of({"clusters": {"train": {"mode": {"mode": "yolo", "by": "x", "at": 1, "reason": ""}}}})


# -- what decisions do with it ----------------------------------------------------------------------


def test_a_pause_records_and_pages_and_holds_and_the_sweep_lets_it_go_after_resume() -> None:
    store = MemoryStore()
    paused, _ = control.pause(None, None, who())
    out = fault(store, pol(paused), "a3-node-001")
    inc: Incident = out.incident
    assert out.result == "held" and out.start_step is None and inc["workflow"] is None
    assert inc["held"] is not None and inc["held"]["control"] == "pause"
    assert "paused (everything) by alice" in inc["held"]["reason"]
    assert inc["budget_scopes"] == []  # no blast-radius slot taken while paused
    assert len(pages(store, inc["id"])) == 1
    assert release_held(store, pol(paused), T0 + 60) == 0  # still paused: not tried, not paged again
    assert len(pages(store, inc["id"])) == 1
    resumed, _ = control.resume(paused, None, who(T0 + 120))
    started: list[Any] = []
    assert release_held(store, pol(resumed), T0 + 180, started.append) == 1
    after = store.get(inc["id"])
    assert after is not None and after["state"] == State.OPEN and started[0].start_step == 1
    assert after["holds"][0]["control"] == "pause" and after["holds"][0]["by"] == "sweep"


def test_a_clusters_pause_holds_only_that_cluster() -> None:
    store = MemoryStore()
    doc, _ = control.pause(None, "eval", who())
    assert fault(store, pol(doc), "b3-node-001").result == "held"
    acted = fault(store, pol(doc), "a3-node-001")
    assert acted.result == "opened" and acted.start_step == 1


def test_in_observe_mode_a_pause_holds_nothing_there_is_nothing_to_stop() -> None:
    store = MemoryStore()
    doc, _ = control.pause(None, None, who())
    out = fault(store, pol(doc, mode="observe"), "a3-node-001")
    assert out.result == "opened" and out.incident["workflow"]["state"] == RunState.OBSERVE


def test_a_decided_step_does_not_start_while_paused() -> None:
    store = MemoryStore()
    iid = fault(store, pol(), "a3-node-001").incident["id"]
    paused, _ = control.pause(None, "train", who(T0 + 1))
    leased = store.decide(iid, LeaseStart(1), pol(paused), T0 + 2)
    assert leased.result == "refused" and "paused (cluster train)" in str(leased.refused)
    assert store.decide(iid, LeaseStart(1), pol(), T0 + 3).result == "leased"


def test_a_clusters_mode_overrides_the_policys() -> None:
    store = MemoryStore()
    doc, _ = control.set_mode(None, "train", "enforce", who())
    acted = fault(store, pol(doc, mode="observe"), "a3-node-001")
    assert acted.incident["mode"] == "enforce" and acted.start_step == 1
    watched = fault(store, pol(doc, mode="observe"), "b3-node-001")
    assert watched.incident["mode"] == "observe" and watched.start_step is None
    doc, _ = control.set_mode(doc, "eval", "observe", who())
    seen = fault(MemoryStore(), pol(doc, mode="enforce"), "b3-node-002")
    assert seen.incident["workflow"]["state"] == RunState.OBSERVE


@pytest.mark.parametrize(("scope", "value"), [("node", "a3-node-001"), ("cluster", "train")])
def test_a_silenced_scopes_fault_is_recorded_and_paged_never_acted_on(scope: str, value: str) -> None:
    store = MemoryStore()
    doc, _ = control.silence(None, scope, value, 3600, who())
    out = fault(store, pol(doc), "a3-node-001")
    inc = out.incident
    assert out.result == "opened" and out.start_step is None and inc["workflow"] is None
    assert inc["state"] == State.OPEN and inc["silenced"]["value"] == value and inc["step"] == 0
    (page,) = pages(store, inc["id"])
    assert "REBOOT_NODE not acted on, silenced" in page and "firmware roll" in page
    node = store.records.node(inc["node_key"])
    assert node is not None and node["remediations"] == []  # no cooldown, ladder or lemon count
    assert close_bursts(store, T0 + 3000) == 1  # ends with its burst, like an observe-mode episode
    assert cast(Any, store.get(inc["id"]))["state"] == State.RESOLVED
    later = fault(store, pol(doc), "a3-node-001", T0 + 3700)  # the silence is over: acted on
    assert later.incident["id"] != inc["id"] and later.start_step == 1


def test_a_blocks_silence_covers_the_nodes_of_that_block() -> None:
    store = MemoryStore()
    store.records.put_node("p.z.a3-node-001", cast(Any, {"block": "c1/b7"}))
    doc, _ = control.silence(None, "block", "c1/b7", 3600, who())
    inc = {"node": {"instance": "a3-node-001"}, "cluster": "train", "budget_scopes": []}
    assert Control.of(doc).silence(cast(Incident, inc), T0, "c1/b7") is not None
    assert Control.of(doc).silence(cast(Incident, inc), T0, "c1/b8") is None
    joined = {**inc, "budget_scopes": [ids.block_scope("c1/b7")]}  # it joined the block at its claim
    assert Control.of(doc).silence(cast(Incident, joined), T0) is not None
