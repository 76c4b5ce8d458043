"""pitstop-slurm-agent: runs on the Slurm controller and executes Pitstop's commands.

It pulls commands from its cluster's Pub/Sub subscription (outbound connections only: a
private cluster needs no inbound path), executes a closed set of operations with
scontrol/scancel/squeue (argument lists, never a shell; every argument validated), and
writes each result to Firestore (``<prefix>_slurm_results/<command id>``) where actuate
waits for it. A command past its deadline is refused, not replayed; a command already
answered is acknowledged without running again. Why an agent and not slurmrestd: its REST
API has no requeue in any version up to v0.0.42 and no node update before v0.0.39.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pitstop.adapters import log

NODE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,62})")
JOB = re.compile(r"[0-9]{1,10}")
INCIDENT = re.compile(r"i[a-z2-7]{9}")
ACTIONS = frozenset(
    {"RESTART_JOB", "DRAIN_NODE", "RESET_GPU", "RESCHEDULE_JOB", "REBOOT_NODE", "REPLACE_NODE"}
)
SIGNALS = frozenset({"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGCONT"})
OPS = frozenset({"jobs_on_node", "drain", "resume", "requeue", "signal", "job_state", "node_state"})


class CommandRefusedError(ValueError):
    """The command is malformed, unknown, expired or carries an argument that fails validation."""


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


class SlurmCommands:
    """The closed set of operations, each a fixed argv with validated arguments."""

    def __init__(self, run: Callable[[list[str]], str] | None = None, release_requeued: bool = False) -> None:
        self._run = run or self._subprocess
        self.release_requeued = release_requeued

    @staticmethod
    def _subprocess(argv: list[str]) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
        return proc.stdout

    def execute(self, op: str, args: Mapping[str, Any]) -> Any:
        if op not in OPS:
            raise CommandRefusedError(f"unknown operation {op!r}")
        return getattr(self, op)(args)

    def jobs_on_node(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        node = _need(args, "node", NODE)
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
                    }
                )
        return jobs

    def drain(self, args: Mapping[str, Any]) -> dict[str, Any]:
        node = _need(args, "node", NODE)
        incident = _need(args, "incident", INCIDENT)
        action = args.get("action")
        if action not in ACTIONS:
            raise CommandRefusedError("argument action is missing or invalid")
        # The reason is built here from validated parts only: no log text ever reaches Slurm.
        reason = f"pitstop {incident} {action}"
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
        return {"node": node, "reason": reason}

    def resume(self, args: Mapping[str, Any]) -> dict[str, Any]:
        node = _need(args, "node", NODE)
        state = self.node_state({"node": node})
        if "DRAIN" in state["state"] or "DOWN" in state["state"]:
            self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return {"node": node}

    def requeue(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        self._run(["scontrol", "requeue", job])
        if self.release_requeued:  # a requeued job is otherwise held ~120 s (BeginTime)
            self._run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        return {"job": job}

    def signal(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        sig = args.get("signal")
        if sig not in SIGNALS:
            raise CommandRefusedError("argument signal is missing or not allowed")
        self._run(["scancel", f"--signal={sig.removeprefix('SIG')}", "--full", job])
        return {"job": job, "signal": sig}

    def job_state(self, args: Mapping[str, Any]) -> dict[str, Any]:
        job = _need(args, "job", JOB)
        try:
            kv = _kv(self._run(["scontrol", "show", "job", "-o", job]))
        except RuntimeError as exc:
            if "Invalid job id" in str(exc):
                return {"job": job, "state": "UNKNOWN"}
            raise
        return {
            "job": job,
            "state": kv.get("JobState", "UNKNOWN"),
            "nodelist": kv.get("NodeList", ""),
            "restarts": int(kv.get("Restarts", "0") or 0),
            "user": kv.get("UserId", "").split("(")[0],
        }

    def node_state(self, args: Mapping[str, Any]) -> dict[str, Any]:
        node = _need(args, "node", NODE)
        kv = _kv(self._run(["scontrol", "show", "node", "-o", node]))
        return {"node": node, "state": kv.get("State", "UNKNOWN"), "reason": kv.get("Reason", "")}


class Agent:
    def __init__(self, commands: SlurmCommands, results: Any, clock: Callable[[], float] = time.time) -> None:
        self.commands, self.results, self.clock = commands, results, clock  # results: a Firestore collection
        self.handled = 0

    def handle(self, raw: bytes) -> dict[str, Any] | None:
        """One command message → its result document (None if it was already answered)."""
        try:
            cmd = json.loads(raw)
            if (
                not isinstance(cmd, dict)
                or not isinstance(cmd.get("id"), str)
                or not re.fullmatch(r"[-a-z0-9_]{1,128}", cmd["id"])
            ):
                raise CommandRefusedError("command without a valid id")
        except (json.JSONDecodeError, CommandRefusedError) as exc:
            log.emit("ERROR", "slurm agent: malformed command dropped", reason=str(exc))
            return None
        ref = self.results.document(cmd["id"])
        if ref.get().exists:
            return None
        now = self.clock()
        result: dict[str, Any] = {"id": cmd["id"], "op": cmd.get("op"), "done_at": now}
        try:
            deadline = float(cmd.get("deadline", 0))
            if now > deadline:
                raise CommandRefusedError(f"command expired {int(now - deadline)} s ago; not replayed")
            result["result"] = self.commands.execute(str(cmd.get("op")), cmd.get("args") or {})
            result["ok"] = True
        except CommandRefusedError as exc:
            result.update(ok=False, refused=True, error=str(exc))
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            result.update(ok=False, refused=False, error=str(exc)[:500])
        ref.set(result)
        self.handled += 1
        log.emit(
            "INFO" if result["ok"] else "WARNING",
            "slurm agent: command done",
            id=cmd["id"],
            op=cmd.get("op"),
            ok=result["ok"],
            error=result.get("error"),
        )
        return result

    def serve(self, subscription: str, stop: threading.Event) -> None:
        from google.cloud.pubsub_v1 import SubscriberClient

        sub = SubscriberClient()

        def callback(message: Any) -> None:
            try:
                self.handle(message.data)
                message.ack()
            except Exception as exc:  # a Firestore hiccup: let Pub/Sub redeliver
                log.emit("ERROR", "slurm agent: command failed, will be redelivered", error=str(exc)[:300])
                message.nack()

        future = sub.subscribe(subscription, callback)
        stop.wait()
        future.cancel()
        sub.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pitstop-slurm-agent", description=__doc__.splitlines()[0])
    p.add_argument("--project", default=os.environ.get("GOOGLE_CLOUD_PROJECT"))
    p.add_argument("--subscription", required=True, help="the cluster's command subscription id")
    p.add_argument("--collection-prefix", default="pitstop")
    p.add_argument(
        "--release-requeued",
        action="store_true",
        help="let requeued jobs start at once instead of after Slurm's ~120 s BeginTime",
    )
    args = p.parse_args(argv)
    from google.cloud import firestore

    db = firestore.Client(project=args.project)
    agent = Agent(
        SlurmCommands(release_requeued=args.release_requeued),
        db.collection(f"{args.collection_prefix}_slurm_results"),
    )
    stop = threading.Event()
    import signal as sig

    sig.signal(sig.SIGTERM, lambda *a: stop.set())
    sig.signal(sig.SIGINT, lambda *a: stop.set())
    log.emit("INFO", "slurm agent started", subscription=args.subscription)
    agent.serve(f"projects/{args.project}/subscriptions/{args.subscription}", stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
