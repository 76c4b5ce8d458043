"""Storm counts in shards (services/count_shards.py) through the memory store: no line is lost
when a store call fails and the delivery or the write is tried again (issue 23's two missing lines)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from pitstop.adapters.memory_counts import MemoryCounts
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, policy
from pitstop.core.aggregate import CloseByPerson
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.services.coalesce import DIRECT_LINES, Coalescer
from pitstop.services.count_checks import VERIFY_S
from tests.helpers import ops_agent_entry

T0 = 1_800_000_000.0
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
XID94 = (
    "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
)
NODE = "a3-node-070"
CLF = Classifier.default()


def line(n: int, ts: float) -> FaultEvent:
    """One Xid 94 line of NODE logged at ``ts``, as ingest hands it to the coalescer."""
    return {
        **CLF.classify(ops_agent_entry(XID94, instance=NODE, insert_id=f"{NODE}-{n}")),
        "_observed_ts": ts,
    }


def counted(store: MemoryStore) -> int:
    return sum(i["counts"]["events"] for i in store.query())


class Flaky(MemoryStore):
    """A memory store whose decisions or shard writes fail while told to (Firestore trouble)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_apply = False
        self.hold_shard: str | None = None  # a shard whose next write waits for ``go_on``, then fails
        self.inside, self.go_on = threading.Event(), threading.Event()
        self.counts = FlakyShards(self)

    def apply(self, ev: Any, pol: policy.Policy, now: float, countable: Any = None) -> engine.Outcome:
        if self.fail_apply:
            raise TimeoutError("store unavailable")
        return super().apply(ev, pol, now, countable)


class FlakyShards(MemoryCounts):
    """The flaky store's counts: a held shard's write waits, then fails."""

    def __init__(self, store: Flaky) -> None:
        super().__init__(store.docs)
        self.store = store

    def put_shards(self, pages: Any) -> None:
        st = self.store
        if any(st.hold_shard in shards for shards in pages.values()):
            st.hold_shard = None
            st.inside.set()
            assert st.go_on.wait(30)
            raise TimeoutError("shard write lost")
        super().put_shards(pages)


def storm_start(store: MemoryStore, lines: int) -> tuple[Coalescer, str]:
    """An incident on NODE with its first lines committed and ``lines`` more counted in memory."""
    coal = Coalescer(store, policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]}), clock=lambda: T0)
    coal.timer = False
    for n in range(DIRECT_LINES + lines):
        coal.handle(line(n, T0), T0)
    (inc,) = store.query()
    return coal, inc["id"]


def test_a_replay_that_failed_takes_its_line_out_of_the_old_shard_once() -> None:
    """A line written into an incident closed meanwhile is taken out of the old shard and replayed;
    the replay's store call fails (as the decisions that answered 500 did), and the next check
    replays it again. Before the fix that check took the line out of the shard a second time: one
    line lost per failed replay."""
    store = Flaky()
    coal, old = storm_start(store, 5)
    coal.flush_all(T0)
    assert store.decide(old, CloseByPerson("ops", False), None, T0 + 1).result == "closed"
    for n in range(100, 105):  # logged after the close; the cache (read at T0) still says OPEN
        assert coal.handle(line(n, T0 + 2), T0 + 2).coalesced
    store.fail_apply = True
    coal.flush_all(T0 + 3)  # written; the resolved feed names the incident: the replay fails
    assert counted(store) == DIRECT_LINES + 10 - 1  # the replayed line is out of the old shard, not in yet
    store.fail_apply = False
    coal.flush_due(T0 + 3 + VERIFY_S)  # the safety net checks it again: replayed
    incidents = store.query()
    assert len(incidents) == 2 and counted(store) == DIRECT_LINES + 10


def test_a_failed_write_of_an_old_incidents_shard_is_written_after_the_new_ones() -> None:
    """A shard write fails while the node has moved on to a new incident (and a new shard, written
    since): the old shard's snapshot is kept and written again later. Before the fix its number
    was compared with the new shard's newest write and it was dropped as outdated: its lines lost."""
    store = Flaky()
    coal, old = storm_start(store, 5)
    store.hold_shard = f"{coal.writer.instance}-1"  # the old incident's shard
    first = threading.Thread(target=coal.flush_all, args=(T0,))
    first.start()
    assert store.inside.wait(30)  # its write is under way
    assert store.decide(old, CloseByPerson("ops", False), None, T0 + 1).result == "closed"
    later = T0 + 10  # the cache is stale: the next line reads the node's incident again
    for n in range(200, 200 + DIRECT_LINES + 5):  # a new incident: its first lines, then counted
        coal.handle(line(n, later), later)
    second = threading.Thread(target=coal.flush_all, args=(later,))
    second.start()  # the new shard's write waits for the node (the old write holds it)
    store.go_on.set()  # the old write fails
    first.join(30)
    second.join(30)
    coal.flush_all(later + 1)  # what failed is written now
    assert len(store.query()) == 2 and counted(store) == 2 * (DIRECT_LINES + 5)


class SlowRead(MemoryStore):
    """A memory store whose next incident read waits for ``go_on`` once armed (a slow Firestore),
    and which runs ``after_node_read`` once after a node's latest incident was read."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.inside, self.go_on = threading.Event(), threading.Event()
        self.after_node_read: Callable[[], object] | None = None
        self.counts = SlowReads(self)


class SlowReads(MemoryCounts):
    """The slow store's reads (decisions read incidents through them too)."""

    def __init__(self, store: SlowRead) -> None:
        super().__init__(store.docs)
        self.store = store

    def as_decided(self, iid: str) -> Any:
        st = self.store
        if st.hold:
            st.hold = False
            st.inside.set()
            assert st.go_on.wait(30)
        return super().as_decided(iid)

    def latest(self, nkey: str) -> Any:
        out = super().latest(nkey)
        then, self.store.after_node_read = self.store.after_node_read, None
        if then is not None:
            then()
        return out


