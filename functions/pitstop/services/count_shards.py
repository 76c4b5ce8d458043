"""How the coalescer (services/coalesce.py) writes a node's storm counts and learns that an incident
stopped absorbing them.

Each node state of an instance owns one count shard of its incident (core/store.py
``with_shards``): it keeps the shard's totals in memory and writes them whole, blindly, at most
every ``flush_interval_s``, into its page (the instance's document for up to PAGE_SHARDS shards):
every due shard of a page in one write (no read, no transaction, no contender), the page's other
shards left as they are. Snapshots of a shard are numbered, page writes take turns, and an
older snapshot is never written over a newer one, so a retried or overtaken write loses nothing.

A written line is *unverified* until an incident read that follows its write says the incident
still absorbs it. The read comes from the store's resolved feed, looked at once per timer tick
(one query per instance, not one read per node): an incident it names is read again (one read)
by every instance that wrote lines into it; and from a safety net, a read at most ``VERIFY_S``
after a write that no feed record explained, and right after a write when no timer watches the
feed. An incident that no longer absorbs the strongest unverified line gets that line replayed
through the full path (a new incident, a raise), and the line is taken out of the old shard's
totals, so the counts stay a lower bound.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from pitstop.adapters import log
from pitstop.core import engine
from pitstop.core.actions import RANK
from pitstop.core.answers import SlimIncident, SlimRun
from pitstop.core.domain import CountShard, Deltas, FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.core.store import IncidentStore

VERIFY_S = 60.0  # a written line is checked against its incident at most this long after (safety net)
FEED_MARGIN_S = 15.0  # a feed look reaches this far behind the previous one (a resolving commit's delay)
FEED_DONE_MAX = 10_000  # resolutions already acted on that an instance remembers


def slim(inc: Incident | None) -> SlimIncident | None:
    """The cached view of an incident (as decided: its shards are not read): what engine.absorbs
    and the coalescing rule read, and no more (an incident's 1000 recent keys times thousands of
    nodes would not fit an instance)."""
    if inc is None:
        return None
    wf = inc.get("workflow")
    run: SlimRun | None = (
        {"step": wf.get("step"), "state": wf.get("state"), "lease_until": wf.get("lease_until")}
        if wf
        else None
    )  # enough to see a start was lost
    return {
        "id": inc.get("id"),
        "state": inc.get("state"),
        "action": inc["action"],
        "mode": inc.get("mode"),
        "burst_until": inc.get("burst_until"),
        "closure": inc.get("closure"),
        "node_key": inc.get("node_key"),
        "trust": inc.get("trust"),
        "evidence_room": engine.evidence_room(inc),
        "events": int((inc.get("counts") or {}).get("events", 0)),
        "timeline": {"resolved": (inc.get("timeline") or {}).get("resolved")},
        "workflow": run,
    }


def stronger(a: FaultEvent | None, b: FaultEvent) -> FaultEvent:
    """The stronger of two representative lines (the later one on a tie)."""
    return b.copy() if a is None or RANK[b["action"]] >= RANK[a["action"]] else a.copy()


@dataclass
class NodeState:
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


@dataclass(frozen=True)
class Job:
    """One detached snapshot of a shard, to be written outside the coalescer's lock."""

    st: NodeState
    nkey: str
    iid: str
    shard: str
    page: str
    totals: CountShard
    representative: FaultEvent
    lines: int
    seq: int


