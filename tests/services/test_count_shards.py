"""Storm counts in shards (services/count_shards.py) through the memory store: no line is lost
when a store call fails and the delivery or the write is tried again (issue 23's two missing lines)."""

from __future__ import annotations

import threading
from typing import Any

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import engine, policy
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.services.coalesce import DIRECT_LINES, Coalescer
from pitstop.services.count_shards import VERIFY_S
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
    return sum(i["counts"]["events"] for i in store.list())


class Flaky(MemoryStore):
    """A memory store whose decisions or shard writes fail while told to (Firestore trouble)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_apply = False
        self.hold_shard: str | None = None  # a shard whose next write waits for ``go_on``, then fails
        self.inside, self.go_on = threading.Event(), threading.Event()

    def apply(self, ev: Any, pol: policy.Policy, now: float, countable: Any = None) -> engine.Outcome:
        if self.fail_apply:
            raise TimeoutError("store unavailable")
        return super().apply(ev, pol, now, countable)

    def put_count_shards(self, pages: Any) -> None:
        if any(self.hold_shard in shards for shards in pages.values()):
            self.hold_shard = None
            self.inside.set()
            assert self.go_on.wait(30)
            raise TimeoutError("shard write lost")
        super().put_count_shards(pages)


def storm_start(store: MemoryStore, lines: int) -> tuple[Coalescer, str]:
    """An incident on NODE with its first lines committed and ``lines`` more counted in memory."""
    coal = Coalescer(store, policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]}), clock=lambda: T0)
    coal.timer = False
    for n in range(DIRECT_LINES + lines):
        coal.handle(line(n, T0), T0)
    (inc,) = store.list()
    return coal, inc["id"]


def test_a_replay_that_failed_takes_its_line_out_of_the_old_shard_once() -> None:
    """A line written into an incident closed meanwhile is taken out of the old shard and replayed;
    the replay's store call fails (as the decisions that answered 500 did), and the next check
    replays it again. Before the fix that check took the line out of the shard a second time: one
    line lost per failed replay."""
    store = Flaky()
    coal, old = storm_start(store, 5)
    coal.flush_all(T0)
    assert store.close(old, "ops", T0 + 1, unfence=False).result == "closed"
    for n in range(100, 105):  # logged after the close; the cache (read at T0) still says OPEN
        assert coal.handle(line(n, T0 + 2), T0 + 2).coalesced
    store.fail_apply = True
    coal.flush_all(T0 + 3)  # written; the resolved feed names the incident: the replay fails
    assert counted(store) == DIRECT_LINES + 10 - 1  # the replayed line is out of the old shard, not in yet
    store.fail_apply = False
    coal.flush_due(T0 + 3 + VERIFY_S)  # the safety net checks it again: replayed
    incidents = store.list()
    assert len(incidents) == 2 and counted(store) == DIRECT_LINES + 10


def test_a_failed_write_of_an_old_incidents_shard_is_written_after_the_new_ones() -> None:
    """A shard write fails while the node has moved on to a new incident (and a new shard, written
    since): the old shard's snapshot is kept and written again later. Before the fix its number
    was compared with the new shard's newest write and it was dropped as outdated: its lines lost."""
    store = Flaky()
    coal, old = storm_start(store, 5)
    store.hold_shard = f"{coal.instance}-1"  # the old incident's shard
    first = threading.Thread(target=coal.flush_all, args=(T0,))
    first.start()
    assert store.inside.wait(30)  # its write is under way
    assert store.close(old, "ops", T0 + 1, unfence=False).result == "closed"
    later = T0 + 10  # the cache is stale: the next line reads the node's incident again
    for n in range(200, 200 + DIRECT_LINES + 5):  # a new incident: its first lines, then counted
        coal.handle(line(n, later), later)
    second = threading.Thread(target=coal.flush_all, args=(later,))
    second.start()  # the new shard's write waits for the node (the old write holds it)
    store.go_on.set()  # the old write fails
    first.join(30)
    second.join(30)
    coal.flush_all(later + 1)  # what failed is written now
    assert len(store.list()) == 2 and counted(store) == 2 * (DIRECT_LINES + 5)
