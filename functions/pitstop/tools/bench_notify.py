"""``pitstop bench notify``: a storm of notifications through notify as deployed, N x C deliveries.

Each instance is its own process: functions-framework serving functions/main.py's ``notify``
(through tools/bench_calls.py, which only times) with THREADS = C, its ledger on one Firestore
emulator, its metrics to the local Cloud Monitoring stand-in, its posts to the local webhook sink
(chat) and the sink's PagerDuty Events v2 endpoint (``python -m pitstop.local.serve``). The push
side is bench ingest's (tools/bench_fleet.py): at most C deliveries in flight per instance, a
refused or unanswered delivery redelivered after Pub/Sub's retry delay (scaled), dead-lettered
after 5 attempts (notify's subscription allows 10: the bench is stricter).

The storm is what ingest and actuate publish (services/outbox.py): one page of a held storm (one
notification, published ``page_copies`` times: the sweep republishing an entry whose mark-sent was
lost, each copy its own Pub/Sub message), and incident notices (core/remediation.notification):
per incident one under way (no page), then one resolved or, one in ten, failed; ``republished`` of
them published a second time. Each notification's summary ends with its serial, which is how the
sinks' records are matched to it: duplicates are posts beyond one per notification, counted from
the sink's own file.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pitstop.core import remediation
from pitstop.core.answers import Notification
from pitstop.core.domain import Incident
from pitstop.local import procs
from pitstop.plugins.channels.pagerduty.body import pagerduty_action, pagerduty_event
from pitstop.plugins.channels.pagerduty.local import PATH as PAGERDUTY_PATH
from pitstop.tools import bench_fleet
from pitstop.tools.bench_calls import STATS_DIR_ENV
from pitstop.tools.bench_types import CallsReport, NotifyRun, PushBody, Report, SinkFigures

CALLS_SOURCE = Path(__file__).with_name("bench_calls.py")
PKG_ROOT = Path(__file__).resolve().parents[2]  # functions/: main.py and pitstop
HOOK_PATH = "/hook"
ROUTING_KEY = "pitstopbenchroutingkey0000000000"  # 32 characters, as PagerDuty shape-checks it
SERIAL = " #"  # a summary ends with " #<serial>"


@dataclass(frozen=True)
class Shape:
    """One run: instances, deliveries at once per each, and the storm."""

    instances: int
    concurrency: int
    notifications: int  # Pub/Sub messages pushed (copies included)
    page_copies: int = 50
    republish_every: int = 20  # one incident notice in this many is published twice
    retry_scale: float = 0.1
    deadline_s: float = 600.0
    ack_deadline_s: float = 60.0


def _incident(i: int, state: str) -> Incident:
    inc: dict[str, object] = {
        "id": f"ibench{i:05d}",
        "node": {"instance": f"a3-node-{i % 1000:03d}", "zone": "us-central1-a", "project": "train-prod"},
        "cluster": "train",
        "kind": "gpu_xid",
        "xid": 79,
        "action": "REBOOT_NODE",
        "state": state,
        "step": 1,
        "reason": "Xid 79: GPU has fallen off the bus",
        "timeline": {"detected": 1_800_000_000.0, "fenced": 1_800_000_030.0, "resolved": 1_800_000_400.0},
    }
    return cast(Incident, inc)  # the fields a notification reads


def _notice(i: int, state: str, severity: str, serial: int) -> Notification:
    text = {
        "FENCED": "REBOOT_NODE under way",
        "RESOLVED": "REBOOT_NODE done; node healthy and back in service",
    }
    summary = f"a3-node-{i % 1000:03d}: {text.get(state, 'REBOOT_NODE FAILED at act')}{SERIAL}{serial}"
    return remediation.notification(_incident(i, state), severity, summary)


def storm(shape: Shape) -> tuple[list[Notification], list[int]]:
    """The distinct notifications, and the order their messages are published (indexes, copies
    included): the page's copies spread through the first half, republished notices after their first."""
    from pitstop.core.remediation import page_notification

    held = _incident(99_999, "HELD")
    page = page_notification(f"incident ibench99999: cluster budget spent{SERIAL}0", held)
    distinct: list[Notification] = [page]
    order: list[int] = []
    i = 0
    while len(order) + shape.page_copies < shape.notifications:
        under_way = _notice(i, "FENCED", "info", len(distinct))
        distinct.append(under_way)
        order.append(len(distinct) - 1)
        failed = i % 10 == 9
        ended = _notice(
            i, "FAILED" if failed else "RESOLVED", "critical" if failed else "info", len(distinct)
        )
        distinct.append(ended)
        order.append(len(distinct) - 1)
        if i % shape.republish_every == 0:
            order.append(len(distinct) - 1)
        i += 1
    order = order[: max(0, shape.notifications - shape.page_copies)]
    step = max(1, len(order) // (2 * max(shape.page_copies, 1)))
    for c in range(shape.page_copies):
        order.insert(min(len(order), c * (step + 1)), 0)
    return distinct, order


def _messages(distinct: list[Notification], order: list[int]) -> Iterator[PushBody]:
    for m, idx in enumerate(order):
        data = base64.b64encode(json.dumps(distinct[idx]).encode()).decode()
        yield {"message": {"data": data, "messageId": f"bench-{m}", "publishTime": "2026-11-26T06:00:00Z"}}


def _serial(text: str) -> int | None:
    head = text.split("\n", 1)[0]
    tail = head.rpartition(SERIAL)[2]
    return int(tail) if tail.isdigit() else None


def sent(records: Sequence[Mapping[str, object]]) -> dict[str, dict[Hashable, int]]:
    """Posts per notification at each sink, from the sink's records: the chat webhook's by the
    summary's serial, PagerDuty's by (dedup key, action): one alert per incident, one resolve.
    A record is the sink's JSON, read back: a body that is not an object reads as empty."""
    out: dict[str, dict[Hashable, int]] = {"webhook": {}, "pagerduty": {}}
    for r in records:
        raw = r.get("body")
        body: Mapping[str, object] = raw if isinstance(raw, Mapping) else {}
        if r.get("path") == HOOK_PATH:
            key: Hashable = _serial(str(body.get("text", "")))
            out["webhook"][key] = out["webhook"].get(key, 0) + 1
        elif r.get("path") == PAGERDUTY_PATH:
            key = (body.get("dedup_key"), body.get("event_action"))
            out["pagerduty"][key] = out["pagerduty"].get(key, 0) + 1
    return out


def expected(distinct: list[Notification], order: list[int]) -> dict[str, set[Hashable]]:
    """What each sink should receive once of the notifications published: every one by chat (its
    serial), PagerDuty's triggers and resolves (dedup key, action)."""
    pd: set[Hashable] = set()
    for n in (distinct[i] for i in set(order)):
        action = pagerduty_action(n)
        if action is not None:
            pd.add((pagerduty_event(n, ROUTING_KEY, action)["dedup_key"], action))
    return {"webhook": set(order), "pagerduty": pd}


def _sinks(workdir: Path, env: dict[str, str], stack: ExitStack) -> tuple[str, str]:
    """The webhook sink (chat and PagerDuty) and Cloud Monitoring's stand-in, each a process."""
    out = []
    for name in ("webhook", "monitoring"):
        port = procs.free_port()
        argv = [sys.executable, "-m", "pitstop.local.serve", name, "--port", str(port)]
        proc = procs.Proc(
            name, [*argv, "--out", str(workdir / f"{name}.jsonl")], workdir / f"{name}.log", env
        )
        stack.callback(proc.stop)
        _listening(proc.start(), port)
        out.append(f"127.0.0.1:{port}")
    return out[0], out[1]


def _listening(proc: procs.Proc, port: int, timeout: float = 60.0) -> None:
    """Until the process accepts connections on its port (monitoring's is gRPC: no HTTP probe)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited early:\n{proc.tail()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{proc.name} not listening after {timeout}s:\n{proc.tail()}")


def run(shape: Shape, firestore_host: str) -> NotifyRun:
    """One run: the sinks, N instances, the storm pushed, the instances stopped, the sinks read."""
    project, workdir, stats = bench_fleet.scratch("pitstop-bench-notify-")
    policy = workdir / "policy.yaml"
    policy.write_text(json.dumps({"mode": "enforce", "clusters": []}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUBSUB_", "SLURM_"))}
    env |= {
        "PYTHONPATH": str(PKG_ROOT),
        "GOOGLE_CLOUD_PROJECT": project,
        "FIRESTORE_EMULATOR_HOST": firestore_host,
    }
    distinct, order = storm(shape)
    with ExitStack() as stack:
        hook, monitoring = _sinks(workdir, env, stack)
        env |= {
            "PITSTOP_POLICY": str(policy),
            "PITSTOP_MONITORING_ENDPOINT": monitoring,
            "PITSTOP_WEBHOOK_URL": f"http://{hook}{HOOK_PATH}",
            "PITSTOP_WEBHOOK_FORMAT": "chat",
            "PITSTOP_PAGERDUTY_URL": f"http://{hook}{PAGERDUTY_PATH}",
            "PITSTOP_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
            STATS_DIR_ENV: str(stats),
        }
        instances = bench_fleet.start_instances(
            "notify", shape.instances, workdir, env, shape.concurrency, CALLS_SOURCE
        )
        try:
            push = bench_fleet._Push(_messages(distinct, order), shape)
            slots = [
                threading.Thread(
                    target=bench_fleet._deliver_loop,
                    args=(push, inst.port, shape.ack_deadline_s),
                    daemon=True,
                )
                for inst in instances
                for _ in range(shape.concurrency)
            ]
            elapsed = bench_fleet.run_slots(slots, instances)
        finally:
            for inst in instances:
                inst.proc.signal(15)
            for inst in instances:
                inst.proc.stop(timeout=60)
    reports: list[CallsReport] = [json.loads(p.read_text()) for p in sorted(stats.glob("*.json"))]
    records: list[Mapping[str, object]] = [
        json.loads(x) for x in (workdir / "webhook.jsonl").read_text().splitlines() if x
    ]
    metrics = workdir / "monitoring.jsonl"
    series = sum(1 for x in metrics.read_text().splitlines() if x) if metrics.exists() else 0
    return _figures(
        shape, push.tally, elapsed, reports, instances, expected(distinct, order), records, series
    )


def _figures(
    shape: Shape,
    tally: bench_fleet._Tally,
    elapsed: float,
    reports: list[CallsReport],
    instances: list[bench_fleet._Instance],
    want: dict[str, set[Hashable]],
    records: list[Mapping[str, object]],
    series: int,
) -> NotifyRun:
    calls = [c for r in reports for c in r["calls"]]
    took = sorted(c[2] for c in calls)
    outcomes: dict[str, int] = {}
    for _, outcome, _ in calls:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    got = sent(records)
    per_sink: dict[str, SinkFigures] = {
        sink: {
            "expected": len(want[sink]),
            "sent": sum(got[sink].values()),
            "duplicates": sum(n - 1 for n in got[sink].values()),
            "missing": len(want[sink] - set(got[sink])),
            "unexpected": len(set(got[sink]) - want[sink]),
        }
        for sink in ("webhook", "pagerduty")
    }
    return {
        "instances": shape.instances,
        "concurrency": shape.concurrency,
        "notifications": shape.notifications,
        "distinct": len(want["webhook"]),
        "finished": True,
        "seconds": round(elapsed, 1),
        "notifications_per_s": round(shape.notifications / elapsed, 1),
        "latency_ms": {
            "p50": bench_fleet.percentile_ms(took, 0.5),
            "p99": bench_fleet.percentile_ms(took, 0.99),
            "max": bench_fleet.percentile_ms(took, 1.0),
        },
        "outcomes": dict(sorted(outcomes.items())),
        "deliveries": tally.delivered,
        "refused": tally.refused,
        "timed_out": tally.timed_out,
        "dead_lettered": tally.dead_lettered,
        "sinks": per_sink,
        "duplicates_sent": sum(s["duplicates"] for s in per_sink.values()),
        "missing": sum(s["missing"] for s in per_sink.values()),
        "page_posts": got["webhook"].get(0, 0),  # the held storm's page, by chat: must be 1
        "metrics_series": series,
        "peak_mib_per_instance": round(max((i.peak_pss_mib for i in instances), default=0.0), 1),
        "peak_mib_by_instance": [round(i.peak_pss_mib, 1) for i in instances],
        "worker_hwm_mib_max": max((r["peak_mib"] for r in reports), default=0.0),
        "ready_s_max": round(max((i.ready_s for i in instances), default=0.0), 1),
    }


def bench_notify(
    notifications_n: int, instances: list[int], concurrency: list[int], **shape: Any
) -> Report[NotifyRun]:
    """The storm through every (instances, concurrency), on one Firestore emulator."""
    proc = None
    host = os.environ.get("FIRESTORE_EMULATOR_HOST")
    if not host:
        proc, host = procs.start_emulator("firestore", Path(tempfile.mkdtemp(prefix="pitstop-bench-")))
    try:
        runs = []
        for k, (n, c) in enumerate(((n, c) for n in instances for c in concurrency), 1):
            shaped = Shape(n, c, notifications_n, **shape)
            total = len(instances) * len(concurrency)
            print(f"pitstop bench: notify run {k} of {total}: {shaped}", file=sys.stderr, flush=True)
            runs.append(run(shaped, host))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # progress
    finally:
        if proc is not None:
            proc.stop()
    return {"benchmark": "notify", "cpus": os.cpu_count(), "runs": runs}
