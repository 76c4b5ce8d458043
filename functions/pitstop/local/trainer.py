"""A training job's stand-in on the local stack: it writes the job heartbeat, until it is hung.

Slurm runs it as a job's batch step. Each step it writes one point of
``custom.googleapis.com/pitstop/job/heartbeat`` (labels ``cluster`` and ``job``) with the real
client library, as docs/telemetry.md tells a training loop to, to the stack's Monitoring
stand-in, whose alerting opens the heartbeat policy's alert when the points stop.

``pitstop local chaos hang`` hangs the runs it finds (``<chaos dir>/hang.json`` names each job
and its Slurm restart count): such a run stops beating, as a job stuck in a collective does; a
run that Slurm requeued (``SLURM_RESTART_COUNT`` up by one) beats again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HANG_FILE = "hang.json"
METRIC = "custom.googleapis.com/pitstop/job/heartbeat"


def heartbeat_client(endpoint: str) -> Any:
    """The real MetricServiceClient, on the stand-in's plain gRPC port."""
    import grpc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import monitoring_v3
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    channel = grpc.insecure_channel(endpoint)
    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return monitoring_v3.MetricServiceClient(
        transport=MetricServiceGrpcTransport(channel=channel, credentials=anonymous)
    )


def beat(client: Any, project: str, cluster: str, job: str, step: int) -> None:
    """One heartbeat point: docs/telemetry.md's snippet, line for line."""
    from google.cloud import monitoring_v3

    series = monitoring_v3.TimeSeries()
    series.metric.type, series.resource.type = METRIC, "global"
    series.metric.labels.update({"cluster": cluster, "job": job})
    point = {"interval": {"end_time": {"seconds": int(time.time())}}, "value": {"int64_value": step}}
    series.points = [monitoring_v3.Point(point)]
    client.create_time_series(name=f"projects/{project}", time_series=[series])


def hung(chaos_dir: Path, job: str, run: int) -> bool:
    try:
        runs = json.loads((chaos_dir / HANG_FILE).read_text()).get("runs", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(runs, dict) and runs.get(job) == run


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pitstop.local.trainer")
    p.add_argument("--monitoring", required=True, help="the Monitoring stand-in (host:port)")
    p.add_argument("--project", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--chaos-dir", required=True)
    p.add_argument("--every", type=float, default=1.0, help="seconds between steps")
    args = p.parse_args(argv)
    job, run = os.environ["SLURM_JOB_ID"], int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    chaos_dir = Path(args.chaos_dir)
    chaos_dir.mkdir(parents=True, exist_ok=True)
    (chaos_dir / f"run-{job}.json").write_text(json.dumps({"job": job, "run": run}))
    client = heartbeat_client(args.monitoring)
    step = 0
    while True:
        if not hung(chaos_dir, job, run):
            step += 1
            try:
                beat(client, args.project, args.cluster, job, step)
            except Exception as exc:  # a missed beat is what the alert is for; keep training
                print(f"heartbeat not written: {exc}", file=sys.stderr)
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
