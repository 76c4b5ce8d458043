"""When the coalescer's buffered storm counts (services/coalesce.py) are written: on the next line
of a node once its interval has passed (no timer), on the instance's own timer (a daemon thread,
:meth:`Flusher.due`), when a node state is evicted, or at shutdown (:meth:`Flusher.all`;
functions/main.py wires SIGTERM and atexit). What is written is then checked against its incident
(services/count_checks.py).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from pitstop.adapters import log
from pitstop.services.count_checks import VERIFY_S, CountChecker
from pitstop.services.count_shards import Job, ShardWriter
from pitstop.services.node_memory import NodeMemory, NodeState

IDLE_TICKS = 30  # the timer thread stops after this many ticks with nothing buffered
# Jitter from a generator of its own: the timer runs on a background thread, and a draw from the
# module's shared one there moves another thread's random sequence mid-use.
_JITTER = random.Random()  # noqa: S311 - jitter, not a secret


class Flusher:
    """Writes what the node states buffered (through the ShardWriter) and checks it (through the
    CountChecker): now, when due, or on a timer thread of its own while counts are buffered
    (``timer``: off, only lines and flushes write)."""

    def __init__(
        self,
        memory: NodeMemory,
        writer: ShardWriter,
        checker: CountChecker,
        clock: Callable[[], float],
        flush_interval: float,
    ) -> None:
        self.memory, self.writer, self.checker, self.clock = memory, writer, checker, clock
        self.flush_interval = flush_interval
        self.timer = True
        self._thread: threading.Thread | None = None
        self.stopped = threading.Event()  # set: the timer ends (close)

    def write(self, jobs: list[Job], now: float) -> None:
        """Write detached snapshots in one store call, then check them if no feed is watched."""
        self.checker.after_write(self.writer.write(jobs, now), now)

    def evict(self, evicted: list[tuple[str, NodeState]], now: float) -> None:
        """Write and check what evicted node states still hold (nobody else would)."""
        for old_key, old in evicted:
            with self.memory.lock:
                job = self.writer.take(old, old_key, now)
            if job is not None:
                self.write([job], now)
            if old.unverified or old.replays:
                self.checker.verify(old_key, old, now)

    def all(self, now: float, wait_s: float = 30.0) -> int:
        """Write every buffered count now (SIGTERM, exit, the sweep, the end of a benchmark).

        In one store call (one write per page: at SIGTERM an instance has seconds, and a storm
        over 2,000 nodes leaves as many shards). Returns once writes already under way elsewhere
        (the timer, another line) have finished too, so whoever reads the incidents next sees
        every count this instance had.
        """
        nodes = self.memory.nodes
        with self.memory.lock:
            jobs = [job for k in list(self.memory.pending) if (job := self.writer.take(nodes[k], k, now))]
        self.write(jobs + self.writer.take_retries(), now)
        self.writer.wait_written(wait_s)
        self.checker.watch_feed(now)  # what was resolved since the last look: replayed before it goes
        return len(jobs)

    def due(self, now: float) -> int:
        """Look at the resolved feed, write the counts buffered for a flush interval or longer, check
        lines written ``VERIFY_S`` ago that nothing checked since, drop idle node states.

        A page with a node due is written whole: every node of it with lines buffered goes in the
        same write (a write per page and interval, whatever the nodes). A shutdown's ``all``
        waits for it.
        """
        self.checker.watch_feed(now)
        jobs = self.writer.take_retries()
        nodes, pending = self.memory.nodes, self.memory.pending
        with self.memory.lock:
            pages = {nodes[k].page for k in pending if now - nodes[k].last_flush >= self.flush_interval}
            due = [k for k in pending if nodes[k].page in pages]
            late = [
                (k, st)
                for k, st in nodes.items()
                if (st.unverified and now - st.written_at >= VERIFY_S) or st.replays
            ]
            self.memory.drop_idle(now)
            written = [job for k in due if (job := self.writer.take(nodes[k], k, now))]
        self.write(jobs + written, now)  # one store call: a write per page, not per node
        for k, st in late:
            self.checker.verify(k, st, now)
        return len(written)

    def ensure_timer(self) -> bool:
        """Under the lock: make sure the timer thread runs while counts are buffered (False: off)."""
        if not self.timer or self.stopped.is_set():
            return False
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._tick, name="pitstop-flush", daemon=True)
            self._thread.start()
        return True

    def _tick(self) -> None:
        """The timer: write due counts every interval, first as it starts (until its first look at
        the feed, a write was checked by a read at once); stop when nothing was buffered for a while."""
        quiet, tick = 0, self.checker.tick_s
        while True:
            try:
                self.due(self.clock())
            except Exception as exc:  # never let the timer die silently with counts buffered
                log.emit("ERROR", "storm count flush failed", error=repr(exc)[:300])
            with self.memory.lock:
                quiet = 0 if self.memory.pending else quiet + 1
                if quiet >= IDLE_TICKS:
                    self._thread = None
                    return
            # Jittered, so that instances started together do not merge into the same incidents at once.
            if self.stopped.wait(tick * _JITTER.uniform(0.75, 1.25)):
                return

    def close(self) -> None:
        """Stop the timer thread (tests, benchmarks); buffered counts stay until flushed."""
        self.stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
