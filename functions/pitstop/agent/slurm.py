"""pitstop-slurm-agent: runs on the Slurm controller and executes Pitstop's commands.

It pulls commands from its cluster's Pub/Sub subscription (outbound connections only: a
private cluster needs no inbound path), executes a closed set of operations with
scontrol/scancel/squeue (argument lists, never a shell; every argument validated), and
publishes each state of each command to its cluster's results topic
(``pitstop-slurm-<cluster>-results``), which only this cluster's agent may publish to.
actuate pulls that topic's subscription and merges the results into Firestore
(``<prefix>_slurm_results/<command id>``), forward only; the agent itself holds no Firestore
access at all. Why an agent and not slurmrestd: its REST API has no requeue in any version up
to v0.0.42 and no node update before v0.0.39.

Exactly once. Pub/Sub delivers a command at least once, actuate republishes the same command
id on every retry, and streaming pull runs callbacks concurrently, so the agent claims a
command before it runs it (the pattern idempotency libraries use: record "in progress" under a
precondition, act, record the result). The record is a local SQLite ledger (``--ledger``, one
row per command id with a ``version`` bumped on every write):

1. Insert the row as ``running`` with an owner, a claim token and ``claim_until``
   (``INSERT OR IGNORE``: exactly one insert of a command id succeeds).
2. A delivery whose insert is ignored reads the row: ``done`` or ``failed`` (final) → the answer
   is known: it is published again (so a result message that was lost is recovered) and nothing
   runs; ``running`` within its claim → another delivery is executing it, so this one is
   acknowledged and left (the result appears when that one finishes); ``transient`` (the last
   attempt hit a passing Slurm hiccup) or ``running`` past its claim (its agent died) → taken
   over by an UPDATE conditioned on the row's version (only one taker wins; the others see no
   row updated and leave).
3. Run the command, then write the final state, again conditioned on the version of the claim,
   so an agent that lost its claim never overwrites the next attempt's answer.

Every state written (running, transient, done, failed) is published as the whole row, JSON,
with attributes ``id`` and ``state`` and the command id as ordering key. A final state is
published before the command's message is acknowledged; if that publish fails the message is
redelivered and step 2 publishes the answer again. Rows older than ``KEEP_S`` are deleted at
start and hourly: every command expires within minutes, so a copy that old is never run.

The claim (``CLAIM_S``) outlasts the longest command (its subprocesses' timeouts), so a live
agent is never overtaken. A command past its deadline is refused if it was never seen, and
ignored if it was (a fresher copy carries the retry); it is never run.

Failures: ``transient`` for a passing hiccup (slurmctld unreachable or slow, a timeout, a
controller in standby, "try again"): a retry runs a new attempt. ``failed`` for everything
else (refused commands, invalid node, unknown job, unexpected output): replayed, never re-run.

Fences: Pitstop drains with the reason ``pitstop <incident> <action>`` and lifts only that. A
node someone else drained (or failed) keeps its state and reason; a node that is only DOWN
(which Slurm itself returns to service when its slurmd registers again) gets Pitstop's drain
on top, with the previous reason kept in the new one.

Capacity (``capacity``, read-only): whether a job's gang could start again now without the
fenced node: idle, responding, undrained nodes of its partition outside any active reservation,
plus the job's own healthy nodes (they free up when it is requeued), against its node count.
A count, not a promise: GRES, features and higher-priority pending jobs are not weighed.

Checks on a fenced node (``start_check``, ``check_result``). Slurm never starts a job on a DRAIN
node, whatever reservation the job names (checked on 22.05: it stays pending with
ReqNodeNotAvail), and a person's or Pitstop's drain is the only fence Slurm has. So the agent
swaps the fence for a reservation, for the length of the check only:

1. ``scontrol create reservation ReservationName=<check name> Users=<agent user>
   Nodes=<node>[,<peer>] StartTime=now Duration=UNLIMITED Flags=MAINT``. MAINT lets it overlap
   a reservation the node already sits in, and an overlapping MAINT reservation keeps that
   reservation's jobs off the node too (checked: "Required nodes outside of the reservation").
   Without IGNORE_JOBS, so a peer that got busy since it was picked fails the creation and the
   next idle peer is tried. UNLIMITED, so an agent that died mid-check leaves the node reserved
   (out of everyone's reach), never free.
2. Only then the node is resumed: reserved for the agent's user, it takes only jobs that name
   the reservation.
3. ``sbatch`` a holder job named after the check (``--reservation``, ``-w``, ``--exclusive``,
   a time limit per DCGM level), which sleeps; the tools run as job steps in it (``srun
   --jobid --overlap``), started by a runner process the agent spawns (``--run-check``), so
   each tool's stdout comes back to the controller over srun's own I/O: no shared filesystem.
4. When the tools are done (or the job ended, or its time ran out) the node is drained again
   with exactly the reason it had before, then the job is cancelled, and once it has left the
   node the reservation is deleted. The drain comes first, so the node is never unfenced
   and unreserved at once; a node someone drained meanwhile keeps their drain.

Every step is idempotent and recorded in ``<check dir>/<name>/state.json``: a start delivered
again answers what the first one started (the job is also found by name in squeue), and a
start interrupted midway continues where it stopped. ``check_result`` is a fresh probe: not
done while the runner lives; a runner that died (an agent restart under systemd kills it) is
started again while the job runs, else the check ends with an error. Creating reservations
takes root or SlurmUser, which the agent runs as (the systemd unit runs it as root).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import pwd
import re
import shlex
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pitstop.adapters import log
from pitstop.adapters.scheduler import (
    DRAIN_REASON_PREFIX,
    FINAL_STATES,
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_RUNNING,
    RESULT_TRANSIENT,
    drain_reason,
    result_state,
)

NODE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,62})")
# A job, an array task (123_4) or a heterogeneous job component (123+0); nothing else.
JOB = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,10})?")
INCIDENT = re.compile(r"i[a-z2-7]{9}")
COMMAND_ID = re.compile(r"[-a-z0-9_]{1,128}")
ACTIONS = frozenset(
    {"RESTART_JOB", "DRAIN_NODE", "RESET_GPU", "RESCHEDULE_JOB", "REBOOT_NODE", "REPLACE_NODE"}
)
SIGNALS = frozenset({"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGCONT"})
OPS = frozenset(
    {
        "jobs_on_node",
        "drain",
        "resume",
        "requeue",
        "signal",
        "job_state",
        "node_state",
        "capacity",
        "start_check",
        "check_result",
    }
)
# A check's name, as pitstop.core.checks.check_name builds it: its reservation and job name too.
CHECK_NAME = re.compile(r"pitstop-(i[a-z2-7]{9})-([0-9]{1,6})-(diagnose|validate)")
CHECK_KEYS = frozenset({"node", "name", "kind", "incident", "dcgm_level", "gpus", "message_bytes", "peer"})
USER = re.compile(r"[a-z_][-a-z0-9_]{0,31}")
PARTITION = re.compile(r"[A-Za-z0-9_][-A-Za-z0-9_.]{0,63}")
DEFAULT_CHECK_DIR = "/var/lib/pitstop/checks"
# How long each tool may run (s): dcgmi diag -r 1 takes seconds, -r 2 ~2 min, -r 3 ~30 min, -r 4 1-2 h.
DCGM_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 3 * 3600}
SMI_TIMEOUT_S = 120
NCCL_TIMEOUT_S = 900
START_WAIT_S = 600.0  # for the holder job to start (a powered-down peer may have to boot)
LEAVE_WAIT_S = 120.0  # for the cancelled holder job to leave its nodes before the reservation goes
RUNNER_RESPAWNS = 3  # a runner that died is started again this often while the job runs
OUTPUT_MAX = 256 * 1024  # characters kept of one tool's stdout (a result must fit in Firestore)
ACTIVE_JOB_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING"})
# Node flags that leave a node usable: cloud nodes that are up, a job on it finishing.
_IDLE_FLAGS = frozenset({"CLOUD"})
_OWN_FLAGS = frozenset({"CLOUD", "COMPLETING"})
_OWN_BASES = frozenset({"ALLOCATED", "MIXED", "IDLE", "COMPLETING"})
# States of a job that holds its nodes: they free up when it is requeued.
_HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})

RUN_TIMEOUT_S = 60.0  # one scontrol/squeue/scancel call
REQUEUE_SETTLE_S = 15.0  # how long a requeue waits for the old run to finish completing
# Seconds past the one in which the requeued job was seen PENDING before its hold is lifted:
# slurmd rejects a job credential created no later than its revocation (whole seconds).
REVOKE_MARGIN_S = 1.0
# The longest mutating command runs three subprocesses (drain: show, update; requeue: requeue,
# update); the claim outlasts them with room to spare, so a live agent is never overtaken.
# (jobs_on_node runs one `scontrol show job` per job on the node and may take longer with many jobs,
# but it only reads: a second delivery running it alongside changes nothing. start_check runs more
# calls, each taken once and recorded in the check's state under a lock of its own, so a delivery
# that took a slow start over continues it instead of doing it twice.)
CLAIM_S = 4 * RUN_TIMEOUT_S
PUBLISH_TIMEOUT_S = 30.0  # one result message; past it the command's delivery is nacked and redelivered
# Ledger rows are kept a week: long past any command's deadline (COMMAND_DEADLINE_S), so a copy
# of a pruned command is refused as expired, never run again.
KEEP_S = 7 * 86400.0
PRUNE_EVERY_S = 3600.0
DEFAULT_LEDGER = "/var/lib/pitstop/agent-ledger.sqlite"

# Slurm's messages for a passing hiccup (slurm_errno.c strings, as scontrol prints them), plus
# the OS's. Anything else from Slurm is final: a retry would get the same answer.
TRANSIENT_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "communication send failure",
    "communication receive failure",
    "communication shutdown failure",
    "standby mode",
    "try again",
    "resource temporarily unavailable",
    "connection refused",
    "connection timed out",
    "connection reset by peer",
    "munge encode failed",
    # what `scontrol requeue` and `scancel` print when slurmctld cannot be reached (22.05, observed)
    "unexpected message received",
)

# `scontrol show node -o`: State=BASE[suffix][+FLAG...], e.g. IDLE, DOWN*, MIXED+DRAIN, IDLE+FAIL.
_STATE = re.compile(r"(?:^| )State=([A-Z_]+[*~#!%$@^-]?(?:\+[A-Z_]+[*~#!%$@^-]?)*)(?= |$)")
_SUFFIXES = "*~#!%$@^-"  # Slurm's marks on a state word: not responding, powered down, ...
# Reason=<text> [user@YYYY-MM-DDTHH:MM:SS]: the first such stamp that ends the line or precedes a
# further Key= field (SLURM_TIME_FORMAT=standard pins the time format).
_REASON = re.compile(r"(.*?) \[[^\s\[\]@]+@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\](?= [A-Za-z]+=|$)")
_REASON_TEXT = re.compile(r"[^A-Za-z0-9 _.,:;()/@+-]")


# The cluster's node list (sinfo) is trusted for this long; a name missing from it re-reads it,
# at most this often.
MEMBERS_TTL_S = 300.0
MEMBERS_REFRESH_S = 5.0


class CommandRefusedError(ValueError):
    """The command is malformed, unknown, expired or carries an argument that fails validation."""


class SlurmOutputError(RuntimeError):
    """Slurm answered something this agent does not understand; never guessed at."""


class CheckNotReadyError(RuntimeError):
    """The node cannot take a check yet (not responding, still running jobs): a retry may."""


def _need(args: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    v = args.get(key)
    if not isinstance(v, str) or pattern.fullmatch(v) is None:
        raise CommandRefusedError(f"argument {key} is missing or invalid")
    return v


def _kv(text: str) -> dict[str, str]:
    """``scontrol show -o`` output: Key=Value pairs (values may contain '=' but not spaces, except Reason)."""
    out: dict[str, str] = {}
    reason = re.search(r"\bReason=(.*?)(?= \w+=|$)", text)
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out.setdefault(k, v)
    if reason:
        out["Reason"] = reason.group(1)
    return out


def _run_fields(kv: Mapping[str, str]) -> dict[str, Any]:
    """A job's run from ``scontrol show job -o``: ``Restarts=`` (requeues so far) and ``StartTime=``.

    Requeued, a job's restart count goes up and it starts again later, so the pair names one run.
    Missing or malformed fields are None (unknown), never guessed.
    """
    restarts = kv.get("Restarts", "")
    start = kv.get("StartTime", "")
    return {
        "restarts": int(restarts) if restarts.isdigit() else None,
        "start_time": start if start and start != "None" else None,
    }


def is_transient(exc: BaseException) -> bool:
    """A passing hiccup (try again later) rather than an answer a retry would repeat."""
    if isinstance(exc, subprocess.TimeoutExpired):
        return True
    if isinstance(exc, FileNotFoundError | PermissionError):
        return False  # scontrol missing or not allowed: a broken installation, not a hiccup
    if isinstance(exc, OSError):
        return True  # fork/pipe trouble (EAGAIN, ENOMEM): the host is busy
    if isinstance(exc, CheckNotReadyError):
        return True
    if isinstance(exc, RuntimeError) and not isinstance(exc, SlurmOutputError):
        text = str(exc).lower()
        return any(m in text for m in TRANSIENT_MARKERS)
    return False


def job_leader(job: str) -> str:
    """The job Slurm acts on as a whole: a heterogeneous job's leader (123 for 123+1), else the id.

    Slurm requeues a heterogeneous job only as a whole (``scontrol requeue 123+0`` answers
    "Invalid job id specified"); an array task (123_4) is a job of its own and stays as it is.
    """
    return job.split("+", 1)[0]


@dataclass(frozen=True)
class NodeInfo:
    node: str
    state: str  # as Slurm prints it, e.g. "IDLE+DRAIN", "DOWN*"
    reason: str  # without Slurm's "[user@time]" stamp; "" when none

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0].rstrip(_SUFFIXES)

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(f.rstrip(_SUFFIXES) for f in self.state.split("+")[1:])

    @property
    def drained(self) -> bool:
        """Taken out of service on purpose: DRAIN (draining or drained) or FAIL (failing or failed)."""
        return "DRAIN" in self.flags or "FAIL" in self.flags or self.base == "FAIL"

    @property
    def out_of_service(self) -> bool:
        return self.drained or self.base == "DOWN"

    @property
    def marked(self) -> bool:
        """Slurm marks a state word when the node is not responding (*), powered down (~), ..."""
        return any(w[-1:] in _SUFFIXES for w in self.state.split("+") if w)

    @property
    def free_idle(self) -> bool:
        """Idle, responding and in service: a job could start on it now (reservations aside)."""
        return self.base == "IDLE" and not self.marked and self.flags <= _IDLE_FLAGS

    @property
    def usable_own(self) -> bool:
        """A node of a running job that returns to service when the job is requeued."""
        return self.base in _OWN_BASES and not self.marked and self.flags <= _OWN_FLAGS


def parse_node(text: str, node: str) -> NodeInfo:
    """One node from ``scontrol show node -o NODE``, parsed strictly: anything unexpected raises."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith(f"NodeName={node} "):
        raise SlurmOutputError(f"unexpected scontrol show node output for {node}: {text[:200]!r}")
    head, sep, tail = lines[0].partition(" Reason=")
    states = _STATE.findall(head)
    if len(states) != 1:
        raise SlurmOutputError(f"no single State= for {node} in {head[:200]!r}")
    reason = ""
    if sep:
        m = _REASON.match(tail)
        reason = (m.group(1) if m else tail).strip()
    return NodeInfo(node, states[0], reason)


