"""The incident store and ingest on the Firestore and Pub/Sub emulators, under contention."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from google.cloud import firestore
from google.cloud.pubsub_v1 import SubscriberClient

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.pubsub import Notifier
from pitstop.adapters.store_tally import Tally
from pitstop.adapters.workflows import WorkflowStarter
from pitstop.core import engine, policy
from pitstop.core.aggregate import CloseByPerson, LeaseStart
from pitstop.core.domain import Budget, FaultEvent, NodeRef
from pitstop.local.executions_server import ExecutionsService
from pitstop.services.actuate import Actuator
from pitstop.services.ingest import Ingest, PoisonMessageError
from pitstop.services.launch import workflow_argument
from pitstop.services.sweep import Sweep
from tests.helpers import PROJECT, ZONE, hand_edit, ops_agent_entry, push_body

pytestmark = pytest.mark.emulator

T0 = 1_800_000_000.0
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID94 = (
    "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
)
XID48 = "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected in the FB"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_policy(**over: Any) -> policy.Policy:
    doc: dict[str, Any] = {"mode": "enforce", "clusters": [CLUSTER]}
    doc.update(over)
    return policy.from_doc(doc)


def entry(line: str, node: str, n: int, ts: str = "2027-01-15T08:00:00Z") -> dict[str, Any]:
    e = ops_agent_entry(line, instance=node, insert_id=f"{node}-{n}")
    e["timestamp"] = ts
    return e


def tally(ing: Ingest) -> Tally:
    """The bench counters of an ingest's Firestore store (not the port's: the concrete store's)."""
    assert isinstance(ing.store, IncidentStore)
    return ing.store.tally


def make_ingest(
    fs: firestore.Client,
    ex_endpoint: str | None,
    pol: policy.Policy,
    clock: Clock,
    notifier: Notifier | None = None,
    project: str = "train-prod",
) -> Ingest:
    store = IncidentStore(fs, "pitstop")
    starter = (
        WorkflowStarter(project, "us-central1", "pitstop-remediate", ex_endpoint) if ex_endpoint else None
    )
    return Ingest(pol, store, starter, notifier, clock=clock)


def test_concurrent_deliveries_make_one_incident_and_one_start(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    # five function instances (separate coalescers), 50 deliveries of 10 distinct events
    instances = [make_ingest(fs_client, endpoint, pol, clock) for _ in range(5)]
    payloads = [push_body(entry(XID79, "a3-node-003", i % 10), message_id=str(i % 10)) for i in range(50)]
    barrier = threading.Barrier(10)

    def deliver(i: int) -> str:
        if i < 10:
            barrier.wait()
        # A delivery that raises is redelivered by Pub/Sub, as in production (the subscription's
        # retry policy backs off 10-600 s; here a jittered 1-3 s). Ten instances' transactions on
        # one node's documents can exhaust the store's retries on the emulator's lock timeouts
        # when the machine is loaded; what must hold is the outcome, however often that happens.
        for attempt in range(10):
            try:
                return instances[i % 5].handle_payload(payloads[i]).result
            except ValueError:
                if attempt == 9:
                    raise
                time.sleep(random.uniform(1.0, 3.0))
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(deliver, range(50)))
    for one in instances:  # an incident's first lines are committed one by one, the rest merged
        one.coalescer.flush_all(clock.t)
    incidents = instances[0].store.query()  # with the count shards summed
    assert len(incidents) == 1, results
    assert svc.created == 1
    if cast(Any, incidents[0])["workflow"]["state"] == "pending":
        # the starter raised after creating the execution (its delivery was redelivered as a
        # duplicate): the minute sweep finds the execution by its labels once the lease expires
        clock.t += 61
        assert Sweep(instances[0]).run()["restarted"] == 1
        incidents = instances[0].store.query()
    assert svc.created == 1
    inc = incidents[0]
    assert inc["action"] == "REBOOT_NODE"
    assert cast(Any, inc)["workflow"]["state"] == "started"
    assert results.count("opened") == 1
    assert inc["counts"]["events"] == 10
    dedup = list(fs_client.collection("pitstop_dedup").stream())
    assert len(dedup) <= 10


