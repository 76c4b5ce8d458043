"""What a check is and runs: its arguments (check_spec), the command lines of its tools (check_steps,
the NCCL test's _nccl_argv, the holder job's holder_argv) and one tool's run (_srun).

The checks are divided by responsibility into parts that commands.SlurmCommands composes, each
holding what it needs: this module (arguments and command lines, no state), check_files.py (a
check's directory, lock and records), fence_swap.py (a fenced node's drain swapped for a
reservation and back), runner.py (the runner process and its tools), progress.py (a started
check's answer), fenced.py (start_check / check_result on a fenced node) and gang.py (the same
beside a running job). The package docstring says how a check runs and why.
"""

from __future__ import annotations

import math
import os
import pwd
import subprocess
from collections.abc import Callable, Mapping
from typing import cast

from pitstop.agent.slurm.access import CheckTools
from pitstop.agent.slurm.gang_steps import GANG_KINDS, gang_steps
from pitstop.agent.slurm.records import CheckKind, CheckState
from pitstop.agent.slurm.text import (
    CHECK_KEYS,
    CHECK_NAME,
    DCGM_TIMEOUT_S,
    FABRIC_KEYS,
    FABRIC_NAME,
    FABRIC_PATH,
    FABRIC_VALUE,
    FABRIC_VAR,
    INCIDENT,
    NCCL_TIMEOUT_S,
    NODE,
    SMI_TIMEOUT_S,
    VALIDATE_KINDS,
    Args,
    CommandRefusedError,
    SlurmOutputError,
    _need,
)
from pitstop.core.domain import FabricSpec
from pitstop.core.slurm_wire import (
    CheckStarted,
)

CHECK_KINDS: frozenset[str] = frozenset({"diagnose", "validate", "revalidate", "corroborate"})