class ShardWriter:
    """Mixed into the Coalescer, which provides the store, the lock, the node states and the timer."""

    store: IncidentStore
    policy: Policy
    _lock: threading.RLock
    _page_lock: threading.Lock  # one page write at a time (this instance's)
    _nodes: OrderedDict[str, NodeState]
    _pending: set[str]
    _retry: list[Job]
    _feed_from: float
    _feed_seen: float
    _feed_done: OrderedDict[tuple[str, float], None]  # an ordered set
    on_outcome: Callable[[engine.Outcome], None] | None

    def _watching(self, now: float) -> bool:
        raise NotImplementedError

    def _done_merging(self) -> None:
        raise NotImplementedError

    def _remember(self, key: str) -> None:
        raise NotImplementedError

    def _shard_doc(self, st: NodeState, nkey: str, iid: str, now: float) -> CountShard:
        """Under the lock: what the shard document holds (its totals, and the burst they extend)."""
        totals = copy.deepcopy(st.deltas)
        last = float(totals["last_seen"])
        burst = last + self.policy.window("burst_silence_s") if last else 0.0
        return {**totals, "incident": iid, "node": nkey, "burst_until": burst, "at": now}

    def _snapshot(self, st: NodeState, nkey: str, now: float) -> Job | None:
        """Under the lock: detach what the node counted since its last write (None: nothing)."""
        st.last_flush = now
        if not st.buffered or st.shard_iid is None or st.representative is None:
            return None
        st.seq += 1
        doc = self._shard_doc(st, nkey, st.shard_iid, now)
        job = Job(st, nkey, st.shard_iid, st.shard, st.page, doc, st.representative, st.buffered, st.seq)
        self._pending.discard(nkey)
        st.representative, st.buffered = None, 0
        return job

    def _merge(self, job: Job, now: float) -> None:
        self._merge_all([job], now)

    def _merge_all(self, jobs: list[Job], now: float) -> None:
        """Write detached snapshots (each comes here once), all in one store call (one write per
        page they are in), then check them if no feed is watched."""
        if not jobs:
            return
        try:
            with self._page_lock:  # page writes in turn: a newer snapshot is never overtaken
                newest: dict[str, Job] = {}  # per shard, its newest snapshot not written yet
                for job in jobs:
                    other = newest.get(job.shard)
                    if job.seq > job.st.written.get(job.shard, 0) and (other is None or job.seq > other.seq):
                        newest[job.shard] = job  # else a newer one of it holds these lines
                pages: dict[str, dict[str, CountShard]] = {}
                for job in newest.values():
                    pages.setdefault(job.page, {})[job.shard] = job.totals
                if pages:
                    self.store.counts.put_shards(pages)
                for job in newest.values():
                    job.st.written[job.shard] = job.seq
            with self._lock:
                for job in jobs:
                    job.st.unverified[job.iid] = stronger(job.st.unverified.get(job.iid), job.representative)
                    job.st.written_at = now
        except Exception as exc:  # Firestore trouble: the lines are written with the next snapshot
            log.emit("WARNING", "storm counts not written yet", shards=len(jobs), error=repr(exc)[:300])
            for job in jobs:
                self._restore(job)
            return
        finally:
            for _ in jobs:
                self._done_merging()
        watched = self._watching(now)
        for nkey, st in {id(j.st): (j.nkey, j.st) for j in jobs}.values():
            if not watched or (st.latest["state"] if st.latest else None) == State.RESOLVED:
                self.verify(nkey, st, now)

    def _restore(self, job: Job) -> None:
        """A write failed: its lines go out with the node's next snapshot, or the job is kept."""
        with self._lock:
            st = job.st
            if st.shard == job.shard and self._nodes.get(job.nkey) is st:
                st.buffered += job.lines
                st.representative = stronger(st.representative, job.representative)
                self._pending.add(job.nkey)
            else:
                self._retry.append(job)

    def _take_retries(self) -> list[Job]:
        with self._lock:
            jobs, self._retry = self._retry, []
        return jobs

    # -- checking written lines against their incident ---------------------------------

    def verify(self, nkey: str, st: NodeState, now: float, cached: str | None = None) -> None:
        """Read each incident this node wrote unchecked lines into (and ``cached``, the one its
        cache holds, so that lines counted from now on are checked against the read); replay the
        strongest line of one that no longer absorbs it (and the lines whose replay failed before)."""
        with st.lock:
            with self._lock:
                todo: dict[str, FaultEvent | None] = {**st.unverified}
                st.unverified = {}
            if cached is not None:
                todo.setdefault(cached, None)
            for iid, rep in todo.items():
                try:
                    inc = self.store.counts.as_decided(iid)
                except Exception as exc:  # checked again at the next look
                    log.emit("WARNING", "storm counts not checked yet", node=nkey, error=repr(exc)[:300])
                    with self._lock:
                        if rep is not None:
                            st.unverified[iid] = stronger(st.unverified.get(iid), rep)
                    continue
                with self._lock:
                    if (st.latest["id"] if st.latest else None) == iid:
                        st.latest, st.fetched_at = slim(inc), now
                if rep is not None and not (
                    inc and engine.absorbs(inc, rep, float(rep.get("_observed_ts") or now))
                ):
                    self._uncount(nkey, st, iid, rep, now)
            with self._lock:
                replays, st.replays = st.replays, []
        for iid, rep in replays:
            self._replay(nkey, st, iid, rep, now)

    def _uncount(self, nkey: str, st: NodeState, iid: str, rep: FaultEvent, now: float) -> None:
        """Under the node's lock: take the line out of the shard it was written to (if this state
        still holds that shard) and queue its replay, so that it is counted once, where the replay
        puts it. Taken out once: a replay that fails is queued again as it is (``st.replays``)."""
        with self._lock:
            st.replays.append((iid, rep.copy()))
            if st.shard_iid != iid:
                return
            one = engine.empty_deltas()
            engine.count_into(one, rep, float(rep.get("_observed_ts") or now), self.policy)
            counts = st.deltas["counts"]
            for k, n in one["counts"].items():
                if k in counts:
                    counts[k] = max(0, counts[k] - n)
            for gk, g in one["gpus"].items():
                held = st.deltas["gpus"].get(gk, {}).get("xids", {})
                for x, n in g["xids"].items():
                    if x in held:
                        held[x] = max(0, held[x] - n)
            st.seq += 1
            seq, shard, page, doc = st.seq, st.shard, st.page, self._shard_doc(st, nkey, iid, now)
        try:
            with self._page_lock:
                if seq > st.written.get(shard, 0):
                    self.store.counts.put_shards({page: {shard: doc}})
                    st.written[shard] = seq
        except Exception as exc:  # the shard keeps the line until its next write: one line too many
            log.emit(
                "WARNING", "replayed line still in its shard", node=nkey, incident=iid, error=repr(exc)[:300]
            )

    def _replay(self, nkey: str, st: NodeState, iid: str, rep: FaultEvent, now: float) -> None:
        """The full path for a line its incident no longer absorbs (a new incident, a raise)."""
        try:
            out = self.store.apply(rep, self.policy, now)
        except Exception as exc:  # the next tick replays it again (apply is exactly once)
            log.emit("WARNING", "storm line not replayed yet", node=nkey, incident=iid, error=repr(exc)[:300])
            with self._lock:
                st.replays.append((iid, rep))
            return
        with self._lock:
            if out.result != "duplicate" and out.incident is not None:
                st.latest, st.fetched_at = slim(out.incident), now
            self._remember(engine.event_key(rep))
        if self.on_outcome is not None:
            self.on_outcome(out)

    def watch_feed(self, now: float) -> int:
        """One look at the resolved feed: every node of an incident it names reads that incident
        again (now, if it counted or wrote lines unchecked; else at its next line). Returns the
        nodes checked."""
        try:
            records = self.store.counts.resolved_since(self._feed_from)
        except Exception as exc:  # the safety net (VERIFY_S) and the cache's TTL still hold
            log.emit("WARNING", "resolved feed not read", error=repr(exc)[:300])
            return 0
        with self._lock:
            self._feed_from, self._feed_seen = now - FEED_MARGIN_S, now
            fresh = [(r["incident"], float(r["at"])) for r in records]
            ids = {iid for iid, at in fresh if (iid, at) not in self._feed_done}
            self._feed_done.update(dict.fromkeys(fresh))
            while len(self._feed_done) > FEED_DONE_MAX:
                self._feed_done.popitem(last=False)
            hit = [
                (k, st)
                for k, st in self._nodes.items()
                if ids & {*st.unverified, (st.latest["id"] if st.latest else None)}
            ]
            for _, st in hit:
                st.fetched_at = float("-inf")  # the next line reads the incident again
        checked = [(k, st) for k, st in hit if st.unverified or st.buffered]
        for k, st in checked:  # its cache then says resolved, and a write into it is checked at once
            self.verify(k, st, now, cached=(st.latest["id"] if st.latest else None))
        return len(checked)