def test_step_up_starts_one_new_execution(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    ing = make_ingest(fs_client, endpoint, make_policy(), Clock())
    first = ing.handle_payload(entry(XID48, "a3-node-009", 1))
    assert first.result == "opened" and first.start_step == 1
    assert ing.handle_payload(entry(XID48, "a3-node-009", 2)).result == "absorbed"
    raised = ing.handle_payload(entry(XID79, "a3-node-009", 3))
    assert raised.result == "raised" and raised.start_step == 2
    assert svc.created == 2
    labels = sorted(r.labels["pitstop-step"] for r in svc.records.values())
    assert labels == ["1", "2"]


def make_actuator(
    ing: Ingest, pol: policy.Policy, clock: Clock, notifier: Notifier | None = None
) -> Actuator:
    """actuate's service on ingest's store and Workflows client (close never calls Compute)."""
    return Actuator(pol, ing.store, cast(ComputeAdapter, None), {}, notifier, ing.starter, clock=clock)


def worsening(ing: Ingest, node: str) -> str:
    """An incident (RESET_GPU) being verified when a fault that asks for a reboot arrives."""
    first = ing.handle_payload(entry(XID48, node, 1))
    assert first.result == "opened" and first.incident is not None
    iid = str(first.incident["id"])
    hand_edit(ing.store, iid, lambda d: d.update({"state": "VERIFYING"}))
    assert ing.handle_payload(entry(XID79, node, 2)).result == "raised"
    return iid


def test_step_up_from_actuate_starts_once_like_ingest(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, endpoint, pol, clock)
    iid = worsening(ing, "a3-node-050")
    assert svc.created == 1
    act = make_actuator(ing, pol, clock)
    clock.t += 60
    body, status = act.handle({"op": "close", "incident": iid, "step": 1})
    assert status == 200 and body["outcome"] == "escalated to REBOOT_NODE (step 2)"
    assert svc.created == 2
    inc: Any = ing.store.get(iid)
    assert inc is not None and inc["state"] == "OPEN" and inc["action"] == "REBOOT_NODE"
    assert inc["workflow"]["state"] == "started" and inc["workflow"]["step"] == 2
    node = ing.store.records.node(inc["node_key"])
    assert node is not None and [r["action"] for r in node["remediations"]] == ["RESET_GPU", "REBOOT_NODE"]
    # a retried close replays its record, and nothing is left for the sweep to start
    again, _ = act.handle({"op": "close", "incident": iid, "step": 1})
    assert again["replayed"] is True
    clock.t += 120
    assert Sweep(ing).run()["restarted"] == 0
    assert svc.created == 2
    assert sorted(r.labels["pitstop-step"] for r in svc.records.values()) == ["1", "2"]


def test_step_up_from_actuate_in_observe_mode_starts_nothing(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, endpoint, pol, clock)
    iid = worsening(ing, "a3-node-051")
    act = make_actuator(ing, make_policy(mode="observe"), clock)
    body, status = act.handle({"op": "close", "incident": iid, "step": 1})
    assert status == 200 and body["outcome"] == "escalated to REBOOT_NODE (step 2)"
    inc = ing.store.get(iid)
    assert inc is not None
    assert inc["workflow"] == {"step": 2, "state": "observe", "would_start": True, "execution": None}
    clock.t += 120
    assert Sweep(ing).run()["restarted"] == 0
    assert svc.created == 1


def test_step_up_from_actuate_past_a_budget_is_held_and_pages(
    fs_client: firestore.Client,
    executions: tuple[ExecutionsService, str],
    notifications: tuple[str, str, SubscriberClient],
) -> None:
    svc, endpoint = executions
    project, topic, sub = notifications
    pol = make_policy(budgets={"cluster": {"max_nodes": 8, "max_percent": 100}, "block": {"max_nodes": 1}})
    clock = Clock()
    ing = make_ingest(fs_client, endpoint, pol, clock, notifier=Notifier(project, topic))
    iid = worsening(ing, "a3-node-052")
    inc = ing.store.get(iid)
    assert inc is not None
    # acting on the node taught Pitstop its reservation block, whose only slot another node took since
    ing.store.records.set_node_fields(inc["node_key"], {"block": "c1/block-9"})
    other: NodeRef = {"project": PROJECT, "zone": ZONE, "instance": "a3-node-053", "instance_id": None}
    ing.store.records.put_node(engine.node_key(other), {**engine.new_node(other), "block": "c1/block-9"})
    assert ing.handle_payload(entry(XID79, "a3-node-053", 1)).result == "opened"
    assert svc.created == 2
    act = make_actuator(ing, pol, clock, notifier=Notifier(project, topic))
    body, status = act.handle({"op": "close", "incident": iid, "step": 1})
    assert status == 200
    assert body["outcome"].startswith("escalation to REBOOT_NODE held: blast-radius budget block-")
    assert svc.created == 2
    held: Any = ing.store.get(iid)
    assert held is not None and held["state"] == "HELD" and held["held"]["scope"].startswith("block-")
    resp = sub.pull(subscription=sub.subscription_path(project, "pull"), max_messages=10, timeout=10)
    pages = [json.loads(m.message.data) for m in resp.received_messages]
    assert [p["kind"] for p in pages] == ["page"] and "block-" in pages[0]["summary"]
    assert pages[0]["incident"]["id"] == iid and pages[0]["incident"]["state"] == "HELD"
    assert Sweep(ing).run()["released"] == 0  # the block is still full


def test_two_nodes_race_for_the_last_budget_slot(fs_client: firestore.Client) -> None:
    pol = make_policy()  # cap 1 for an 8-node cluster
    store = IncidentStore(fs_client, "pitstop")
    from pitstop.core.classify import Classifier

    clf = Classifier.default()
    evs = []
    for node in ("a3-node-004", "a3-node-005"):
        e = clf.classify(entry(XID79, node, 1))
        e["_observed_ts"] = T0
        evs.append(e)
    barrier = threading.Barrier(2)

    def go(e: FaultEvent) -> engine.Outcome:
        barrier.wait()
        return store.apply(e, pol, T0)

    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(go, evs))
    assert sorted(o.result for o in outs) == ["held", "opened"]
    budget = store.records.budget("cluster-train")
    assert budget is not None and len(budget["slots"]) == 1
    winner = next(o for o in outs if o.result == "opened")
    assert winner.incident is not None and list(budget["slots"]) == [winner.incident["id"]]


