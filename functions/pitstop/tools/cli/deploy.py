"""``pitstop deploy`` and ``pitstop teardown``: the pipeline in a project, through gcloud."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_deploy(args: argparse.Namespace) -> int:
    from pitstop.tools import deploy

    try:
        conf: Mapping[str, object] = deploy.load_config(args.config)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"pitstop deploy: {e}", file=sys.stderr)
        return 2
    region = args.region or deploy.setting(conf, "region")
    try:  # actuate's Compute grant names each GKE node pool's MIG and VMs: read them first
        conf = deploy.learn_node_groups(conf, args.project, deploy.run_gcloud)
    except ValueError as e:
        print(f"pitstop deploy: {e}", file=sys.stderr)
        return 2
    if args.command == "teardown":
        return deploy.teardown(deploy.plan(args.project, region, conf), args.purge)
    if args.dry_run:
        for line in deploy.dry_run_lines(args.project, region, conf):
            print(line)
        return 0
    with tempfile.TemporaryDirectory(prefix="pitstop-src-") as staged:  # gone once gcloud has uploaded it
        source = deploy.stage_source(deploy.policy_path(conf), Path(staged))
        done = deploy.apply(deploy.plan(args.project, region, conf, str(source)))
    if done == 0:  # who else can feed Pitstop logs or messages: findings a person can act on
        from pitstop.tools import exposure

        exposure.report(args.project, conf)
    return done


def add(sub: Subparsers) -> None:
    """deploy and teardown share their options; each has one flag of its own."""
    for name, text in (
        ("deploy", "deploy the pipeline into a project with gcloud (idempotent)"),
        ("teardown", "remove what deploy created"),
    ):
        dp = sub.add_parser(name, help=text)
        dp.add_argument("--project", required=True)
        dp.add_argument("--region", default=None)
        dp.add_argument("--config", default=None, help="deploy.yaml (see infra/deploy.defaults.yaml)")
        if name == "deploy":
            dp.add_argument("--dry-run", action="store_true", help="print the gcloud commands, one per line")
        else:
            dp.add_argument("--purge", action="store_true", help="also say how to delete incident data")
        dp.set_defaults(func=cmd_deploy)
