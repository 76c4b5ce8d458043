"""One suite, two stores: the Firestore store (on the emulator) and the memory store keep the port's
semantics alike (core/store.py), so what unit tests, replay and the simulator see on the memory
store is what the functions see on Firestore."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest
from google.cloud import firestore

from pitstop.adapters.firestore import IncidentStore as FirestoreStore
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, policy, steps
from pitstop.core.aggregate import CloseByPerson, FailStuck, JoinBlock, LeaseStart, RecordStarted, ReleaseHeld
from pitstop.core.classify import Classifier
from pitstop.core.domain import Budget, CountShard, FaultEvent, Incident, NodeDoc, OutboxEntry, WorkflowRun
from pitstop.core.states import RunState, State
from pitstop.core.store import COUNT_PAGE_KEEP_S, IncidentStore, commit_of
from pitstop.services.sweep import close_bursts
from tests.helpers import hand_edit, ops_agent_entry

T0 = 1_800_000_000.0
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
POLICY = policy.from_doc(
    {
        "mode": "enforce",
        "clusters": [{"name": "train", "scheduler": "slurm", "size": 4, "match": {"name_pattern": "a3-*"}}],
        "budgets": {
            "cluster": {"max_nodes": 1, "max_percent": 100},
            "zone": {"max_nodes": 8, "max_percent": 100},
        },
    }
)


@pytest.fixture(params=["memory", "firestore"])
def store(request: pytest.FixtureRequest) -> Iterator[IncidentStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    request.getfixturevalue("firestore_host")
    yield FirestoreStore(firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}"))


def _any(doc: Mapping[str, Any] | None) -> Any:
    """A stored document as the assertions read it ({} when there is none)."""
    return doc or {}


def _event(line: str, node: str, insert_id: str | None = None, at: float = T0) -> FaultEvent:
    ev = Classifier.default().classify(
        ops_agent_entry(line, instance=node, insert_id=insert_id or uuid.uuid4().hex)
    )
    return {**ev, "_observed_ts": at}


def test_a_delivery_is_applied_once_and_a_second_fault_absorbed(store: IncidentStore) -> None:
    ev = _event(XID79, "a3-node-001", "same")
    first = store.apply(ev, POLICY, T0)
    assert first.result == "opened" and first.incident is not None and first.start_step == 1
    again = store.apply(ev, POLICY, T0 + 1)
    assert again.result == "duplicate" and again.duplicate_of == first.incident["id"]
    other = store.apply(_event(XID79, "a3-node-001"), POLICY, T0 + 2)
    assert other.result == "absorbed"
    inc = store.get(first.incident["id"])
    assert inc is not None and inc["counts"]["events"] == 2
    assert store.latest_incident(inc["node_key"]) == inc


def test_a_nodes_latest_incident_is_its_newest_episode_resolved_or_not(store: IncidentStore) -> None:
    """What a first contact reads (services/coalesce.py read_latest): the node's latest incident,
    still its latest once resolved, and the next episode's incident once one opens."""
    first = store.apply(_event(XID79, "a3-node-011"), POLICY, T0)
    assert first.incident is not None
    nkey, iid = first.incident["node_key"], first.incident["id"]
    assert _any(store.latest_incident(nkey))["id"] == iid
    assert store.decide(iid, CloseByPerson("ops", False), None, T0 + 1).result == "closed"
    assert _any(store.latest_incident(nkey))["state"] == "RESOLVED"
    again = store.apply(_event(XID79, "a3-node-011", at=T0 + 5), POLICY, T0 + 5)
    assert again.result in ("opened", "held")  # a new episode (held: the node was acted on just now)
    assert again.incident is not None and again.incident["id"] != iid
    assert _any(store.latest_incident(nkey))["id"] == again.incident["id"]
    assert store.latest_incident("a3-node-never-seen") is None