def test_redelivery_changes_nothing(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    body = push_body(entry(XID79, "a3-node-006", 1), message_id="77")
    first = make_ingest(fs_client, endpoint, pol, clock).handle_payload(body)
    assert first.result == "opened"
    before = first.incident
    # a different instance (no shared memory) gets the redelivery
    second = make_ingest(fs_client, endpoint, pol, clock).handle_payload(body)
    assert second.result == "duplicate"
    assert before is not None
    after = IncidentStore(fs_client).get(before["id"])
    assert after is not None
    assert after["counts"] == {"events": 1, "xid_79": 1}
    assert svc.created == 1


def test_crash_between_decided_and_started_recovers_once(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, endpoint, pol, clock)
    # the decision is committed, then the instance dies before starting the workflow
    from pitstop.core.classify import Classifier

    e = Classifier.default().classify(entry(XID79, "a3-node-007", 1))
    e["_observed_ts"] = T0
    out = ing.store.apply(e, pol, T0)
    assert out.start_step == 1 and out.incident is not None
    iid = out.incident["id"]
    # Pub/Sub redelivers (the function never acked): the duplicate path starts it
    again = make_ingest(fs_client, endpoint, pol, clock).handle_payload(
        push_body(entry(XID79, "a3-node-007", 1))
    )
    assert again.result == "duplicate"
    assert svc.created == 1
    inc: Any = ing.store.get(iid)
    assert inc is not None and inc["workflow"]["state"] == "started"
    # a second redelivery does nothing more
    make_ingest(fs_client, endpoint, pol, clock).handle_payload(push_body(entry(XID79, "a3-node-007", 1)))
    assert svc.created == 1


def test_crash_after_create_before_record_finds_the_execution(
    fs_client: firestore.Client, executions: tuple[ExecutionsService, str]
) -> None:
    svc, endpoint = executions
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, endpoint, pol, clock)
    assert ing.starter is not None
    from pitstop.core.classify import Classifier

    e = Classifier.default().classify(entry(XID79, "a3-node-008", 1))
    e["_observed_ts"] = T0
    out = ing.store.apply(e, pol, T0)
    assert out.incident is not None
    iid = out.incident["id"]
    assert ing.store.decide(iid, LeaseStart(1), None, T0).result == "leased"
    ing.starter.start(
        iid, 1, workflow_argument(out.incident, 1)
    )  # created; the instance dies before recording it
    assert svc.created == 1
    # another holder cannot start while the lease runs
    assert ing.start_workflow(iid, 1, T0 + 10) is None
    # after the lease, the sweep finds the execution by its labels instead of creating another
    clock.t = T0 + 120
    assert Sweep(ing).run()["restarted"] == 1
    assert svc.created == 1
    inc: Any = ing.store.get(iid)
    assert inc is not None and inc["workflow"]["state"] == "started"
    assert inc["workflow"]["execution"] == next(iter(svc.records))


def test_storm_coalesces_to_few_writes(fs_client: firestore.Client) -> None:
    pol, clock = make_policy(budgets={"cluster": {"max_nodes": 8, "max_percent": 100}}), Clock()
    ing = make_ingest(fs_client, None, pol, clock)
    nodes = [f"a3-node-{i:03d}" for i in range(8)]
    n = 0
    for second in range(10):
        clock.t = T0 + second
        for k in range(100):
            node = nodes[k % 8]
            line = XID94 if k % 3 else XID79
            ing.handle_payload(entry(line, node, n, ts=f"2027-01-15T08:00:{second:02d}Z"))
            n += 1
    ing.coalescer.flush_all(clock.t)
    incidents = ing.store.query()
    assert len(incidents) == 8
    assert sum(i["counts"]["events"] for i in incidents) == n
    assert tally(ing).writes / n < 0.2, tally(ing).writes


def test_a_buffer_keeps_only_the_evidence_its_incident_has_room_for(fs_client: firestore.Client) -> None:
    """An incident keeps its first MAX_EVIDENCE summaries and a merge drops the rest, so buffering
    more is memory spent for nothing: ~0.9 KB a line, ~8 KB a node, 40 MiB over 5,000 nodes."""
    from pitstop.core import engine

    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, None, pol, clock)
    ing.coalescer.timer = False  # only flush_all merges here
    first = ing.handle_payload(entry(XID94, "a3-node-050", 0))
    assert first.incident is not None
    nkey, iid = first.incident["node_key"], first.incident["id"]
    for n in range(1, 20):
        ing.handle_payload(entry(XID94, "a3-node-050", n))
    buffered = ing.coalescer.memory.nodes[nkey]
    direct = 20 - buffered.buffered  # a node's first lines are committed one by one
    assert buffered.buffered > 0 and len(buffered.deltas["evidence"]) == engine.MAX_EVIDENCE - direct
    ing.coalescer.flush_all(clock.t)
    for n in range(20, 40):
        ing.handle_payload(entry(XID94, "a3-node-050", n))
    # the shard's totals keep what the incident has room for, no more
    assert buffered.buffered == 20 and len(buffered.deltas["evidence"]) == engine.MAX_EVIDENCE - direct
    ing.coalescer.flush_all(clock.t)
    inc = ing.store.get(iid)
    assert inc is not None and inc["counts"]["events"] == 40
    kept = [e["insert_id"] for e in inc["evidence"]]
    assert kept == [f"a3-node-050-{n}" for n in range(engine.MAX_EVIDENCE)]


