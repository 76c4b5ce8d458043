"""``pitstop bench notify`` and ``pitstop bench actuate``: the figures notify's and actuate's sizes
in infra/resources.yaml come from (tools/bench_notify.py, tools/bench_actuate.py)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pitstop.tools.bench_types import ActuateRun, NotifyRun, Report

TARGETS = ("notify", "actuate")


def counts(text: str) -> list[int]:
    """A comma-separated list of positive integers (instances, levels), for every bench verb."""
    if not all(p.isdigit() and int(p) > 0 for p in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"counts are positive integers, comma-separated (1,2,5,10); got {text!r}"
        )
    return [int(p) for p in text.split(",")]


def add_arguments(b: argparse.ArgumentParser) -> None:
    """This module's flags on ``pitstop bench``."""
    b.add_argument(
        "--levels",
        type=counts,
        default=[1, 4, 8, 16],
        help="notify, actuate: calls at once per instance (THREADS), one run each (1,4,8,16)",
    )
    b.add_argument(
        "--notifications", type=int, default=2000, help="notify: Pub/Sub messages in the storm (2000)"
    )
    b.add_argument(
        "--notify-instances", type=counts, default=[1, 2], help="notify: instances, one run each (1,2)"
    )
    b.add_argument(
        "--page-copies", type=int, default=50, help="notify: the held storm's page, published this often"
    )
    b.add_argument(
        "--remediations", type=int, default=None, help="actuate: remediations per run (2 x the level)"
    )
    b.add_argument(
        "--compute-scale", type=float, default=0.01, help="actuate: the fake Compute's durations times this"
    )
    b.add_argument(
        "--workflow-scale", type=float, default=0.05, help="actuate: the workflow's sleeps times this"
    )


def run(args: argparse.Namespace) -> Report[NotifyRun] | Report[ActuateRun]:
    """The target's figures; the in-process services' log lines go to stderr, the figures alone to stdout."""
    with contextlib.redirect_stdout(sys.stderr):
        if args.target == "notify":
            from pitstop.tools import bench_notify

            return bench_notify.bench_notify(
                args.notifications,
                args.notify_instances,
                args.levels,
                page_copies=args.page_copies,
                retry_scale=args.retry_scale,
                deadline_s=args.deadline,
            )
        from pitstop.tools import bench_actuate

        return bench_actuate.bench_actuate(
            args.levels,
            args.remediations,
            compute_scale=args.compute_scale,
            workflow_scale=args.workflow_scale,
            deadline_s=args.deadline,
        )
