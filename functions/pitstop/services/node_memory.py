"""What an ingest instance's coalescer (services/coalesce.py) remembers between deliveries: the
node states it counts into and the delivery keys it has seen, both bounded, under one lock.

The lock is the coalescer's one lock: counting a line, detaching a snapshot to write
(services/count_shards.py) and checking written lines (services/count_checks.py) each change a
node state, the set of nodes with counts buffered and the seen keys together, so they hold it
across all three. Methods and attributes here say "under the lock" where the caller holds it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pitstop.core import engine
from pitstop.core.answers import SlimIncident
from pitstop.core.domain import Deltas, FaultEvent

IDLE_S = 600.0  # a node state untouched this long, with nothing buffered, is dropped


@dataclass
class NodeState:
    """One node as this instance knows it: its cached incident, and the shard it counts into."""

    latest: SlimIncident | None  # the cached (slim) incident
    fetched_at: float
    last_flush: float
    touched: float
    deltas: Deltas = field(default_factory=engine.empty_deltas)  # the shard's totals
    representative: FaultEvent | None = None  # strongest line counted since the last write
    buffered: int = 0  # lines counted since the last write
    shard: str = ""  # this state's shard of ``shard_iid``
    shard_iid: str | None = None
    opened: str | None = None  # the incident this instance opened (it commits the first lines)
    page: str = ""  # the instance's document that holds the shard (PAGE_SHARDS shards each)
    seq: int = 0  # snapshots taken of this state's shards
    # The newest snapshot written, per shard: a snapshot of an older incident's shard that failed
    # and is written again later is compared with its own shard's writes, not the new shard's.
    written: dict[str, int] = field(default_factory=dict)
    unverified: dict[str, FaultEvent] = field(default_factory=dict)  # incident -> strongest line
    # Lines already taken out of their shard whose replay failed: replayed again, never taken out
    # twice (a failed replay checked again lost one line per failure).
    replays: list[tuple[str, FaultEvent]] = field(default_factory=list)
    written_at: float = 0.0
    lock: threading.RLock = field(default_factory=threading.RLock)  # one check at a time


class SeenKeys:
    """Delivery keys this instance counted or read in an incident's recent keys, the oldest
    forgotten first past ``max``. A set and a deque: half the bytes of an OrderedDict per key."""

    def __init__(self, max_keys: int) -> None:
        self.keys: set[str] = set()
        self.order: deque[str] = deque()  # the same keys, oldest first
        self.max = max_keys

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: str) -> None:
        """Under the lock."""
        if key in self.keys:
            return
        self.keys.add(key)
        self.order.append(key)
        if len(self.order) > self.max:
            self.keys.discard(self.order.popleft())


class NodeMemory:
    """The node states (least recently used first), which of them have counts buffered
    (``pending``), and the seen delivery keys; ``lock`` guards them and every node state's fields."""

    def __init__(self, seen_max: int, max_nodes: int) -> None:
        self.lock = threading.RLock()
        self.nodes: OrderedDict[str, NodeState] = OrderedDict()
        self.pending: set[str] = set()  # nodes with buffered counts
        self.seen = SeenKeys(seen_max)
        self.max_nodes = max_nodes

    def admit(self, nkey: str, now: float) -> tuple[NodeState, list[tuple[str, NodeState]]]:
        """Under the lock: the node's state (new or touched), and the states it evicted (their
        counts still to be written and checked: services/count_flush.py ``Flusher.evict``)."""
        st = self.nodes.get(nkey)
        if st is None:
            st = self.nodes[nkey] = NodeState(None, now, now, now)
        self.nodes.move_to_end(nkey)
        evicted: list[tuple[str, NodeState]] = []
        while len(self.nodes) > self.max_nodes:
            evicted.append(self.nodes.popitem(last=False))
        return st, evicted

    def drop_idle(self, now: float) -> None:
        """Under the lock: drop the node states untouched for ``IDLE_S`` that hold nothing to write
        or check."""
        idle = [k for k, st in self.nodes.items() if _empty(st) and now - st.touched >= IDLE_S]
        for k in idle:
            del self.nodes[k]

    def forget(self, nkey: str | None = None) -> None:
        """Drop cached node states (all, or one), except those with counts still to merge."""
        with self.lock:
            for k in [nkey] if nkey is not None else list(self.nodes):
                st = self.nodes.get(k)
                if st is not None and _empty(st):
                    del self.nodes[k]

    def stats(self) -> dict[str, int]:
        """Sizes of the in-memory maps (bounded; see services/coalesce.py)."""
        with self.lock:
            return {"nodes": len(self.nodes), "seen": len(self.seen), "buffered_nodes": len(self.pending)}


def _empty(st: NodeState) -> bool:
    """Nothing buffered, unchecked or to replay: the state may go (its cache is re-read)."""
    return not st.buffered and not st.unverified and not st.replays