def test_held_incident_pages_a_human_once(
    fs_client: firestore.Client, notifications: tuple[str, str, SubscriberClient]
) -> None:
    project, topic, sub = notifications
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, None, pol, clock, notifier=Notifier(project, topic))
    results = [ing.handle_payload(entry(XID79, f"a3-node-01{i}", i)).result for i in range(4)]
    assert results == ["opened", "held", "held", "held"]
    resp = sub.pull(subscription=sub.subscription_path(project, "pull"), max_messages=10, timeout=10)
    pages = [json.loads(m.message.data) for m in resp.received_messages]
    assert len(pages) == 1
    assert pages[0]["kind"] == "page" and "cluster-train" in pages[0]["summary"]
    assert pages[0]["incident"]["state"] == "HELD"


def test_sweep_releases_held_when_window_slides(fs_client: firestore.Client) -> None:
    pol, clock = make_policy(mode="observe"), Clock()
    ing = make_ingest(fs_client, None, pol, clock)
    ing.handle_payload(entry(XID79, "a3-node-020", 1))
    held = ing.handle_payload(entry(XID79, "a3-node-021", 2))
    assert held.result == "held" and held.incident is not None
    clock.t = T0 + 60
    assert Sweep(ing).run()["released"] == 0
    clock.t = T0 + 1900
    assert Sweep(ing).run()["released"] == 1
    inc: Any = ing.store.get(held.incident["id"])
    assert inc is not None and inc["state"] == "OPEN"
    assert inc["workflow"]["would_start"] is True


def test_poison_raises_and_others_flow(fs_client: firestore.Client) -> None:
    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, None, pol, clock)
    with pytest.raises(PoisonMessageError):
        ing.handle_payload({"message": {"data": "%%%notbase64", "messageId": "1"}})
    assert ing.handle_payload(push_body({"logName": "x", "textPayload": "hello"})).result == "ignored"
    bad_node = entry(XID79, "Bad Node;reboot", 1)
    assert ing.handle_payload(push_body(bad_node)).result == "ignored"
    assert ing.handle_payload(push_body(entry(XID79, "a3-node-030", 2))).result == "opened"


def test_incidents_cli_lists_and_releases(fs_client: firestore.Client, firestore_host: str) -> None:
    import os
    import subprocess
    import sys

    pol, clock = make_policy(), Clock()
    ing = make_ingest(fs_client, None, pol, clock)
    ing.handle_payload(entry(XID79, "a3-node-040", 1))
    held = ing.handle_payload(entry(XID79, "a3-node-041", 2)).incident
    assert held is not None
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": fs_client.project, "FIRESTORE_EMULATOR_HOST": firestore_host}
    policy_file = f"/tmp/pitstop-policy-{fs_client.project}.yaml"
    with open(policy_file, "w") as f:
        f.write(
            "mode: enforce\nclusters:\n"
            "- {name: train, scheduler: slurm, size: 8, match: {name_pattern: 'a3-*'}}\n"
        )
    env["PITSTOP_POLICY"] = policy_file

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pitstop.tools.cli", "incidents", *args],
            env=env,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )

    table = run("--open", "--timeline")
    assert table.returncode == 0, table.stderr
    assert "a3-node-040" in table.stdout and "HELD" in table.stdout
    assert "blast-radius budget cluster-train exhausted" in table.stdout
    assert "detected" in table.stdout and "classified" in table.stdout
    rows = [json.loads(x) for x in run("--json").stdout.splitlines()]
    assert {r["state"] for r in rows} == {"OPEN", "HELD"}
    assert all("classified" in r["durations_s"] for r in rows)
    rel = run("--release", held["id"], "--by", "alice")
    assert rel.returncode == 0 and "released" in rel.stdout
    after: Any = IncidentStore(fs_client).get(held["id"])
    assert after is not None and after["state"] == "OPEN"
    assert after["workflow"]["state"] == "pending"
    assert run("--release", held["id"]).returncode == 1  # no longer held


def _counted_ingest(fs: firestore.Client, pol: policy.Policy, clock: Clock) -> tuple[Ingest, Any]:
    """An instance with a Firestore client of its own, whose billed operations are counted."""
    from pitstop.tools.firestore_ops import FirestoreOps

    client = firestore.Client(project=fs.project)
    ops = FirestoreOps(client)
    ing = Ingest(pol, IncidentStore(client, "pitstop"), None, None, clock=clock)
    ing.coalescer.timer = False  # the test plays the timer: flush_due
    return ing, ops


