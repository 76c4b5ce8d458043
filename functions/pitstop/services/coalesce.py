"""Coalescing storms in memory so that 1 000 000 identical lines cost a handful of writes.

An incident's first lines (``DIRECT_LINES``, as its stored count says, whichever instance
committed them) are committed one by one, so an ordinary fault's few lines are counted exactly
and at once. Judged by the incident, not by the instance: a storm spread over N instances
commits its first lines once, not N times on the same documents. After that, an event that cannot
change anything — its node's latest incident (read from Firestore less than ``cache_ttl_s``
ago, or as this instance last wrote or merged it) absorbs it and it does not raise the
action — is only counted in memory. Such an event asks nothing of Firestore: no read, no
write, no workflow follow-up.

Buffered counts are merged into the incident at most every ``flush_interval_s`` per node, by
a read and a write on condition that the incident is still as read (no transaction, no lock:
many instances merging into the same incidents do not queue; the store's merge_counts), which
re-checks the incident; if the incident stopped absorbing meanwhile (it was resolved), the
strongest buffered event is replayed through the full path, so no fault is lost to a stale
cache. The merge happens on the next line of that node once the interval has passed, or on the
instance's own timer (a daemon thread, :meth:`Coalescer.flush_due`), or at shutdown
(:meth:`Coalescer.flush_all`; functions/main.py wires SIGTERM and atexit). Each merge returns
the incident as written, which refreshes the cache without a read.

Memory is bounded: at most ``max_nodes`` node states (least recently used dropped first, after
their counts are merged; idle ones dropped after ``IDLE_S``), at most ``seen_max`` delivery
keys, and per node at most the engine's bounds (GPUs, Xid codes, evidence, ``MAX_DELTA_KEYS``).

Guarantees: incident creation, raises, holds and workflow starts are exactly once (the
transactional path with its dedup record). Event *counts* are a lower bound: an instance
that dies without SIGTERM loses at most one interval of counts, never a decision.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pitstop.adapters import log
from pitstop.core import alerts, engine, trust
from pitstop.core.actions import RANK, Action
from pitstop.core.domain import Deltas, FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.store import IncidentStore

DIRECT_LINES = 4  # an incident's first lines are committed one by one (by any instance)
MAX_NODES = 10_000  # node states an instance keeps
SEEN_MAX = 100_000  # delivery keys an instance remembers (redeliveries to it are dropped at once)
IDLE_S = 600.0  # a node state untouched this long, with nothing buffered, is dropped
IDLE_TICKS = 30  # the timer thread stops after this many ticks with nothing buffered
FLUSH_WORKERS = 8  # merges at once when everything is flushed (SIGTERM leaves an instance 10 s)
GATE_STRIPES = 256  # per-node gates for lines that must be decided (node keys hashed onto them)
# What the cache keeps of an incident: what engine.absorbs and the coalescing rule read, and no
# more (an incident's 1000 recent keys times thousands of nodes would not fit an instance).
_CACHED = ("id", "state", "action", "mode", "burst_until", "closure", "node_key", "trust")
_CACHED_RUN = ("step", "state", "lease_until")  # of ``workflow``: enough to see a start was lost

Job = tuple[str, FaultEvent, Deltas, int]  # incident id, representative, deltas, lines


def slim(inc: Incident | None) -> dict[str, Any] | None:
    """The cached view of an incident."""
    if inc is None:
        return None
    out = {k: inc.get(k) for k in _CACHED}
    out["evidence_room"] = engine.evidence_room(inc)  # buffered evidence past it would be dropped
    out["events"] = int((inc.get("counts") or {}).get("events", 0))  # lines committed (DIRECT_LINES)
    out["timeline"] = {"resolved": (inc.get("timeline") or {}).get("resolved")}
    wf = inc.get("workflow")
    out["workflow"] = {k: wf.get(k) for k in _CACHED_RUN} if wf else None
    return out


def _verified(ev: FaultEvent) -> bool:
    src = ev.get("source")
    return isinstance(src, Mapping) and src.get("trust") == trust.VERIFIED


def as_view(view: Mapping[str, Any] | None) -> Incident | None:
    """The cached, slim view of an incident where an Outcome carries one: only the fields the
    caller reads of a coalesced answer (id, state, step, workflow) are in it."""
    return cast(Incident, view) if view is not None else None


@dataclass
class _Node:
    latest: dict[str, Any] | None
    fetched_at: float
    last_flush: float
    touched: float
    deltas: Deltas = field(default_factory=engine.empty_deltas)
    representative: FaultEvent | None = None
    buffered: int = 0


class Coalescer:
    def __init__(
        self,
        store: IncidentStore,
        policy: Policy,
        clock: Callable[[], float] = time.time,
        seen_max: int = SEEN_MAX,
        max_nodes: int = MAX_NODES,
    ) -> None:
        self.store, self.policy, self.clock = store, policy, clock
        self.cache_ttl = float(policy.doc["store"]["cache_ttl_s"])
        self.flush_interval = float(policy.doc["store"]["flush_interval_s"])
        self._nodes: OrderedDict[str, _Node] = OrderedDict()
        self._pending: set[str] = set()  # nodes with buffered counts
        # Delivery keys, oldest first in the deque: half the bytes of an OrderedDict per key.
        self._seen: set[str] = set()
        self._seen_order: deque[str] = deque()
        self._applying: dict[str, threading.Event] = {}  # keys in a store transaction right now
        self._seen_max, self._max_nodes = seen_max, max_nodes
        self._lock = threading.RLock()
        self._gates = [threading.Lock() for _ in range(GATE_STRIPES)]
        self._merged = threading.Condition(self._lock)  # notified as each detached merge finishes
        self._inflight = 0  # counts detached by _take and not yet merged (or restored)
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self.coalesced = 0
        self.timer = True  # merge buffered counts on a daemon thread (off: only lines and flushes merge)
        # Follow-ups (workflow starts, pages) of events replayed at flush time.
        self.on_outcome: Callable[[engine.Outcome], None] | None = None

    def _remember(self, key: str) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        self._seen_order.append(key)
        if len(self._seen_order) > self._seen_max:
            self._seen.discard(self._seen_order.popleft())

    # -- one event -------------------------------------------------------------------

    def handle(self, ev: FaultEvent, now: float) -> engine.Outcome:
        """Count the event in memory if the cached incident says it changes nothing; else decide it.

        Only a line that cannot be counted in memory passes its node's gate, one at a time: it
        reads the node's incident or commits itself, and the lines waiting behind it look at the
        cache again when their turn comes. So the C concurrent first lines of a node make one
        read and the incident's first DIRECT_LINES commits, not C of each.
        """
        key = engine.event_key(ev)
        nkey = engine.subject_key(ev)
        counted = self._counted(ev, key, nkey, now)
        if counted is not None:
            return counted
        with self._gates[hash(nkey) % GATE_STRIPES]:
            counted = self._counted(ev, key, nkey, now)  # the cache may have changed meanwhile
            return counted if counted is not None else self._decide(ev, key, nkey, now)

    def _counted(self, ev: FaultEvent, key: str, nkey: str, now: float) -> engine.Outcome | None:
        """A duplicate, or the event counted in memory by a fresh cache; None: it must be decided."""
        with self._lock:
            if key in self._seen:
                return engine.Outcome("duplicate")
            st = self._nodes.get(nkey)
            if st is None or not self._fresh(st, now):
                return None
            absorbed, job = self._buffer(st, nkey, ev, key, now)
        if job is not None:
            self._merge(nkey, job, now)
        return absorbed

    def _decide(self, ev: FaultEvent, key: str, nkey: str, now: float) -> engine.Outcome:
        """Behind the node's gate: refresh the cache if it is stale, then count or commit the event."""
        with self._lock:
            st = self._nodes.get(nkey)
            fresh = st is not None and self._fresh(st, now)
        if not fresh:
            latest = self.store.latest_incident(nkey)  # plain reads: no write to refresh a cache
            with self._lock:
                st, jobs = self._admit(nkey, now)
                st.latest, st.fetched_at = slim(latest), now
                for k in latest.get("recent_keys", []) if latest else []:
                    self._remember(k)
                dup = key in self._seen
            self._merge_all(jobs, now)
            if dup:
                return engine.Outcome("duplicate", incident=as_view(slim(latest)))
            with self._lock:
                absorbed, job = self._buffer(st, nkey, ev, key, now)
            if job is not None:
                self._merge(nkey, job, now)
            if absorbed is not None:
                return absorbed
        assert st is not None
        return self._commit(st, ev, key, now)

    def _fresh(self, st: _Node, now: float) -> bool:
        """Whether the cached incident may decide without a read.

        Read less than ``cache_ttl_s`` ago; or counts are buffered for it and the timer runs: their
        merge reads the incident in its transaction, re-checks that it absorbs (replaying the
        strongest buffered event if not) and refreshes this cache, so a storm costs no reads.
        """
        if now - st.fetched_at < self.cache_ttl:
            return True
        return bool(st.buffered) and self._flusher is not None and self._flusher.is_alive()

    def _buffer(
        self, st: _Node, nkey: str, ev: FaultEvent, key: str, now: float
    ) -> tuple[engine.Outcome | None, Job | None]:
        """Under the lock: count the event in memory if it cannot change anything (and say so)."""
        ts = float(ev.get("_observed_ts") or now)
        latest, st.touched = st.latest, now
        if alerts.is_alert(ev) and latest is not None:
            return None, self._take(st, now)  # an alert's open or close may end or reopen an episode
        if latest is None and ev["action"] == Action.NONE and not engine.counts_toward_lemon(ev):
            self._remember(key)
            return engine.Outcome("ignored"), None
        action = engine.believed(ev, self.policy)[0]["action"]  # a forged line raises nothing
        if (
            latest is None
            or key in self._applying  # a copy of it is in a transaction now: wait for that one
            or (_verified(ev) and latest.get("trust") != trust.VERIFIED)  # it makes the evidence trusted
            or latest.get("events", 0) < DIRECT_LINES
            or RANK[action] > RANK[latest["action"]]
            or engine.ends_recovery(ev, self.policy)  # may end the episode: decided in the store
            or not engine.absorbs(as_view(latest), ev, ts)
        ):
            return None, self._take(st, now)  # counts so far go first: the store path may change things
        engine.count_into(st.deltas, ev, ts, self.policy, latest.get("evidence_room", engine.MAX_EVIDENCE))
        if st.representative is None or RANK[ev["action"]] >= RANK[st.representative["action"]]:
            st.representative = ev.copy()
        st.buffered += 1
        self.coalesced += 1
        self._remember(key)
        self._pending.add(nkey)
        # The timer merges; a line only does when no timer runs here (it merges on the request's time).
        due = not self._ensure_timer() and now - st.last_flush >= self.flush_interval
        job = self._take(st, now) if due else None
        return engine.Outcome("absorbed", incident=as_view(latest), coalesced=True), job

    def _commit(self, st: _Node, ev: FaultEvent, key: str, now: float) -> engine.Outcome:
        """The full, transactional path; its answer refreshes the cache.

        A redelivery that arrives while this instance still applies its first delivery waits for
        that one instead of racing it in a second transaction on the same documents: then it is
        a duplicate, or (the first failed) it is applied itself.
        """
        while True:
            with self._lock:
                if key in self._seen:
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

    def _apply(self, st: _Node, ev: FaultEvent, key: str, now: float) -> engine.Outcome:
        out = self.store.apply(ev, self.policy, now)
        with self._lock:
            if out.result != "duplicate":
                if out.incident is not None:
                    st.latest = slim(out.incident)
                st.fetched_at = now
            self._remember(key)
        return out

    # -- node states -----------------------------------------------------------------

    def _admit(self, nkey: str, now: float) -> tuple[_Node, list[tuple[str, Job]]]:
        """Under the lock: the node's state (new or touched), and the counts of any state it evicted."""
        st = self._nodes.get(nkey)
        if st is None:
            st = self._nodes[nkey] = _Node(None, now, now, now)
        self._nodes.move_to_end(nkey)
        jobs: list[tuple[str, Job]] = []
        while len(self._nodes) > self._max_nodes:
            old_key, old = self._nodes.popitem(last=False)
            job = self._take(old, now)
            if job is not None:
                jobs.append((old_key, job))
        return st, jobs

    def _take(self, st: _Node, now: float) -> Job | None:
        """Under the lock: detach a node's buffered counts so they can be written outside it."""
        st.last_flush = now
        if not st.buffered or st.latest is None or st.representative is None:
            return None
        job = (st.latest["id"], st.representative, st.deltas, st.buffered)
        self._pending.discard(engine.subject_key(st.representative))
        st.deltas, st.representative, st.buffered = engine.empty_deltas(), None, 0
        self._inflight += 1
        return job

    def _restore(self, nkey: str, job: Job) -> None:
        """A merge failed: its counts go back into the node's buffer for the next flush."""
        _, rep, deltas, lines = job
        with self._lock:
            st = self._nodes.get(nkey)
            if st is None:
                st = self._nodes[nkey] = _Node(None, 0.0, 0.0, self.clock())
                st.latest = {"id": job[0]}
            engine.add_deltas(st.deltas, deltas)
            if st.representative is None or RANK[rep["action"]] > RANK[st.representative["action"]]:
                st.representative = rep
            st.buffered += lines
            self._pending.add(nkey)

    def _merge(self, nkey: str, job: Job, now: float) -> None:
        """Write one detached job (every job _take returns comes here exactly once)."""
        iid, rep, deltas, _ = job
        try:
            out = self.store.merge_counts(iid, rep, deltas, self.policy, now)
        except Exception as exc:  # Firestore trouble: keep the counts, the next flush tries again
            log.emit("WARNING", "storm counts not merged yet", node=nkey, incident=iid, error=repr(exc)[:300])
            self._restore(nkey, job)
            self._done_merging()
            return
        with self._lock:
            st = self._nodes.get(nkey)
            if st is not None and out.incident is not None:
                st.latest, st.fetched_at = slim(out.incident), self.clock()  # as of the merge
        self._done_merging()
        if not out.coalesced and self.on_outcome is not None:
            self.on_outcome(out)

    def _done_merging(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._merged.notify_all()

    def _merge_all(self, jobs: list[tuple[str, Job]], now: float) -> int:
        for nkey, job in jobs:
            self._merge(nkey, job, now)
        return len(jobs)

    # -- flushing --------------------------------------------------------------------

    def flush_all(self, now: float, wait_s: float = 30.0) -> int:
        """Write every buffered count now (SIGTERM, exit, the sweep, the end of a benchmark).

        Merges FLUSH_WORKERS at a time: at SIGTERM an instance has seconds, and a storm over
        2,000 nodes leaves as many merges. Returns once merges already under way elsewhere (the
        timer, another line) have finished too, so whoever reads the incidents next sees every
        count this instance had.
        """
        with self._lock:
            jobs = [(k, job) for k in list(self._pending) if (job := self._take(self._nodes[k], now))]
        self._merge_parallel(jobs, now)
        with self._lock:
            self._merged.wait_for(lambda: self._inflight == 0, timeout=wait_s)
        return len(jobs)

    def _merge_parallel(self, jobs: list[tuple[str, Job]], now: float) -> None:
        """Merge these jobs FLUSH_WORKERS at a time, this thread among them: at interpreter exit
        (atexit) no executor takes work and Python 3.12 starts no thread, so this one merges
        whatever the others cannot."""
        todo, lock = list(jobs), threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    nkey, job = todo.pop()
                self._merge(nkey, job, now)

        helpers: list[threading.Thread] = []
        try:
            for _ in range(min(FLUSH_WORKERS, len(jobs)) - 1):
                helpers.append(threading.Thread(target=work, name="pitstop-flush", daemon=True))
                helpers[-1].start()
        except RuntimeError:  # no new thread at interpreter shutdown
            helpers = [t for t in helpers if t.is_alive()]
        work()
        for t in helpers:
            t.join()

    def flush_due(self, now: float) -> int:
        """Write the counts buffered for a flush interval or longer; drop idle node states.

        One node at a time (taken, merged, the next): what is not merged yet stays buffered, where
        a shutdown's flush_all finds it, instead of being held by this thread when the instance stops.
        """
        with self._lock:
            due = [k for k in self._pending if now - self._nodes[k].last_flush >= self.flush_interval]
            idle = [k for k, st in self._nodes.items() if not st.buffered and now - st.touched >= IDLE_S]
            for k in idle:
                del self._nodes[k]
        merged = 0
        for k in due:
            with self._lock:
                st = self._nodes.get(k)
                job = self._take(st, now) if st is not None and k in self._pending else None
            if job is not None:
                self._merge(k, job, now)
                merged += 1
        return merged

    def _ensure_timer(self) -> bool:
        """Under the lock: make sure the timer thread runs while counts are buffered (False: off)."""
        if not self.timer or self._stop.is_set():
            return False
        if self._flusher is None or not self._flusher.is_alive():
            self._flusher = threading.Thread(target=self._tick, name="pitstop-flush", daemon=True)
            self._flusher.start()
        return True

    def _tick(self) -> None:
        """The timer: merge due counts every interval; stop when nothing has been buffered for a while."""
        quiet = 0
        tick = max(self.flush_interval / 2, 0.25)
        # Jittered, so that instances started together do not merge into the same incidents at once.
        while not self._stop.wait(tick * random.uniform(0.75, 1.25)):  # noqa: S311 - not a secret
            try:
                self.flush_due(self.clock())
            except Exception as exc:  # never let the timer die silently with counts buffered
                log.emit("ERROR", "storm count flush failed", error=repr(exc)[:300])
            with self._lock:
                quiet = 0 if self._pending else quiet + 1
                if quiet >= IDLE_TICKS:
                    self._flusher = None
                    return

    def close(self) -> None:
        """Stop the timer thread (tests, benchmarks); buffered counts stay until flushed."""
        self._stop.set()
        flusher = self._flusher
        if flusher is not None:
            flusher.join(timeout=5)

    def forget(self, nkey: str | None = None) -> None:
        """Drop cached node states (all, or one), except those with counts still to merge."""
        with self._lock:
            for k in [nkey] if nkey is not None else list(self._nodes):
                st = self._nodes.get(k)
                if st is not None and not st.buffered:
                    del self._nodes[k]

    def stats(self) -> dict[str, int]:
        """Sizes of the in-memory maps (bounded; see the module docstring)."""
        with self._lock:
            return {"nodes": len(self._nodes), "seen": len(self._seen), "buffered_nodes": len(self._pending)}
