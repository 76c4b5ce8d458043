"""``pitstop incidents``: read the incident store, release one held past its budget, or close one."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
from pitstop.core import engine
from pitstop.core.aggregate import ReleaseHeld
from pitstop.core.store import InStates
from pitstop.tools.common import add_store_flags, store_and_policy


def cmd_incidents(args: argparse.Namespace) -> int:
    import time

    from pitstop.core.states import OPEN_STATES
    from pitstop.core.timeline import durations, iso, render

    store, pol = store_and_policy(args.project, args.config)
    if args.release:
        out = store.decide(args.release, ReleaseHeld(args.by or "operator", force=True), pol, time.time())
        print(f"{args.release}: {out.result}")
        return 0 if out.result == "released" else 1
    if args.close:
        return _close_incident(store, pol, args)
    incidents = store.query(InStates(OPEN_STATES if args.open else frozenset()))
    if args.json:
        for inc in incidents:
            sys.stdout.buffer.write(orjson.dumps({**inc, "durations_s": durations(inc)}, default=str) + b"\n")
        return 0
    _control_summary(store, pol)
    print(f"{'ID':<11} {'STATE':<10} {'ACTION':<14} {'NODE':<28} {'CLUSTER':<10} {'EVENTS':>7}  DETECTED")
    for inc in incidents:
        print(
            f"{inc['id']:<11} {inc['state']:<10} {inc['action']:<14} {engine.subject_name(inc):<28} "
            f"{inc.get('cluster') or '-':<10} {inc['counts']['events']:>7}  "
            f"{iso(inc['timeline'].get('detected'))}"
        )
        if inc.get("held"):
            print(f"    held: {inc['held']['reason']}")
        if inc.get("silenced"):
            print(f"    silenced: {inc['silenced']}")
        if inc.get("failure"):
            print(f"    failed at {inc['failure'].get('stage')}: {inc['failure'].get('error')}")
        if inc.get("closure"):
            print(f"    closed by {inc['closure']['by']} at {iso(inc['closure']['at'])}")
        if args.timeline:
            print("\n".join(render(inc)))
    return 0


def _control_summary(store: Any, pol: Any) -> None:
    """What `pitstop pause`, `mode` and `silence` put in force, and the week's changes (who, why)."""
    import time

    from pitstop.adapters.firestore_control import FirestoreControl
    from pitstop.tools import control_ops

    lines = control_ops.summary(
        FirestoreControl(store.db, pol.doc["store"]["collection_prefix"]), time.time()
    )
    for line in lines:
        print(line)


def _close_incident(store: Any, pol: Any, args: argparse.Namespace) -> int:
    """`--close ID [--unfence] --by NAME`: see services/close.py."""
    import time

    if not args.by:
        print("pitstop: --close needs --by NAME (recorded on the incident)", file=sys.stderr)
        return 2
    from pitstop.services.close import close_incident
    from pitstop.services.schedulers import Wiring, factories, schedulers_for

    schedulers = {}
    if args.unfence and any(c.scheduler in factories() for c in pol.clusters):
        import os

        from google.cloud.pubsub_v1 import PublisherClient

        results = store.db.collection(f"{pol.doc['store']['collection_prefix']}_slurm_results")
        kube = os.environ.get("PITSTOP_KUBE_ENDPOINT")  # the local stack's fake API server, if any
        wiring = Wiring(store.db.project, PublisherClient(), results, kube_endpoint=kube)
        schedulers = schedulers_for(pol, wiring)
    done = close_incident(store, schedulers, args.close, args.by, time.time(), args.unfence)
    print("\n".join(done.lines))
    return 0 if done.ok else 1


def add(sub: Subparsers) -> None:
    """incidents: read the incident store, release one held past its budget, or close one."""
    i = sub.add_parser("incidents", help="list incidents (Firestore), release a held one, or close one")
    i.add_argument("--open", action="store_true", help="only open, held and failed incidents")
    i.add_argument("--json", action="store_true", help="one JSON object per incident (with durations_s)")
    i.add_argument("--timeline", action="store_true", help="print each incident's timeline")
    i.add_argument("--release", metavar="ID", help="release a HELD incident past its budget")
    i.add_argument("--close", metavar="ID", help="end an OPEN, HELD or FAILED incident (RESOLVED by you)")
    i.add_argument("--unfence", action="store_true", help="with --close: lift Pitstop's drain on the node")
    i.add_argument("--by", default=None, help="who releases (default operator) or closes (required)")
    add_store_flags(i)
    i.set_defaults(func=cmd_incidents)
