"""``pitstop resume``: lift a pause (core/control.py). The sweep then lets each incident the pause
held go on, as a new step, within a minute or two (the control's cache and the sweep's minute)."""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from pitstop.core import control
from pitstop.tools import control_ops

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_resume(args: argparse.Namespace) -> int:
    return control_ops.apply(args, partial(_resume, args.cluster))


def _resume(
    cluster: str | None, doc: control.ControlDoc, who: control.Stamp
) -> tuple[control.ControlDoc, control.Change]:
    return control.resume(doc, cluster, who)


def add(sub: Subparsers) -> None:
    """resume: lift a pause."""
    p = sub.add_parser(
        "resume",
        help="lift a pause: everything's and every cluster's, or (--cluster) one cluster's",
        description=__doc__,
    )
    p.add_argument("--cluster", default=None, help="lift only this cluster's own pause")
    control_ops.add_flags(p, reason_required=False)
    p.set_defaults(func=cmd_resume)
