"""``pitstop silence``: leave a node, a cluster or a reservation block alone for a while (core/control.py).

A new fault episode in a silenced scope is recorded and paged, never acted on, and ends with its
burst; one after the silence is acted on as usual. An incident already under way there (its node
fenced) stops before its next disruptive op and goes on once the silence ends. Like an
alertmanager silence or a PagerDuty maintenance window: for a planned firmware roll, a rack under
investigation, a node someone is working on.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import TYPE_CHECKING

from pitstop.core import control
from pitstop.core.timefmt import to_rfc3339
from pitstop.tools import common, control_ops

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_silence(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.expire:
        return control_ops.apply(args, partial(_expire, args.expire))
    scopes = [(s, getattr(args, s)) for s in control.SCOPES if getattr(args, s)]
    if len(scopes) != 1 or not args.for_ or not args.reason:
        raise control.ControlError(
            "silence one scope: --node N, --cluster C or --block B, with --for (e.g. 4h) and --reason"
        )
    scope, value = scopes[0]
    try:
        for_s = common.duration_s(args.for_)
    except SystemExit:
        raise control.ControlError(f"--for takes a duration like 90m, 4h or 2d, not {args.for_!r}") from None
    check = (lambda pol: control_ops.known_cluster(pol, value)) if scope == "cluster" else None
    return control_ops.apply(args, partial(_silence, scope, value, for_s), check)


def _silence(
    scope: str, value: str, for_s: float, doc: control.ControlDoc, who: control.Stamp
) -> tuple[control.ControlDoc, control.Change]:
    return control.silence(doc, scope, value, for_s, who)


def _expire(
    sid: str, doc: control.ControlDoc, who: control.Stamp
) -> tuple[control.ControlDoc, control.Change]:
    return control.expire(doc, sid, who)


def _list(args: argparse.Namespace) -> int:
    store, _ = control_ops.store_and_policy(args)
    now = time.time()
    listed = control.Control.of(store.read_control()).silences(now, ended=args.all)
    if not listed:
        print("no silence in force" + ("" if args.all else " (--all: the ended ones of the last week too)"))
    for s in listed:
        state = "ended early" if "ended" in s else ("active" if control.active(s, now) else "over")
        print(f"{s['id']}  {s['scope']:<7} {s['value']:<28} {to_rfc3339(s['since'])} .. "
              f"{to_rfc3339(s['until'])}  {state:<11} by {s['by']}: {s['reason']}")  # fmt: skip
    return 0


def add(sub: Subparsers) -> None:
    """silence: leave a node, a cluster or a block alone for a while."""
    p = sub.add_parser(
        "silence",
        help="record and page, never act on, a node, cluster or block for a while (list, expire)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--node", default=None, help="an instance name")
    scope.add_argument("--cluster", default=None, help="a cluster (its policy name)")
    scope.add_argument("--block", default=None, help="a reservation block, CLUSTER/BLOCK as Compute names it")
    scope.add_argument("--list", action="store_true", help="list the silences in force")
    scope.add_argument("--expire", metavar="ID", default=None, help="end a silence now")
    p.add_argument("--for", dest="for_", metavar="DURATION", default=None, help="how long: 90m, 4h, 2d")
    p.add_argument("--all", action="store_true", help="with --list: the ended ones of the last week too")
    control_ops.add_flags(p, reason_required=False)
    p.set_defaults(func=cmd_silence)
