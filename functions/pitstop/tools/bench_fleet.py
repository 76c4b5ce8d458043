"""``pitstop bench ingest``: a storm through ingest as deployed, N instances x C deliveries each.

Each instance is its own process: functions-framework serving functions/main.py's ``ingest``
(through tools/bench_instance.py, which only counts) with THREADS = C, its own coalescer,
against one Firestore emulator; workflow starts go to a local Executions API that runs
nothing. The bench plays Pub/Sub push: at most C deliveries in flight per instance, and a
delivery refused (any non-2xx answer) or not answered within the ack deadline is delivered
again after Pub/Sub's exponential retry delay, with the same message id, until the
subscription's maximum delivery attempts dead-letter it (infra/resources.yaml sets both for
ingest's trigger; the bench scales the delays down by ``retry_scale``).

Figures per run: lines/s (first delivery to last answer), Firestore operations per line,
contention retries, workflow starts per incident, every line counted (after the instances
stopped and merged what they buffered), and each instance's peak memory (sampled PSS of
gunicorn's master and worker together, and the worker's own VmHWM).
"""

from __future__ import annotations

import heapq
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pitstop.core.domain import Incident
from pitstop.local import procs
from pitstop.tools import bench_cpu
from pitstop.tools.bench import storm
from pitstop.tools.bench_types import IngestRun, InstanceFigures, PushBody, Report, RunCpu
from pitstop.tools.firestore_ops import added

if TYPE_CHECKING:
    from pitstop.local.executions_server import ExecutionsService

INSTANCE_SOURCE = Path(__file__).with_name("bench_instance.py")
PUSH_PATH = "/projects/train-prod/topics/pitstop-events"
SUBSCRIPTION = "projects/train-prod/subscriptions/pitstop-ingest-trigger"
# ingest's trigger subscription as deploy sets it (infra/resources.yaml subscription-update).
MAX_DELIVERY_ATTEMPTS = 5
MIN_RETRY_DELAY_S = 10.0
MAX_RETRY_DELAY_S = 600.0


@dataclass(frozen=True)
class Shape:
    """What one run deploys and pushes."""

    instances: int
    concurrency: int
    lines: int
    nodes: int
    ack_deadline_s: float = 60.0
    retry_scale: float = 0.1  # Pub/Sub's 10 s..600 s retry delays, scaled for a bench
    deadline_s: float = 600.0  # a run pushes no new message after this (a stalled shape is reported)


class Pacing(Protocol):
    """What the push side reads of a run's shape (bench ingest's and bench notify's alike)."""

    @property
    def retry_scale(self) -> float: ...

    @property
    def deadline_s(self) -> float: ...


@dataclass
class _Tally:
    """The push side's counts (under its lock)."""

    delivered: int = 0  # HTTP requests sent
    acked: int = 0
    refused: int = 0
    timed_out: int = 0
    dead_lettered: int = 0
    status: dict[str, int] = field(default_factory=dict)


class _Push:
    """Pub/Sub push, played: fresh messages in order, redeliveries when their retry delay is up."""

    def __init__(self, bodies: Iterator[PushBody], shape: Pacing) -> None:
        self.bodies, self.shape = bodies, shape
        self.retry: list[tuple[float, int, bytes, int]] = []  # (due, seq, body, attempts so far)
        self.inflight, self.fresh_done = 0, False
        self.stop_at = time.monotonic() + shape.deadline_s
        self.tally = _Tally()
        self.cond = threading.Condition()
        self._seq = 0
        self.cut_short = False
        self.pushed = 0  # distinct messages handed out

    def take(self) -> tuple[bytes, int] | None:
        """The next delivery (body, attempts before it), or None when every message is settled."""
        with self.cond:
            while True:
                now = time.monotonic()
                if self.retry and self.retry[0][0] <= now:
                    _, _, body, attempts = heapq.heappop(self.retry)
                    self.inflight += 1
                    return body, attempts
                if not self.fresh_done and now >= self.stop_at:
                    self.fresh_done = self.cut_short = True  # what is pushed already settles
                if not self.fresh_done:
                    msg = next(self.bodies, None)
                    if msg is not None:
                        self.inflight += 1
                        self.pushed += 1
                        return _push_body(msg), 0
                    self.fresh_done = True
                if not self.retry and self.inflight == 0:
                    self.cond.notify_all()
                    return None
                wait = (self.retry[0][0] - now) if self.retry else None
                self.cond.wait(wait)

    def settle(self, body: bytes, attempts: int, outcome: str) -> None:
        """Ack, or schedule the redelivery (dead-letter after the subscription's attempts)."""
        with self.cond:
            self.inflight -= 1
            t = self.tally
            t.delivered += 1
            t.status[outcome] = t.status.get(outcome, 0) + 1
            if outcome == "200":
                t.acked += 1
            else:
                t.timed_out += outcome == "timeout"
                t.refused += outcome != "timeout"
                if attempts + 1 >= MAX_DELIVERY_ATTEMPTS:
                    t.dead_lettered += 1
                else:
                    delay = min(MAX_RETRY_DELAY_S, MIN_RETRY_DELAY_S * 2**attempts) * self.shape.retry_scale
                    self._seq += 1
                    heapq.heappush(self.retry, (time.monotonic() + delay, self._seq, body, attempts + 1))
            self.cond.notify_all()


