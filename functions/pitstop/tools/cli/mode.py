"""``pitstop mode``: one cluster's mode at run time, over the policy's (core/control.py).

Enforce one cluster first: keep the policy's ``mode: observe`` and `pitstop mode enforce --cluster
C`. It takes effect within ``store.control_cache_s`` (30 s), no redeploy; a step already decided
keeps its mode. actuate acts only where deploy.yaml's ``compute_zones`` and ``gke_clusters``
granted it a role: with ``--config``, enforce is refused where they grant none.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from pitstop.core import control
from pitstop.core.policy import Policy
from pitstop.tools import control_ops

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_mode(args: argparse.Namespace) -> int:
    mode = None if args.mode == "policy" else args.mode
    return control_ops.apply(args, partial(_set, args.cluster, mode), partial(_check, args))


def _set(
    cluster: str, mode: str | None, doc: control.ControlDoc, who: control.Stamp
) -> tuple[control.ControlDoc, control.Change]:
    return control.set_mode(doc, cluster, mode, who)


def _check(args: argparse.Namespace, pol: Policy) -> None:
    control_ops.known_cluster(pol, args.cluster)
    if args.mode != "enforce" or not args.config:
        return
    from pitstop.tools import deploy

    conf = deploy.load_config(args.config)
    if not deploy.compute_scope(conf, args.project or ""):
        raise control.ControlError(
            "deploy.yaml names no compute_zones and no gke_clusters: actuate has no Compute Engine role "
            "and could not act; add the cluster's zones and `pitstop deploy` first"
        )


def add(sub: Subparsers) -> None:
    """mode: a cluster's mode at run time."""
    p = sub.add_parser(
        "mode",
        help="set one cluster's mode (observe | enforce) over the policy's, or back to the policy's",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("mode", choices=["observe", "enforce", "policy"], help="policy: the policy's mode again")
    p.add_argument("--cluster", required=True, help="the cluster (its policy name)")
    control_ops.add_flags(p)
    p.set_defaults(func=cmd_mode)
