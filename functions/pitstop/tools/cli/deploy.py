"""``pitstop deploy`` and ``pitstop teardown``: the pipeline in a project, through gcloud.

deploy checks deploy.yaml and the policy together first (tools/preflight.py) and creates nothing
when they disagree. teardown shows what it deletes (``--dry-run``) and asks before it does,
unless ``--yes``; without a terminal to ask on and without ``--yes`` it refuses.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pitstop.tools import deploy

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

PURGE_HELP = (
    "also delete every collection Pitstop wrote in its two Firestore databases (the incident "
    "history, budgets, the notify ledger), with `gcloud firestore bulk-delete`, after everything "
    "else is gone; the empty databases stay. Without it the data is kept"
)


def cmd_deploy(args: argparse.Namespace) -> int:
    from pitstop.tools import deploy

    conf: Mapping[str, object] = deploy.load_config(
        args.config
    )  # a ConfigError is explained by the CLI's main
    region = args.region or deploy.setting(conf, "region")
    try:  # actuate's Compute grant names each GKE node pool's MIG and VMs: read them first
        conf = deploy.learn_node_groups(conf, args.project, deploy.run_gcloud)
    except ValueError as e:
        print(f"pitstop deploy: {e}", file=sys.stderr)
        return 2
    if args.command == "teardown":
        return _teardown(args, deploy.plan(args.project, region, conf))
    if not _preflight(args.project, conf, live=not args.dry_run):
        return 2
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


def _preflight(project: str, conf: deploy.Conf, live: bool) -> bool:
    """Print the pre-flight findings on stderr; False when any is an error (nothing is deployed)."""
    from pitstop.tools import deploy, preflight

    found = preflight.check(conf, project)
    if live and not any(f.level == "error" for f in found):
        found += preflight.webhook_secret(project, deploy.run_gcloud)
    for f in found:
        print(f"pitstop deploy: {f.line()}", file=sys.stderr)
    if any(f.level == "error" for f in found):
        print("pitstop deploy: nothing was deployed: fix the errors above and run it again", file=sys.stderr)
        return False
    return True


def _teardown(args: argparse.Namespace, steps: list[deploy.Step]) -> int:
    from pitstop.tools import deploy

    if args.dry_run:
        for line in deploy.teardown_lines(steps, args.purge):
            print(line)
        return 0
    if not args.yes and not confirm(args.project, args.purge):
        return 1 if sys.stdin.isatty() else 2
    return deploy.teardown(steps, args.purge)


def confirm(
    project: str, purge: bool, stdin: TextIO | None = None, ask: Callable[[str], str] = input
) -> bool:
    """A person at a terminal types the project id; anything else (or no terminal) deletes nothing."""
    stdin = stdin or sys.stdin
    if not stdin.isatty():
        print(
            "pitstop teardown: refusing to delete without --yes: there is no terminal to confirm on. "
            f"See what it deletes with `pitstop teardown --project {project} --dry-run`",
            file=sys.stderr,
        )
        return False
    data = " and every collection of its incident history and notify ledger" if purge else ""
    print(f"This deletes Pitstop's resources from project {project}{data}.", file=sys.stderr)
    try:
        answer = ask(f"Type the project id ({project}) to go on: ")
    except EOFError:
        answer = ""
    if answer.strip() != project:
        print("pitstop teardown: not confirmed; nothing was deleted", file=sys.stderr)
        return False
    return True


def add(sub: Subparsers) -> None:
    """deploy and teardown share their options; each has flags of its own."""
    for name, text in (
        ("deploy", "deploy the pipeline into a project with gcloud (idempotent; checks the config first)"),
        ("teardown", "remove what deploy created (asks first; --dry-run shows what)"),
    ):
        dp = sub.add_parser(name, help=text)
        dp.add_argument("--project", required=True, help="the Google Cloud project Pitstop runs in")
        dp.add_argument(
            "--region", default=None, help="the functions' and workflow's region (default: deploy.yaml's)"
        )
        dp.add_argument("--config", default=None, help="deploy.yaml (see infra/deploy.defaults.yaml)")
        if name == "deploy":
            dp.add_argument(
                "--dry-run", action="store_true", help="check the config, then print the gcloud commands"
            )
        else:
            dp.add_argument(
                "--dry-run", action="store_true", help="print what would be deleted, in order; delete nothing"
            )
            dp.add_argument("--purge", action="store_true", help=PURGE_HELP)
            dp.add_argument("--yes", action="store_true", help="do not ask (for scripts); asks otherwise")
        dp.set_defaults(func=cmd_deploy)
