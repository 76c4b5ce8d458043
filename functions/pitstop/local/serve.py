"""Run one local stand-in as a process: ``python -m pitstop.local.serve NAME [options]``.

fake-compute, executions (the Workflows runner behind the Executions gRPC API), monitoring,
prometheus (Managed Service for Prometheus' query API over the GPU stand-ins), webhook (every
channel folder's sink: records notifications and can be taken down), vm-sync (starts and
stops each node's slurmd as its fake VM goes down and comes back, like a real host would),
scheduler (Cloud Scheduler's job that calls the sweep function every interval), and vertex
(Vertex AI's JobService for custom training jobs).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pitstop.local.alerting import AlertNotification


def _wait_forever(on_stop: Any = None) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    stop.wait()
    if on_stop:
        on_stop()


def fake_compute(args: argparse.Namespace) -> None:
    from pitstop.local.fake_compute import FakeCompute, serve

    fake = FakeCompute(time_scale=args.time_scale)
    cluster = json.loads(Path(args.cluster).read_text())
    for inst in cluster["instances"]:
        fake.add_from_spec(cluster["project"], cluster["zone"], inst)
    server, _ = serve(fake, port=args.port)
    _wait_forever(server.shutdown)


def executions(args: argparse.Namespace) -> None:
    from pitstop.local.executions_server import ExecutionsService, serve
    from pitstop.local.workflows_runner import runner_for

    env = json.loads(Path(args.env).read_text())
    svc = ExecutionsService(runner_for(args.workflow, env, args.time_scale))
    server, _ = serve(svc, port=args.port)
    _wait_forever(lambda: server.stop(0))


def _alerting(args: argparse.Namespace) -> Any:
    """The stand-in's alerting (local/telemetry.py), publishing to the alerts topic on the emulator."""
    from google.cloud import pubsub_v1

    from pitstop.local.telemetry import Alerting, gpu_state_reader

    pub = pubsub_v1.PublisherClient()
    topic = pub.topic_path(args.project, args.alerts_topic)

    def publish(doc: AlertNotification) -> None:
        pub.publish(topic, json.dumps(doc).encode()).result(timeout=30)

    def instance_id(node: str) -> str:
        url = f"{args.compute}/compute/v1/projects/{args.project}/zones/{args.zone}/instances/{node}"
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the stack's loopback fake
            return str(json.loads(resp.read())["id"])

    alerts = Alerting(
        args.project, args.zone, publish, gpu_state_reader(args.gpu_state), instance_id, args.alert_scale
    )
    threading.Thread(target=alerts.run, args=(threading.Event(),), daemon=True, name="alerting").start()
    return alerts


def monitoring(args: argparse.Namespace) -> None:
    import grpc

    from pitstop.local.fake_monitoring import FakeMonitoring, serve
    from pitstop.local.telemetry import gpu_state_reader

    out = Path(args.out)
    alerts = _alerting(args) if args.compute else None

    class Recording(FakeMonitoring):
        """Also appends every series to a JSON Lines file that tests and `local status` read."""

        def create(self, req: Any, ctx: grpc.ServicerContext) -> Any:
            n = len(self.series)
            resp = super().create(req, ctx)
            with out.open("a") as f:
                for s in self.series[n:]:
                    f.write(json.dumps(s) + "\n")
            return resp

    gpu_state = gpu_state_reader(args.gpu_state) if args.compute else None
    server, _ = serve(Recording(alerts.heartbeat if alerts is not None else None, gpu_state), port=args.port)
    _wait_forever(lambda: server.stop(0))


def vertex(args: argparse.Namespace) -> None:
    """Vertex AI's JobService (REST v1) for every region (local/fake_vertex.py)."""
    from pitstop.local.fake_vertex import FakeVertex, serve

    fake = FakeVertex(step_s=args.step_s, run_s=args.run_s)
    server, _ = serve(fake, port=args.port)
    stop = threading.Event()
    if args.monitoring:  # the jobs' training loops write their heartbeats there (local/trainer.py's metric)
        from pitstop.local.trainer import beat, heartbeat_client

        client = heartbeat_client(args.monitoring)

        def beats() -> None:
            step = 0
            while not stop.wait(args.beat_s):
                step += 1
                for project, cluster, job in fake.beating():
                    beat(client, project, cluster, job, step)

        threading.Thread(target=beats, daemon=True, name="vertex-heartbeats").start()

    def down() -> None:
        stop.set()
        server.shutdown()

    _wait_forever(down)


def prometheus(args: argparse.Namespace) -> None:
    """Managed Service for Prometheus' query API over the GPU stand-ins (local/fake_prometheus.py)."""
    from pitstop.local.fake_prometheus import FakePrometheus, serve
    from pitstop.local.telemetry import gpu_state_reader

    nodes = [n for n in args.nodes.split(",") if n]
    fake = FakePrometheus(args.project, args.cluster, args.zone, nodes, gpu_state_reader(args.gpu_state))
    server, _ = serve(fake, port=args.port)
    _wait_forever(server.shutdown)


def channel_sinks() -> dict[str, Any]:
    """Each channel folder's local sink (plugins/channels/<name>/local.py) by the path it serves."""
    import importlib

    from pitstop.core import plugins

    sinks = {}
    for p in plugins.found("channels"):
        if (p.folder / "local.py").is_file():
            local = importlib.import_module(f"{p.module}.local")
            sinks[local.PATH] = local
    return sinks


