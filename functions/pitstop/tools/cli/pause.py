"""``pitstop pause``: the brake, without a redeploy (core/control.py).

Every function reads the control document within ``store.control_cache_s`` (30 s): incidents are
still recorded and paged, none is acted on; a running step's next disruptive op is refused and its
incident held, its node still fenced. `pitstop resume` lets them go on.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from pitstop.core import control
from pitstop.tools import control_ops

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_pause(args: argparse.Namespace) -> int:
    return control_ops.apply(
        args, partial(_pause, args.cluster), lambda pol: control_ops.known_cluster(pol, args.cluster)
    )


def _pause(
    cluster: str | None, doc: control.ControlDoc, who: control.Stamp
) -> tuple[control.ControlDoc, control.Change]:
    return control.pause(doc, cluster, who)


def add(sub: Subparsers) -> None:
    """pause: stop acting now, everywhere or on one cluster (no redeploy)."""
    p = sub.add_parser(
        "pause",
        help="stop acting within a minute, no redeploy: incidents are still recorded and paged",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--cluster", default=None, help="pause only this cluster (its policy name); default: everything"
    )
    control_ops.add_flags(p)
    p.set_defaults(func=cmd_pause)