def _push_body(msg: PushBody) -> bytes:
    return json.dumps({**msg, "subscription": SUBSCRIPTION}).encode()


def _deliver_loop(push: _Push, port: int, timeout: float) -> None:
    """One delivery slot of one instance: POST, answer, next (a fresh connection after a timeout)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    while (item := push.take()) is not None:
        body, attempts = item
        try:
            conn.request("POST", PUSH_PATH, body, headers)
            resp = conn.getresponse()
            resp.read()
            outcome = "200" if 200 <= resp.status < 300 else str(resp.status)
        except TimeoutError:
            outcome = "timeout"
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        except (ConnectionError, http.client.HTTPException):
            outcome = "connection"
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        push.settle(body, attempts, outcome)
    conn.close()


@dataclass
class _Instance:
    proc: procs.Proc
    port: int
    peak_pss_mib: float = 0.0
    ready_s: float = 0.0  # from its start until it answered (a cold start, on a loaded machine)


def _pids_of(pid: int) -> list[int]:
    """A process and its children (gunicorn's master and its worker)."""
    out = [pid]
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _pss_mib(pids: list[int]) -> float:
    """Proportional set size of these processes together: shared pages counted once, as a container's."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class _MemorySampler:
    """Samples each instance's PSS while the storm runs; keeps the peak."""

    def __init__(self, instances: list[_Instance], every_s: float = 0.5) -> None:
        self.instances, self.every_s = instances, every_s
        self._stop = threading.Event()
        self._pids = [_pids_of(i.proc.popen.pid) if i.proc.popen else [] for i in instances]
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def __enter__(self) -> _MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        for inst, pids in zip(self.instances, self._pids, strict=True):
            inst.peak_pss_mib = max(inst.peak_pss_mib, _pss_mib(pids))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()


def _bench_policy(nodes: int) -> str:
    """The policy the instances load: one Slurm cluster the storm's nodes belong to, enforcing."""
    cluster = {"name": "train", "scheduler": "slurm", "size": nodes, "match": {"name_pattern": "a3-node-*"}}
    return json.dumps({"mode": "enforce", "clusters": [cluster]})  # JSON is YAML


def start_instance(
    target: str, name: str, workdir: Path, env: dict[str, str], threads: int, source: Path = INSTANCE_SOURCE
) -> _Instance:
    """One functions-framework process serving ``target`` from ``source`` with THREADS = ``threads``."""
    ff = str(Path(sys.executable).parent / "functions-framework")
    port = procs.free_port()
    signature = "http" if target == "actuate" else "cloudevent"
    argv = [ff, "--target", target, "--source", str(source), "--signature-type", signature]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    proc = procs.Proc(name, argv, workdir / f"{name}.log", {**env, "THREADS": str(threads)})
    return _Instance(proc.start(), port)


def start_instances(
    target: str, count: int, workdir: Path, env: dict[str, str], threads: int, source: Path = INSTANCE_SOURCE
) -> list[_Instance]:
    """``count`` instances, each waited for until it answers (``ready_s``: since the first started)."""
    out = [start_instance(target, f"{target}-{i}", workdir, env, threads, source) for i in range(count)]
    t0 = time.perf_counter()
    for inst in out:
        procs.wait_http(f"http://127.0.0.1:{inst.port}/", inst.proc, timeout=120, accept_errors=True)
        inst.ready_s = time.perf_counter() - t0
    return out


def run_slots(slots: list[threading.Thread], instances: list[_Instance]) -> float:
    """Run the delivery threads to their end, sampling the instances' memory; the seconds it took."""
    with _MemorySampler(instances):
        t0 = time.perf_counter()
        for s in slots:
            s.start()
        for s in slots:
            s.join()
        return time.perf_counter() - t0


def percentile_ms(sorted_s: list[float], q: float) -> float:
    """The ``q`` quantile of sorted seconds, in ms (0 for none)."""
    if not sorted_s:
        return 0.0
    return round(1000 * sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))], 1)


