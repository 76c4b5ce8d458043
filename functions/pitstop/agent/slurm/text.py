"""Slurm's words, read strictly: node states and reasons, job runs, reservations, transient errors;
and the limits and patterns every argument is checked against."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from pitstop.core.slurm_wire import JobRunFields

# A command's arguments as they came off the wire (Command.args): each op checks the ones it reads.
Args = Mapping[str, object]

NODE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,62})")
# A job, an array task (123_4) or a heterogeneous job component (123+0); nothing else.
JOB = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,10})?")
INCIDENT = re.compile(r"i[a-z2-7]{9}")
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
        "start_gang_check",
        "gang_check_result",
    }
)
# A check's name, as pitstop.core.checks.check_name builds it: its reservation and job name too.
CHECK_NAME = re.compile(
    r"pitstop-(i[a-z2-7]{9})-([0-9]{1,6})-(diagnose|validate|revalidate|corroborate|sweep|links)"
)
CHECK_KEYS = frozenset(
    {
        "node",
        "name",
        "kind",
        "incident",
        "dcgm_level",
        "gpus",
        "message_bytes",
        "peer",
        "fabric",
        "exclude_peers",
    }
)
VALIDATE_KINDS = frozenset({"validate", "revalidate"})  # revalidate: the NCCL test alone, another peer
# The fabric's NCCL setup a validation carries (schemas/validation.yaml ``fabric``), checked again
# here: it becomes an environment and a path on the nodes, never a shell string.
FABRIC_KEYS = frozenset({"name", "ranks_per_node", "profile", "profile_env", "library_path", "env"})
FABRIC_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,200}")
FABRIC_VAR = re.compile(r"NCCL_[A-Z0-9_]{1,60}")  # never LD_PRELOAD, PATH, ...
FABRIC_VALUE = re.compile(r"[A-Za-z0-9._/,:=-]{0,300}")
FABRIC_NAME = re.compile(r"[A-Za-z0-9 ._()/-]{2,40}")
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
OUTPUT_MAX = 256 * 1024  # characters kept of one tool's stdout (a result must fit in actuate's record of it)
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


CHECK_JOB = re.compile(r"pitstop-i[a-z2-7]{9}-[0-9]{1,6}-[a-z_]{1,32}")  # core/checks.check_name


def own_check(name: str, kv: Mapping[str, str]) -> bool:
    """A check job of Pitstop's own: named as core/checks names them and running in the reservation
    of that name, which only Pitstop creates (checks.holder_argv). A requeue of it is refused
    ("Requested operation is presently disabled": it is --no-requeue), and it is not the node's."""
    return CHECK_JOB.fullmatch(name) is not None and kv.get("Reservation") == name


def _need(args: Args, key: str, pattern: re.Pattern[str]) -> str:
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


def _run_fields(kv: Mapping[str, str]) -> JobRunFields:
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