def coalescer(store: MemoryStore, clock: Callable[[], float]) -> Coalescer:
    coal = Coalescer(
        store, policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]}), clock, ack_deadline_s=60
    )
    coal.timer = False
    return coal


def test_a_delivery_answered_past_its_ack_deadline_leaves_the_line_to_its_redelivery() -> None:
    """Pub/Sub times a push out at the ack deadline and delivers the message again, here to another
    instance, which counts the copy in memory. The first delivery waited on a slow read of its
    incident meanwhile; before the fix it counted the line too once the read came back (one line
    counted twice); now it counts nothing ("late") and the copy's count is the only one."""
    store, now = SlowRead(), [T0]
    a, b = coalescer(store, lambda: now[0]), coalescer(store, lambda: now[0])
    for n in range(DIRECT_LINES):
        a.handle(line(n, T0), T0)  # a opened the incident and committed its first lines
    arrived = now[0] = T0 + 10  # a's cache is stale: the line reads its incident again
    store.hold = True
    first: list[engine.Outcome] = []
    slow = threading.Thread(target=lambda: first.append(a.handle(line(50, arrived), arrived)))
    slow.start()
    assert store.inside.wait(30)  # the first delivery is inside its slow read
    now[0] = arrived + 61  # past the 60 s deadline: Pub/Sub redelivers it, to b
    assert b.handle(line(50, arrived), now[0]).coalesced
    store.go_on.set()
    slow.join(30)
    assert [o.result for o in first] == ["late"]
    a.flush_all(now[0])
    b.flush_all(now[0])
    assert counted(store) == DIRECT_LINES + 1


def test_an_instance_that_lost_the_race_to_open_an_incident_counts_its_line_in_memory() -> None:
    """Two instances meet a node's first lines at once: both read no incident, one opens it. The
    other's decision reads the node again and finds the incident, which absorbs the line: counted
    in memory, nothing written (before, it committed the line, as every instance of a storm did
    with its first line of each node: ten commits per node at ten instances)."""
    store, now = SlowRead(), [T0]
    a, b = coalescer(store, lambda: now[0]), coalescer(store, lambda: now[0])
    opened: list[engine.Outcome] = []
    store.after_node_read = lambda: opened.append(a.handle(line(0, T0), T0))  # a opens it meanwhile
    out = b.handle(line(1, T0), T0)  # b read no incident
    assert [o.result for o in opened] == ["opened"]
    writes = store.tally.writes
    assert out.result == "absorbed" and out.coalesced and store.tally.writes == writes
    b.flush_all(T0)
    assert counted(store) == 2


def test_jitter_leaves_the_shared_random_sequence_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coalescer's pauses and the store's retry backoff run on any thread, the timer on its
    own: drawn from the shared ``random`` they moved other threads' sequences mid-use (Hypothesis
    warned that its strategies used ``random`` when a timer left by an earlier test drew meanwhile).
    Only this thread's draws are looked at: another test's leftover thread may draw meanwhile."""
    import random
    from unittest import mock

    from google.api_core import exceptions as gexc

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.services.coalesce import Crowd

    me, shared = threading.get_ident(), []
    draw = random.uniform

    def watched(a: float, b: float) -> float:
        if threading.get_ident() == me:
            shared.append((a, b))
        return draw(a, b)

    monkeypatch.setattr(random, "uniform", watched)
    crowd = Crowd(wait_s=0.001)
    with crowd.inflight.held(), crowd.inflight.held():
        assert crowd.pause()  # crowded: it drew a pause
    store = IncidentStore(mock.MagicMock())  # only its retry loop runs: no database needed
    lost = iter([gexc.Conflict("contention"), None])  # type: ignore[no-untyped-call]

    def once() -> str:
        err = next(lost)
        if err is not None:
            raise err
        return "done"

    assert store._turns.serialised("n", False, once) == "done"
    assert store.tally.retries == 1  # it drew a backoff
    assert shared == []


def test_a_policy_put_in_force_reaches_every_part_of_the_coalescer() -> None:
    """The runtime control swaps the coalescer's policy (services/ingest.py ``in_force``). Its
    parts each hold it (services/count_rule.py, count_shards.py, count_checks.py): a swap that
    missed one would count, write or replay under the policy no longer in force. Here the shard
    written after the swap extends the burst by the new policy's silence window."""

    class Pages(MemoryCounts):
        written: list[Any]

        def put_shards(self, pages: Any) -> None:
            self.written.extend(shard for page in pages.values() for shard in page.values())
            super().put_shards(pages)

    store = MemoryStore()
    pages = store.counts = Pages(store.docs)
    pages.written = []
    coal = coalescer(store, lambda: T0)
    for n in range(DIRECT_LINES + 2):
        coal.handle(line(n, T0), T0)
    new = policy.from_doc({"mode": "enforce", "clusters": [CLUSTER], "windows": {"burst_silence_s": 4321}})
    assert new.window("burst_silence_s") != coal.policy.window("burst_silence_s")
    coal.policy = new
    assert coal.counter.policy is new and coal.checker.policy is new
    coal.flush_all(T0)
    (shard,) = pages.written
    assert shard["burst_until"] == shard["last_seen"] + 4321
    assert counted(store) == DIRECT_LINES + 2
