"""``pitstop demo``: the local stack plus the fault scenarios."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_demo(args: argparse.Namespace) -> int:

    from pitstop.local.stack import default_workdir
    from pitstop.tools import demo

    return demo.run(
        Path(args.workdir) if args.workdir else default_workdir() / "demo", args.only or None, keep=args.keep
    )


def add(sub: Subparsers) -> None:
    """demo: the local stack plus the fault scenarios."""
    d = sub.add_parser("demo", help="start the local stack, run the fault scenarios, stop it")
    d.add_argument(
        "--only",
        nargs="*",
        help="xid79 xid13 preemption maintenance duplicates lemon blast_radius poison xid79_spare "
        "lemon_spare degraded replace_not_confirmed no_spare straggler_spare ecc_trend degraded_no_spare "
        "gang_wide_throttle hang_bad_node hang_software; GKE: gke_xid79 gke_two_members "
        "gke_preemption gke_maintenance gke_pdb gke_regional gke_serial gke_straggler_spare "
        "gke_gang_wide_throttle",
    )
    d.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    d.add_argument("--workdir", default=None)
    d.set_defaults(func=cmd_demo)
