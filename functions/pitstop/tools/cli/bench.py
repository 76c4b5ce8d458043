"""``pitstop bench``: speed figures, measured on demand and never asserted in tests."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from pitstop.tools.cli import bench_sizing

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

# The two storms: many lines on few nodes, and few lines each on many nodes.
DEFAULT_STORMS = "50000x64,20000x2000"


def _storms(text: str) -> list[tuple[int, int]]:
    """``LINESxNODES[,LINESxNODES...]``."""
    out = []
    for part in text.split(","):
        lines, _, nodes = part.partition("x")
        if not (lines.isdigit() and nodes.isdigit() and int(lines) > 0 and int(nodes) > 0):
            raise argparse.ArgumentTypeError(f"a storm is LINESxNODES, e.g. 50000x64; got {part!r}")
        out.append((int(lines), int(nodes)))
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    result: Mapping[str, object]  # printed as JSON, whichever bench made it
    if args.target == "classify":
        from pitstop.tools import bench

        result = bench.bench_classify(args.lines or 100_000)
    elif args.target in bench_sizing.TARGETS:
        result = bench_sizing.run(args)
    elif args.target == "simulate":
        from pitstop.tools import simulate

        result = simulate.bench_simulate()
    else:
        from pitstop.tools import bench_fleet

        result = bench_fleet.bench_ingest(
            args.storms,
            args.instances,
            args.concurrency,
            ack_deadline_s=args.ack_deadline,
            retry_scale=args.retry_scale,
            deadline_s=args.deadline,
        )
    sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def add(sub: Subparsers) -> None:
    """bench: speed figures, measured on demand and never asserted in tests."""
    b = sub.add_parser("bench", help="measure speed")
    b.add_argument(
        "target",
        choices=("classify", "ingest", "simulate", *bench_sizing.TARGETS),
        help="what to measure: classify (the parser), ingest (storms through N instances), simulate "
        "(the fleet model), " + ", ".join(bench_sizing.TARGETS) + " (one function's instances)",
    )
    b.add_argument("--lines", type=int, default=None, help="classify: input lines (100000)")
    b.add_argument(
        "--storms",
        type=_storms,
        default=_storms(DEFAULT_STORMS),
        help=f"ingest: storms as LINESxNODES, comma-separated ({DEFAULT_STORMS})",
    )
    b.add_argument(
        "--instances",
        type=bench_sizing.counts,
        default=[1, 2, 5, 10],
        help="ingest: function instances, one run each per storm (1,2,5,10)",
    )
    b.add_argument(
        "--concurrency", type=int, default=16, help="ingest: concurrent deliveries per instance (THREADS)"
    )
    b.add_argument(
        "--ack-deadline", type=float, default=60.0, help="ingest: seconds before a delivery is redelivered"
    )
    b.add_argument(
        "--retry-scale",
        type=float,
        default=0.1,
        help="ingest: Pub/Sub's 10-600 s retry delays times this (0.1: 1-60 s)",
    )
    b.add_argument(
        "--deadline", type=float, default=600.0, help="ingest: seconds a run pushes new messages at most"
    )
    bench_sizing.add_arguments(b)
    b.set_defaults(func=cmd_bench)
