"""`pitstop bench notify` and `pitstop bench actuate`, run tiny: their figures are measurements.

Each runs the real function under functions-framework as its own process (the sizes in
infra/resources.yaml come from these figures); what is asserted is that each figure was read
where it happens (the sinks' own records, the instance's own memory, the fake Compute's calls,
the store's incidents), never how fast anything was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from pitstop.plugins.channels.webhook.body import render
from pitstop.tools import bench_notify

PITSTOP = [sys.executable, "-m", "pitstop.tools.cli", "bench"]


def _bench(target: str, env: dict[str, str], *flags: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*PITSTOP, target, *flags], capture_output=True, timeout=300, check=False, env={**os.environ, **env}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(proc.stdout)["runs"]  # stdout holds the figures alone: logs go to stderr
    result: dict[str, Any] = run
    return result


@pytest.mark.emulator
def test_bench_notify_counts_what_the_sinks_received(firestore_host: str) -> None:
    """A storm whose page is published 3 times and some notices twice: every notification reaches
    the chat webhook once and PagerDuty once where it pages or resolves, as the sink's file says."""
    flags = ["--notifications", "30", "--notify-instances", "1", "--levels", "2", "--page-copies", "3"]
    run = _bench("notify", {"FIRESTORE_EMULATOR_HOST": firestore_host}, *flags, "--retry-scale", "0.01")
    hook, pd = run["sinks"]["webhook"], run["sinks"]["pagerduty"]
    assert run["distinct"] < run["notifications"]  # copies of the page and republished notices
    assert hook["sent"] == hook["expected"] == run["distinct"] and hook["duplicates"] == 0, run
    assert pd["sent"] == pd["expected"] > 0 and pd["duplicates"] == pd["missing"] == 0, run
    assert run["page_posts"] == 1 and run["duplicates_sent"] == 0
    # every message answered 2xx once; a copy that found another's claim was refused and redelivered
    assert run["outcomes"]["ok"] == run["notifications"] and run["dead_lettered"] == 0
    assert run["deliveries"] == run["notifications"] + run["refused"]
    assert run["metrics_series"] > 0
    assert len(run["peak_mib_by_instance"]) == 1 and run["peak_mib_per_instance"] > 0
    assert run["worker_hwm_mib_max"] > 30  # an interpreter with main loaded, as the worker reported


def test_duplicates_are_counted_from_the_sink_records() -> None:
    """The count the bench reports is the sink's: a second post of one notification is one duplicate."""
    shape = bench_notify.Shape(1, 1, 12, page_copies=2)
    distinct, order = bench_notify.storm(shape)
    n = distinct[order[-1]]
    chat = {"path": bench_notify.HOOK_PATH, "body": render(n, "chat")}
    got = bench_notify.sent([chat, chat])
    assert got["webhook"] == {order[-1]: 2}
    assert order.count(0) == 2 and len(order) == 12  # the page's copies are in the storm


@pytest.mark.emulator
def test_bench_actuate_remediates_through_the_workflow(firestore_host: str, pubsub_host: str) -> None:
    """Two remediations at once through one actuate instance: each resolved, one reset each, every
    op of the path called once per remediation, the instance's memory its own."""
    env = {"FIRESTORE_EMULATOR_HOST": firestore_host, "PUBSUB_EMULATOR_HOST": pubsub_host}
    flags = ["--levels", "2", "--remediations", "2", "--compute-scale", "0.002", "--workflow-scale", "0.01"]
    run = _bench("actuate", env, *flags)
    assert run["finished"] and run["resolved"] == 2 and run["incidents"] == {"RESOLVED": 2}, run
    assert run["compute_resets"] == 2 and run["notices_published"] == 2
    by_op = run["latency_ms_by_op"]
    for op in ("claim", "fence", "act", "verify", "close"):
        assert by_op[op]["calls"] == 2, (op, by_op)
    assert by_op["operation"]["calls"] >= 2  # the reset's operation polled until done
    assert run["calls"] == sum(o["calls"] for o in by_op.values()) and run["answers"] == {"200": run["calls"]}
    assert run["peak_mib"] > 0 and run["worker_hwm_mib"] > 30