def _totals(ev: FaultEvent, lines: int, iid: str, pol: policy.Policy = POLICY) -> CountShard:
    """A shard's totals as an instance keeps them: ``lines`` lines of incident ``iid`` counted like
    the incident counts."""
    totals = engine.empty_deltas()
    for _ in range(lines):
        engine.count_into(totals, ev, ev["_observed_ts"], pol)
    burst = ev["_observed_ts"] + pol.window("burst_silence_s")
    return cast(CountShard, {**totals, "incident": iid, "node": "", "burst_until": burst, "at": 0.0})


def test_a_count_page_carries_the_expiry_its_ttl_policy_deletes_it_by(firestore_host: str) -> None:
    """Deploy puts a TTL policy on the count pages' ``expire_at`` (infra/resources.yaml): each write
    of a page moves it to COUNT_PAGE_KEEP_S from then, as a timestamp (a TTL field must hold one:
    firebase.google.com/docs/firestore/ttl), so only the pages of instances long gone expire."""
    fs = FirestoreStore(firestore.Client(project=f"t-{uuid.uuid4().hex[:12]}"))
    ev = _event(XID13, "a3-node-002")
    out = fs.apply(ev, POLICY, T0)
    assert out.incident is not None
    before = time.time()
    fs.put_count_shards({"inst-a-p0": {"inst-a-1": _totals(ev, 5, out.incident["id"])}})
    page = fs.counts.document("inst-a-p0").get().to_dict() or {}
    expiry = page.get("expire_at")
    assert isinstance(expiry, dt.datetime)
    assert before + COUNT_PAGE_KEEP_S - 1 <= expiry.timestamp() <= time.time() + COUNT_PAGE_KEEP_S + 1


def test_count_shards_are_summed_where_the_incident_is_read(store: IncidentStore) -> None:
    """Storm counts live in shards, one per writer, written whole into its instance's pages: a
    reader (get, list) sees the incident's own shards summed, a cache (latest_incident,
    incident_as_decided) the decided part, and a shard written again replaces its totals (a
    retried write adds nothing) and leaves the page's other shards as they were."""
    ev = _event(XID13, "a3-node-002")
    out = store.apply(ev, POLICY, T0)
    other = store.apply(_event(XID13, "a3-node-003"), POLICY, T0)
    assert out.incident is not None and other.incident is not None
    iid = out.incident["id"]
    store.put_count_shards(
        {"inst-a-p0": {"inst-a-1": _totals(ev, 5, iid), "inst-a-2": _totals(ev, 4, other.incident["id"])}}
    )
    store.put_count_shards({"inst-b-p0": {"inst-b-1": _totals(ev, 7, iid)}})
    store.put_count_shards({"inst-a-p0": {"inst-a-1": _totals(ev, 6, iid)}})  # replaces a-1
    inc = store.get(iid)
    assert inc is not None and inc["counts"]["events"] == 1 + 6 + 7 and inc["counts"]["xid_13"] == 14
    assert sorted(i["counts"]["events"] for i in store.list()) == [5, 14]
    assert inc["burst_until"] == T0 + POLICY.window("burst_silence_s")
    assert _any(store.incident_as_decided(iid))["counts"]["events"] == 1
    assert _any(store.latest_incident(inc["node_key"]))["counts"]["events"] == 1


def test_a_summed_incident_keeps_the_incidents_bounds(store: IncidentStore) -> None:
    """Many shards, each within the engine's bounds, sum to an incident within the same bounds: at
    most MAX_GPUS GPUs by name (the rest under OTHER) and MAX_EVIDENCE summaries."""
    ev = _event(XID79, "a3-node-007")
    out = store.apply(ev, POLICY, T0)
    assert out.incident is not None
    for n in range(engine.MAX_GPUS + 8):
        gpu = _event(XID79.replace("a1:00", f"{n:02x}:00"), "a3-node-007")
        store.put_count_shards({f"inst-{n}-p0": {f"inst-{n}-1": _totals(gpu, 2, out.incident["id"])}})
    inc = store.get(out.incident["id"])
    assert inc is not None and inc["counts"]["events"] == 1 + 2 * (engine.MAX_GPUS + 8)
    assert (
        len(inc["gpus"]) == engine.MAX_GPUS + 1 and inc["gpus"][engine.OTHER]["xids"]["79"] == 2 * 9
    )  # a1 and 31 by name
    assert len(inc["evidence"]) == engine.MAX_EVIDENCE


