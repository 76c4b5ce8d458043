"""How the coalescer (services/coalesce.py) learns that an incident stopped absorbing the storm
counts it wrote (services/count_shards.py), so that no fault is lost to a stale cache.

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

from collections import OrderedDict
from collections.abc import Callable

from pitstop.adapters import log
from pitstop.core import engine
from pitstop.core.domain import FaultEvent
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.core.store import IncidentStore
from pitstop.services.count_shards import ShardWriter, slim, stronger
from pitstop.services.node_memory import NodeMemory, NodeState

VERIFY_S = 60.0  # a written line is checked against its incident at most this long after (safety net)
FEED_MARGIN_S = 15.0  # a feed look reaches this far behind the previous one (a resolving commit's delay)
FEED_DONE_MAX = 10_000  # resolutions already acted on that an instance remembers


class CountChecker:
    """Checks written lines against their incidents (the resolved feed, the safety net) and
    replays a line its incident no longer absorbs; ``on_outcome`` gets each replay's answer (its
    follow-ups: a workflow start, a page)."""

    def __init__(
        self,
        store: IncidentStore,
        policy: Policy,
        memory: NodeMemory,
        writer: ShardWriter,
        start: float,
        tick_s: float,
    ) -> None:
        self.store, self.policy, self.memory, self.writer = store, policy, memory, writer
        self.tick_s = tick_s  # the timer's interval: the feed is watched while looked at this often
        self._feed_from = start - FEED_MARGIN_S  # the resolved feed, from a little before the start
        self._feed_seen = float("-inf")  # when it was last looked at
        self._feed_done: OrderedDict[tuple[str, float], None] = OrderedDict()  # an ordered set
        self.on_outcome: Callable[[engine.Outcome], None] | None = None

    def watching(self, now: float) -> bool:
        """The resolved feed was looked at lately (by the timer, or whoever plays it: flush_due)."""
        return now - self._feed_seen < 3 * self.tick_s

    def after_write(self, written: list[tuple[str, NodeState]], now: float) -> None:
        """Check lines just written (ShardWriter.write) at once where no feed is watched, or
        where the node's cached incident is resolved already."""
        if not written:
            return
        watched = self.watching(now)
        for nkey, st in written:
            if not watched or (st.latest["state"] if st.latest else None) == State.RESOLVED:
                self.verify(nkey, st, now)

    def verify(self, nkey: str, st: NodeState, now: float, cached: str | None = None) -> None:
        """Read each incident this node wrote unchecked lines into (and ``cached``, the one its
        cache holds, so that lines counted from now on are checked against the read); replay the
        strongest line of one that no longer absorbs it (and the lines whose replay failed before)."""
        with st.lock:
            with self.memory.lock:
                todo: dict[str, FaultEvent | None] = {**st.unverified}
                st.unverified = {}
            if cached is not None:
                todo.setdefault(cached, None)
            for iid, rep in todo.items():
                try:
                    inc = self.store.counts.as_decided(iid)
                except Exception as exc:  # checked again at the next look
                    log.emit("WARNING", "storm counts not checked yet", node=nkey, error=repr(exc)[:300])
                    with self.memory.lock:
                        if rep is not None:
                            st.unverified[iid] = stronger(st.unverified.get(iid), rep)
                    continue
                with self.memory.lock:
                    if (st.latest["id"] if st.latest else None) == iid:
                        st.latest, st.fetched_at = slim(inc), now
                if rep is not None and not (
                    inc and engine.absorbs(inc, rep, float(rep.get("_observed_ts") or now))
                ):
                    self._uncount(nkey, st, iid, rep, now)
            with self.memory.lock:
                replays, st.replays = st.replays, []
        for iid, rep in replays:
            self._replay(nkey, st, iid, rep, now)

    def _uncount(self, nkey: str, st: NodeState, iid: str, rep: FaultEvent, now: float) -> None:
        """Under the node's lock: take the line out of the shard it was written to (if this state
        still holds that shard) and queue its replay, so that it is counted once, where the replay
        puts it. Taken out once: a replay that fails is queued again as it is (``st.replays``)."""
        with self.memory.lock:
            st.replays.append((iid, rep.copy()))
            change = self.writer.take_out(st, nkey, iid, rep, now)
        if change is None:
            return
        try:
            self.writer.rewrite(st, change)
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
            with self.memory.lock:
                st.replays.append((iid, rep))
            return
        with self.memory.lock:
            if out.result != "duplicate" and out.incident is not None:
                st.latest, st.fetched_at = slim(out.incident), now
            self.memory.seen.add(engine.event_key(rep))
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
        with self.memory.lock:
            self._feed_from, self._feed_seen = now - FEED_MARGIN_S, now
            fresh = [(r["incident"], float(r["at"])) for r in records]
            ids = {iid for iid, at in fresh if (iid, at) not in self._feed_done}
            self._feed_done.update(dict.fromkeys(fresh))
            while len(self._feed_done) > FEED_DONE_MAX:
                self._feed_done.popitem(last=False)
            hit = [
                (k, st)
                for k, st in self.memory.nodes.items()
                if ids & {*st.unverified, (st.latest["id"] if st.latest else None)}
            ]
            for _, st in hit:
                st.fetched_at = float("-inf")  # the next line reads the incident again
        checked = [(k, st) for k, st in hit if st.unverified or st.buffered]
        for k, st in checked:  # its cache then says resolved, and a write into it is checked at once
            self.verify(k, st, now, cached=(st.latest["id"] if st.latest else None))
        return len(checked)