def test_ten_instances_counting_into_one_incident_write_once_per_interval_and_read_nothing(
    fs_client: firestore.Client,
) -> None:
    """Issue 23: ten instances merging one incident's storm each read and wrote the incident every
    interval, on condition (0.385 store operations per line at 10 instances). Now an instance
    writes its own count shard into its page, blindly: one write per interval, no read, and the one
    query per look at the resolved feed; every line still arrives. Meeting the node costs each
    instance two reads (the node's document, then its latest), and no query."""
    from pitstop.services.coalesce import DIRECT_LINES

    pol, clock = make_policy(), Clock()
    first = make_ingest(fs_client, None, pol, clock)
    for n in range(DIRECT_LINES):
        first.handle_payload(entry(XID94, "a3-node-060", n))
    instances = [_counted_ingest(fs_client, pol, clock) for _ in range(10)]
    for i, (ing, _) in enumerate(instances):
        for n in range(20):
            assert ing.handle_payload(entry(XID94, "a3-node-060", 1000 * (i + 1) + n)).coalesced
    meeting = [(ops.reads, ops.writes) for _, ops in instances]
    assert meeting == [(2, 0)] * 10  # each met the node once: its document and the incident's
    for interval in range(1, 4):
        clock.t = T0 + 10 * interval
        for i, (ing, ops) in enumerate(instances):
            before = (ops.reads, ops.writes)
            assert ing.coalescer.flush_due(clock.t) == 1  # the interval's write
            assert (ops.reads - before[0], ops.writes - before[1]) == (1, 1)  # the feed's query; the shard
            for n in range(20):  # more lines, counted in memory
                line = entry(XID94, "a3-node-060", 1000 * (i + 1) + 20 * interval + n)
                assert ing.handle_payload(line).coalesced
    (inc,) = first.store.query()
    assert inc["counts"]["events"] == DIRECT_LINES + 10 * 80 - 10 * 20  # the last interval still buffered
    for ing, _ in instances:
        ing.coalescer.flush_all(clock.t)
    (inc,) = first.store.query()
    assert inc["counts"]["events"] == inc["counts"]["xid_94"] == DIRECT_LINES + 10 * 80
    assert sum(ops.writes for _, ops in instances) == 10 * 4  # one write per instance and interval
    pages = fs_client.collection("pitstop_counts")
    mine = pages.where(filter=firestore.FieldFilter("incidents", "array_contains", inc["id"]))
    assert len(list(mine.stream())) == 10  # one page per instance


def test_lines_written_into_an_incident_resolved_meanwhile_are_replayed_once(
    fs_client: firestore.Client,
) -> None:
    """The guarantee the conditioned merge gave, kept without a read per merge: a person closes the
    incident while ten instances count its node's lines from caches that still say OPEN. Each
    instance's next look at the resolved feed finds it; the strongest line written after the close
    is replayed through the full path (one new incident, created once), taken out of the old
    incident's counts, and no line is counted twice."""
    from pitstop.services.coalesce import DIRECT_LINES

    pol, clock = make_policy(), Clock()
    first = make_ingest(fs_client, None, pol, clock)
    for n in range(DIRECT_LINES):
        first.handle_payload(entry(XID94, "a3-node-061", n))
    (old,) = first.store.query()
    instances = [_counted_ingest(fs_client, pol, clock) for _ in range(10)]
    for i, (ing, _) in enumerate(instances):
        ing.coalescer.flush_due(clock.t)  # each watches the feed
        for n in range(5):
            assert ing.handle_payload(entry(XID94, "a3-node-061", 100 * (i + 1) + n)).coalesced
    assert first.store.decide(old["id"], CloseByPerson("ops", False), None, T0 + 1).result == "closed"
    clock.t = T0 + 5
    for i, (ing, _) in enumerate(instances):  # lines logged after the close; the caches say OPEN
        for n in range(5, 10):
            line = entry(XID94, "a3-node-061", 100 * (i + 1) + n, ts="2027-01-15T08:00:05Z")
            assert ing.handle_payload(line).coalesced
    clock.t = T0 + 10
    for ing, _ in instances:
        ing.coalescer.flush_due(clock.t)
        ing.coalescer.flush_all(clock.t)
    incidents = {i["id"]: i for i in first.store.query()}
    assert len(incidents) == 2  # the old one and the one the replays opened, once
    (new,) = [i for i in incidents.values() if i["id"] != old["id"]]
    assert new["state"] != "RESOLVED" and new["counts"]["events"] == 10  # one replayed line per instance
    assert incidents[old["id"]]["counts"]["events"] == DIRECT_LINES + 10 * 10 - 10
    assert first.store.counts.latest(new["node_key"]) is not None


def test_an_incidents_first_lines_are_committed_once_not_once_per_instance(
    fs_client: firestore.Client,
) -> None:
    """A second instance meets an incident that already has its first lines: it counts in memory
    at once (no transaction, no write) and the merge brings every line in."""
    from pitstop.services.coalesce import DIRECT_LINES

    pol, clock = make_policy(), Clock()
    a, b = make_ingest(fs_client, None, pol, clock), make_ingest(fs_client, None, pol, clock)
    for one in (a, b):
        one.coalescer.timer = False  # only flush_all merges here
    results = [a.handle_payload(entry(XID94, "a3-node-062", n)).result for n in range(DIRECT_LINES)]
    assert results == ["opened", *["absorbed"] * (DIRECT_LINES - 1)]
    assert b.handle_payload(entry(XID94, "a3-node-062", 100)).coalesced
    assert tally(b).writes == 0  # it read the incident, and wrote nothing
    b.coalescer.flush_all(clock.t)
    (inc,) = a.store.query()
    assert inc["counts"]["events"] == DIRECT_LINES + 1


