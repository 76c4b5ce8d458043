"""Chaos on the local stack: rehearse the failures Pitstop must survive (`pitstop local chaos KIND`).

Kinds and what they break:

- ``compute-error CODE``: the next N mutating Compute calls (optionally only on ``node``, or of one
  ``method``) answer CODE with Compute's real error body (the fake Compute's ``/_admin/faults``).
- ``actuate-crash-after-effect``: the next N mutating Compute calls actuate makes (optionally only
  on ``node`` / of ``method``) are performed, and then the actuate instance dies before it answers
  (a flag file read by ``chaos_main``, the wrapper actuate runs from locally). The stack's
  supervisor starts a new instance, as Cloud Run would.
- ``publish-timeout``: the next N notifications actuate publishes (optionally only about ``node``)
  are not sent and the publish times out (again through ``chaos_main``).
- ``agent-down`` / ``agent-up``: stop and start the Slurm agent process.
- ``webhook-down`` / ``webhook-up``: the webhook sink answers 503 / OK.
- ``firestore-restart``: Firestore unreachable for a while (every connection through the stack's
  relay cut, new ones refused), then back with every write it acknowledged
  (``Stack.restart_firestore``).
- ``hang [--node N]``: every training run on the stack stops beating (local/trainer.py): a job
  stuck in a collective; with ``--node``, that node's GPU is the culprit (the GPU stand-ins show a
  GPU that fails its quick diagnostic and that NVML cannot open); ``hang link --node N``: an
  NVLink of the node down instead (its node check is clean, its NCCL busbw a fifth of its peers');
  without ``--node``, a software hang (no node to find). A requeued run beats again. On a GKE
  stack only the node's GPU is set (a JobSet's pods run no trainer: the test writes its heartbeat).
- ``straggler --node N``: N's GPU is held below its clocks (thermal) most of the time: the Monitoring
  stand-in's throttle policy opens after its window; nvidia-smi -q shows the slowdown.
- ``degrading --node N``: N's GPU's correctable ECC errors rise past the ECC trend policy's line.
- ``heal --node N``: N's GPU healthy again (a straggler's or degrading node's alert closes).
- ``clear``: disarm every armed fault and flag (and end a hang).

Flags live in ``<workdir>/chaos/<kind>.json`` (``{"left": N, "node": ..., "method": ...}``); a
process that acts on one takes it under an exclusive file lock, so N means N across threads and
processes. Nothing here is imported by shipped code.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, TypedDict

from pitstop.local.compute_shapes import ArmedFault, GpuStateSet


class _Spec(Protocol):
    @property
    def node_names(self) -> list[str]: ...
    @property
    def scheduler(self) -> str: ...


class Stack(Protocol):
    """What a chaos request needs of the running stack (pitstop.local.stack.Stack is one)."""

    @property
    def spec(self) -> _Spec: ...
    @property
    def endpoints(self) -> dict[str, str]: ...
    @property
    def chaos_dir(self) -> Path: ...

    def set_agent(self, up: bool) -> Any: ...
    def restart_firestore(self, down_s: float = 2.0) -> None: ...
    def set_gpu_state(self, node: str, state: object) -> GpuStateSet: ...


FLAG_KINDS = ("actuate-crash-after-effect", "publish-timeout")
# Faults that print no Xid (issue 24): the GPU state preset (pitstop.local.gpu_tools.state) each puts
# on its node, None for healthy again.
TELEMETRY_KINDS = ("hang", "straggler", "degrading", "heal")
GPU_PRESET: dict[str, str | None] = {
    "hang": "hung",
    "straggler": "straggler",
    "degrading": "degrading",
    "heal": None,
}
HANG_FILE = "hang.json"  # the runs a hang stopped (local/trainer.py reads it)
KINDS = (
    "compute-error",
    *FLAG_KINDS,
    "agent-down",
    "agent-up",
    "webhook-down",
    "webhook-up",
    "firestore-restart",
    *TELEMETRY_KINDS,
    "clear",
)
# The fake Compute's (and ComputeAdapter's) names of the calls that change something.
MUTATING_METHODS = ("reset", "set_labels", "report_host_as_faulty", "perform_maintenance", "recreate")
CHAOS_DIR_ENV = "PITSTOP_CHAOS_DIR"


class ChaosError(ValueError):
    """A chaos request that cannot be carried out (unknown kind, bad argument, stack part missing)."""


# -- flag files (shared by the stack, which arms them, and chaos_main, which takes them) ----------


class Flag(TypedDict):
    """An armed flag file: uses ``left``, for calls on ``node`` and of ``method`` (None: any)."""

    left: int
    node: str | None
    method: str | None


class Done(TypedDict, total=False):
    """What a chaos request did (``kind`` always; the rest as the kind has it)."""

    kind: str
    armed: Flag | list[ArmedFault]  # a flag kind's flag; compute-error: the fake Compute's faults
    agent: object  # the stack's answer to agent-down|up
    gpu: GpuStateSet
    runs: dict[str, int]  # hang: the runs told to stop beating (job -> run)


def arm_flag(chaos_dir: Path, kind: str, times: int, node: str | None, method: str | None) -> Flag:
    if kind not in FLAG_KINDS:
        raise ChaosError(f"{kind} is not a flag kind")
    chaos_dir.mkdir(parents=True, exist_ok=True)
    doc: Flag = {"left": times, "node": node, "method": method}
    with _locked(chaos_dir / f"{kind}.json") as f:
        f.seek(0)
        f.truncate()
        f.write(json.dumps(doc))
    return doc


def armed_flags(chaos_dir: Path) -> dict[str, Flag]:
    out: dict[str, Flag] = {}
    for kind in FLAG_KINDS:
        path = chaos_dir / f"{kind}.json"
        with contextlib.suppress(OSError, ValueError):
            out[kind] = json.loads(path.read_text())
    return out


def clear_flags(chaos_dir: Path) -> None:
    for kind in FLAG_KINDS:
        (chaos_dir / f"{kind}.json").unlink(missing_ok=True)
    (chaos_dir / HANG_FILE).unlink(missing_ok=True)


def take_flag(chaos_dir: Path, kind: str, node: str | None, method: str | None = None) -> bool:
    """Use up one arming of ``kind`` if it applies to this call (``node``, ``method``); False if none."""
    path = chaos_dir / f"{kind}.json"
    if not path.exists():
        return False
    with _locked(path) as f:
        if os.fstat(f.fileno()).st_nlink == 0:  # used up and removed while this one waited
            return False
        f.seek(0)
        try:
            doc = json.loads(f.read() or "{}")
        except ValueError:
            return False
        if int(doc.get("left") or 0) <= 0 or not _applies(doc, node, method):
            return False
        doc["left"] = int(doc["left"]) - 1
        if doc["left"] <= 0:
            path.unlink(missing_ok=True)
        else:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(doc))
    return True


def flag_applies(chaos_dir: Path, kind: str, node: str | None, method: str | None = None) -> bool:
    """Whether an arming of ``kind`` is waiting for a call like this one (without using it up)."""
    doc = armed_flags(chaos_dir).get(kind)
    return doc is not None and int(doc.get("left") or 0) > 0 and _applies(doc, node, method)


def _applies(doc: Mapping[str, object], node: str | None, method: str | None) -> bool:
    return doc.get("node") in (None, node) and doc.get("method") in (None, method)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[IO[str]]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- applying a kind to a running stack (the stack's controller calls this) ----------------------


def apply(
    stack: Stack,
    kind: str,
    arg: str | None = None,
    times: int = 1,
    node: str | None = None,
    method: str | None = None,
) -> Done:
    """Carry out one chaos request on ``stack``; what was done, as JSON."""
    if kind not in KINDS:
        raise ChaosError(f"unknown chaos kind {kind!r}; one of: {', '.join(KINDS)}")
    if times < 1:
        raise ChaosError("--times must be at least 1")
    if method is not None and method not in MUTATING_METHODS:
        raise ChaosError(f"--method must be one of {', '.join(MUTATING_METHODS)}")
    if node is not None and node not in stack.spec.node_names:
        raise ChaosError(f"no node {node!r} in this stack")
    if kind == "compute-error":
        return {"kind": kind, "armed": _compute_error(stack, arg, times, node, method)}
    if kind in FLAG_KINDS:
        return {"kind": kind, "armed": arm_flag(stack.chaos_dir, kind, times, node, method)}
    if kind in ("agent-down", "agent-up"):
        return {"kind": kind, "agent": stack.set_agent(kind == "agent-up")}
    if kind in ("webhook-down", "webhook-up"):
        hook = stack.endpoints["webhook"].rsplit("/", 1)[0]
        _post(hook + ("/_up" if kind == "webhook-up" else "/_down"), {})
        return {"kind": kind}
    if kind == "firestore-restart":
        stack.restart_firestore(down_s=float(arg) if arg else 2.0)
        return {"kind": kind}
    if kind in TELEMETRY_KINDS:
        return _telemetry(stack, kind, node, arg)
    clear_flags(stack.chaos_dir)
    _post(stack.endpoints["compute"] + "/_admin/faults", {"clear": True})
    return {"kind": kind}


def _telemetry(stack: Stack, kind: str, node: str | None, arg: str | None = None) -> Done:
    """A fault that prints no Xid: a hung job (its runs stop beating), a throttled or degrading GPU."""
    if node is None and kind != "hang":
        raise ChaosError(f"{kind} needs --node")
    if arg not in (None, "link") or (arg == "link" and kind != "hang"):
        raise ChaosError("only hang takes an argument: link (the node's link, not its GPU)")
    out: Done = {"kind": kind}
    if node is not None:
        out["gpu"] = stack.set_gpu_state(node, "hung_link" if arg == "link" else GPU_PRESET[kind])
    if kind == "hang" and stack.spec.scheduler == "gke" and node is not None:
        return out  # a JobSet's heartbeat is its own (no training stand-in runs in the fake pods)
    if kind == "hang":
        runs = {}
        for f in sorted(stack.chaos_dir.glob("run-*.json")):
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(f.read_text())
                runs[str(doc["job"])] = int(doc["run"])
        if not runs:
            raise ChaosError("no training run to hang: start one (Stack.submit_training)")
        (stack.chaos_dir / HANG_FILE).write_text(json.dumps({"runs": runs}))
        out["runs"] = runs
    return out


def _compute_error(
    stack: Stack, arg: str | None, times: int, node: str | None, method: str | None
) -> list[ArmedFault]:
    """Arm the fake Compute's fault; the faults it has armed now."""
    code, _, reason = (arg or "").partition(":")
    if not code.isdigit() or not 400 <= int(code) <= 599:
        raise ChaosError("compute-error needs an HTTP error status, e.g. 503 or 403:rateLimitExceeded")
    body: dict[str, object] = {"code": int(code), "times": times, "node": node, "method": method}
    if reason:
        body["reason"] = reason
    try:
        armed: list[ArmedFault] = _post(stack.endpoints["compute"] + "/_admin/faults", body)["armed"]
    except urllib.error.HTTPError as exc:
        raise ChaosError(f"fake Compute refused the fault: {exc.read().decode(errors='replace')}") from None
    return armed


def _post(url: str, body: Mapping[str, object]) -> Any:
    req = urllib.request.Request(  # noqa: S310 - loopback URLs from the stack's own state
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
        raw = resp.read()
    return json.loads(raw) if raw else {}
