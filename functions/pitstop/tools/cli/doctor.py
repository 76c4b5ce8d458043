"""``pitstop doctor``: what in a GKE cluster would keep Pitstop from restarting a gang once and the
restart mechanisms of its own it has (JobSet failure policy, Kueue's topology-aware node replacement),
(``--slurm``, on a controller) Slurm's version, expedited requeue and topology, and (``--project``)
every principal that can write each input Pitstop reads (schemas/inputs.yaml), roles inherited from
the project's folders and organization included."""

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
    d.add_argument(
        "--project",
        default=None,
        help="also (alone: only) read the IAM policies of the project, its folders and organization and "
        "Pitstop's topics: each input Pitstop reads, with every principal that can write it",
    )
    d.add_argument("--config", default=None, help="deploy.yaml, for the Slurm clusters' topics")
    d.add_argument(
        "--slurm",
        action="store_true",
        help="on a Slurm controller: Slurm's version, its expedited requeue (25.11+) and its topology",
    )
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 1 when any check has a finding (2 when the IAM policies could not be read)."""
    status = 0
    if args.slurm:
        from pitstop.agent.slurm.access import SlurmAccess
        from pitstop.agent.slurm.placement import doctor

        for line in doctor(SlurmAccess()):
            print(line)
        if not (args.project or args.kubeconfig or args.context):
            return 0
    if args.project:
        from pitstop.tools import deploy, exposure

        found = exposure.report(args.project, deploy.load_config(args.config), every=True)
        status = 2 if found < 0 else int(found > 0)
    if args.project and args.kubeconfig is None and args.context is None:
        return status
    return max(status, _gke(args))


def _gke(args: argparse.Namespace) -> int:
    """One line per JobSet that cannot restart on a disruption; 1 when there is any."""
    from kubernetes import config

    from pitstop.adapters.gke import doctor_findings
    from pitstop.adapters.gke.doctor import native_mechanisms

    api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    findings = doctor_findings(api)
    for line in findings:
        print(line)
    if not findings:
        print(
            "every JobSet restarts as a gang on a disruption (failure policy, no Ignore on DisruptionTarget)"
        )
    for line in native_mechanisms(api):  # what the cluster restarts by itself: found, not a finding
        print(line)
    return 1 if findings else 0