def test_a_resolution_is_recorded_in_the_resolved_feed(store: IncidentStore) -> None:
    """Whatever resolves an incident (a person, a burst's end) records it in the same commit, so
    an instance counting its node's lines in memory learns it from one query."""
    observe = policy.from_doc({**POLICY.doc, "mode": "observe"})
    burst = store.apply(_event(XID13, "a3-node-008"), observe, T0)
    closed = store.apply(_event(XID79, "a3-node-009"), POLICY, T0)
    assert burst.incident is not None and closed.incident is not None
    assert store.resolved_since(T0 - 60) == []
    assert store.decide(closed.incident["id"], CloseByPerson("ops", False), None, T0 + 5).result == "closed"
    assert close_bursts(store, T0 + 10_000) == 1  # the observed burst ends
    feed = {r["incident"]: r for r in store.resolved_since(T0 - 60)}
    assert set(feed) == {closed.incident["id"], burst.incident["id"]}
    assert feed[burst.incident["id"]]["node"] == burst.incident["node_key"]
    assert store.resolved_since(T0 + 20_000) == []


def test_a_shards_burst_keeps_a_record_only_incident_open(store: IncidentStore) -> None:
    """The sweep ends an observed burst after its silence; lines counted only in a shard are part
    of the burst, so the incident stays open until the shard's silence too has passed."""
    observe = policy.from_doc({**POLICY.doc, "mode": "observe"})
    out = store.apply(_event(XID13, "a3-node-010"), observe, T0)
    assert out.incident is not None
    late = _event(XID13, "a3-node-010", at=T0 + 500)
    store.put_count_shards({"inst-a-p0": {"inst-a-1": _totals(late, 3, out.incident["id"], observe)}})
    silence = observe.window("burst_silence_s")
    assert close_bursts(store, T0 + silence + 1) == 0
    assert close_bursts(store, T0 + 500 + silence + 1) == 1


def test_one_starter_wins_the_lease_and_records_the_start(store: IncidentStore) -> None:
    out = store.apply(_event(XID79, "a3-node-003"), POLICY, T0)
    assert out.incident is not None
    iid = out.incident["id"]
    assert [i["id"] for i in store.pending_starts(T0)] == [iid]
    assert store.decide(iid, LeaseStart(1), None, T0).result == "leased"
    assert store.decide(iid, LeaseStart(1), None, T0 + 1).result != "leased"  # the lease holds
    store.decide(iid, RecordStarted(1, "exec-1"), None, T0 + 2)
    wf = _any(store.get(iid))["workflow"]
    assert wf["state"] == RunState.STARTED and wf["execution"] == "exec-1"
    assert store.pending_starts(T0 + 100) == []


def test_step_records_run_once_through_the_runner(store: IncidentStore) -> None:
    out = store.apply(_event(XID79, "a3-node-004"), POLICY, T0)
    assert out.incident is not None
    iid = out.incident["id"]
    runner: steps.StepRunner[Any] = steps.StepRunner(store.steps(iid), 60.0, lambda: T0)
    calls: list[int] = []

    def effect(claim: steps.Claim) -> dict[str, Any]:
        calls.append(claim.attempt)
        return {"did": "reset"}

    payload = {"op": "act", "incident": iid, "step": 1}
    assert runner.run("1-act", payload, effect, "exec-1") == {"did": "reset"}
    assert runner.run("1-act", payload, effect, "exec-2")["replayed"] is True
    rec = store.step_record(iid, "1-act")
    assert calls == [1] and rec is not None and rec["state"] == "done" and rec["owner"] == "exec-1"
    held = runner.begin("1-fence", {**payload, "op": "fence"}, "exec-1")
    assert isinstance(held, steps.Claim)
    with pytest.raises(steps.BusyError):
        runner.begin("1-fence", {**payload, "op": "fence"}, "exec-2")


