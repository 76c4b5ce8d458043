"""pitstop-slurm-agent: runs on the Slurm controller and executes Pitstop's commands (its command line)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pitstop.adapters import log
from pitstop.agent.slurm import credentials
from pitstop.agent.slurm.access import (
    CheckTools,
)
from pitstop.agent.slurm.commands import (
    SlurmCommands,
)
from pitstop.agent.slurm.ledger import (
    Ledger,
)
from pitstop.agent.slurm.loop import (
    Agent,
    ResultsTopic,
)
from pitstop.agent.slurm.text import (
    CHECK_NAME,
    DEFAULT_CHECK_DIR,
    DEFAULT_LEDGER,
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pitstop-slurm-agent", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {credentials.version()}")
    p.add_argument("--project", default=os.environ.get("GOOGLE_CLOUD_PROJECT"))
    p.add_argument(
        "--impersonate-service-account",
        metavar="EMAIL",
        default=os.environ.get("PITSTOP_IMPERSONATE_SA") or None,
        help="call Pub/Sub as this service account (the VM's own identity mints its tokens; needs "
        "roles/iam.serviceAccountTokenCreator on it); default: $PITSTOP_IMPERSONATE_SA, else the VM's",
    )
    p.add_argument("--subscription", required=True, help="the cluster's command subscription id")
    p.add_argument(
        "--results-topic",
        required=True,
        help="the cluster's results topic: an id (pitstop-slurm-CLUSTER-results) or projects/P/topics/T",
    )
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help="the SQLite file of claims and results")
    p.add_argument(
        "--keep-requeue-hold",
        action="store_true",
        help="leave a requeued job held until Slurm's BeginTime (~120 s later); by default it may "
        "start at once on healthy nodes (the faulty node is drained first)",
    )
    p.add_argument("--release-requeued", action="store_true", help=argparse.SUPPRESS)  # now the default
    checks = p.add_argument_group("checks on a fenced node (corroborate, diagnose, validate)")
    checks.add_argument(
        "--nvidia-smi", default="nvidia-smi", help="command prefix of nvidia-smi on the nodes"
    )
    checks.add_argument("--dcgmi", default="dcgmi", help="command prefix of dcgmi on the nodes")
    checks.add_argument(
        "--dmesg", default="dmesg", help="command prefix of dmesg on the nodes (corroboration reads --raw)"
    )
    checks.add_argument(
        "--clock",
        default=shlex.join(CheckTools().clock),
        help="command printing the node's wall clock (date +%%s.%%N) then /proc/uptime (dates dmesg's lines)",
    )
    checks.add_argument(
        "--all-gather-perf", default="all_gather_perf", help="command prefix of nccl-tests' all_gather_perf"
    )
    checks.add_argument("--srun-mpi", default=None, help="srun --mpi plugin for the NCCL test (e.g. pmix)")
    checks.add_argument(
        "--check-gres", default=None, help="GRES name of GPUs (e.g. gpu): checks ask --gres=NAME:<gpus>"
    )
    checks.add_argument("--check-dir", default=DEFAULT_CHECK_DIR, help="checks' state and tool outputs")
    checks.add_argument(
        "--fabric-root",
        default="/",
        help="the directory the fabric's NCCL profile and plugin paths (schemas/validation.yaml) are under",
    )
    return p.parse_args(argv)


def _prefix(flag: str, value: str) -> tuple[str, ...]:
    argv = tuple(shlex.split(value))
    if not argv:
        raise SystemExit(f"pitstop-slurm-agent: {flag} must name a command")
    return argv


def commands_for(args: argparse.Namespace) -> SlurmCommands:
    """The job should run again within a minute: Slurm's requeue hold is lifted unless asked not to."""
    for flag, value in (("--srun-mpi", args.srun_mpi), ("--check-gres", args.check_gres)):
        if value is not None and re.fullmatch(r"[a-z0-9_]{1,32}", value) is None:
            raise SystemExit(f"pitstop-slurm-agent: {flag} must be a plain name")
    tools = CheckTools(
        nvidia_smi=_prefix("--nvidia-smi", args.nvidia_smi),
        dcgmi=_prefix("--dcgmi", args.dcgmi),
        dmesg=_prefix("--dmesg", args.dmesg),
        clock=_prefix("--clock", args.clock),
        all_gather_perf=_prefix("--all-gather-perf", args.all_gather_perf),
        srun_mpi=args.srun_mpi,
        gres=args.check_gres,
        directory=args.check_dir,
        fabric_root=args.fabric_root,
    )
    return SlurmCommands(release_requeued=not args.keep_requeue_hold, checks=tools)


def run_check_main(argv: Sequence[str]) -> int:
    """``--run-check DIR --lock-fd N``: the runner of one check (spawned by the agent, which hands
    it the check's runner lock as descriptor N; it holds it until it exits)."""
    p = argparse.ArgumentParser(prog="pitstop-slurm-agent --run-check")
    p.add_argument("directory")
    p.add_argument("--lock-fd", type=int, default=None)
    args = p.parse_args(argv)
    d = Path(args.directory)
    if CHECK_NAME.fullmatch(d.name) is None:
        raise SystemExit("not a check directory")
    cmds = SlurmCommands(checks=CheckTools(directory=str(d.parent)))
    try:
        return cmds.run_check(d)
    except Exception as exc:  # check_result finishes what the runner could not
        log.emit("ERROR", "slurm agent: check runner failed", check=d.name, error=str(exc)[:300])
        return 1


def results_topic(args: argparse.Namespace) -> str:
    """The full topic path; an id is taken to be in ``--project``."""
    topic = str(args.results_topic)
    return topic if topic.startswith("projects/") else f"projects/{args.project}/topics/{topic}"


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["--run-check"]:
        return run_check_main(given[1:])
    args = parse_args(given)
    creds = credentials.for_account(args.impersonate_service_account)
    topic = ResultsTopic(results_topic(args), credentials=creds)
    agent = Agent(commands_for(args), Ledger(args.ledger), topic)
    stop = threading.Event()
    import signal as sig

    sig.signal(sig.SIGTERM, lambda *a: stop.set())
    sig.signal(sig.SIGINT, lambda *a: stop.set())
    log.emit(
        "INFO",
        "slurm agent started",
        subscription=args.subscription,
        results_topic=results_topic(args),
        ledger=args.ledger,
        owner=agent.owner,
        impersonating=args.impersonate_service_account or "",
    )
    agent.serve(f"projects/{args.project}/subscriptions/{args.subscription}", stop, creds)
    return 0