def check_steps(st: CheckState) -> list[tuple[str, list[str], float]]:
    """The srun of each tool of a check: (output key, argv, timeout s), from its recorded state.

    Each tool is a job step of the holder job (``--overlap`` shares the job's resources with its
    sleeping batch step); its stdout comes back to the runner through srun.
    """
    if st["kind"] in GANG_KINDS:
        return gang_steps(st)
    tools, job, node = st["tools"], str(st["job"]), str(st["node"])
    gres = [f"--gres={tools['gres']}:{int(st['gpus'])}"] if tools.get("gres") else []
    base = ["srun", f"--jobid={job}", "--overlap", "--chdir=/tmp", "--quiet", *gres]
    one = [*base, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--"]
    if st["kind"] == "corroborate":
        # read-only, beside the job the node runs or in the holder job. GPUs asked for explicitly
        # (issue 35, 11): without --gres a step gets the job's GRES "except those implicitly
        # requested when a job is exclusive" (srun(1) --gres), so under ConstrainDevices=yes
        # nvidia-smi in an exclusive job's step saw no GPU and that read as every GPU lost;
        # --overlap "allows steps to share all resources (CPUs, memory, and GRES)" (srun(1)), and a
        # job holding fewer GPUs on the node refuses the step: no answer, never a low count.
        clock = tools.get("clock") or list(CheckTools().clock)  # dates the ring buffer's lines
        return [
            ("dmesg", [*one, *tools.get("dmesg", ["dmesg"]), "--raw"], float(SMI_TIMEOUT_S)),
            ("clock", [*one, *clock], float(SMI_TIMEOUT_S)),
            ("nvidia_smi_q", [*one, *tools["nvidia_smi"], "-q"], float(SMI_TIMEOUT_S)),
        ]
    level = int(st["dcgm_level"])
    dcgm = ("dcgm", [*one, *tools["dcgmi"], "diag", "-r", str(level), "-j"], float(DCGM_TIMEOUT_S[level]))
    if st["kind"] == "diagnose":
        return [
            ("nvidia_smi_q", [*one, *tools["nvidia_smi"], "-q"], float(SMI_TIMEOUT_S)),
            ("nvlink", [*one, *tools["nvidia_smi"], "nvlink", "--status"], float(SMI_TIMEOUT_S)),
            dcgm,
        ]
    # a validation counts the node's GPUs first (GPUs missing are a finding the NCCL test cannot
    # make); the second peer's run is the NCCL test alone
    smi = ("nvidia_smi_q", [*one, *tools["nvidia_smi"], "-q"], float(SMI_TIMEOUT_S))
    steps = [] if st["kind"] == "revalidate" else [smi, dcgm]
    if st.get("peer"):
        steps.append(("nccl", _nccl_argv(st, base), float(NCCL_TIMEOUT_S)))
    return steps


# Sources the fabric's NCCL profile (its path and the plugin's library directory as arguments,
# never spliced into the script), then runs the rest of the argv: ``env K=V ... all_gather_perf``.
_FABRIC_SH = (
    'p=$1; lib=$2; shift 2; export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; '
    '. "$p" || exit 97; exec "$@"'
)


def _nccl_argv(st: CheckState, base: list[str]) -> list[str]:
    """The all_gather between the node and its peer: the fabric's setup when the check carries it
    (its ranks per node, -g GPUs per rank, the plugin's profile and variables), else one rank per
    node driving every GPU (a figure that cannot count against the host)."""
    tools, fabric = st["tools"], st.get("fabric")
    mpi = [f"--mpi={tools['srun_mpi']}"] if tools.get("srun_mpi") else []
    ranks = int(fabric["ranks_per_node"]) if fabric else 1
    both = [
        *base,
        *mpi,
        *(["--overcommit"] if ranks > 1 else []),  # ranks per GPU, not per CPU the holder job got
        "--nodes=2",
        f"--ntasks={2 * ranks}",
        f"--ntasks-per-node={ranks}",
        f"--nodelist={st['node']},{st['peer']}",
    ]
    top = int(st["message_bytes"])  # the size judged (512 MiB on a3-highgpu-8g, 8 GiB on most)
    per_rank = max(1, int(st["gpus"]) // ranks)
    gather = [*tools["all_gather_perf"], "-b", str(min(1 << 30, top)), "-e", str(top), "-f", "2"]
    gather += ["-g", str(per_rank)]
    if not fabric:
        return [*both, "--", *gather]
    root = str(tools.get("fabric_root") or "/").rstrip("/")
    pre = [f"{k}={v}" for k, v in sorted(fabric["profile_env"].items())]
    env = [f"{k}={v}" for k, v in sorted(fabric["env"].items())]
    wrapped = [
        "/bin/sh",
        "-c",
        _FABRIC_SH,
        "pitstop-nccl",
        root + fabric["profile"],
        root + fabric["library_path"],
    ]
    return [*both, "--", "env", *pre, *wrapped, "env", *env, *gather]


def _fabric_arg(raw: object, gpus: int) -> FabricSpec | None:
    """The fabric's NCCL setup of a validation, every part checked (None: the check carries none)."""
    if raw is None:
        return None
    bad = CommandRefusedError("argument fabric is invalid")
    if not isinstance(raw, Mapping) or set(raw) != FABRIC_KEYS:
        raise bad
    ranks = raw["ranks_per_node"]
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 16 or gpus % ranks:
        raise bad
    paths = (raw["profile"], raw["library_path"])
    if not all(isinstance(p, str) and FABRIC_PATH.fullmatch(p) and ".." not in p.split("/") for p in paths):
        raise bad
    if not isinstance(raw["name"], str) or FABRIC_NAME.fullmatch(raw["name"]) is None:
        raise bad
    for key in ("env", "profile_env"):
        env = raw[key]
        if not isinstance(env, Mapping) or len(env) > 32:
            raise bad
        for k, v in env.items():
            if not (
                isinstance(k, str)
                and FABRIC_VAR.fullmatch(k)
                and isinstance(v, str)
                and FABRIC_VALUE.fullmatch(v)
            ):
                raise bad
    return cast(FabricSpec, {k: raw[k] for k in sorted(FABRIC_KEYS)})  # each key checked above


def _exclude_arg(raw: object) -> list[str]:
    if raw is None:
        return []
    if (
        not isinstance(raw, list)
        or len(raw) > 8
        or not all(isinstance(n, str) and NODE.fullmatch(n) for n in raw)
    ):
        raise CommandRefusedError("argument exclude_peers is invalid")
    return sorted(set(raw))


def check_minutes(kind: str, level: int) -> int:
    """The holder job's time limit: every tool's timeout, the wait for it to start, and a margin."""
    if kind == "corroborate":
        return math.ceil(3 * SMI_TIMEOUT_S / 60) + 10  # dmesg, the clock read, nvidia-smi -q
    if kind == "revalidate":
        return math.ceil(NCCL_TIMEOUT_S / 60) + 10
    total = DCGM_TIMEOUT_S[level] + (
        2 * SMI_TIMEOUT_S if kind == "diagnose" else NCCL_TIMEOUT_S + SMI_TIMEOUT_S
    )
    return math.ceil(total / 60) + 10


def _agent_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _step_env() -> dict[str, str]:
    """The environment of srun/sbatch: the agent's, without a Slurm job's own variables (the agent
    is no job) and without PITSTOP_NODE (which node a step runs on is Slurm's to say)."""
    keep = {"SLURM_CONF", "SLURM_TIME_FORMAT"}
    return {
        k: v
        for k, v in os.environ.items()
        if (not k.startswith("SLURM_") or k in keep) and k != "PITSTOP_NODE"
    }


def check_spec(args: Args, start: bool, member: Callable[[Args], str]) -> CheckState:
    """A check's arguments, each validated; the name must be the one its incident and kind make, and
    ``member`` names a node of this cluster (SlurmAccess.member)."""
    unknown = sorted(str(k) for k in args if k not in CHECK_KEYS)
    if unknown:
        raise CommandRefusedError(f"unknown check arguments: {', '.join(unknown)[:120]}")
    name = _need(args, "name", CHECK_NAME)
    incident = _need(args, "incident", INCIDENT)
    kind = args.get("kind")
    m = CHECK_NAME.fullmatch(name)
    if (
        not isinstance(kind, str)
        or kind not in CHECK_KINDS
        or m is None
        or (m.group(1), m.group(3)) != (incident, kind)
    ):
        raise CommandRefusedError("check name, incident and kind do not agree")
    node = member(args)
    spec: CheckState = {"node": node, "name": name, "incident": incident, "kind": cast(CheckKind, kind)}
    if not start:
        return spec
    spec["dcgm_level"] = 1 if kind == "corroborate" else _int_arg(args, "dcgm_level", 1, 4)
    spec["gpus"] = _int_arg(args, "gpus", 1, 16)
    if kind in VALIDATE_KINDS:
        spec["message_bytes"] = _int_arg(args, "message_bytes", 1 << 20, 64 << 30)
        want_peer = args.get("peer", True)
        if not isinstance(want_peer, bool) or (kind == "revalidate" and not want_peer):
            raise CommandRefusedError("argument peer is missing or invalid")
        spec["want_peer"] = want_peer
        spec["fabric"] = _fabric_arg(args.get("fabric"), spec["gpus"])
        spec["exclude_peers"] = _exclude_arg(args.get("exclude_peers"))
    return spec


def holder_argv(st: CheckState) -> list[str]:
    """The holder job's sbatch: pinned to the node (and peer) through the reservation; it only sleeps."""
    peer, minutes = st["peer"], int(st["minutes"])
    gres = [f"--gres={st['tools']['gres']}:{int(st['gpus'])}"] if st["tools"].get("gres") else []
    return [
        "sbatch",
        "--parsable",
        f"--job-name={st['name']}",
        f"--reservation={st['name']}",
        f"--partition={st['partition']}",
        f"--nodelist={st['node']}" + (f",{peer}" if peer else ""),
        f"--nodes={2 if peer else 1}",
        "--ntasks-per-node=1",
        "--exclusive",
        "--no-requeue",
        f"--time={minutes}",
        "--output=/dev/null",
        "--error=/dev/null",
        "--chdir=/tmp",
        *gres,
        "--wrap",
        f"sleep {minutes * 60}",
    ]


def _started(st: CheckState) -> CheckStarted:
    """A started check's answer (a copy: a gang check's adds its nodes)."""
    started = st.get("started")
    if not started:
        raise SlurmOutputError(f"check {st.get('name')} has no start recorded")
    return started.copy()


def _int_arg(args: Args, key: str, lo: int, hi: int) -> int:
    v = args.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CommandRefusedError(f"argument {key} is missing or invalid")
    return v


def _srun(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """One tool as a job step: (exit code, stdout, stderr); 124 when it ran out of time."""

    def text(v: str | bytes | None) -> str:
        return v.decode(errors="replace") if isinstance(v, bytes) else (v or "")

    try:
        proc = subprocess.run(  # argv built by check_steps from validated parts
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=_step_env()
        )
    except subprocess.TimeoutExpired as exc:
        return 124, text(exc.stdout), text(exc.stderr) + f"\n(timed out after {timeout:.0f} s)"
    except OSError as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr
