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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
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
OPS = frozenset({"jobs_on_node", "drain", "resume", "requeue", "signal", "job_state", "node_state"})

RUN_TIMEOUT_S = 60.0  # one scontrol/squeue/scancel call
# The longest mutating command runs three subprocesses (drain: show, update; requeue: requeue,
# update); the claim outlasts them with room to spare, so a live agent is never overtaken.
# (jobs_on_node runs one `scontrol show job` per job on the node and may take longer with many jobs,
# but it only reads: a second delivery running it alongside changes nothing.)
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


class SlurmCommands:
    """The closed set of operations, each a fixed argv with validated arguments."""

    def __init__(self, run: Callable[[list[str]], str] | None = None, release_requeued: bool = False) -> None:
        self._run = run or self._subprocess
        self.release_requeued = release_requeued
        self._nodes: frozenset[str] = frozenset()
        self._nodes_at = -1e18
        self._nodes_lock = threading.Lock()

    def _member(self, args: Mapping[str, Any]) -> str:
        """A node argument this agent may act on: a valid name Slurm lists as one of its nodes.

        A command naming any other host (a VM of another cluster, a name a log line made up) is
        refused before any scontrol runs. The list is re-read when a name is missing from it
        (a node just added), at most every MEMBERS_REFRESH_S.
        """
        node = _need(args, "node", NODE)
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
        if self.release_requeued:  # a requeued job is otherwise held ~120 s (BeginTime)
            self._run(["scontrol", "update", f"JobId={target}", "StartTime=now"])
        return {"job": job, "requeued": target}

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
    return p.parse_args(argv)


def commands_for(args: argparse.Namespace) -> SlurmCommands:
    """The job should run again within a minute: Slurm's requeue hold is lifted unless asked not to."""
    return SlurmCommands(release_requeued=not args.keep_requeue_hold)


def results_topic(args: argparse.Namespace) -> str:
    """The full topic path; an id is taken to be in ``--project``."""
    topic = str(args.results_topic)
    return topic if topic.startswith("projects/") else f"projects/{args.project}/topics/{topic}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