def parse_nodes(text: str) -> dict[str, tuple[NodeInfo, tuple[str, ...]]]:
    """Every node from ``scontrol show node -o``: name -> (state, partitions). Strict per line."""
    out: dict[str, tuple[NodeInfo, tuple[str, ...]]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.match(r"NodeName=(\S+) ", line)
        if m is None or NODE.fullmatch(m.group(1)) is None:
            raise SlurmOutputError(f"unexpected scontrol show node line: {line[:200]!r}")
        parts = _kv(line.partition(" Reason=")[0]).get("Partitions", "")
        names = tuple(p for p in parts.split(",") if p and PARTITION.fullmatch(p))
        out[m.group(1)] = (parse_node(line, m.group(1)), names)
    return out


@dataclass(frozen=True)
class Reservation:
    name: str
    state: str  # ACTIVE or INACTIVE
    nodes: str  # Slurm's host list, "(null)" when it reserves no nodes
    users: str
    flags: str


def parse_reservations(text: str) -> dict[str, Reservation]:
    """``scontrol show reservation -o``: name -> reservation ("No reservations in the system": none)."""
    out: dict[str, Reservation] = {}
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        kv = _kv(line)
        r = Reservation(
            kv["ReservationName"],
            kv.get("State", ""),
            kv.get("Nodes", ""),
            kv.get("Users", ""),
            kv.get("Flags", ""),
        )
        out[r.name] = r
    return out


@dataclass(frozen=True)
class CheckTools:
    """How checks run: each tool a command prefix (the real names by default; locally the stand-ins
    in pitstop.local.gpu_tools), srun's MPI plugin for the NCCL test (nccl-tests built with MPI
    needs one, e.g. ``pmix``), the GRES name GPUs are scheduled as (``gpu``; none: whole nodes
    through ``--exclusive``), and where checks keep their state and outputs."""

    nvidia_smi: tuple[str, ...] = ("nvidia-smi",)
    dcgmi: tuple[str, ...] = ("dcgmi",)
    all_gather_perf: tuple[str, ...] = ("all_gather_perf",)
    srun_mpi: str | None = None
    gres: str | None = None
    directory: str = DEFAULT_CHECK_DIR


def check_steps(st: Mapping[str, Any]) -> list[tuple[str, list[str], float]]:
    """The srun of each tool of a check: (output key, argv, timeout s), from its recorded state.

    Each tool is a job step of the holder job (``--overlap`` shares the job's resources with its
    sleeping batch step); its stdout comes back to the runner through srun.
    """
    tools, job, node = st["tools"], str(st["job"]), str(st["node"])
    gres = [f"--gres={tools['gres']}:{int(st['gpus'])}"] if tools.get("gres") else []
    base = ["srun", f"--jobid={job}", "--overlap", "--chdir=/tmp", "--quiet", *gres]
    one = [*base, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--"]
    level = int(st["dcgm_level"])
    dcgm = ("dcgm", [*one, *tools["dcgmi"], "diag", "-r", str(level), "-j"], float(DCGM_TIMEOUT_S[level]))
    if st["kind"] == "diagnose":
        return [
            ("nvidia_smi_q", [*one, *tools["nvidia_smi"], "-q"], float(SMI_TIMEOUT_S)),
            ("nvlink", [*one, *tools["nvidia_smi"], "nvlink", "--status"], float(SMI_TIMEOUT_S)),
            dcgm,
        ]
    steps = [dcgm]
    if st.get("peer"):
        mpi = [f"--mpi={tools['srun_mpi']}"] if tools.get("srun_mpi") else []
        both = [
            *base,
            *mpi,
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            f"--nodelist={node},{st['peer']}",
        ]
        top = int(st["message_bytes"])  # the size judged (512 MiB on a3-highgpu-8g, 8 GiB on most)
        gather = [*tools["all_gather_perf"], "-b", str(min(1 << 30, top)), "-e", str(top), "-f", "2"]
        steps.append(("nccl", [*both, "--", *gather, "-g", str(int(st["gpus"]))], float(NCCL_TIMEOUT_S)))
    return steps


def check_minutes(kind: str, level: int) -> int:
    """The holder job's time limit: every tool's timeout, the wait for it to start, and a margin."""
    total = DCGM_TIMEOUT_S[level] + (2 * SMI_TIMEOUT_S if kind == "diagnose" else NCCL_TIMEOUT_S)
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


class SlurmCommands:
    """The closed set of operations, each a fixed argv with validated arguments."""

    def __init__(
        self,
        run: Callable[[list[str]], str] | None = None,
        release_requeued: bool = False,
        checks: CheckTools | None = None,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._run = run or self._subprocess
        self._sleep, self._wall = sleep, wall
        self.release_requeued = release_requeued
        self.checks = checks or CheckTools()
        self._nodes: frozenset[str] = frozenset()
        self._nodes_at = -1e18
        self._nodes_lock = threading.Lock()
        self._children: list[subprocess.Popen[bytes]] = []  # check runners, reaped as they exit

    def _member(self, args: Mapping[str, Any]) -> str:
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
                out = self._run(["sinfo", "-h", "-N", "-o", "%N"])  # one line per node (and partition)
                self._nodes = frozenset(w for w in out.split() if NODE.fullmatch(w))
                self._nodes_at = now
            if node not in self._nodes:
                raise CommandRefusedError(f"node {node} is not a node of this Slurm cluster (sinfo)")
        return node

    @staticmethod
    def _subprocess(argv: list[str]) -> str:
        env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}  # the reason stamp format parse_node reads
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, env=env
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
        return proc.stdout

    def execute(self, op: str, args: Any) -> Any:
        if op not in OPS:
            raise CommandRefusedError(f"unknown operation {op!r}")
        if not isinstance(args, Mapping):
            raise CommandRefusedError("arguments must be an object")
        return getattr(self, op)(args)

    def jobs_on_node(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The jobs on a node, each with its run (``restarts``, ``start_time``) from ``scontrol show job``.

        The run tells a later requeue whether the job is still the one the fault hit.
        """
        node = self._member(args)
        out = self._run(["squeue", "-h", "-w", node, "-o", "%i|%T|%u|%D|%N|%j"])
        jobs = []
        for line in out.splitlines():
            parts = line.split("|", 5)
            if len(parts) == 6 and JOB.fullmatch(parts[0]):
                jobs.append(
                    {
                        "id": parts[0],
                        "state": parts[1],
                        "user": parts[2],
                        "nodes": int(parts[3] or 0),
                        "nodelist": parts[4],
                        "name": parts[5][:128],
                        **_run_fields(self._show_job(parts[0]) or {}),
                    }
                )
            elif line.strip():
                log.emit("WARNING", "slurm agent: squeue line not understood, skipped", line=line[:200])
        return jobs

    def _show_job(self, job: str) -> dict[str, str] | None:
        """``scontrol show job -o JOB`` as key/value pairs; None for a job Slurm no longer knows."""
        try:
            out = self._run(["scontrol", "show", "job", "-o", job])
        except RuntimeError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        lines = [line for line in out.splitlines() if line.strip()]
        return _kv(lines[0]) if lines else {}

    def node_info(self, node: str) -> NodeInfo:
        return parse_node(self._run(["scontrol", "show", "node", "-o", node]), node)

    def drain(self, args: Mapping[str, Any]) -> dict[str, Any]:
        node = self._member(args)
        incident = _need(args, "incident", INCIDENT)
        action = args.get("action")
        if action not in ACTIONS:
            raise CommandRefusedError("argument action is missing or invalid")
        # The reason is built here from validated parts only: no log text ever reaches Slurm.
        reason = drain_reason(incident, action)
        before = self.node_info(node)
        out: dict[str, Any] = {
            "node": node,
            "previous_state": before.state,
            "previous_reason": before.reason,
            "already_drained_by_other": False,
        }
        ours = before.reason.startswith(f"{DRAIN_REASON_PREFIX}{incident} ")
        if before.drained and not ours:
            # Someone else's drain (a person, or Pitstop for another incident): left as it is.
            log.emit(
                "INFO",
                "slurm agent: node already drained by someone else; left alone",
                node=node,
                state=before.state,
                reason=before.reason,
            )
            return {**out, "reason": None, "already_drained_by_other": True}
        if before.base == "DOWN" and before.reason and not ours:
            # DOWN alone is not a fence: Slurm returns the node to service when its slurmd registers
            # again (ReturnToService), i.e. right after the reboot Pitstop is about to do. Drain it,
            # keeping what was there in the reason.
            kept = _REASON_TEXT.sub("", before.reason)[:80]
            reason = f"{reason} (was {before.base}: {kept})"
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return {**out, "reason": reason}

    def resume(self, args: Mapping[str, Any]) -> dict[str, Any]:
        node = self._member(args)
        prefix = DRAIN_REASON_PREFIX
        if args.get("incident") is not None:  # commands from before the incident was sent: any Pitstop drain
            prefix += _need(args, "incident", INCIDENT) + " "
        info = self.node_info(node)
        out: dict[str, Any] = {"node": node, "state": info.state, "reason": info.reason}
        if not info.out_of_service:
            return {**out, "resumed": False}
        if not info.reason.startswith(prefix):
            log.emit(
                "INFO",
                "slurm agent: node drained by someone else; left drained",
                node=node,
                state=info.state,
                reason=info.reason,
            )
            return {**out, "resumed": False, "left_drained": info.reason}
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return {**out, "resumed": True}

    def requeue(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        target = job_leader(job)
        try:
            self._run(["scontrol", "requeue", target])
        except RuntimeError as exc:
            if "Job is pending execution" not in str(exc):
                raise
            # Already back in the queue (e.g. the other component of a heterogeneous job requeued it).
            return {"job": job, "requeued": target, "already_pending": True}
        if not self.release_requeued:
            return {"job": job, "requeued": target}
        return {"job": job, "requeued": target, "released": self._release_hold(target)}

    def _release_hold(self, target: str) -> bool:
        """Lift the BeginTime hold Slurm puts on a requeued batch job (about 120 s), so the gang
        starts again at once.

        Slurm sets that hold when the requeued job leaves COMPLETING (its old run's steps ended on
        every node), so lifting it earlier is undone: wait until the job is PENDING, then lift it.
        Not in the same second, though: each slurmd revoked the job's old credential when it ended
        the old run, and rejects a credential created in the second of that revocation or before
        it ("Job credential revoked": the relaunch fails and the job ends; seen in CI). So the
        hold is lifted from the start of a later whole second on.
        Bounded: a job still completing after ``REQUEUE_SETTLE_S`` keeps Slurm's hold.
        """
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while time.monotonic() < deadline:
            kv = self._show_job(target)
            state = (kv or {}).get("JobState", "UNKNOWN")
            if state == "PENDING":
                self._sleep(REVOKE_MARGIN_S + 1.0 - self._wall() % 1.0)
                self._run(["scontrol", "update", f"JobId={target}", "StartTime=now"])
                return True
            if state not in ("COMPLETING", "RUNNING", "CONFIGURING", "REQUEUED"):
                return False  # started already, or gone
            self._sleep(0.25)
        return False

    def signal(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        sig = args.get("signal")
        if sig not in SIGNALS:
            raise CommandRefusedError("argument signal is missing or not allowed")
        target = job_leader(job)  # every component of a heterogeneous job checkpoints together
        self._run(["scancel", f"--signal={sig.removeprefix('SIG')}", "--full", target])
        return {"job": job, "signal": sig, "signalled": target}

    def job_state(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        kv = self._show_job(job)
        if kv is None:
            return {"job": job, "state": "UNKNOWN", "restarts": None, "start_time": None}
        return {
            "job": job,
            "state": kv.get("JobState", "UNKNOWN"),
            "nodelist": kv.get("NodeList", ""),
            "user": kv.get("UserId", "").split("(")[0],
            **_run_fields(kv),
        }

    def node_state(self, args: Mapping[str, Any]) -> dict[str, Any]:
        info = self.node_info(self._member(args))
        return {"node": info.node, "state": info.state, "reason": info.reason}

    # -- capacity: could the gang start again now without the fenced node? ---------------------

    def _hostnames(self, lists: Sequence[str]) -> set[str]:
        """Slurm host lists (``a3-node-[001-003]``) expanded by Slurm itself."""
        wanted = [x for x in lists if x and x != "(null)"]
        if not wanted:
            return set()
        names = self._run(["scontrol", "show", "hostnames", ",".join(wanted)]).split()
        if any(NODE.fullmatch(n) is None for n in names):
            raise SlurmOutputError(f"unexpected host names from scontrol show hostnames: {names[:5]}")
        return set(names)

    def _reservations(self) -> dict[str, Reservation]:
        return parse_reservations(self._run(["scontrol", "show", "reservation", "-o"]))

    def _reserved(self, reservations: Mapping[str, Reservation], but: str | None = None) -> set[str]:
        """The nodes in an active reservation (other than ``but``)."""
        return self._hostnames(
            [r.nodes for r in reservations.values() if r.state == "ACTIVE" and r.name != but]
        )

    def capacity(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Whether the job's gang could start again now without ``node``: ``enough``, ``need``
        (its node count), ``free`` (what was counted) and ``why`` (one line saying so).

        Counted, in each of the job's partitions (the best one answers): nodes that are idle,
        responding, neither drained, down, failed nor in maintenance, and in no active
        reservation (a job in a reservation counts only that reservation's nodes) nor in the
        job's ExcNodeList, plus the job's own nodes that are healthy (they free up when it is
        requeued), never the fenced node. A job Slurm does not know, one already pending, or one
        pinned to the fenced node (ReqNodeList) cannot move now: ``enough`` is False and ``why``
        says so. One that ended on the fault has freed its nodes, which count as idle.
        """
        job = _need(args, "job", JOB)
        fenced = self._member(args)
        kv = self._show_job(job)
        if kv is None:
            why = f"job {job} is not known to Slurm: nothing to requeue"
            return {"job": job, "state": "UNKNOWN", "enough": False, "need": None, "free": None, "why": why}
        state = kv.get("JobState", "UNKNOWN")
        count = re.match(r"[0-9]+", kv.get("NumNodes", ""))
        partitions = [p for p in kv.get("Partition", "").split(",") if p]
        if count is None or not partitions:
            raise SlurmOutputError(f"no NumNodes or Partition for job {job}")
        need = int(count.group(0))
        nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
        reservations = self._reservations()
        resv = kv.get("Reservation") or None
        reserved = self._reserved(reservations, but=resv)
        allowed = self._hostnames([reservations[resv].nodes]) if resv in reservations else None
        if resv is not None and allowed is None:
            allowed = set()  # its reservation is gone: it can start nowhere
        own = self._hostnames([kv.get("NodeList", "")]) if state in _HOLDING_STATES else set()
        excluded = self._hostnames([kv.get("ExcNodeList", "")])
        required = self._hostnames([kv.get("ReqNodeList", "")])
        best: tuple[int, str, list[str], list[str]] | None = None
        for part in partitions:
            idle = sorted(
                n
                for n, (info, parts) in nodes.items()
                if part in parts
                and n != fenced
                and n not in own
                and info.free_idle
                and n not in reserved
                and n not in excluded
                and (allowed is None or n in allowed)
            )
            mine = sorted(n for n in own if n != fenced and n in nodes and nodes[n][0].usable_own)
            if best is None or len(idle) + len(mine) > best[0]:
                best = (len(idle) + len(mine), part, idle, mine)
        assert best is not None
        free, part, idle, mine = best
        where = f"partition {part}" + (f", reservation {resv}" if resv else "")
        why = (
            f"{len(idle)} idle healthy node{'' if len(idle) == 1 else 's'} in {where} + {len(mine)} of the"
            f" job's own; needs {need}"
        )
        enough = free >= need
        if state == "PENDING":
            enough, why = False, f"job {job} is already pending, nothing to move ({why})"
        elif fenced in required:
            enough, why = False, f"job {job} requires the fenced node {fenced} (its node list is pinned)"
        # A job that ended on the fault (FAILED, NODE_FAIL, ...) has freed its nodes: they count as
        # idle above, and whether it is requeued at all is actuate's call (it knows the run).
        return {
            "job": job,
            "state": state,
            "enough": enough,
            "need": need,
            "free": free,
            "partition": part,
            "idle": idle[:64],
            "own": mine[:64],
            "why": why,
        }

    # -- checks on a fenced node (diagnose / validate): see the module docstring ----------------

    def _check_spec(self, args: Mapping[str, Any], start: bool) -> dict[str, Any]:
        """A check's arguments, each validated; the name must be the one its incident and kind make."""
        unknown = sorted(str(k) for k in args if k not in CHECK_KEYS)
        if unknown:
            raise CommandRefusedError(f"unknown check arguments: {', '.join(unknown)[:120]}")
        name = _need(args, "name", CHECK_NAME)
        incident = _need(args, "incident", INCIDENT)
        kind = args.get("kind")
        m = CHECK_NAME.fullmatch(name)
        if kind not in ("diagnose", "validate") or m is None or (m.group(1), m.group(3)) != (incident, kind):
            raise CommandRefusedError("check name, incident and kind do not agree")
        node = self._member(args)
        spec: dict[str, Any] = {"node": node, "name": name, "incident": incident, "kind": kind}
        if not start:
            return spec
        spec["dcgm_level"] = _int_arg(args, "dcgm_level", 1, 4)
        spec["gpus"] = _int_arg(args, "gpus", 1, 16)
        if kind == "validate":
            spec["message_bytes"] = _int_arg(args, "message_bytes", 1 << 20, 64 << 30)
            want_peer = args.get("peer", True)
            if not isinstance(want_peer, bool):
                raise CommandRefusedError("argument peer is missing or invalid")
            spec["want_peer"] = want_peer
        return spec

    def _check_path(self, name: str) -> Path:
        return Path(self.checks.directory) / name  # a CHECK_NAME: no separators, no dots

    @contextlib.contextmanager
    def _check_lock(self, name: str) -> Iterator[Path]:
        """The check's directory, held exclusively (starts, results and the runner's finish take turns)."""
        Path(self.checks.directory).mkdir(parents=True, exist_ok=True, mode=0o700)
        d = self._check_path(name)
        d.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(d / "state.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield d
        finally:
            os.close(fd)

    @staticmethod
    def _load(d: Path) -> dict[str, Any] | None:
        try:
            st: dict[str, Any] = json.loads((d / "state.json").read_text())
        except FileNotFoundError:
            return None
        return st

    @staticmethod
    def _save(d: Path, st: Mapping[str, Any]) -> None:
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, d / "state.json")

    def start_check(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Start a diagnostic or validation on the fenced node, once per check name; returns at once.

        ``{"started": name, "peer": str | None, "note": str, "job": id}``. A start delivered again
        answers what the first one started. The node must carry Pitstop's drain for this
        incident (someone else's drain is left alone: refused), respond, and run no job
        (else a retryable "not ready").
        """
        spec = self._check_spec(args, start=True)
        node, name = spec["node"], spec["name"]
        with self._check_lock(name) as d:
            st = self._load(d)
            if st is not None and st.get("node") != node:
                raise CommandRefusedError(f"check {name} runs on {st.get('node')}, not {node}")
            if st is not None and st.get("started"):
                return dict(st["started"])
            if st is None or st.get("undone"):
                st = self._new_check(spec)
                self._save(d, st)
            try:
                self._begin(d, st)
            except Exception as exc:
                self._undo_start(d, st, exc)
                raise
            return dict(st["started"])

    def _new_check(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        node, incident = spec["node"], spec["incident"]
        nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
        if node not in nodes:
            raise SlurmOutputError(f"scontrol show node does not list {node}")
        info, partitions = nodes[node]
        if "DRAIN" not in info.flags or not info.reason.startswith(f"{DRAIN_REASON_PREFIX}{incident} "):
            raise CommandRefusedError(
                f"node {node} is not fenced by Pitstop for {incident} (state {info.state}, reason"
                f" {info.reason[:80]!r}): a check runs only on a node Pitstop drained"
            )
        if info.marked or "NOT_RESPONDING" in info.flags or info.base in ("DOWN", "FAIL"):
            raise CheckNotReadyError(
                f"node {node} is {info.state}, not responding: try again once it is back"
            )
        if info.base != "IDLE" or info.flags - {"DRAIN", "CLOUD", "RESERVED", "MAINTENANCE"}:
            raise CheckNotReadyError(f"node {node} is {info.state}: a check needs it idle; try again")
        if not partitions:
            raise CommandRefusedError(f"node {node} is in no partition: no job can run on it")
        user = _agent_user()
        if USER.fullmatch(user) is None:
            raise CommandRefusedError("the agent's user name is not one a reservation can name")
        tools = self.checks
        return {
            **spec,
            "reason": info.reason,  # the drain put back afterwards, exactly
            "partitions": list(partitions),
            "partition": partitions[0],
            "peer": None,
            "note": ""
            if spec.get("want_peer", True)
            else "no peer asked for: validated without the NCCL test",
            "user": user,
            "job": None,
            "tools": {
                "nvidia_smi": list(tools.nvidia_smi),
                "dcgmi": list(tools.dcgmi),
                "all_gather_perf": list(tools.all_gather_perf),
                "srun_mpi": tools.srun_mpi,
                "gres": tools.gres,
            },
            "minutes": check_minutes(spec["kind"], spec["dcgm_level"]),
            "started": None,
            "finished": False,
            "respawns": 0,
            "created_at": time.time(),
        }

    def _begin(self, d: Path, st: dict[str, Any]) -> None:
        """The start's steps, each skipped when an earlier attempt already took it."""
        node, name = st["node"], st["name"]
        self._reserve(d, st)  # first: once resumed, the reservation is the node's only fence
        info = self.node_info(node)
        if info.drained:
            if info.reason != st["reason"]:
                raise CommandRefusedError(
                    f"node {node} was drained meanwhile by someone else ({info.reason[:80]!r}): no check"
                )
            self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        if st["job"] is None:
            st["job"] = self._find_job(name, st["user"]) or self._submit(st)
            self._save(d, st)
        self._reap()
        if not self._runner_alive(d):
            self._spawn_runner(d)
        st["started"] = {"started": name, "peer": st["peer"], "note": st["note"], "job": st["job"]}
        self._save(d, st)
        log.emit("INFO", "slurm agent: check started", check=name, node=node, peer=st["peer"], job=st["job"])

    def _peers(self, st: Mapping[str, Any]) -> tuple[str, list[str]]:
        """A partition of the node with idle healthy unreserved peers, and those peers (fresh)."""
        nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
        reserved = self._reserved(self._reservations())
        for part in st["partitions"]:
            found = sorted(
                n
                for n, (info, parts) in nodes.items()
                if part in parts
                and n != st["node"]
                and info.free_idle
                and n not in reserved
                and n.lower() != "all"
            )
            if found:
                return part, found
        return st["partitions"][0], []

    def _reserve(self, d: Path, st: dict[str, Any]) -> None:
        """The check's reservation: the node (and for validate one idle peer), for the agent's user."""
        name, node = st["name"], st["node"]
        existing = self._reservations().get(name)
        if existing is not None:
            want = {node} | ({st["peer"]} if st["peer"] else set())
            if self._hostnames([existing.nodes]) != want:
                raise SlurmOutputError(f"reservation {name} holds {existing.nodes}, not {sorted(want)}")
            self._save(d, st)
            return
        candidates: list[str] = []
        if st["kind"] == "validate" and st.get("want_peer", True):
            st["partition"], candidates = self._peers(st)
            if not candidates:
                st["note"] = f"no idle unreserved peer in partition {st['partition']}: no NCCL test"
        for peer in [*candidates[:4], None]:
            nodes = node if peer is None else f"{node},{peer}"
            st["peer"] = peer
            try:
                self._run(
                    [
                        "scontrol",
                        "create",
                        "reservation",
                        f"ReservationName={name}",
                        f"Users={st['user']}",
                        f"Nodes={nodes}",
                        "StartTime=now",
                        "Duration=UNLIMITED",
                        "Flags=MAINT",
                    ]
                )
            except RuntimeError as exc:
                if peer is not None and "nodes are busy" in str(exc).lower():
                    continue  # the peer took a job since it was picked: the next one
                if "duplicate reservation name" in str(exc).lower():
                    return self._reserve(d, st)  # an answer lost on its way: made after all
                raise
            if peer is None and candidates:
                st["note"] = f"every idle peer in partition {st['partition']} got busy: no NCCL test"
            self._save(d, st)
            return

    def _find_job(self, name: str, user: str) -> str | None:
        """The check's holder job if an earlier attempt submitted it (found by name)."""
        out = self._run(["squeue", "-h", "-n", name, "-u", user, "-o", "%i|%T"])
        for line in out.splitlines():
            job, _, state = line.partition("|")
            if JOB.fullmatch(job) and state in ACTIVE_JOB_STATES:
                return job
        return None

    def _submit(self, st: Mapping[str, Any]) -> str:
        """The holder job: pinned to the node (and peer) through the reservation; it only sleeps."""
        peer, minutes = st["peer"], int(st["minutes"])
        gres = [f"--gres={st['tools']['gres']}:{int(st['gpus'])}"] if st["tools"].get("gres") else []
        out = self._run(
            [
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
        )
        job = out.strip().split(";", 1)[0]
        if JOB.fullmatch(job) is None:
            raise SlurmOutputError(f"unexpected sbatch answer {out[:100]!r}")
        return job

    def _reap(self) -> None:
        self._children = [p for p in self._children if p.poll() is None]

    @staticmethod
    def _runner_alive(d: Path) -> bool:
        """Whether a runner holds the check's runner lock (it holds it for as long as it lives)."""
        fd = os.open(d / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def _spawn_runner(self, d: Path) -> None:
        """Start the runner in a session of its own, handing it the runner lock already taken, so
        there is no moment at which a started check has no runner to be seen."""
        fd = os.open(d / "runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with open(d / "runner.log", "ab") as out:
                argv = [
                    sys.executable,
                    "-m",
                    "pitstop.agent.slurm",
                    "--run-check",
                    str(d),
                    "--lock-fd",
                    str(fd),
                ]
                proc = subprocess.Popen(  # a fixed argv; the directory is a check name
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,),
                    start_new_session=True,
                )
            self._children.append(proc)
        finally:
            os.close(fd)  # the runner keeps the lock through its inherited descriptor

    def _undo_start(self, d: Path, st: dict[str, Any], exc: BaseException) -> None:
        """A start that failed midway is taken back (the fence restored, the reservation gone) and
        forgotten, so a retry starts afresh; if that fails too, the next try continues from the record."""
        try:
            if self._finish(d, st, wait_s=30.0):
                self._save(d, {"name": st["name"], "node": st["node"], "undone": str(exc)[:300]})
        except Exception as undo:
            log.emit(
                "WARNING",
                "slurm agent: a failed check start could not be taken back yet",
                check=st["name"],
                error=str(undo)[:300],
            )

    def _job_gone(self, job: str | None, wait_s: float) -> bool:
        """Whether the job has left its nodes, waiting up to ``wait_s``."""
        if job is None:
            return True
        deadline = time.monotonic() + wait_s
        while True:
            try:
                states = self._run(["squeue", "-h", "-j", job, "-o", "%T"]).split()
            except RuntimeError as exc:
                if "Invalid job id" in str(exc):
                    return True
                raise
            if not set(states) & ACTIVE_JOB_STATES:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _finish(self, d: Path, st: dict[str, Any], wait_s: float) -> bool:
        """Put the node back as it was: drained with its reason first, then the job cancelled, then
        (once the job has left) the reservation deleted. True when all of it is done. Idempotent."""
        if st.get("finished"):
            return True
        node, name = st["node"], st["name"]
        job = st.get("job") or self._find_job(name, st["user"])  # submitted, its answer lost
        info = self.node_info(node)
        if not info.drained:
            self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={st['reason']}"])
            info = self.node_info(node)
            if not info.drained:
                raise SlurmOutputError(f"node {node} is {info.state} after the drain")
        elif info.reason != st["reason"] and "restored" not in st:
            st["note"] = f"{st['note']}; " if st["note"] else ""
            st["note"] += f"node drained meanwhile by someone else ({info.reason[:80]}): left so"
        st["restored"] = {"state": info.state, "reason": info.reason}
        if job is not None:
            self._run(["scancel", job])  # a job that already ended: nothing to do, exit 0
        self._save(d, st)
        if not self._job_gone(job, wait_s):
            return False
        try:
            self._run(["scontrol", "delete", f"ReservationName={name}"])
        except RuntimeError as exc:
            if "in use" in str(exc):
                return False  # the job is still leaving: next time
            if "reservation is invalid" not in str(exc):
                raise
        info = self.node_info(node)  # as the check leaves it
        if not info.drained:
            raise SlurmOutputError(f"node {node} is {info.state} after the check; expected it drained")
        st["restored"] = {"state": info.state, "reason": info.reason}
        st["finished"], st["finished_at"] = True, time.time()
        self._save(d, st)
        log.emit(
            "INFO", "slurm agent: check finished; node fenced again", check=name, node=node, state=info.state
        )
        return True

    def check_result(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The check's state now (a fresh probe): ``done`` only once the tools ran (or could not)
        and the node is fenced again as before; then ``outputs`` (each tool's stdout), ``peer``,
        ``note``, ``error`` (None, or why a tool or the run failed) and ``exit_codes``."""
        spec = self._check_spec(args, start=False)
        node, name = spec["node"], spec["name"]
        if not (self._check_path(name) / "state.json").exists():
            raise CommandRefusedError(f"no check {name} was started")
        with self._check_lock(name) as d:
            st = self._load(d)
            if st is None or st.get("node") != node:
                raise CommandRefusedError(f"no check {name} was started on {node}")
            if st.get("undone"):
                raise CommandRefusedError(f"check {name} did not start: {st['undone']}")
            if st.get("finished"):
                return self._answer(d, st)
            if not st.get("started"):
                return self._pending(st, "the check is still being started")
            self._reap()
            if self._runner_alive(d):
                return self._pending(st, "running")
            if not (d / "result.json").exists():
                if st["respawns"] < RUNNER_RESPAWNS and not self._job_gone(st["job"], 0.0):
                    st["respawns"] += 1
                    self._save(d, st)
                    self._spawn_runner(d)
                    log.emit("WARNING", "slurm agent: check runner had stopped; started again", check=name)
                    return self._pending(st, "runner started again")
                _write_json(
                    d / "result.json",
                    {
                        "keys": [],
                        "exit_codes": {},
                        "error": "the check's runner stopped before the tools finished",
                    },
                )
            if self._finish(d, st, wait_s=3.0):
                return self._answer(d, st)
            return self._pending(st, "fencing the node again")

    @staticmethod
    def _pending(st: Mapping[str, Any], phase: str) -> dict[str, Any]:
        return {
            "done": False,
            "name": st["name"],
            "node": st["node"],
            "peer": st.get("peer"),
            "note": st.get("note", ""),
            "job": st.get("job"),
            "phase": phase,
            "outputs": {},
            "error": None,
        }

    @staticmethod
    def _answer(d: Path, st: Mapping[str, Any]) -> dict[str, Any]:
        res = json.loads((d / "result.json").read_text())
        outputs, stderr = {}, {}
        for key in res.get("keys", []):
            out, err = d / f"{key}.out", d / f"{key}.err"
            if out.exists():
                outputs[key] = out.read_text(errors="replace")[:OUTPUT_MAX]
            if err.exists() and err.stat().st_size:
                stderr[key] = err.read_text(errors="replace")[-1000:]
        return {
            "done": True,
            "name": st["name"],
            "node": st["node"],
            "peer": st.get("peer"),
            "note": st.get("note", ""),
            "job": st.get("job"),
            "outputs": outputs,
            "exit_codes": res.get("exit_codes", {}),
            "stderr": stderr,
            "error": res.get("error"),
            "restored": st.get("restored"),
        }

    # -- the runner (``--run-check DIR``): the tools as job steps, then the fence back ------------

    def _wait_running(self, job: str, wait_s: float) -> str:
        """The holder job's state once it runs (or has ended, or ``wait_s`` passed)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                state = self._run(["squeue", "-h", "-j", job, "-o", "%T"]).strip()
            except RuntimeError as exc:
                if "Invalid job id" not in str(exc):
                    raise
                state = ""
            if state not in ("PENDING", "CONFIGURING") or time.monotonic() >= deadline:
                return state
            time.sleep(1.0)

    def run_check(self, d: Path) -> int:
        """Run the check recorded in ``d`` (called in the runner process, holding the runner lock)."""
        st = self._load(d)
        if st is None or not st.get("job") or st.get("finished"):
            return 0
        job = str(st["job"])
        codes: dict[str, int] = {}
        errors: list[str] = []
        keys: list[str] = []
        state = self._wait_running(job, START_WAIT_S)
        if state != "RUNNING":
            errors.append(f"the check job {job} did not run ({state or 'gone'})")
        else:
            for key, argv, timeout in check_steps(st):
                rc, out, err = _srun(argv, timeout)
                (d / f"{key}.out").write_text(out)
                (d / f"{key}.err").write_text(err[-4000:])
                codes[key], keys = rc, [*keys, key]
                if rc != 0 and not out.strip():
                    errors.append(f"{key}: exited {rc} without output: {err.strip()[-200:]}")
        _write_json(
            d / "result.json", {"keys": keys, "exit_codes": codes, "error": "; ".join(errors) or None}
        )
        for _ in range(10):
            with self._check_lock(d.name):
                st = self._load(d) or st
                if self._finish(d, st, wait_s=0.0):
                    return 0
            self._job_gone(job, LEAVE_WAIT_S)
        return 1


def _int_arg(args: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v = args.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CommandRefusedError(f"argument {key} is missing or invalid")
    return v


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


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


class Ledger:
    """The agent's claims and results, in SQLite on the controller: one row per command id.

    ``version`` goes up with every write; an UPDATE conditioned on it is the claim's
    precondition. One connection used under a lock (callbacks run on a thread pool), each
    read-modify-write inside ``BEGIN IMMEDIATE`` so two processes on one file serialize too; WAL
    with full sync so a claim that was answered survives a crash of the controller.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, version INTEGER NOT NULL,"
                " state TEXT NOT NULL, updated_at REAL NOT NULL, doc TEXT NOT NULL)"
            )

    def create(self, cid: str, doc: Mapping[str, Any], now: float) -> int | None:
        """Insert the row at version 1 unless the id exists (then None): one insert of an id wins."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO results (id, version, state, updated_at, doc) VALUES (?, 1, ?, ?, ?)",
                (cid, result_state(doc), now, json.dumps(doc)),
            )
        return 1 if cur.rowcount == 1 else None

    def get(self, cid: str) -> tuple[dict[str, Any], int] | None:
        """The row's document and version, or None."""
        with self._lock:
            row = self._db.execute("SELECT doc, version FROM results WHERE id = ?", (cid,)).fetchone()
        return None if row is None else (dict(json.loads(row[0])), int(row[1]))

    def update(
        self, cid: str, fields: Mapping[str, Any], version: int, now: float
    ) -> tuple[dict[str, Any], int] | None:
        """Merge ``fields`` into the row if it is still at ``version``: (document, new version), or
        None when another write came first (the precondition failed) or the row is gone."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT doc FROM results WHERE id = ? AND version = ?", (cid, version)
                ).fetchone()
                doc = None if row is None else {**json.loads(row[0]), **fields}
                if doc is not None:
                    self._db.execute(
                        "UPDATE results SET doc = ?, state = ?, updated_at = ?, version = version + 1"
                        " WHERE id = ? AND version = ?",
                        (json.dumps(doc), result_state(doc), now, cid, version),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return None if doc is None else (doc, version + 1)

    def prune(self, before: float) -> int:
        """Delete rows last written before ``before``; how many."""
        with self._lock:
            return self._db.execute("DELETE FROM results WHERE updated_at < ?", (before,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


class ResultSink(Protocol):
    """Where the agent answers (ResultsTopic; tests may record instead)."""

    def send(self, doc: Mapping[str, Any]) -> None: ...


class ResultsTopic:
    """The cluster's results topic: each command id is one ordered stream (``ordering_key``).

    ``send`` waits until Pub/Sub has the message and raises if it could not be published, so a
    caller can leave the command unacknowledged and answer again on its redelivery.
    """

    def __init__(self, topic: str, publisher: Any = None) -> None:
        if publisher is None:
            from google.cloud.pubsub_v1 import PublisherClient
            from google.cloud.pubsub_v1.types import PublisherOptions

            publisher = PublisherClient(publisher_options=PublisherOptions(enable_message_ordering=True))
        self.topic, self.publisher = topic, publisher

    def send(self, doc: Mapping[str, Any]) -> None:
        cid, state = str(doc["id"]), result_state(doc)
        data = json.dumps(doc, default=str).encode()
        try:
            self.publisher.publish(self.topic, data, ordering_key=cid, id=cid, state=state).result(
                timeout=PUBLISH_TIMEOUT_S
            )
        except Exception:
            # A failed publish pauses its ordering key; resumed, the redelivery's answer can go out.
            with contextlib.suppress(Exception):
                self.publisher.resume_publish(self.topic, cid)
            raise


@dataclass(frozen=True)
class Claim:
    """This delivery's right to run a command: the attempt, and the ledger row version it wrote."""

    token: str
    attempt: int
    version: int


class Agent:
    def __init__(
        self,
        commands: SlurmCommands,
        ledger: Ledger,
        results: ResultSink,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        claim_s: float = CLAIM_S,
    ) -> None:
        self.commands, self.ledger, self.results, self.clock = commands, ledger, results, clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.claim_s = claim_s
        self.handled = 0

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any] | None:
        try:
            cmd = json.loads(raw)
            if (
                not isinstance(cmd, dict)
                or not isinstance(cmd.get("id"), str)
                or COMMAND_ID.fullmatch(cmd["id"]) is None
            ):
                raise CommandRefusedError("command without a valid id")
        except (json.JSONDecodeError, UnicodeDecodeError, CommandRefusedError) as exc:
            log.emit("ERROR", "slurm agent: malformed command dropped", reason=str(exc))
            return None
        return cmd

    def handle(self, raw: bytes) -> dict[str, Any] | None:
        """One delivery of a command → the result document it recorded, or None when it ran nothing.

        None: malformed, already answered (the answer is published again), being run by another
        delivery, or an expired copy. Raises when a final answer could not be published (the
        caller nacks; the redelivery publishes it again from the ledger).
        """
        cmd = self._parse(raw)
        if cmd is None:
            return None
        now = self.clock()
        try:
            deadline = float(cmd.get("deadline", 0))
        except (TypeError, ValueError):
            deadline = 0.0
        if now > deadline:
            return self._refuse_expired(cmd, now, deadline)
        claim = self._claim(cmd, now)
        if claim is None:
            return None
        result = self._execute(cmd, claim)
        doc = self._finish(cmd, claim, result)
        if doc is None:
            return None
        self.results.send(doc)
        self.handled += 1
        log.emit(
            "INFO" if result["ok"] else "WARNING",
            "slurm agent: command done",
            id=cmd["id"],
            op=cmd.get("op"),
            state=result["state"],
            attempt=claim.attempt,
            error=result.get("error"),
        )
        return doc

    def _replay(self, cid: str, doc: Mapping[str, Any]) -> None:
        """A known final answer, published again: the earlier message may have been lost."""
        log.emit("INFO", "slurm agent: command already answered; answer published again", id=cid)
        self.results.send(doc)

    def _announce(self, doc: Mapping[str, Any]) -> None:
        """Publish a claim (``running``); best effort: the final answer is what actuate waits for."""
        try:
            self.results.send(doc)
        except Exception as exc:
            log.emit("WARNING", "slurm agent: claim not published", id=doc.get("id"), error=str(exc)[:300])

    def _refuse_expired(self, cmd: Mapping[str, Any], now: float, deadline: float) -> dict[str, Any] | None:
        """An expired command is refused if it was never seen, and otherwise left: it never runs."""
        doc = {
            "id": cmd["id"],
            "op": cmd.get("op"),
            "state": RESULT_FAILED,
            "ok": False,
            "refused": True,
            "transient": False,
            "result": None,
            "error": f"command expired {int(now - deadline)} s ago; not replayed",
            "owner": self.owner,
            "attempt": 0,
            "done_at": now,
        }
        if self.ledger.create(cmd["id"], doc, now) is None:  # seen before; a fresher copy carries any retry
            known = self.ledger.get(cmd["id"])
            if known is not None and result_state(known[0]) in FINAL_STATES:
                self._replay(cmd["id"], known[0])
            else:
                log.emit("INFO", "slurm agent: expired copy of a known command ignored", id=cmd["id"])
            return None
        self.results.send(doc)
        self.handled += 1
        log.emit("WARNING", "slurm agent: expired command refused", id=cmd["id"], op=cmd.get("op"))
        return doc

    def _claim_fields(self, cmd: Mapping[str, Any], now: float, token: str, attempt: int) -> dict[str, Any]:
        return {
            "id": cmd["id"],
            "op": cmd.get("op"),
            "state": RESULT_RUNNING,
            "owner": self.owner,
            "token": token,
            "attempt": attempt,
            "claimed_at": now,
            "claim_until": now + self.claim_s,
        }

    def _claim(self, cmd: Mapping[str, Any], now: float) -> Claim | None:
        """Make this delivery the one that runs the command, or say why not (None)."""
        token, cid = uuid.uuid4().hex, cmd["id"]
        for _ in range(3):  # a row pruned between insert and read is simply tried again
            fields = self._claim_fields(cmd, now, token, 1)
            if self.ledger.create(cid, fields, now) is not None:
                self._announce(fields)
                return Claim(token, 1, 1)
            row = self.ledger.get(cid)
            if row is None:
                continue
            doc, version = row
            state = result_state(doc)
            if state in FINAL_STATES:
                self._replay(cid, doc)
                return None
            if state == RESULT_RUNNING and _number(doc.get("claim_until")) > now:
                log.emit(
                    "INFO",
                    "slurm agent: command is being run by another delivery; left to it",
                    id=cid,
                    owner=doc.get("owner"),
                )
                return None
            # transient, or running past its claim (that agent is gone): take it over, once
            attempt = int(_number(doc.get("attempt")) or 1) + 1
            fields = {**self._claim_fields(cmd, now, token, attempt), "previous_error": doc.get("error")}
            taken = self.ledger.update(cid, fields, version, now)
            if taken is None:
                log.emit("INFO", "slurm agent: another delivery took the command over", id=cid)
                return None
            log.emit(
                "INFO",
                "slurm agent: command taken over for a new attempt",
                id=cid,
                was=state,
                attempt=attempt,
            )
            self._announce(taken[0])
            return Claim(token, attempt, taken[1])
        return None

    def _execute(self, cmd: Mapping[str, Any], claim: Claim) -> dict[str, Any]:
        result: dict[str, Any] = {
            "state": RESULT_DONE,
            "ok": True,
            "refused": False,
            "transient": False,
            "result": None,
            "error": None,
        }
        try:
            result["result"] = self.commands.execute(str(cmd.get("op")), cmd.get("args") or {})
        except CommandRefusedError as exc:
            result.update(state=RESULT_FAILED, ok=False, refused=True, error=str(exc))
        except Exception as exc:  # classified, recorded: never an endless redelivery
            transient = is_transient(exc)
            result.update(
                state=RESULT_TRANSIENT if transient else RESULT_FAILED,
                ok=False,
                transient=transient,
                error=f"{type(exc).__name__}: {exc}"[:500],
            )
        result.update(done_at=self.clock(), attempt=claim.attempt)
        return result

    def _finish(self, cmd: Mapping[str, Any], claim: Claim, result: dict[str, Any]) -> dict[str, Any] | None:
        """Record the result if the claim is still ours (its document); a lost claim never
        overwrites a newer attempt's answer (None)."""
        written = self.ledger.update(cmd["id"], result, claim.version, self.clock())
        if written is None:
            row = self.ledger.get(cmd["id"])
            log.emit(
                "ERROR",
                "slurm agent: claim lost while running; result not recorded",
                id=cmd["id"],
                owner=row[0].get("owner") if row else None,
                state=result_state(row[0]) if row else None,
            )
            return None
        return written[0]

    def prune(self) -> None:
        """Forget rows older than KEEP_S (the ledger stays bounded)."""
        gone = self.ledger.prune(self.clock() - KEEP_S)
        if gone:
            log.emit("INFO", "slurm agent: old ledger rows deleted", rows=gone)

    def serve(self, subscription: str, stop: threading.Event) -> None:
        from google.cloud.pubsub_v1 import SubscriberClient

        sub = SubscriberClient()

        def callback(message: Any) -> None:
            try:
                self.handle(message.data)
                message.ack()
            except Exception as exc:  # an answer not published (or a ledger error): let Pub/Sub redeliver
                log.emit("ERROR", "slurm agent: command failed, will be redelivered", error=str(exc)[:300])
                message.nack()

        future = sub.subscribe(subscription, callback)
        self.prune()
        while not stop.wait(PRUNE_EVERY_S):
            self.prune()
        future.cancel()
        sub.close()


def _number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pitstop-slurm-agent", description=__doc__.splitlines()[0])
    p.add_argument("--project", default=os.environ.get("GOOGLE_CLOUD_PROJECT"))
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
    checks = p.add_argument_group("checks on a fenced node (diagnose, validate)")
    checks.add_argument(
        "--nvidia-smi", default="nvidia-smi", help="command prefix of nvidia-smi on the nodes"
    )
    checks.add_argument("--dcgmi", default="dcgmi", help="command prefix of dcgmi on the nodes")
    checks.add_argument(
        "--all-gather-perf", default="all_gather_perf", help="command prefix of nccl-tests' all_gather_perf"
    )
    checks.add_argument("--srun-mpi", default=None, help="srun --mpi plugin for the NCCL test (e.g. pmix)")
    checks.add_argument(
        "--check-gres", default=None, help="GRES name of GPUs (e.g. gpu): checks ask --gres=NAME:<gpus>"
    )
    checks.add_argument("--check-dir", default=DEFAULT_CHECK_DIR, help="checks' state and tool outputs")
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
        all_gather_perf=_prefix("--all-gather-perf", args.all_gather_perf),
        srun_mpi=args.srun_mpi,
        gres=args.check_gres,
        directory=args.check_dir,
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
    agent = Agent(commands_for(args), Ledger(args.ledger), ResultsTopic(results_topic(args)))
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
    )
    agent.serve(f"projects/{args.project}/subscriptions/{args.subscription}", stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