def scratch(prefix: str) -> tuple[str, Path, Path]:
    """A run's own project id, working folder and the folder its instances report their stats to."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    stats = workdir / "stats"
    stats.mkdir()
    return f"bench-{uuid.uuid4().hex[:8]}", workdir, stats


def _stop_instances(instances: list[_Instance], stats_dir: Path) -> list[InstanceFigures]:
    """SIGTERM every instance (each merges its buffered counts), then read what each reported."""
    for inst in instances:
        inst.proc.signal(15)
    for inst in instances:
        inst.proc.stop(timeout=120)
    reports: list[InstanceFigures] = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("*.json"))]
    return reports


def _cpu_watch(firestore_host: str, instances: list[_Instance]) -> bench_cpu.CpuWatch:
    """CPU over the push: the emulator (whoever listens on its port) and every instance's processes."""
    emulator = bench_cpu.listener_pid(int(firestore_host.rsplit(":", 1)[1]))
    pids = [p for i in instances if i.proc.popen is not None for p in _pids_of(i.proc.popen.pid)]
    return bench_cpu.CpuWatch([emulator] if emulator is not None else [], pids)


def run_storm(shape: Shape, firestore_host: str, executions: ExecutionsService, endpoint: str) -> IngestRun:
    """One run: deploy N instances, push the storm, stop them, read back what it left."""
    from google.cloud import firestore

    project, workdir, stats_dir = scratch("pitstop-bench-")
    policy = workdir / "policy.yaml"
    policy.write_text(_bench_policy(shape.nodes))
    pkg_root = str(Path(__file__).resolve().parents[2])  # functions/: main.py and pitstop
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUBSUB_", "SLURM_"))}
    env |= {
        "PYTHONPATH": pkg_root,
        "GOOGLE_CLOUD_PROJECT": project,
        "FIRESTORE_EMULATOR_HOST": firestore_host,
        "PITSTOP_POLICY": str(policy),
        "PITSTOP_WORKFLOWS_ENDPOINT": endpoint,
        "PITSTOP_BENCH_STATS_DIR": str(stats_dir),
        "PITSTOP_ACK_DEADLINE_S": str(shape.ack_deadline_s),  # as deploy sets it beside the subscription's
    }
    before = set(executions.records)
    instances = start_instances("ingest", shape.instances, workdir, env, shape.concurrency)
    try:
        push = _Push(storm(shape.lines, shape.nodes), shape)
        slots = [
            threading.Thread(target=_deliver_loop, args=(push, inst.port, shape.ack_deadline_s), daemon=True)
            for inst in instances
            for _ in range(shape.concurrency)
        ]
        watch = _cpu_watch(firestore_host, instances)
        elapsed = run_slots(slots, instances)
        cpu = watch.done()
    finally:
        reports = _stop_instances(instances, stats_dir)
    from pitstop.adapters.firestore import IncidentStore

    incidents = IncidentStore(firestore.Client(project=project)).query()  # count shards summed
    starts: dict[tuple[str, str], int] = {}  # (incident, step) -> executions created
    for name in set(executions.records) - before:
        labels = executions.records[name].labels
        key = (labels.get("pitstop-incident", ""), labels.get("pitstop-step", ""))
        starts[key] = starts.get(key, 0) + 1
    out = _figures(shape, push.tally, (elapsed, cpu), reports, instances, incidents, starts)
    if push.cut_short:  # the storm did not get through in deadline_s: figures for what was pushed
        ops = out["firestore_reads"] + out["firestore_writes"]
        out |= {"finished": False, "lines_pushed": push.pushed, "lines_per_s": round(push.pushed / elapsed)}
        out["store_ops_per_line"] = round(ops / max(push.pushed, 1), 4)
        out["every_line_counted"] = out["lines_counted"] == push.pushed
    return out


