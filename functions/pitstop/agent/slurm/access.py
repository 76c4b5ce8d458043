"""How the agent reaches Slurm (SlurmAccess), and how its checks run tools (CheckTools)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pitstop.agent.slurm.text import (
    DEFAULT_CHECK_DIR,
    MEMBERS_REFRESH_S,
    MEMBERS_TTL_S,
    NODE,
    RUN_TIMEOUT_S,
    Args,
    CommandRefusedError,
    NodeInfo,
    Reservation,
    SlurmOutputError,
    _kv,
    _need,
    parse_node,
    parse_nodes,
    parse_reservations,
)


@dataclass(frozen=True)
class CheckTools:
    """How checks run: each tool a command prefix (the real names by default; locally the stand-ins
    in pitstop.local.gpu_tools), srun's MPI plugin for the NCCL test (nccl-tests built with MPI
    needs one, e.g. ``pmix``), the GRES name GPUs are scheduled as (``gpu``; none: whole nodes
    through ``--exclusive``), and where checks keep their state and outputs."""

    nvidia_smi: tuple[str, ...] = ("nvidia-smi",)
    dmesg: tuple[str, ...] = ("dmesg",)
    # the node's wall clock and seconds since boot, read together: what dates the ring buffer's lines
    clock: tuple[str, ...] = ("/bin/sh", "-c", "date +%s.%N; cat /proc/uptime")
    dcgmi: tuple[str, ...] = ("dcgmi",)
    all_gather_perf: tuple[str, ...] = ("all_gather_perf",)
    srun_mpi: str | None = None
    gres: str | None = None
    directory: str = DEFAULT_CHECK_DIR
    fabric_root: str = (
        "/"  # where the fabric's NCCL profile paths start on the nodes (locally: a stand-in tree)
    )


def run_subprocess(argv: list[str]) -> str:
    """One argv run on the controller (never a shell): its stdout; a RuntimeError on a non-zero exit."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}  # the reason stamp format parse_node reads
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


class SlurmAccess:
    """How the agent reaches Slurm: one argv at a time, through ``run`` (a subprocess by default),
    with the node arguments checked against Slurm's own node list; the reads every operation shares.

    One instance is shared by every part of the agent (commands.SlurmCommands composes them), so the
    node list is read once for all of them and a test swaps ``run`` in one place.
    """

    def __init__(self, run: Callable[[list[str]], str] | None = None) -> None:
        self.run = run or run_subprocess
        self._nodes: frozenset[str] = frozenset()
        self._nodes_at = -1e18
        self._nodes_lock = threading.Lock()

    def member(self, args: Args) -> str:
        """A node argument this agent may act on: a valid name Slurm lists as one of its nodes.

        A command naming any other host (a VM of another cluster, a name a log line made up) is
        refused before any scontrol runs. The list is re-read when a name is missing from it
        (a node just added), at most every MEMBERS_REFRESH_S.
        """
        node = _need(args, "node", NODE)
        if node.lower() == "all":  # NodeName=ALL and Nodes=ALL mean every node to scontrol
            raise CommandRefusedError("argument node is missing or invalid")
        with self._nodes_lock:
            now = time.monotonic()
            stale = now - self._nodes_at > MEMBERS_TTL_S
            if stale or (node not in self._nodes and now - self._nodes_at > MEMBERS_REFRESH_S):
                out = self.run(["sinfo", "-h", "-N", "-o", "%N"])  # one line per node (and partition)
                self._nodes = frozenset(w for w in out.split() if NODE.fullmatch(w))
                self._nodes_at = now
            if node not in self._nodes:
                raise CommandRefusedError(f"node {node} is not a node of this Slurm cluster (sinfo)")
        return node

    def show_job(self, job: str) -> dict[str, str] | None:
        """``scontrol show job -o JOB`` as key/value pairs; None for a job Slurm no longer knows."""
        try:
            out = self.run(["scontrol", "show", "job", "-o", job])
        except RuntimeError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        lines = [line for line in out.splitlines() if line.strip()]
        return _kv(lines[0]) if lines else {}

    def node_info(self, node: str) -> NodeInfo:
        return parse_node(self.run(["scontrol", "show", "node", "-o", node]), node)

    def nodes(self) -> dict[str, tuple[NodeInfo, tuple[str, ...]]]:
        """Every node with its partitions (``scontrol show node -o``)."""
        return parse_nodes(self.run(["scontrol", "show", "node", "-o"]))

    def hostnames(self, lists: Sequence[str]) -> set[str]:
        """Slurm host lists (``a3-node-[001-003]``) expanded by Slurm itself."""
        wanted = [x for x in lists if x and x != "(null)"]
        if not wanted:
            return set()
        names = self.run(["scontrol", "show", "hostnames", ",".join(wanted)]).split()
        if any(NODE.fullmatch(n) is None for n in names):
            raise SlurmOutputError(f"unexpected host names from scontrol show hostnames: {names[:5]}")
        return set(names)

    def reservations(self) -> dict[str, Reservation]:
        return parse_reservations(self.run(["scontrol", "show", "reservation", "-o"]))

    def reserved(self, reservations: Mapping[str, Reservation], but: str | None = None) -> set[str]:
        """The nodes in an active reservation (other than ``but``)."""
        return self.hostnames(
            [r.nodes for r in reservations.values() if r.state == "ACTIVE" and r.name != but]
        )