def test_a_run_of_a_job_is_requeued_for_one_incident(store: IncidentStore) -> None:
    assert store.mark_job_requeue("train-42-abc", "ifirst0001", T0)
    assert store.mark_job_requeue("train-42-abc", "ifirst0001", T0 + 1)  # its own retry
    assert not store.mark_job_requeue("train-42-abc", "isecond001", T0 + 2)


def test_budget_holds_release_close_fail_and_settle(store: IncidentStore) -> None:
    first = store.apply(_event(XID79, "a3-node-005"), POLICY, T0)
    second = store.apply(_event(XID79, "a3-node-006"), POLICY, T0)
    assert first.incident is not None and second.incident is not None
    assert second.result == "held" and second.page is not None  # the cluster budget is 1 node
    held = second.incident["id"]
    assert store.decide(held, ReleaseHeld("sweep", force=False), POLICY, T0 + 5).result == "still_held"
    assert (
        store.decide(held, ReleaseHeld("ops", force=True), POLICY, T0 + 6).result == "released"
    )  # a person: past the budget
    store.decide(
        first.incident["id"], RecordStarted(1, "projects/p/locations/l/workflows/w/executions/e1"), None, T0
    )
    inc = store.get(first.incident["id"])
    assert inc is not None
    hand_edit(
        store, inc["id"], lambda d: cast(WorkflowRun, d["workflow"]).update({"state": RunState.STARTED})
    )
    failed = store.decide(
        inc["id"], FailStuck("projects/p/locations/l/workflows/w/executions/e1", "overran"), None, T0 + 9
    )
    assert failed.result == "failed" and _any(store.get(inc["id"]))["state"] == State.FAILED
    closed = store.decide(inc["id"], CloseByPerson("ops", False), None, T0 + 11)
    assert closed.result == "closed" and _any(store.get(inc["id"]))["state"] == State.RESOLVED


def test_a_failed_incidents_slot_counts_until_a_person_closes_it(store: IncidentStore) -> None:
    """Issue 21 (11): the watchdog's FAILED leaves the node fenced, and its slot counting past the
    window; only a person's close lets it go (the window then slides past it)."""
    execution = "projects/p/locations/l/workflows/w/executions/e7"
    first = store.apply(_event(XID79, "a3-node-007"), POLICY, T0)
    assert first.incident is not None
    iid = first.incident["id"]
    store.decide(iid, RecordStarted(1, execution), None, T0)
    assert store.decide(iid, FailStuck(execution, "overran"), None, T0 + 60).result == "failed"
    late = T0 + 2 * POLICY.budget_window_s
    second = store.apply(_event(XID79, "a3-node-008"), POLICY, late)
    assert second.result == "held" and second.incident is not None and second.page is not None
    assert (
        store.decide(second.incident["id"], ReleaseHeld("sweep", force=False), POLICY, late + 1).result
        == "still_held"
    )
    assert store.decide(iid, CloseByPerson("ops", False), None, late + 2).result == "closed"
    assert (
        store.decide(second.incident["id"], ReleaseHeld("sweep", force=False), POLICY, late + 3).result
        == "released"
    )


BLOCK_POLICY = policy.from_doc(
    {
        **POLICY.doc,
        "budgets": {
            **POLICY.doc["budgets"],
            "cluster": {"max_nodes": 8, "max_percent": 100},
            "block": {"max_nodes": 1, "max_percent": 100},
        },
        "cooldowns": {"REBOOT_NODE": 86400},
    }
)