def _figures(
    shape: Shape,
    tally: _Tally,
    took: tuple[float, RunCpu],  # the push window: seconds, and where the CPU went
    reports: list[InstanceFigures],
    instances: list[_Instance],
    incidents: Sequence[Incident],
    starts: dict[tuple[str, str], int],
) -> IngestRun:
    elapsed, cpu = took
    per_incident: dict[str, int] = {}
    for (iid, _), n in starts.items():
        per_incident[iid] = per_incident.get(iid, 0) + n
    reads, writes = sum(r["reads"] for r in reports), sum(r["writes"] for r in reports)
    counted = sum(i.get("counts", {}).get("events", 0) for i in incidents)
    where = added(r.get("ops_by_collection", {}) for r in reports)  # store operations by kind and collection
    sites = added(r.get("ops_by_site", {}) for r in reports)  # and by call site (firestore_ops.call_site)
    commits = added(r.get("commits", {}) for r in reports)  # decisions' commits by outcome
    calls = added(r.get("calls", {}) for r in reports)  # requests sent (a batched get is one)
    return {
        "instances": shape.instances,
        "concurrency": shape.concurrency,
        "lines": shape.lines,
        "nodes": shape.nodes,
        "finished": True,
        "lines_per_s": round(shape.lines / elapsed),
        "seconds": round(elapsed, 1),
        "store_ops_per_line": round((reads + writes) / shape.lines, 4),
        "firestore_reads": reads,
        "firestore_writes": writes,
        "retries": sum(r["retries"] for r in reports),
        # Decisions' commits refused because another instance wrote first: their writes are in the
        # operations above (counted at the client, pessimistically), and here on their own.
        "refused_commits": sum(r.get("refused_commits", 0) for r in reports),
        "refused_commit_writes": sum(r.get("refused_writes", 0) for r in reports),
        "ops_by_collection": dict(sorted(where.items(), key=lambda kv: -kv[1])),
        "ops_by_site": dict(sorted(sites.items(), key=lambda kv: -kv[1])),
        "calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        "cpu_s": cpu,
        "commits": dict(sorted(commits.items())),
        "incidents": len(incidents),
        "held": sum(1 for i in incidents if i.get("state") == "HELD"),
        "workflow_starts": sum(starts.values()),
        # One execution per incident step: a storm's stronger line (79 after 94) raises an open
        # incident to a second step, which is started once too.
        "starts_per_step_max": max(starts.values(), default=0),
        "duplicate_starts": sum(n - 1 for n in starts.values()),
        "starts_per_incident_max": max(per_incident.values(), default=0),
        "incidents_started": len(per_incident),
        "lines_counted": counted,
        "every_line_counted": counted == shape.lines,
        "deliveries": tally.delivered,
        "refused": tally.refused,
        "timed_out": tally.timed_out,
        "dead_lettered": tally.dead_lettered,
        "answers": dict(sorted(tally.status.items())),
        "pages": sum(r["pages"] for r in reports),
        "instances_reporting": len(reports),
        "peak_mib_per_instance": round(max((i.peak_pss_mib for i in instances), default=0.0), 1),
        "peak_mib_by_instance": [round(i.peak_pss_mib, 1) for i in instances],
        "worker_hwm_mib_max": max((r["peak_mib"] for r in reports), default=0.0),
        "ready_s_max": round(max((i.ready_s for i in instances), default=0.0), 1),
    }


def bench_ingest(
    storms: list[tuple[int, int]], instances: list[int], concurrency: int, **shape: Any
) -> Report[IngestRun]:
    """Every storm (lines, nodes) through every instance count, on one Firestore emulator."""
    from pitstop.local.executions_server import ExecutionsService, serve

    proc = None
    host = os.environ.get("FIRESTORE_EMULATOR_HOST")
    if not host:
        proc, host = procs.start_emulator("firestore", Path(tempfile.mkdtemp(prefix="pitstop-bench-")))
        os.environ["FIRESTORE_EMULATOR_HOST"] = host  # the read-back's client, in this process
    executions = ExecutionsService(None, workers=1)
    server, port = serve(executions, port=procs.free_port())
    try:
        runs: list[IngestRun] = []
        for lines, nodes in storms:
            for n in instances:
                shaped = Shape(n, concurrency, lines, nodes, **shape)
                k = len(runs) + 1
                print(
                    f"pitstop bench: ingest run {k} of {len(storms) * len(instances)}: {lines} lines over "
                    f"{nodes} nodes, {n} instance(s) x {concurrency}",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(run_storm(shaped, host, executions, f"127.0.0.1:{port}"))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # progress: a run is minutes
    finally:
        server.stop(0)
        if proc is not None:
            proc.stop()
            os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
    return {"benchmark": "ingest", "cpus": os.cpu_count(), "runs": runs}