def test_in_a_storm_the_opener_counts_its_incidents_first_lines_in_memory(
    fs_client: firestore.Client,
) -> None:
    """Issue 23: the opener committed an incident's first DIRECT_LINES lines one by one even in a
    storm (at 10 instances, ~110 commits of two writes each per 50,000-line storm). With more
    deliveries in flight at the instance than an ordinary fault's first lines, those lines are
    counted in memory like the rest; every line still arrives."""
    from pitstop.services.coalesce import DIRECT_LINES

    pol, clock = make_policy(), Clock()
    a = make_ingest(fs_client, None, pol, clock)
    a.coalescer.timer = False
    a.coalescer.crowd.arrivals.value = DIRECT_LINES  # others in flight here: a storm
    assert a.handle_payload(entry(XID94, "a3-node-065", 0)).result == "opened"
    writes = tally(a).writes
    results = [a.handle_payload(entry(XID94, "a3-node-065", n)) for n in range(1, DIRECT_LINES)]
    assert all(out.coalesced for out in results)
    assert tally(a).writes == writes  # no commit
    a.coalescer.crowd.arrivals.value = 0
    a.coalescer.flush_all(clock.t)
    (inc,) = a.store.query()
    assert inc["counts"]["events"] == DIRECT_LINES


def test_a_raise_another_instance_made_meanwhile_costs_a_read_not_a_refused_commit(
    fs_client: firestore.Client,
) -> None:
    """The raise race (issue 23): an instance whose view of a node's incident is a moment old meets
    a stronger line while deliveries crowd in; another instance raised the incident meanwhile. It
    reads the incident again before deciding (services/coalesce.py ``Crowd.pause``) and counts the line
    in memory: no commit, so none refused (it committed on its view, and its commit was refused:
    its writes and three reads, on each of ten instances)."""
    from pitstop.services.coalesce import DIRECT_LINES

    pol, clock = make_policy(), Clock()
    a, b = make_ingest(fs_client, None, pol, clock), make_ingest(fs_client, None, pol, clock)
    for one in (a, b):
        one.coalescer.timer = False
    for n in range(DIRECT_LINES):
        a.handle_payload(entry(XID94, "a3-node-063", n))
    assert b.handle_payload(entry(XID94, "a3-node-063", 100)).coalesced  # b's view: RESTART_JOB
    b.coalescer.flush_all(clock.t)  # written and checked: nothing buffered (no merge reads it again)
    assert a.handle_payload(entry(XID79, "a3-node-063", 101)).result == "raised"
    b.coalescer.crowd.wait_s = 0.0  # no pause needed here: a's commit is in already
    b.coalescer.crowd.inflight.value = 1  # another delivery in flight at b: a storm
    out = b.handle_payload(entry(XID79, "a3-node-063", 102))
    assert out.coalesced and out.incident is not None and out.incident["action"] == "REBOOT_NODE"
    assert tally(b).commits == {}  # no decision committed, none refused
    b.coalescer.crowd.inflight.value = 0
    b.coalescer.flush_all(clock.t)
    (inc,) = a.store.query()
    assert inc["counts"]["events"] == DIRECT_LINES + 3


def test_a_decision_that_waited_its_turn_reads_its_incident_again(fs_client: firestore.Client) -> None:
    """A decision queued behind this instance's others (adapters/firestore.py ``QUEUED_S``) reads
    the incident again instead of committing on what was read before it waited: another instance
    raised it meanwhile, and the line is counted in memory, no commit refused."""
    from pitstop.adapters.firestore import QUEUED_S
    from pitstop.core.classify import Classifier

    pol, clf = make_policy(), Classifier.default()
    mine, other = IncidentStore(fs_client, "pitstop"), IncidentStore(fs_client, "pitstop")
    first: FaultEvent = {**clf.classify(entry(XID94, "a3-node-064", 1)), "_observed_ts": T0}
    opened = other.apply(first, pol, T0)
    assert opened.result == "opened"
    nkey = engine.subject_key(first)
    assert _any_action(mine.counts.latest(nkey)) == "RESTART_JOB"  # in mine's cache now
    asked = time.monotonic()  # mine's decision asks for its turn, having read the incident just before
    stronger: FaultEvent = {**clf.classify(entry(XID79, "a3-node-064", 2)), "_observed_ts": T0}
    assert other.apply(stronger, pol, T0).result == "raised"
    time.sleep(2 * QUEUED_S)  # its turn comes late: its cached incident is older than its wait
    again: FaultEvent = {**clf.classify(entry(XID79, "a3-node-064", 3)), "_observed_ts": T0}
    raised = lambda inc: inc is not None and inc["action"] == "REBOOT_NODE"  # noqa: E731
    out = mine._apply(again, pol, T0, raised, asked)
    assert out.coalesced and out.incident is not None and out.incident["action"] == "REBOOT_NODE"
    assert (mine.tally.commits, mine.tally.writes) == ({}, 0)


