"""Coalescing storms in memory so that 1 000 000 identical lines cost a handful of writes.

An incident's first lines (``DIRECT_LINES``, as its stored count says) are committed one by one
by the instance that opened it, so an ordinary fault's few lines are counted exactly and at
once; another instance counts them in memory (a storm's first lines reach every instance at once,
and ten instances committed ten lines each per node), and so does the opener while more
deliveries than that are in flight at it (a storm: ``Crowd.storm``). After that, an event that cannot
change anything — its node's latest incident (read from Firestore less than ``cache_ttl_s``
ago, or as this instance last wrote or merged it) absorbs it and it does not raise the
action — is only counted in memory. Such an event asks nothing of Firestore: no read, no
write, no workflow follow-up. A line that must be decided is decided on a view of its incident
at most ``DECIDE_S`` old (else read again first), and the store's decision asks the coalescer
whether the incident as it read it lets the line be counted after all (``countable``: another
instance opened or raised it meanwhile), so a stale cache costs a read, not a commit. The rule
and the count in memory are services/count_rule.py ``LineCounter``.

Buffered counts are written at most every ``flush_interval_s`` per node into the node state's own
count shard, kept in the instance's page documents (``PAGE_SHARDS`` shards each; services/
count_shards.py ``ShardWriter``): every due node of a page in one blind write, no read, no
transaction, so N instances counting into the same incidents never contend, and a storm costs a
write per page and interval, whatever its nodes. Reports, pages and people read the incident
with its shards summed (the store's ``get``/``list``). Whether the incident still absorbs
what was written is checked by a later read of it: when the store's resolved feed (one query per
instance and timer tick) names it, at most ``VERIFY_S`` after a write otherwise, or at once when
no timer runs; if it stopped absorbing (it was resolved), the strongest written line is replayed
through the full path and taken out of the old shard, so no fault is lost to a stale cache
(services/count_checks.py ``CountChecker``). The write happens on the next line of that node once
the interval has passed (no timer), on the instance's own timer (a daemon thread,
:meth:`Coalescer.flush_due`), or at shutdown (:meth:`Coalescer.flush_all`; functions/main.py wires
SIGTERM and atexit), as services/count_flush.py ``Flusher`` schedules it. The cache is trusted
for ``cache_ttl_s`` after a read, and up to ``VERIFY_S`` while the timer watches the feed.

Memory is bounded (services/node_memory.py ``NodeMemory``): at most ``max_nodes`` node states
(least recently used dropped first, after their counts are written and checked; idle ones
dropped after ``IDLE_S``), at most ``seen_max`` delivery keys, and per node one shard's totals
within the engine's bounds (GPUs, Xid codes, evidence, ``MAX_DELTA_KEYS``), so a shard document
is bounded the same way.

Guarantees: incident creation, raises, holds and workflow starts are exactly once (the
store's decision with its dedup record). Event *counts*: an instance that dies without SIGTERM
loses at most one interval of counts (and the replay of a line written in its last interval
into an incident resolved meanwhile), never a decision. A delivery that reaches its count in
memory past the trigger's ack deadline (``ack_deadline_s``, from its arrival here) counts
nothing and answers "late": Pub/Sub has timed it out and delivers it again, maybe to another
instance, which counts the copy in memory without a dedup record, so counting both counted the
line twice (a decision is still made: its dedup record makes it once). So a line whose every
delivery is late is not counted (it is dead-lettered). Still possible: a copy of a line whose
first delivery counted in time but whose answer was lost.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator

from pitstop.core import engine
from pitstop.core.domain import FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.core.store import IncidentStore
from pitstop.services.count_checks import VERIFY_S, CountChecker
from pitstop.services.count_flush import Flusher
from pitstop.services.count_rule import DIRECT_LINES, LineCounter, as_view
from pitstop.services.count_shards import PAGE_SHARDS, ShardWriter, slim
from pitstop.services.node_memory import IDLE_S, NodeMemory, NodeState

MAX_NODES = 10_000  # node states an instance keeps
SEEN_MAX = 100_000  # delivery keys an instance remembers (redeliveries to it are dropped at once)
# Pub/Sub's longest ack deadline: a push not answered by then has been timed out and is delivered
# again whatever the subscription says ("The maximum custom deadline you can specify is 600
# seconds"; for push, the deadline is the request's timeout: cloud.google.com/pubsub/docs/
# reference/rest/v1/projects.subscriptions). Deploy sets the trigger's own (PITSTOP_ACK_DEADLINE_S).
ACK_DEADLINE_S = 600.0
DECIDE_S = 1.0  # a line that must be decided is, on a view of its incident this young (else read again)
# Jitter from a generator of its own: the pauses run on any thread, and a draw from the module's
# shared one there moves another thread's random sequence mid-use.
_JITTER = random.Random()  # noqa: S311 - jitter, not a secret
RACE_WAIT_S = 0.25  # a contested decision waits up to this long while deliveries crowd in (Crowd.pause)
GATE_STRIPES = 1024  # per-node gates for lines that must be decided (node keys hashed onto them)
__all__ = ["DIRECT_LINES", "IDLE_S", "PAGE_SHARDS", "Coalescer", "slim"]


class Gauge:
    """How many are inside right now (``held``). ``value`` is read without the lock: a glance that
    decides a pause or a storm, not a count anything is built on."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            self.value += 1
        try:
            yield
        finally:
            with self._lock:
                self.value -= 1


