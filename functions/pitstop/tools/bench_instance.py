"""One ingest instance of ``pitstop bench ingest``: functions/main.py's own handler, counted.

Run as ``functions-framework --source functions/pitstop/tools/bench_instance.py --target ingest``
with THREADS set to the instance's concurrency, as deploy sets it. The handler is main's,
unchanged (timed: a delivery running longer than SLOW_S has its stack written to the instance's
log); before main first builds its Ingest, two things are swapped in:

- ``main._db``: the Firestore client it returns counts its billed operations (tools/firestore_ops.py);
- the notifier: a page is counted, not published (the bench runs no Pub/Sub emulator).

When the instance stops (SIGTERM: gunicorn's worker exits, and main's exit hook merges the
counts it still buffers), it writes its figures to ``$PITSTOP_BENCH_STATS_DIR/<pid>.json``:
Firestore reads and writes, contention retries, pages, the coalescer's sizes and the worker's
peak resident memory. Shipped code knows nothing of this module.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import main
from pitstop.adapters import pubsub
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.store_tally import Tally
from pitstop.tools.firestore_ops import FirestoreOps, added

if TYPE_CHECKING:  # the instance loads no more than before: the figures are its memory's
    from pitstop.tools.bench_types import InstanceFigures

STATS_DIR_ENV = "PITSTOP_BENCH_STATS_DIR"
__all__ = ["ingest"]

_ops: list[FirestoreOps] = []
_pages = [0]
_lock = threading.Lock()
_shipped_db = main._db
SLOW_S = 20.0  # a delivery running longer has its stack written to the instance's log, once
_running: dict[int, float] = {}  # thread -> when the delivery it serves began
_watcher: list[threading.Thread] = []


def ingest(cloud_event: Any) -> None:
    """main's handler, timed: a slow delivery's stack tells where a stalled run waits."""
    tid = threading.get_ident()
    with _lock:
        if not _watcher:  # started in the process that serves (threads do not survive a fork)
            _watcher.append(threading.Thread(target=_watch_slow, name="bench-slow", daemon=True))
            _watcher[0].start()
    _running[tid] = time.monotonic()
    try:
        main.ingest(cloud_event)
    finally:
        _running.pop(tid, None)


def _watch_slow() -> None:
    told: set[tuple[int, float]] = set()
    while True:
        time.sleep(5)
        frames = sys._current_frames()
        for tid, began in list(_running.items()):
            took = time.monotonic() - began
            if took > SLOW_S and (tid, began) not in told and tid in frames:
                told.add((tid, began))
                stack = "".join(traceback.format_stack(frames[tid]))
                sys.stderr.write(f"bench: delivery running {took:.0f} s, thread {tid}:\n{stack}\n")
                sys.stderr.flush()


def _counted_db(project: str, env: str = "PITSTOP_FIRESTORE_DATABASE") -> Any:
    client = _shipped_db(project, env)
    with _lock:
        _ops.append(FirestoreOps(client))
    return client


class _CountedPages:
    """Stands in for the notifications topic: counts pages, publishes nothing."""

    def __init__(self, project: str, topic: str, publisher: Any = None, key: bytes | None = None) -> None:
        self.topic = topic  # the sealing key (pubsub.Notifier's) changes nothing that is counted

    def publish(self, notification: Mapping[str, object]) -> str:
        with _lock:
            _pages[0] += 1
            return f"bench-page-{_pages[0]}"


def _peak_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def figures() -> InstanceFigures:
    """What this instance did, for the bench to add up."""
    built = main._ingest.cache_info().currsize > 0
    svc = main._ingest() if built else None
    store = svc.store if svc is not None else None
    tally = store.tally if isinstance(store, IncidentStore) else Tally()  # the Firestore store's counters
    return {
        "pid": os.getpid(),
        "reads": sum(o.reads for o in _ops),
        "writes": sum(o.writes for o in _ops),
        "ops_by_collection": added(o.by_collection for o in _ops),
        "ops_by_site": added(o.by_site for o in _ops),
        "calls": added(o.calls for o in _ops),
        "retries": tally.retries,
        "refused_commits": tally.refused,
        "refused_writes": tally.refused_writes,
        "commits": dict(tally.commits),
        "coalesced": svc.coalescer.coalesced if svc is not None else 0,
        "coalescer": svc.coalescer.stats() if svc is not None else {},
        "pages": _pages[0],
        "peak_mib": round(_peak_mib(), 1),
    }


def _flush_then_report() -> None:
    main.flush_counts()
    out = os.environ.get(STATS_DIR_ENV)
    if out and main._ingest.cache_info().currsize:  # the worker that served, not gunicorn's master
        Path(out, f"{os.getpid()}.json").write_text(json.dumps(figures()))


main._db = _counted_db
pubsub.Notifier = _CountedPages  # type: ignore[misc,assignment]
atexit.unregister(main.flush_counts)  # one hook, in order: merge what is buffered, then report
atexit.register(_flush_then_report)
