"""``pitstop replay``: what the policy would have done with past entries (observe mode)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
from pitstop.tools.common import duration_s


def cmd_replay(args: argparse.Namespace) -> int:
    import time

    from pitstop.core import policy as policy_mod
    from pitstop.tools import replay as replay_mod

    pol = policy_mod.load(args.policy)
    if args.path:
        items = replay_mod.read_jsonl(args.path)
    else:
        if not args.project:
            raise SystemExit("pitstop replay --since needs --project (or GOOGLE_CLOUD_PROJECT)")
        items = replay_mod.cloud_logging_entries(
            args.project, duration_s(args.since), time.time(), endpoint=args.logging_endpoint
        )
    from pitstop.tools.progress import Progress

    report = replay_mod.replay(items, pol, note=Progress("replay").note)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    t = report["totals"]
    print(f"{report['entries']} entries: {report['by_kind']}")
    print(
        f"{t['incidents']} incidents, {t['would_start']} remediations would start, "
        f"{t['held_by_budget']} held by budget ({t['released_later']} released as the window slid), "
        f"{t['held_for_human']} held for a human; by action {t['by_action']}"
    )
    for inc in report["incidents"]:
        held = f"  HELD: {inc['held']['reason']}" if inc["held"] else ""
        print(
            f"  {inc['id']} {inc['node']:<28} {inc['action']:<14} events={inc['events']:<6} "
            f"{inc['reason']}{held}"
        )
    return 0


def add(sub: Subparsers) -> None:
    """replay: what the policy would have done with past entries (observe mode, no side effects)."""
    r = sub.add_parser("replay", help="what the policy would have done with past log entries (observe mode)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("path", nargs="?", help="JSON Lines export of LogEntries")
    src.add_argument("--since", help="read Cloud Logging with the pipeline's filters, e.g. 6h")
    r.add_argument("--policy", help="policy.yaml to evaluate (default: $PITSTOP_POLICY or shipped defaults)")
    r.add_argument(
        "--project", default=None, help="--since: the project whose logs to read ($GOOGLE_CLOUD_PROJECT)"
    )
    r.add_argument("--logging-endpoint", default=None, help=argparse.SUPPRESS)
    r.add_argument("--json", action="store_true", help="the whole report as one JSON document")
    r.set_defaults(func=cmd_replay)