def test_a_node_joins_its_block_budget_before_it_is_fenced(store: IncidentStore) -> None:
    """Issue 21 (11): the block is learned when the step is claimed (before the fence), not once acted
    on; a second node of a full block is held there, paged; a node already fenced joins past the cap."""
    first = store.apply(_event(XID79, "a3-node-009"), BLOCK_POLICY, T0)
    second = store.apply(_event(XID79, "a3-node-010"), BLOCK_POLICY, T0)
    assert first.incident is not None and second.incident is not None and second.result == "opened"
    a, b = first.incident["id"], second.incident["id"]
    joined = store.decide(a, JoinBlock("c1/block-7"), BLOCK_POLICY, T0 + 1)
    scope = engine.block_scope("c1/block-7")
    assert joined.result == "joined" and scope in _any(store.get(a))["budget_scopes"]
    assert set(_any(store.budget(scope))["slots"]) == {a}
    assert (
        store.decide(a, JoinBlock("c1/block-7"), BLOCK_POLICY, T0 + 2).result == "ignored"
    )  # a retried claim
    held = store.decide(b, JoinBlock("c1/block-7"), BLOCK_POLICY, T0 + 3)
    assert held.result == "held" and held.page is not None and scope in held.page
    inc_b = _any(store.get(b))
    assert inc_b["state"] == State.HELD and (inc_b["held"] or {})["scope"] == scope
    assert _any(store.get_node(inc_b["node_key"]))["block"] == "c1/block-7"
    assert (
        store.decide(b, ReleaseHeld("sweep", force=False), BLOCK_POLICY, T0 + 4).result == "still_held"
    )  # the block counts now
    hand_edit(store, a, lambda d: d.update({"state": State.FENCED}))
    assert store.decide(a, JoinBlock("c1/block-8"), BLOCK_POLICY, T0 + 5).result == "joined"  # moved, fenced
    assert set(_any(store.budget(engine.block_scope("c1/block-8")))["slots"]) == {a}
    hand_edit(store, a, lambda d: d.update({"state": State.FAILED}))
    assert store.decide(a, CloseByPerson("ops", True), None, T0 + 6).result == "closed"
    # the window slides past a's claim: b goes on; its held step was never a remediation, so the
    # day-long cooldown of the policy does not hold it again
    later = T0 + BLOCK_POLICY.budget_window_s + 10
    released = store.decide(b, ReleaseHeld("sweep", force=False), BLOCK_POLICY, later)
    assert released.result == "released" and released.start_step == 2, released


def test_the_outbox_keeps_what_is_unsent(store: IncidentStore) -> None:
    entry: OutboxEntry = {"id": "page-x", "sent": False, "created_at": T0, "notification": {"kind": "page"}}
    assert store.outbox_add("page-x", entry)["id"] == "page-x"
    assert store.outbox_add("page-x", {**entry, "created_at": T0 + 5})["created_at"] == T0  # created once
    assert [e["id"] for e in store.outbox_unsent(T0 + 1)] == ["page-x"]
    store.outbox_note_failure("page-x", T0 + 2)
    store.outbox_mark_sent("page-x", "m-1", T0 + 3, 60.0)
    assert list(store.outbox_unsent(T0 + 10)) == []


def test_one_rule_says_what_a_decision_writes() -> None:
    node = cast(NodeDoc, {"node": {}})
    out = engine.Outcome("absorbed", incident=engine.as_incident({"id": "i1"}), node=node)
    assert (
        commit_of(out, T0).incidents == cast(list[Incident], [{"id": "i1"}])
        and commit_of(out, T0).node is None
    )
    raised = engine.Outcome(
        "raised",
        incident=engine.as_incident({"id": "i1"}),
        node=node,
        budgets=cast(dict[str, Budget], {"b": {}}),
    )
    assert commit_of(raised, T0).count == 3
    assert commit_of(engine.Outcome("duplicate"), T0).count == 0


def test_the_job_disruption_budget_admits_runs_up_to_its_cap(store: IncidentStore) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    assert store.claim_job_restart(job, "run-1", T0, 2, 3600)
    assert store.claim_job_restart(job, "run-1", T0 + 5, 2, 3600)  # the same run again: admitted
    assert store.claim_job_restart(job, "run-2", T0 + 10, 2, 3600)
    assert not store.claim_job_restart(job, "run-3", T0 + 20, 2, 3600)  # spent
    assert store.claim_job_restart(job, "run-3", T0 + 3601, 2, 3600)  # run-1 slid out of the window
