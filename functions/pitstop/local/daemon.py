"""`pitstop local up` in the background: the process that owns a local stack until `local down`.

The stack's supervisor (functions that die are started again) and its chaos endpoint live in
the process that started it, so `pitstop local up` starts this process, which brings the
stack up, writes ``ready.json`` (or ``failed.txt`` with the reason) into the workdir, and
then waits: SIGTERM or SIGINT (`pitstop local down`) stops every part and removes stack.json.

``python -m pitstop.local.daemon --workdir W --spec '{"nodes": 8, ...}' [--sweep-interval S]
[--job-nodes N]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path

from pitstop.local.stack import ClusterSpec, Stack

READY, FAILED = "ready.json", "failed.txt"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pitstop.local.daemon")
    p.add_argument("--workdir", required=True)
    p.add_argument("--spec", default="{}", help="ClusterSpec fields as JSON")
    p.add_argument("--sweep-interval", type=float, default=60.0)
    p.add_argument("--job-nodes", type=int, default=0)
    args = p.parse_args(argv)
    workdir = Path(args.workdir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    stack = Stack(workdir, ClusterSpec(**json.loads(args.spec)), sweep_interval=args.sweep_interval)
    try:
        state = stack.up()
        state.daemon_pid = os.getpid()
        state.save()
        job = None
        if args.job_nodes:
            assert stack.slurm is not None
            job = stack.slurm.submit(args.job_nodes, name="train")
        (workdir / READY).write_text(json.dumps({"job": job, "pid": os.getpid()}))
    except BaseException:
        (workdir / FAILED).write_text(traceback.format_exc())
        stack.down()
        return 1
    stop.wait()
    stack.down()
    (workdir / "stack.json").unlink(missing_ok=True)
    (workdir / READY).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