def webhook(args: argparse.Namespace) -> None:
    """Every channel's sink on one port, each at its own path (its folder's ``local.py`` answers as
    the real endpoint would); while down, each answers 503 and keeps the refused post apart."""
    out = Path(args.out)
    state = {"down": False}
    sinks = channel_sinks()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path in ("/_down", "/_up"):
                state["down"] = self.path == "/_down"
                return self._answer(200)
            if state["down"]:  # refused, and kept apart: a test can see a delivery was tried
                with out.with_name(out.stem + "-refused.jsonl").open("a") as f:
                    seen = {"at": time.time(), "path": self.path, "body": body.decode(errors="replace")}
                    f.write(json.dumps(seen) + "\n")
                return self._answer(503)
            sink = sinks.get(self.path)
            status, answer = sink.answer(body, dict(self.headers)) if sink else (200, None)
            if status < 300:
                with out.open("a") as f:
                    doc = json.loads(body or b"null")
                    f.write(json.dumps({"at": time.time(), "path": self.path, "body": doc}) + "\n")
            return self._answer(status, answer)

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _wait_forever(server.shutdown)


def scheduler(args: argparse.Namespace) -> None:
    """Cloud Scheduler's HTTP job: POST the sweep every ``--interval`` seconds, one line logged per run.

    As Cloud Scheduler does: a fixed schedule (a run that overruns skips the ticks it missed, never
    runs twice at once), its headers, an attempt deadline of 180 s, no retry of a failed run. There
    is no OIDC token: like every local call, the local function accepts the request without one.
    """
    import urllib.error
    import urllib.request

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Google-Cloud-Scheduler",
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": "pitstop-sweep",
    }
    start = time.monotonic()
    while not stop.wait(args.interval - (time.monotonic() - start) % args.interval):
        at = time.time()
        req = urllib.request.Request(args.url, data=b"{}", method="POST", headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=180) as resp:  # noqa: S310 - loopback
                status, body = resp.status, resp.read()[:500].decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()[:500].decode(errors="replace")
        except OSError as exc:
            status, body = 0, str(exc)
        line = {"at": at, "status": status, "took_s": round(time.time() - at, 3), "body": body}
        print(json.dumps(line), flush=True)


def vm_sync(args: argparse.Namespace) -> None:
    """Each fake VM's slurmd runs only while the VM is RUNNING (a preempted or rebooting host drops out)."""
    import urllib.request

    from pitstop.local.procs import Proc

    conf, workdir = args.slurm_conf, Path(args.workdir)
    nodes = args.nodes.split(",")
    daemons: dict[str, Proc] = {}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    env = {"SLURM_CONF": conf, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    while not stop.is_set():
        try:
            req = urllib.request.Request(f"{args.compute}/_admin/state", data=b"{}", method="POST")  # noqa: S310
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
                state = {i["name"]: i["status"] for i in json.loads(resp.read())["instances"]}
        except OSError:
            state = {}
        for n in nodes:
            running = state.get(n) == "RUNNING" if state else True
            p = daemons.get(n)
            if running and (p is None or not p.alive()):
                (workdir / "spool" / n).mkdir(parents=True, exist_ok=True)
                daemons[n] = Proc(
                    f"slurmd-{n}", ["slurmd", "-D", "-f", conf, "-N", n], workdir / f"slurmd-{n}.out", env
                ).start()
            elif not running and p is not None and p.alive():
                p.stop()
        stop.wait(0.5)
    for p in daemons.values():
        p.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pitstop.local.serve")
    sub = p.add_subparsers(dest="name", required=True)
    c = sub.add_parser("fake-compute")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--time-scale", type=float, default=1.0)
    c.add_argument("--cluster", required=True)
    e = sub.add_parser("executions")
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--workflow", required=True)
    e.add_argument("--env", required=True)
    e.add_argument("--time-scale", type=float, default=1.0)
    for name in ("monitoring", "webhook"):
        s = sub.add_parser(name)
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--out", required=True)
        if name == "monitoring":  # its alerting: publishes the telemetry policies' notifications
            s.add_argument(
                "--compute", default=None, help="the fake Compute (instance ids); none: no alerting"
            )
            s.add_argument("--project", default="pitstop-local")
            s.add_argument("--zone", default="us-central1-a")
            s.add_argument("--gpu-state", default=None, help="the fake Compute's GPU state file")
            s.add_argument("--alerts-topic", default="pitstop-alerts")
            s.add_argument("--alert-scale", type=float, default=1.0, help="policy windows times this")
    pr = sub.add_parser("prometheus")
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--gpu-state", required=True, help="the fake Compute's GPU state file")
    pr.add_argument("--nodes", required=True, help="the cluster's node names, comma-separated")
    pr.add_argument("--project", default="pitstop-local")
    pr.add_argument("--zone", default="us-central1-a")
    pr.add_argument("--cluster", default="local")
    vx = sub.add_parser("vertex")
    vx.add_argument("--port", type=int, required=True)
    vx.add_argument("--step-s", type=float, default=5.0, help="seconds a job spends queued, then pending")
    vx.add_argument("--run-s", type=float, default=3600.0, help="seconds a job trains before it succeeds")
    vx.add_argument("--monitoring", default=None, help="the Monitoring stand-in (host:port) for heartbeats")
    vx.add_argument("--beat-s", type=float, default=1.0, help="seconds between a training job's heartbeats")
    sc = sub.add_parser("scheduler")
    sc.add_argument("--url", required=True)
    sc.add_argument("--interval", type=float, default=60.0)
    v = sub.add_parser("vm-sync")
    v.add_argument("--compute", required=True)
    v.add_argument("--slurm-conf", required=True)
    v.add_argument("--workdir", required=True)
    v.add_argument("--nodes", required=True)
    args = p.parse_args(argv)
    {
        "fake-compute": fake_compute,
        "executions": executions,
        "monitoring": monitoring,
        "prometheus": prometheus,
        "vertex": vertex,
        "webhook": webhook,
        "vm-sync": vm_sync,
        "scheduler": scheduler,
    }[args.name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
