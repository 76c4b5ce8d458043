"""``pitstop bench``: speed figures, measured on demand and never asserted in tests."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_bench(args: argparse.Namespace) -> int:
    from pitstop.tools import bench

    if args.target == "classify":
        result = bench.bench_classify(args.lines or 100_000)
    elif args.target == "simulate":
        from pitstop.tools import simulate

        result = simulate.bench_simulate()
    else:
        runs = [
            bench.bench_ingest(args.lines or 20_000, args.nodes, args.workers, int(n), args.report_memory)
            for n in args.instances.split(",")
        ]
        result = {"benchmark": "ingest", "runs": runs}
    sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def add(sub: Subparsers) -> None:
    """bench: speed figures, measured on demand and never asserted in tests."""
    b = sub.add_parser("bench", help="measure speed")
    b.add_argument("target", choices=("classify", "ingest", "simulate"))
    b.add_argument("--lines", type=int, default=None, help="input lines (classify: 100000, ingest: 20000)")
    b.add_argument("--nodes", type=int, default=64, help="ingest: nodes the storm spreads over")
    b.add_argument("--workers", type=int, default=8, help="ingest: concurrent deliveries")
    b.add_argument("--instances", default="1,2", help="ingest: function instances to simulate, one run each")
    b.add_argument(
        "--report-memory", action="store_true", help="ingest: also trace Python allocations (slower)"
    )
    b.set_defaults(func=cmd_bench)
