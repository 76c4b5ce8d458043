"""One notify or actuate instance of ``pitstop bench notify|actuate``: main's handlers, timed.

Run as ``functions-framework --source functions/pitstop/tools/bench_calls.py --target notify``
(or ``actuate``) with THREADS set to the instance's concurrency, as deploy sets it. Each handler
is main's, unchanged; around it this module records how long each call took and how it ended
(actuate: its op and HTTP status; notify: ``ok`` or the exception's type, which makes
functions-framework answer 500 and Pub/Sub redeliver). When the worker exits (SIGTERM), it
writes the calls and its peak resident memory (VmHWM) to ``$PITSTOP_BENCH_STATS_DIR/<pid>.json``.
Shipped code knows nothing of this module.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import main

if TYPE_CHECKING:  # the instance loads no more than before: the figures are its memory's
    from pitstop.tools.bench_types import CallsReport

STATS_DIR_ENV = "PITSTOP_BENCH_STATS_DIR"
__all__ = ["actuate", "notify"]

_calls: list[tuple[str, str, float]] = []  # (what, outcome, seconds)
_lock = threading.Lock()


def _record(what: str, outcome: str, began: float) -> None:
    with _lock:
        _calls.append((what, outcome, time.perf_counter() - began))


def actuate(request: Any) -> Any:
    """main.actuate, timed per op."""
    began = time.perf_counter()
    body = request.get_json(silent=True)
    op = body.get("op") if isinstance(body, dict) else None
    op = op if isinstance(op, str) else "?"
    answer = main.actuate(request)
    _record(op, str(answer[1]) if isinstance(answer, tuple) else "?", began)
    return answer


def notify(cloud_event: Any) -> None:
    """main.notify, timed; an exception is recorded, then raised as before (Pub/Sub redelivers)."""
    began = time.perf_counter()
    try:
        main.notify(cloud_event)
    except Exception as exc:
        _record("notify", type(exc).__name__, began)
        raise
    _record("notify", "ok", began)


def peak_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _report() -> None:
    out = os.environ.get(STATS_DIR_ENV)
    if out and _calls:  # the worker that served, not gunicorn's master
        doc: CallsReport = {"pid": os.getpid(), "peak_mib": round(peak_mib(), 1), "calls": _calls}
        Path(out, f"{os.getpid()}.json").write_text(json.dumps(doc))


atexit.register(_report)
