"""Checks on a fenced node (diagnose / validate): a reservation swapped for the drain, a holder
job, the tools as its steps, the drain put back (the package docstring says how and why)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from pitstop.adapters import log
from pitstop.agent.slurm.access import CheckTools, SlurmAccess
from pitstop.agent.slurm.gang_steps import GANG_KINDS, GANG_PARALLEL, gang_steps
from pitstop.agent.slurm.records import CheckKind, CheckState, RunOutcome
from pitstop.agent.slurm.text import (
    ACTIVE_JOB_STATES,
    CHECK_KEYS,
    CHECK_NAME,
    DCGM_TIMEOUT_S,
    FABRIC_KEYS,
    FABRIC_NAME,
    FABRIC_PATH,
    FABRIC_VALUE,
    FABRIC_VAR,
    INCIDENT,
    JOB,
    LEAVE_WAIT_S,
    NCCL_TIMEOUT_S,
    NODE,
    OUTPUT_MAX,
    RUNNER_RESPAWNS,
    SMI_TIMEOUT_S,
    START_WAIT_S,
    USER,
    VALIDATE_KINDS,
    Args,
    CheckNotReadyError,
    CommandRefusedError,
    SlurmOutputError,
    _need,
    parse_nodes,
)
from pitstop.core.domain import FabricSpec
from pitstop.core.slurm_wire import (
    DRAIN_REASON_PREFIX,
    CheckProgress,
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
        # read-only, beside the job the node runs (its GRES by default: srun(1) --gres) or in the
        # holder job; dmesg needs no GPU at all
        if st.get("borrowed"):
            one = [*base[:5], "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--"]
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


class CheckSetup(SlurmAccess):
    """A check's state, its reservation, holder job and runner: everything start_check sets up."""

    def _check_spec(self, args: Args, start: bool) -> CheckState:
        """A check's arguments, each validated; the name must be the one its incident and kind make."""
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
        node = self._member(args)
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
    def _load(d: Path) -> CheckState | None:
        try:
            st: CheckState = json.loads((d / "state.json").read_text())
        except FileNotFoundError:
            return None
        return st

    @staticmethod
    def _save(d: Path, st: CheckState) -> None:
        tmp = d / "state.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, d / "state.json")

    def _new_check(self, spec: CheckState) -> CheckState:
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
        borrowed = self._running_job(node) if spec["kind"] == "corroborate" else None
        busy = info.base != "IDLE" or info.flags - {"DRAIN", "CLOUD", "RESERVED", "MAINTENANCE"}
        if busy and borrowed is None:
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
            "job": borrowed,
            "borrowed": borrowed is not None,
            "tools": {
                "nvidia_smi": list(tools.nvidia_smi),
                "dmesg": list(tools.dmesg),
                "clock": list(tools.clock),
                "dcgmi": list(tools.dcgmi),
                "all_gather_perf": list(tools.all_gather_perf),
                "srun_mpi": tools.srun_mpi,
                "gres": tools.gres,
                "fabric_root": tools.fabric_root,
            },
            "minutes": check_minutes(spec["kind"], spec["dcgm_level"]),
            "started": None,
            "finished": False,
            "respawns": 0,
            "created_at": time.time(),
        }

    def _begin(self, d: Path, st: CheckState) -> None:
        """The start's steps, each skipped when an earlier attempt already took it."""
        node, name = st["node"], st["name"]
        if st.get("borrowed"):
            return self._begin_beside(d, st)
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

    def _running_job(self, node: str) -> str | None:
        """A job running on the node now (a corroboration runs its read-only tools beside it)."""
        out = self._run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%i"])
        jobs = [j for j in out.split() if JOB.fullmatch(j)]
        return jobs[0] if jobs else None

    def _begin_beside(self, d: Path, st: CheckState) -> None:
        """Steps in the job already on the node (``--overlap``): no reservation, the drain untouched."""
        self._reap()
        if not self._runner_alive(d):
            self._spawn_runner(d)
        st["started"] = {"started": st["name"], "peer": None, "note": st["note"], "job": st["job"]}
        self._save(d, st)
        log.emit("INFO", "slurm agent: check started beside a job", check=st["name"], job=st["job"])

    def _peers(self, st: CheckState) -> tuple[str, list[str]]:
        """A partition of the node with idle healthy unreserved peers, and those peers (fresh)."""
        nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
        reserved = self._reserved(self._reservations())
        for part in st["partitions"]:
            found = sorted(
                n
                for n, (info, parts) in nodes.items()
                if part in parts
                and n != st["node"]
                and n not in st.get("exclude_peers", ())
                and info.free_idle
                and n not in reserved
                and n.lower() != "all"
            )
            if found:
                return part, found
        return st["partitions"][0], []

    def _reserve(self, d: Path, st: CheckState) -> None:
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
        if st["kind"] in VALIDATE_KINDS and st.get("want_peer", True):
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

    def _submit(self, st: CheckState) -> str:
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