def _any_action(inc: Any) -> Any:
    return (inc or {}).get("action")


def test_a_verified_line_is_committed_at_once_where_the_incident_holds_only_unverified_ones(
    fs_client: firestore.Client,
) -> None:
    """Counting in memory is for lines that change nothing: the first kernel-verified line of an
    incident opened from text syslog makes its evidence trusted, so it is a decision, committed
    at once, whichever instance receives it."""
    from pitstop.core import trust
    from tests.helpers import syslog_entry

    pol, clock = make_policy(trust={"text_syslog": "act"}), Clock()  # same action either way
    a, b = make_ingest(fs_client, None, pol, clock), make_ingest(fs_client, None, pol, clock)
    for one in (a, b):
        one.coalescer.timer = False
    for n in range(6):
        line = syslog_entry(XID94, instance="a3-node-063", insert_id=f"s-{n}")
        a.handle_payload({**line, "timestamp": "2027-01-15T08:00:00Z"})
    (inc,) = a.store.query()
    assert inc["trust"] == trust.UNVERIFIED and inc["action"] == "RESTART_JOB"
    assert inc["counts"]["events"] < 6  # the lines past its first were counted in memory
    out = b.handle_payload(entry(XID94, "a3-node-063", 1))
    assert out.result == "absorbed" and not out.coalesced
    assert cast(Any, a.store.get(inc["id"]) or {})["trust"] == trust.VERIFIED


def test_instances_claim_no_more_than_the_budget_allows(
    fs_client: firestore.Client,
) -> None:
    """Five instances (stores of their own) decide twelve node faults at once against a budget of
    three: budgets are read without a lock and written on condition that they are as read, so
    no two decisions deadlock on them and none claims over another's claim: exactly three claim a
    slot, the rest are held."""
    from pitstop.core.classify import Classifier

    pol = make_policy(
        clusters=[{**CLUSTER, "size": 12}], budgets={"cluster": {"max_nodes": 3, "max_percent": 100}}
    )
    stores = [IncidentStore(fs_client, "pitstop") for _ in range(5)]
    clf = Classifier.default()
    evs: list[FaultEvent] = [
        {**clf.classify(entry(XID79, f"a3-node-{i:03d}", 1)), "_observed_ts": T0} for i in range(12)
    ]
    barrier = threading.Barrier(12)

    def go(i: int) -> str:
        barrier.wait()
        return stores[i % 5].apply(evs[i], pol, T0).result

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(go, range(12)))
    assert sorted(results) == ["held"] * 9 + ["opened"] * 3
    budget = stores[0].records.budget("cluster-train")
    assert budget is not None and len(budget["slots"]) == 3


