"""``pitstop doctor``: what in a GKE cluster would keep Pitstop from restarting a gang once."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add(sub: Subparsers) -> None:
    """doctor: what in a cluster would keep Pitstop from restarting a gang once."""
    d = sub.add_parser("doctor", help="check a GKE cluster's JobSets can restart as a gang after a fault")
    d.add_argument("--kubeconfig", default=None, help="kubeconfig of the cluster (default: kubectl's)")
    d.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per JobSet that cannot restart on a disruption; exit 1 when there is any."""
    from kubernetes import config

    from pitstop.adapters.gke import doctor_findings

    api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    findings = doctor_findings(api)
    for line in findings:
        print(line)
    if not findings:
        print(
            "every JobSet restarts as a gang on a disruption (failure policy, no Ignore on DisruptionTarget)"
        )
    return 1 if findings else 0
