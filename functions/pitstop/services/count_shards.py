"""How the coalescer (services/coalesce.py) writes a node's storm counts.

Each node state of an instance owns one count shard of its incident (core/store.py
``with_shards``): it keeps the shard's totals in memory and writes them whole, blindly, at most
every ``flush_interval_s``, into its page (the instance's document for up to PAGE_SHARDS shards):
every due shard of a page in one write (no read, no transaction, no contender), the page's other
shards left as they are. Snapshots of a shard are numbered, page writes take turns, and an
older snapshot is never written over a newer one, so a retried or overtaken write loses nothing.

A written line is then checked against its incident (services/count_checks.py); one its incident
no longer absorbs is taken out of its shard here (``ShardWriter.take_out``) and replayed there.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from dataclasses import dataclass

from pitstop.adapters import log
from pitstop.core import engine
from pitstop.core.actions import RANK
from pitstop.core.answers import SlimIncident, SlimRun
from pitstop.core.domain import CountShard, FaultEvent, Incident
from pitstop.core.policy import Policy
from pitstop.core.store import IncidentStore
from pitstop.services.node_memory import NodeMemory, NodeState

PAGE_SHARDS = 128  # node states' shards per page document (each <= 5 KB, a document <= 1 MiB)


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


@dataclass(frozen=True)
class Rewrite:
    """A shard's totals after a line was taken out of them, to be written outside the lock."""

    seq: int
    shard: str
    page: str
    totals: CountShard


class ShardWriter:
    """Writes detached snapshots of node states' shards into this instance's pages, one store
    call per batch (a write per page), never an older snapshot over a newer one; a snapshot whose
    write failed goes out with its node's next one. Counts what is detached and not yet written
    (``in_flight``), so a shutdown can wait for writes under way on other threads."""

    def __init__(self, store: IncidentStore, policy: Policy, memory: NodeMemory) -> None:
        self.store, self.policy, self.memory = store, policy, memory
        self.instance = uuid.uuid4().hex[:12]  # names this instance's shards
        self._shards = itertools.count(1)
        self._page_lock = threading.Lock()  # one page write at a time (this instance's)
        self._written = threading.Condition(memory.lock)  # notified as each detached write finishes
        self._in_flight = 0  # snapshots detached and not yet written (or restored)
        self._retry: list[Job] = []  # snapshots of shards no node state holds any more, to write again

    def open_shard(self, st: NodeState, iid: str | None) -> None:
        """Under the lock: a new shard of this instance for the node's new incident ``iid`` (the
        old incident's shard was written: its lines went first)."""
        n = next(self._shards)
        st.deltas, st.shard, st.shard_iid = engine.empty_deltas(), f"{self.instance}-{n}", iid
        st.page = f"{self.instance}-p{(n - 1) // PAGE_SHARDS}"

    def take(self, st: NodeState, nkey: str, now: float) -> Job | None:
        """Under the lock: detach what the node counted since its last write, to be written outside
        it (None: nothing)."""
        st.last_flush = now
        if not st.buffered or st.shard_iid is None or st.representative is None:
            return None
        st.seq += 1
        doc = self._shard_doc(st, nkey, st.shard_iid, now)
        job = Job(st, nkey, st.shard_iid, st.shard, st.page, doc, st.representative, st.buffered, st.seq)
        self.memory.pending.discard(nkey)
        st.representative, st.buffered = None, 0
        self._in_flight += 1
        return job

    def take_retries(self) -> list[Job]:
        """The snapshots whose write failed after their node state moved on, detached again."""
        with self.memory.lock:
            jobs, self._retry = self._retry, []
            self._in_flight += len(jobs)
        return jobs

    def wait_written(self, timeout: float) -> None:
        """Until every detached snapshot was written or restored (others' writes too)."""
        with self.memory.lock:
            self._written.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def write(self, jobs: list[Job], now: float) -> list[tuple[str, NodeState]]:
        """Write detached snapshots (each comes here once), all in one store call (one write per
        page they are in). Returns the nodes written, whose lines are now unverified (none if the
        write failed: the lines are written with the next snapshot)."""
        if not jobs:
            return []
        try:
            self._put_newest(jobs)
            with self.memory.lock:
                for job in jobs:
                    job.st.unverified[job.iid] = stronger(job.st.unverified.get(job.iid), job.representative)
                    job.st.written_at = now
        except Exception as exc:  # Firestore trouble: the lines are written with the next snapshot
            log.emit("WARNING", "storm counts not written yet", shards=len(jobs), error=repr(exc)[:300])
            for job in jobs:
                self._restore(job)
            return []
        finally:
            with self.memory.lock:
                for _ in jobs:
                    self._in_flight -= 1
                    self._written.notify_all()
        return list({id(j.st): (j.nkey, j.st) for j in jobs}.values())

    def _put_newest(self, jobs: list[Job]) -> None:
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

    def _restore(self, job: Job) -> None:
        """A write failed: its lines go out with the node's next snapshot, or the job is kept."""
        with self.memory.lock:
            st = job.st
            if st.shard == job.shard and self.memory.nodes.get(job.nkey) is st:
                st.buffered += job.lines
                st.representative = stronger(st.representative, job.representative)
                self.memory.pending.add(job.nkey)
            else:
                self._retry.append(job)

    def _shard_doc(self, st: NodeState, nkey: str, iid: str, now: float) -> CountShard:
        """Under the lock: what the shard document holds (its totals, and the burst they extend)."""
        totals = copy.deepcopy(st.deltas)
        last = float(totals["last_seen"])
        burst = last + self.policy.window("burst_silence_s") if last else 0.0
        return {**totals, "incident": iid, "node": nkey, "burst_until": burst, "at": now}

    # -- a line its incident no longer absorbs ----------------------------------------

    def take_out(self, st: NodeState, nkey: str, iid: str, rep: FaultEvent, now: float) -> Rewrite | None:
        """Under the lock: take the line out of the totals of the shard it was written to, if this
        state still holds that shard (None: it does not; nothing to write)."""
        if st.shard_iid != iid:
            return None
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
        return Rewrite(st.seq, st.shard, st.page, self._shard_doc(st, nkey, iid, now))

    def rewrite(self, st: NodeState, change: Rewrite) -> None:
        """Write a shard as ``take_out`` left it (unless a newer snapshot of it was written);
        raises what the store raised."""
        with self._page_lock:
            if change.seq > st.written.get(change.shard, 0):
                self.store.counts.put_shards({change.page: {change.shard: change.totals}})
                st.written[change.shard] = change.seq