class CheckRuns(CheckSetup):
    """The check runs on a fenced node (diagnose / validate): start, result and the runner's work."""

    def start_check(self, args: Args) -> CheckStarted:
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
                return _started(st)
            if st is None or st.get("undone"):
                gone = self._not_responding(spec) if spec["kind"] == "corroborate" else None
                if gone is not None:
                    return self._answered(d, spec, gone)
                st = self._new_check(spec)
                self._save(d, st)
            try:
                self._begin(d, st)
            except Exception as exc:
                self._undo_start(d, st, exc)
                raise
            return _started(st)

    def _not_responding(self, spec: CheckState) -> str | None:
        """The node's state when slurmctld sees it not responding (its slurmd gone): no tool can run
        there, and that observation, slurmctld's own, is what a corroboration reports."""
        info = self.node_info(spec["node"])
        if info.marked or "NOT_RESPONDING" in info.flags:
            return f"{info.state} {info.reason}".strip()[:200]
        return None

    def _answered(self, d: Path, spec: CheckState, node_state: str) -> CheckStarted:
        """A check answered without running anything: finished at once, its output the node's state."""
        (d / "slurm_node.out").write_text(node_state)
        _write_json(d / "result.json", {"keys": ["slurm_node"], "exit_codes": {}, "error": None})
        note = "node not responding"
        started: CheckStarted = {"started": spec["name"], "peer": None, "note": note, "job": None}
        st: CheckState = {**spec, "peer": None, "note": note, "job": None, "user": _agent_user()}
        self._save(d, {**st, "started": started, "finished": True, "finished_at": time.time()})
        return started

    def _undo_start(self, d: Path, st: CheckState, exc: BaseException) -> None:
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

    def _finish(self, d: Path, st: CheckState, wait_s: float) -> bool:
        """Put the node back as it was: drained with its reason first, then the job cancelled, then
        (once the job has left) the reservation deleted. True when all of it is done. Idempotent."""
        if st.get("finished"):
            return True
        if st.get("borrowed"):  # nothing of the node's was changed: the job is not the check's
            st["finished"], st["finished_at"] = True, time.time()
            self._save(d, st)
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

    def check_result(self, args: Args) -> CheckProgress:
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
            return self._progress(d, st)

    def _progress(self, d: Path, st: CheckState) -> CheckProgress:
        """A started check's answer now (held under its lock): pending, or done with its outputs."""
        name = st["name"]
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
    def _pending(st: CheckState, phase: str) -> CheckProgress:
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
    def _answer(d: Path, st: CheckState) -> CheckProgress:
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
            steps = check_steps(st)
            gang = st["kind"] in GANG_KINDS  # every node of a job: all at once, each may fail alone
            with ThreadPoolExecutor(max_workers=GANG_PARALLEL if gang else 1) as pool:
                ran = list(pool.map(lambda step: _srun(step[1], step[2]), steps))
            if st.get("fabric") and any(key == "nccl" for key, _, _ in steps):
                (d / "nccl_setup.out").write_text(json.dumps(st["fabric"]))  # what the test ran with
                keys.append("nccl_setup")
            for (key, _, _), (rc, out, err) in zip(steps, ran, strict=True):
                (d / f"{key}.out").write_text(out)
                (d / f"{key}.err").write_text(err[-4000:])
                codes[key], keys = rc, [*keys, key]
                if rc != 0 and not out.strip() and not gang:
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


def _write_json(path: Path, doc: RunOutcome) -> None:
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
