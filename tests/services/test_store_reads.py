"""What a storm's decisions read and write (issue 23: at most 0.05 Firestore operations per line at
ten instances), counted at the client as Firestore bills them (tools/firestore_ops.py), on the
emulator. Each test names the operation it removed; each fails on the code that made it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from google.cloud import firestore

from pitstop.adapters.firestore import QUEUED_S, IncidentStore
from pitstop.core import engine
from pitstop.core.aggregate import At, ClaimStep, CloseByPerson, LeaseStart, RecordStarted
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.services.coalesce import DIRECT_LINES, Coalescer
from pitstop.tools.firestore_ops import FirestoreOps
from tests.services.test_store_ingest import CLUSTER, T0, XID79, XID94, entry, make_policy

pytestmark = pytest.mark.emulator

CLF = Classifier.default()


def _event(line: str, node: str, n: int) -> FaultEvent:
    return {**CLF.classify(entry(line, node, n)), "_observed_ts": T0}


def _counted(fs: firestore.Client) -> tuple[IncidentStore, FirestoreOps]:
    """A store with a client of its own (another instance), whose operations are counted."""
    client = firestore.Client(project=fs.project)
    return IncidentStore(client, "pitstop"), FirestoreOps(client)


def _delta(ops: FirestoreOps, act: Callable[[], object]) -> dict[str, int]:
    before = dict(ops.by_collection)
    act()
    return {k: n - before.get(k, 0) for k, n in ops.by_collection.items() if n != before.get(k, 0)}


def test_a_start_is_leased_and_recorded_with_a_write_each_and_no_read(fs_client: firestore.Client) -> None:
    """The decision that schedules a step wrote the incident a moment before: its lease and its
    record are writes conditioned on that (a transaction each read the incident first)."""
    store, ops = _counted(fs_client)
    out = store.apply(_event(XID79, "a3-node-101", 1), make_policy(), T0)
    assert out.incident is not None and out.start_step == 1
    iid = out.incident["id"]
    leased = _delta(ops, lambda: store.decide(iid, LeaseStart(1), None, T0))
    recorded = _delta(ops, lambda: store.decide(iid, RecordStarted(1, "exec-1"), None, T0 + 1))
    assert (leased, recorded) == ({"write:pitstop_incidents": 1}, {"write:pitstop_incidents": 1})
    inc = store.get(iid)
    assert inc is not None and inc["workflow"] is not None
    assert (inc["workflow"]["state"], inc["workflow"]["execution"]) == ("started", "exec-1")


def test_a_lease_taken_elsewhere_since_this_instance_wrote_the_incident_holds(
    fs_client: firestore.Client,
) -> None:
    """The lease's condition is the incident's update time: another instance that leased the step
    meanwhile makes this one read again, and find the lease (one starter, as before)."""
    mine, _ = _counted(fs_client)
    other = IncidentStore(fs_client, "pitstop")
    out = mine.apply(_event(XID79, "a3-node-102", 1), make_policy(), T0)
    assert out.incident is not None
    iid = out.incident["id"]
    assert other.decide(iid, LeaseStart(1), None, T0).result == "leased"
    assert (
        mine.decide(iid, LeaseStart(1), None, T0).result != "leased"
    )  # refused on its memory, then read: leased
    other.decide(iid, RecordStarted(1, "exec-2"), None, T0 + 1)
    mine.decide(
        iid, RecordStarted(1, "exec-3"), None, T0 + 2
    )  # a late record of the same step still lands once
    inc = mine.get(iid)
    assert inc is not None and inc["workflow"] is not None and inc["workflow"]["state"] == "started"


def test_a_claim_refused_on_this_instance_s_copy_is_decided_again_on_a_fresh_read(
    fs_client: firestore.Client,
) -> None:
    """Seen in a CI run: actuate had just written step 1 of an incident (an Xid 31, notify-only);
    ingest raised it to step 2 on an Xid 79 of the same burst; step 2's claim, decided on actuate's
    copy of a moment before, was refused "superseded by step 1" (a refusal writes nothing, so no
    write condition caught the stale read); the execution ended, the incident failed and paged."""
    mine, _ = _counted(fs_client)
    other = IncidentStore(fs_client, "pitstop")
    xid31 = "NVRM: Xid (PCI:0000:b5:00): 31, pid=2512, name=python3, Ch 00000008, MMU Fault: ENGINE GRAPHICS"
    out = mine.apply(_event(xid31, "a3-node-103", 1), make_policy(), T0)
    assert out.incident is not None and out.incident["step"] == 1
    iid = out.incident["id"]
    raised = other.apply(_event(XID79, "a3-node-103", 2), make_policy(), T0 + 1)
    assert raised.result == "raised" and raised.incident is not None and raised.incident["step"] == 2
    claimed = mine.decide(iid, ClaimStep(At(2, "exec-2")), None, T0 + 2)
    assert (claimed.result, claimed.refused) == ("claimed", None)


def test_holds_in_a_row_read_the_budget_once(fs_client: firestore.Client) -> None:
    """A storm's holds each read the cluster's budget (a hold writes it only when it pages): now
    a decision reads it as this instance saw it lately; its write stays conditioned."""
    pol = make_policy(clusters=[{**CLUSTER, "size": 1}])
    store, ops = _counted(fs_client)
    first = store.apply(_event(XID79, "a3-node-103", 1), pol, T0)
    assert first.result == "opened"
    reads = []
    for n in range(3):
        line = _event(XID79, f"a3-node-{104 + n}", 1)

        def hold(line: FaultEvent = line) -> object:
            return store.apply(line, pol, T0)

        reads.append(_delta(ops, hold).get("read:pitstop_budgets", 0))
    assert reads == [0, 0, 0]  # the opener's claim wrote it, and this instance remembers it
    held = [i for i in store.query() if i["state"] == "HELD"]
    assert len(held) == 3


def test_a_refused_open_counted_after_all_reads_no_delivery_record(fs_client: firestore.Client) -> None:
    """Two instances open one node at once; the second's commit is refused and, on fresh reads,
    finds the line countable in the first's incident: it reads no delivery record (only a line
    that must be decided needs one). The coalescer then counts it only if the incident has not
    got it already (its recent keys: a copy of a line the first committed is a duplicate)."""
    mine, ops = _counted(fs_client)
    other = IncidentStore(fs_client, "pitstop")
    pol = make_policy()
    nkey = engine.subject_key(_event(XID94, "a3-node-108", 0))
    assert mine.counts.latest(nkey) is None  # mine has read the node: no incident
    for n in range(1, 6):  # the other opens it, and commits its first lines
        other.apply(_event(XID94, "a3-node-108", n), pol, T0)
    outs: list[engine.Outcome] = []
    line = _event(XID94, "a3-node-108", 9)
    spent = _delta(ops, lambda: outs.append(mine.apply(line, pol, T0, lambda i: i is not None)))
    assert outs[0].coalesced and mine.tally.refused == 1 and "read:pitstop_dedup" not in spent
    coal = Coalescer(mine, pol, clock=lambda: T0)
    coal.timer = False
    st, _ = coal.memory.admit(nkey, T0)
    copy = _event(XID94, "a3-node-108", 1)
    assert coal._apply(st, copy, engine.event_key(copy), T0).result == "duplicate"


def test_a_decision_that_waited_finds_a_new_incident_another_instance_opened(
    fs_client: firestore.Client,
) -> None:
    """A decision that waited its turn on a node that named no incident when last read: another
    instance opened one meanwhile. The node and its incident are read again (two reads, grouped
    with any first contact asked meanwhile) and the line is counted in memory, with no commit."""
    mine, ops = _counted(fs_client)
    other = IncidentStore(fs_client, "pitstop")
    pol = make_policy()
    line = _event(XID94, "a3-node-109", 1)
    nkey = engine.subject_key(line)
    assert mine.counts.latest(nkey) is None
    asked = time.monotonic()
    opened = threading.Thread(target=lambda: other.apply(_event(XID94, "a3-node-109", 2), pol, T0))
    opened.start()
    opened.join()
    while time.monotonic() - asked <= 2 * QUEUED_S:  # its turn comes late
        time.sleep(QUEUED_S)
    waited, get_all = time.monotonic() - asked, mine.db.get_all

    def slow(refs: list[Any], *a: Any, **kw: Any) -> Any:  # the lookup takes longer than the wait
        if refs and refs[0].parent.id.endswith("_incidents"):
            time.sleep(waited + QUEUED_S)
        return get_all(refs, *a, **kw)

    mine.db.get_all = slow
    outs: list[engine.Outcome] = []
    spent = _delta(ops, lambda: outs.append(mine._apply(line, pol, T0, lambda inc: inc is not None, asked)))
    assert spent == {"read:pitstop_nodes": 1, "read:pitstop_incidents": 1}  # the lookup's, used as read
    assert outs[0].result == "absorbed" and outs[0].coalesced


def test_a_decision_leaves_the_counts_buffered_before_it_in_memory(fs_client: firestore.Client) -> None:
    """A line that must be decided (here a stronger one, raising the incident) wrote the node's
    buffered counts first, and then read them back to check them: a decision reads no count
    shard, so they wait for the timer's write like the rest (one write per page and interval)."""
    store, ops = _counted(fs_client)
    pol = make_policy()
    coal = Coalescer(store, pol, clock=lambda: T0)
    coal.timer = False
    for n in range(DIRECT_LINES + 5):  # the first lines committed, then five counted in memory
        coal.handle(_event(XID94, "a3-node-110", n), T0)
    raised: list[engine.Outcome] = []
    spent = _delta(ops, lambda: raised.append(coal.handle(_event(XID79, "a3-node-110", 99), T0)))
    assert raised[0].result == "raised"
    assert "write:pitstop_counts" not in spent and "read:pitstop_incidents" not in spent
    coal.flush_all(T0)
    (inc,) = store.query()
    assert inc["counts"]["events"] == DIRECT_LINES + 5 + 1