class Crowd:
    """Deliveries of this instance past the fast path right now (``inflight``), and the pause a
    contested decision takes while they crowd in (services/coalesce.py ``Coalescer._decide``);
    and all its deliveries in flight (``arrivals``), which tell a storm from an ordinary fault's
    few lines."""

    def __init__(self, wait_s: float = RACE_WAIT_S) -> None:
        self.wait_s, self.inflight, self.arrivals = wait_s, Gauge(), Gauge()

    def storm(self) -> bool:
        """More deliveries in flight here than an ordinary fault's first lines (DIRECT_LINES):
        a storm, whose first lines are counted in memory like the rest (LineCounter.countable)."""
        return self.arrivals.value > DIRECT_LINES

    def pause(self) -> bool:
        """Before a contested decision while deliveries crowd in (others in flight here: a storm,
        which Pub/Sub spreads over several instances), wait a random moment of up to ``wait_s``,
        then read again: the instances meeting one node's lines at once then decide in turn, and
        each after the first finds the incident opened or raised already and counts the line in
        memory, where all committed and all but one commit was refused (each refused commit paid
        its writes and three reads; `pitstop bench ingest`). One delivery alone does not wait:
        an ordinary fault is decided at once. True if it waited."""
        crowded = self.inflight.value > 1
        if crowded and self.wait_s > 0:
            time.sleep(_JITTER.uniform(0, self.wait_s))
        return crowded


def read_latest(store: IncidentStore, nkey: str, st: NodeState | None) -> Incident | None:
    """The node's latest incident: one read of the cached one while it is not resolved (a node's
    latest changes only after it is); else the node's document and its latest, grouped with other
    nodes' first contacts (adapters/firestore_latest.py)."""
    cached = st.latest if st is not None else None
    if cached is not None and cached["id"] is not None and cached["state"] != State.RESOLVED:
        inc = store.counts.as_decided(cached["id"])
        if inc is not None and inc.get("state") != State.RESOLVED:
            return inc
    return store.counts.latest(nkey)


