"""The coalescing rule: whether a line changes nothing on a view of its node's latest incident,
and counting such a line in memory, into its node's shard (services/count_shards.py writes it).

The rule is asked twice: by the coalescer on its cached, slim view (services/coalesce.py), and
by the store's decision on the incident as the store read it (core/store.py ``countable``), so a
line another instance made countable meanwhile costs a read, not a commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from pitstop.core import alerts, engine, trust
from pitstop.core.actions import RANK, Action
from pitstop.core.answers import SlimIncident
from pitstop.core.domain import FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.services.count_flush import Flusher
from pitstop.services.count_shards import Job, ShardWriter
from pitstop.services.node_memory import NodeMemory, NodeState

DIRECT_LINES = 4  # an incident's first lines are committed one by one (by its opener, outside a storm)


def _verified(ev: FaultEvent) -> bool:
    src = ev.get("source")
    return isinstance(src, Mapping) and src.get("trust") == trust.VERIFIED


def as_view(view: SlimIncident | None) -> Incident | None:
    """The cached, slim view of an incident where an Outcome carries one: only the fields the
    caller reads of a coalesced answer (id, state, step, workflow) are in it."""
    return cast(Incident, view) if view is not None else None


class LineCounter:
    """Applies the rule and counts what it lets through (``coalesced``: lines counted so far).
    ``storm`` says whether more deliveries are in flight here than an incident's first lines
    (services/coalesce.py ``Crowd.storm``); ``ack_deadline`` is the trigger's, from a delivery's
    arrival."""

    def __init__(
        self,
        policy: Policy,
        memory: NodeMemory,
        writer: ShardWriter,
        flusher: Flusher,
        clock: Callable[[], float],
        ack_deadline: float,
        storm: Callable[[], bool],
    ) -> None:
        self.policy, self.memory, self.writer, self.flusher = policy, memory, writer, flusher
        self.clock, self.ack_deadline, self.storm = clock, ack_deadline, storm
        self.coalesced = 0

    def count(
        self, st: NodeState, nkey: str, ev: FaultEvent, key: str, now: float, copy_applying: bool
    ) -> tuple[engine.Outcome | None, Job | None]:
        """Under the lock: count the event in memory if it cannot change anything (and say so);
        else None, and the node's counts detached to be written first if the decision may end
        their incident. ``copy_applying``: a copy of the line is in a store transaction now."""
        ts = float(ev.get("_observed_ts") or now)
        latest, st.touched = st.latest, now
        if alerts.is_alert(ev) and latest is not None:
            # an alert's open or close may end or reopen an episode
            return None, self.writer.take(st, nkey, now)
        if latest is None and ev["action"] == Action.NONE and not engine.counts_toward_lemon(ev):
            self.memory.seen.add(key)
            return engine.Outcome("ignored"), None
        if latest is None or copy_applying or not self.countable(st, ev, latest, ts):
            ends = latest is None or latest["state"] == State.RESOLVED or st.shard_iid != latest["id"]
            # a decision reads no shard: they wait
            return None, self.writer.take(st, nkey, now) if ends else None
        if self.late(now):  # its copy counts it (decisions go on: the dedup record makes them once)
            return engine.Outcome("late"), None
        if st.shard_iid != latest["id"]:  # a new shard for a new incident (the old one's is written)
            self.writer.open_shard(st, latest["id"])
        engine.count_into(st.deltas, ev, ts, self.policy, latest.get("evidence_room", engine.MAX_EVIDENCE))
        if st.representative is None or RANK[ev["action"]] >= RANK[st.representative["action"]]:
            st.representative = ev.copy()  # the line to replay if the incident stopped absorbing
        st.buffered += 1
        self.coalesced += 1
        self.memory.seen.add(key)
        self.memory.pending.add(nkey)
        # The timer merges; a line only does when no timer runs here (it merges on the request's time).
        due = not self.flusher.ensure_timer() and now - st.last_flush >= self.flusher.flush_interval
        job = self.writer.take(st, nkey, now) if due else None
        return engine.Outcome("absorbed", incident=as_view(latest), coalesced=True), job

    def countable(
        self, st: NodeState, ev: FaultEvent, latest: SlimIncident | Incident | None, ts: float
    ) -> bool:
        """Whether the event changes nothing on this view of its node's latest incident (slim, or
        as the store read it): then it is counted in memory. An incident's first lines are
        committed by the instance that opened it; another instance counts them (a storm's
        first lines reach every instance at once, and ten committed each)."""
        if latest is None:
            return False
        action = engine.believed(ev, self.policy)[0]["action"]  # a forged line raises nothing
        view: Mapping[str, object] = latest  # stored: ``counts`` holds the count; slim: ``events``
        counts = view.get("counts")
        committed = counts.get("events", 0) if isinstance(counts, Mapping) else view.get("events", 0)
        own = st.deltas["counts"].get("events", 0) if st.shard_iid == latest["id"] else 0  # in its shard
        direct = isinstance(committed, (int, float)) and committed + own < DIRECT_LINES
        return not (
            (_verified(ev) and latest.get("trust") != trust.VERIFIED)  # it makes the evidence trusted
            or (direct and st.opened == latest["id"] and not self.storm())
            or RANK[action] > RANK[latest["action"]]
            or engine.ends_recovery(ev, self.policy)  # may end the episode: decided in the store
            or not engine.absorbs(cast(Incident, latest), ev, ts)  # a slim view holds what it reads
            or (st.shard_iid != latest["id"] and st.buffered)  # the old incident's lines go first
        )

    def late(self, arrived: float) -> bool:
        """Whether Pub/Sub has timed this delivery out already (it waited past its ack deadline,
        behind a decision or a slow read): then it redelivers the message, maybe to another
        instance, which counts the copy, so this delivery must count nothing. Measured from the
        delivery's arrival here, after Pub/Sub pushed it: never late too early (a line lost)."""
        return self.clock() - arrived >= self.ack_deadline