class _FirstWait(threading.Event):
    """The timer's stop event: its first wait records whether the feed was looked at by then, and
    ends the timer (no clock involved)."""

    def __init__(self, coal: Coalescer) -> None:
        super().__init__()
        self.coal = coal
        self.looked: list[bool] = []
        self.waited = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.looked.append(self.coal.checker.watching(time.time()))
        self.waited.set()
        return True


def test_the_timer_watches_the_resolved_feed_from_its_start(fs_client: firestore.Client) -> None:
    """Until its first look at the resolved feed, an instance checked every count it wrote by
    reading the incident at once; the first look waited a tick (seconds, a storm's busiest). Now
    the timer has looked before it first waits."""
    store, _ = _counted(fs_client)
    coal = Coalescer(store, make_policy())
    first = _FirstWait(coal)
    coal.flusher.stopped = first
    for n in range(DIRECT_LINES + 1):  # the last one counted in memory starts the timer
        coal.handle(_event(XID94, "a3-node-111", n), time.time())
    assert first.waited.wait(30)  # the timer reached its first wait
    assert first.looked == [True]


def test_a_budget_a_decision_wrote_is_what_the_next_decision_reads(fs_client: firestore.Client) -> None:
    """Decisions read budgets as this instance last saw them: a release (here a person's close) is
    written in the decision's batch and kept as written, so the next decision never decides on the
    snapshot from before it (where the slot was still active)."""
    pol = make_policy(clusters=[{**CLUSTER, "size": 1}])
    store, ops = _counted(fs_client)
    first = store.apply(_event(XID79, "a3-node-112", 1), pol, T0)
    assert first.result == "opened" and first.incident is not None
    iid = first.incident["id"]
    held = _delta(ops, lambda: store.apply(_event(XID79, "a3-node-113", 1), pol, T0))
    assert "read:pitstop_budgets" not in held  # as the claim wrote it
    assert store.decide(iid, CloseByPerson("ops", unfence=False), None, T0).result == "closed"
    ref = store.collections.budgets.document("cluster-train")  # CLUSTER's
    stored = ref.get().to_dict()
    assert stored is not None and stored["slots"][iid]["active"] is False
    cached = store.snaps.get(ref.path, 60.0)
    assert cached is not None and cached.to_dict() == stored