@pytest.mark.parametrize("before", ["absent", "one slot taken"])
def test_a_budget_claimed_between_a_decisions_read_and_its_commit_makes_it_decide_again(
    fs_client: firestore.Client, monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    """Another instance takes the last slot after this decision read the budget (absent, or
    holding one slot) and before it commits: the commit is refused (the budget is not as read)
    and the decision runs again on the budget as it now stands (held), instead of writing over
    the other's claim: two slots, not three."""
    from pitstop.adapters import firestore_commit
    from pitstop.core.classify import Classifier

    pol = make_policy(
        clusters=[{**CLUSTER, "size": 12}], budgets={"cluster": {"max_nodes": 2, "max_percent": 100}}
    )
    mine, other = IncidentStore(fs_client, "pitstop"), IncidentStore(fs_client, "pitstop")
    clf = Classifier.default()

    def fault(node: str) -> FaultEvent:
        return {**clf.classify(entry(XID79, node, 1)), "_observed_ts": T0}

    cut_in = ["a3-node-071", "a3-node-072"]
    if before == "one slot taken":
        assert other.apply(fault(cut_in.pop(0)), pol, T0).result == "opened"
    plain_read, armed = firestore_commit.LazyBudgets.__getitem__, [True]

    def read_then_cut_in(self: Any, key: str) -> Budget | None:
        doc = plain_read(self, key)
        if armed.pop() if armed else False:  # once: the other instance claims what is left
            for node in cut_in:
                assert other.apply(fault(node), pol, T0).result == "opened"
        return doc

    monkeypatch.setattr(firestore_commit.LazyBudgets, "__getitem__", read_then_cut_in)
    assert mine.apply(fault("a3-node-074"), pol, T0).result == "held"
    assert mine.tally.retries >= 1
    budget = mine.records.budget("cluster-train")
    assert budget is not None and sorted(budget["slots"]) == sorted(
        i["id"] for i in mine.query() if i["state"] != "HELD"
    )
    assert len(budget["slots"]) == 2


def test_a_node_opened_by_another_instance_between_a_decisions_read_and_its_commit_is_absorbed_into(
    fs_client: firestore.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instances open the same node's incident at once: the one whose commit comes second
    finds the node no longer as it read it (absent), decides again and absorbs its line into the
    other's incident: one incident, both lines counted, one slot claimed."""
    from pitstop.adapters import firestore_commit
    from pitstop.core.classify import Classifier

    pol = make_policy(clusters=[{**CLUSTER, "size": 12}])
    mine, other = IncidentStore(fs_client, "pitstop"), IncidentStore(fs_client, "pitstop")
    clf = Classifier.default()
    lines: list[FaultEvent] = [
        {**clf.classify(entry(XID79, "a3-node-075", n)), "_observed_ts": T0} for n in (1, 2)
    ]
    plain_read, armed = firestore_commit.LazyBudgets.__getitem__, [True]

    def read_then_cut_in(self: Any, key: str) -> Budget | None:
        doc = plain_read(self, key)
        if armed.pop() if armed else False:  # once: the other instance opens the node's incident
            assert other.apply(lines[1], pol, T0).result == "opened"
        return doc

    monkeypatch.setattr(firestore_commit.LazyBudgets, "__getitem__", read_then_cut_in)
    assert mine.apply(lines[0], pol, T0).result == "absorbed"
    assert mine.tally.retries >= 1
    (inc,) = mine.query()
    assert inc["counts"]["events"] == 2
    budget = mine.records.budget("cluster-train")
    assert budget is not None and list(budget["slots"]) == [inc["id"]]


def test_a_shutdown_flush_waits_for_the_timers_write_and_takes_what_came_after() -> None:
    """The timer writes every due node's counts in one page write; lines counted while that write
    is under way are buffered when SIGTERM's flush_all runs, which writes them itself and returns
    only once the timer's write has finished (nothing left to a thread that dies with the instance)."""
    from pitstop.adapters.memory_counts import MemoryCounts
    from pitstop.adapters.memory_records import MemoryDocs
    from pitstop.adapters.memory_store import MemoryStore
    from pitstop.core.classify import Classifier
    from pitstop.services.coalesce import DIRECT_LINES, Coalescer

    class SlowFirstMerge(MemoryCounts):
        def __init__(self, docs: MemoryDocs) -> None:
            super().__init__(docs)
            self.entered, self.go_on, self.calls = threading.Event(), threading.Event(), 0

        def put_shards(self, *args: Any, **kwargs: Any) -> None:
            self.calls += 1
            if self.calls == 1:
                self.entered.set()
                assert self.go_on.wait(30)
            super().put_shards(*args, **kwargs)

    pol, store, clf = make_policy(), MemoryStore(), Classifier.default()
    slow = store.counts = SlowFirstMerge(store.docs)
    coal = Coalescer(store, pol, clock=lambda: T0)
    coal.timer = False
    nodes = [f"a3-node-{i:03d}" for i in range(80, 83)]
    for n in range(DIRECT_LINES + 3):
        for node in nodes:
            ev: FaultEvent = {**clf.classify(entry(XID94, node, n)), "_observed_ts": T0}
            coal.handle(ev, T0)
    assert coal.stats()["buffered_nodes"] == 3
    later = T0 + 60
    timer = threading.Thread(target=coal.flush_due, args=(later,))
    timer.start()
    assert slow.entered.wait(30)  # the timer is inside its write, of all three nodes' counts
    assert coal.stats()["buffered_nodes"] == 0
    for n in range(100, 102):  # counted meanwhile
        coal.handle({**clf.classify(entry(XID94, nodes[0], n)), "_observed_ts": later}, later)
    assert coal.stats()["buffered_nodes"] == 1
    merged_by_flush: list[int] = []
    flushed = threading.Thread(target=lambda: merged_by_flush.append(coal.flush_all(later)))
    flushed.start()
    while coal.stats()["buffered_nodes"]:  # flush_all takes the node counted meanwhile
        time.sleep(0.01)
    slow.go_on.set()
    timer.join(30)
    flushed.join(30)
    assert merged_by_flush == [1]
    total = sum(i["counts"]["events"] for i in store.query())
    assert total == 3 * (DIRECT_LINES + 3) + 2 and slow.calls == 2  # one write per flush, not per node


def test_counts_buffered_at_exit_are_merged_by_the_exit_hook() -> None:
    """main.py merges what an instance buffers from an atexit hook (gunicorn's worker exits on
    SIGTERM), where no executor takes work any more: every count still reaches the store."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = """
import atexit
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import policy
from pitstop.core.classify import Classifier
from pitstop.services.coalesce import Coalescer
from tests.helpers import ops_agent_entry

line = XID_LINE
pol = policy.from_doc({"mode": "enforce"})
store = MemoryStore()
coal = Coalescer(store, pol, clock=lambda: 1.8e9)
coal.timer = False
for n in range(12):
    for node in range(20):
        entry = ops_agent_entry(line, instance=f"a3-node-{node:03d}", insert_id=f"{node}-{n}")
        coal.handle({**Classifier.default().classify(entry), "_observed_ts": 1.8e9}, 1.8e9)

def at_exit():
    coal.flush_all(1.8e9 + 60)
    print(sum(i["counts"]["events"] for i in store.query()), flush=True)

atexit.register(at_exit)
""".replace("XID_LINE", repr(XID94))
    env = {**os.environ, "PYTHONPATH": f"{root / 'functions'}:{root}"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=root
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(12 * 20)]