class Coalescer:
    """Answers each delivery from memory where its node's cached incident says it changes nothing,
    and through the store's decision otherwise; it owns the per-node gates, the refresh of a stale
    cache and the commit. Its parts: the node states and seen keys (``memory``), the coalescing
    rule and the count in memory (``counter``, services/count_rule.py), the shard writes
    (``writer``), the checks of written lines (``checker``) and when writes happen (``flusher``)."""

    def __init__(
        self,
        store: IncidentStore,
        policy: Policy,
        clock: Callable[[], float] = time.time,
        seen_max: int = SEEN_MAX,
        max_nodes: int = MAX_NODES,
        ack_deadline_s: float = ACK_DEADLINE_S,
        race_wait_s: float = RACE_WAIT_S,
    ) -> None:
        self.store, self._policy, self.clock = store, policy, clock
        self.crowd = Crowd(race_wait_s)
        self.cache_ttl = float(policy.doc["store"]["cache_ttl_s"])
        flush_interval = float(policy.doc["store"]["flush_interval_s"])
        tick_s = max(min(flush_interval / 2, self.cache_ttl), 0.25)
        self.memory = NodeMemory(seen_max, max_nodes)
        self.writer = ShardWriter(store, policy, self.memory)
        self.checker = CountChecker(store, policy, self.memory, self.writer, clock(), tick_s)
        self.flusher = Flusher(self.memory, self.writer, self.checker, clock, flush_interval)
        self.counter = LineCounter(
            policy, self.memory, self.writer, self.flusher, clock, ack_deadline_s, self.crowd.storm
        )
        self._lock = self.memory.lock  # the one lock (services/node_memory.py)
        self._gates = [threading.Lock() for _ in range(GATE_STRIPES)]
        self._applying: dict[str, threading.Event] = {}  # keys in a store transaction right now

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, pol: Policy) -> None:
        """A new policy in force (the runtime control): counting, writing and replays use it."""
        self._policy = self.counter.policy = self.writer.policy = self.checker.policy = pol

    @property
    def coalesced(self) -> int:
        """Lines counted in memory so far (benchmarks)."""
        return self.counter.coalesced

    @property
    def timer(self) -> bool:
        """Whether buffered counts are merged on a daemon thread (off: only lines and flushes merge)."""
        return self.flusher.timer

    @timer.setter
    def timer(self, on: bool) -> None:
        self.flusher.timer = on

    @property
    def on_outcome(self) -> Callable[[engine.Outcome], None] | None:
        """Follow-ups (workflow starts, pages) of events replayed at flush time."""
        return self.checker.on_outcome

    @on_outcome.setter
    def on_outcome(self, then: Callable[[engine.Outcome], None] | None) -> None:
        self.checker.on_outcome = then

    # -- one event -------------------------------------------------------------------

    def handle(self, ev: FaultEvent, now: float) -> engine.Outcome:
        """Count the event in memory if the cached incident says it changes nothing; else decide it.

        Only a line that cannot be counted in memory passes its node's gate, one at a time: it
        reads the node's incident or commits itself, and the lines waiting behind it look at the
        cache again when their turn comes. So the C concurrent first lines of a node make one
        read and the incident's first DIRECT_LINES commits, not C of each.
        """
        key, nkey = engine.event_key(ev), engine.subject_key(ev)
        with self.crowd.arrivals.held():
            counted = self._counted(ev, key, nkey, now)
            if counted is not None:
                return counted
            with self.crowd.inflight.held(), self._gates[hash(nkey) % GATE_STRIPES]:
                counted = self._counted(ev, key, nkey, now)  # the cache may have changed meanwhile
                return counted if counted is not None else self._decide(ev, key, nkey, now)

    def _counted(self, ev: FaultEvent, key: str, nkey: str, now: float) -> engine.Outcome | None:
        """A duplicate, or the event counted in memory by a fresh cache; None: it must be decided."""
        with self._lock:
            if key in self.memory.seen:
                return engine.Outcome("duplicate")
            st = self.memory.nodes.get(nkey)
            if st is None or not self._fresh(st, now):
                return None
            absorbed, job = self.counter.count(st, nkey, ev, key, now, key in self._applying)
        if job is not None:
            self.flusher.write([job], now)
        return absorbed

    def _decide(self, ev: FaultEvent, key: str, nkey: str, now: float) -> engine.Outcome:
        """Behind the node's gate: refresh a stale cache, then count or commit the event. A line to
        decide is decided on a view at most ``DECIDE_S`` old (on the clock: it may have waited at
        the gate), read again (one read, kept for the commit) where another instance may have
        opened or raised the incident; a contested one (:meth:`_contested`) pauses first."""
        with self._lock:
            st = self.memory.nodes.get(nkey)
            at = max(now, self.clock())
            fresh = st is not None and at - st.fetched_at < min(self.cache_ttl, DECIDE_S)
            contested = self._contested(st, ev)
        waited = False
        if not fresh or contested:
            waited = contested and self.crowd.pause()
            st, counted = self._refresh(ev, key, nkey, now, st)
            if counted is not None:
                return counted
        if not waited and self._contested(st, ev) and self.crowd.pause():
            st, counted = self._refresh(ev, key, nkey, now, st)  # contested only as read: read again
            if counted is not None:
                return counted
        assert st is not None
        return self._commit(st, ev, key, now)

    def _refresh(
        self, ev: FaultEvent, key: str, nkey: str, now: float, st: NodeState | None
    ) -> tuple[NodeState, engine.Outcome | None]:
        """Read the node's latest incident into the cache; the event's answer if it now is a
        duplicate or can be counted in memory (None: it must be decided)."""
        latest = read_latest(self.store, nkey, st)  # plain reads: no write to refresh a cache
        with self._lock:
            st, evicted = self.memory.admit(nkey, now)
            st.latest, st.fetched_at = slim(latest), now
            for k in latest.get("recent_keys", []) if latest else []:
                self.memory.seen.add(k)
            dup = key in self.memory.seen
        self.flusher.evict(evicted, now)
        if dup:
            return st, engine.Outcome("duplicate", incident=as_view(slim(latest)))
        with self._lock:
            absorbed, job = self.counter.count(st, nkey, ev, key, now, key in self._applying)
        if job is not None:
            self.flusher.write([job], now)
        return st, absorbed

    def _contested(self, st: NodeState | None, ev: FaultEvent) -> bool:
        """Whether deciding this line may race other instances' on the node: it would open an
        incident (none known, or it is over) or raise one another instance opened."""
        if st is None or st.latest is None or st.latest["state"] == State.RESOLVED:
            return True
        ts = float(ev.get("_observed_ts") or self.clock())
        return st.opened != st.latest["id"] and not self.counter.countable(st, ev, st.latest, ts)

    def _fresh(self, st: NodeState, now: float) -> bool:
        """Whether the cached incident may decide without a read: read less than ``cache_ttl_s``
        ago, or less than ``VERIFY_S`` ago while the resolved feed is watched (a look marks the
        node stale when its incident is resolved)."""
        age = now - st.fetched_at
        return age < self.cache_ttl or (age < VERIFY_S and self.checker.watching(now))

    def _commit(self, st: NodeState, ev: FaultEvent, key: str, now: float) -> engine.Outcome:
        """The full, transactional path; its answer refreshes the cache.

        A redelivery that arrives while this instance still applies its first delivery waits for
        that one instead of racing it in a second transaction on the same documents: then it is
        a duplicate, or (the first failed) it is applied itself.
        """
        while True:
            with self._lock:
                if key in self.memory.seen:
                    return engine.Outcome("duplicate", incident=as_view(st.latest))
                running = self._applying.get(key)
                if running is None:
                    self._applying[key] = threading.Event()
                    break
            running.wait()
        try:
            return self._apply(st, ev, key, now)
        finally:
            with self._lock:
                self._applying.pop(key).set()

    def _apply(self, st: NodeState, ev: FaultEvent, key: str, now: float) -> engine.Outcome:
        """The store decides, unless the incident it reads (fresher than this cache: another
        instance opened or raised it meanwhile) lets the event be counted in memory after all."""
        ts = float(ev.get("_observed_ts") or now)
        out = self.store.apply(
            ev, self._policy, now, countable=lambda inc: self.counter.countable(st, ev, inc, ts)
        )
        if out.coalesced:  # the store decided and wrote nothing
            with self._lock:
                self._learn(st, out, now)
                if out.incident is not None and key in out.incident.get("recent_keys", ()):
                    return engine.Outcome("duplicate", incident=as_view(st.latest))  # a copy committed
                absorbed, job = self.counter.count(st, engine.subject_key(ev), ev, key, now, False)
            if job is not None:
                self.flusher.write([job], now)
            if absorbed is not None:
                return absorbed
            out = self.store.apply(ev, self._policy, now)  # the slim view asks for a decision after all
        with self._lock:
            self._learn(st, out, now)
            self.memory.seen.add(key)
        return out

    def _learn(self, st: NodeState, out: engine.Outcome, now: float) -> None:
        """Under the lock: the incident as the store read or decided it refreshes the cache."""
        if out.result == "duplicate":
            return
        if out.incident is not None:
            was = st.latest["id"] if st.latest else None
            st.latest = slim(out.incident)
            if not out.coalesced and out.result not in ("absorbed", "ignored") and was != out.incident["id"]:
                st.opened = out.incident["id"]  # this instance commits its first lines
        st.fetched_at = now

    # -- the parts' public faces -------------------------------------------------------

    def flush_all(self, now: float, wait_s: float = 30.0) -> int:
        """Write every buffered count now (services/count_flush.py ``Flusher.all``)."""
        return self.flusher.all(now, wait_s)

    def flush_due(self, now: float) -> int:
        """The timer's work, for whoever plays it (services/count_flush.py ``Flusher.due``)."""
        return self.flusher.due(now)

    def close(self) -> None:
        """Stop the timer thread (tests, benchmarks); buffered counts stay until flushed."""
        self.flusher.close()

    def forget(self, nkey: str | None = None) -> None:
        """Drop cached node states (all, or one), except those with counts still to merge."""
        self.memory.forget(nkey)

    def stats(self) -> dict[str, int]:
        """Sizes of the in-memory maps (bounded; see the module docstring)."""
        return self.memory.stats()
