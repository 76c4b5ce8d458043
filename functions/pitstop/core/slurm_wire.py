"""The Slurm wire protocol: what actuate publishes to a cluster's agent and what the agent answers.

Shared by both sides (adapters/slurm.py and agent/slurm/), which import it from here only. A
command is ``{id, op, args, issued_at, deadline}`` on ``pitstop-slurm-<cluster>``; every state of
its result is the whole record on ``pitstop-slurm-<cluster>-results`` (ordering key: the id).
One record per command id, moved through these states: the agent claims it in its own ledger
before it runs anything, publishes every state, and actuate merges them forward only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NotRequired, TypedDict

from pitstop.core.domain import JsonObject


class Command(TypedDict):
    id: str
    op: str
    args: JsonObject  # the op's own arguments, free-form on the wire: the agent checks each one
    issued_at: float
    deadline: float


class Result(TypedDict, total=False):
    """A command's record as the agent publishes it (and actuate stores it)."""

    id: str
    op: str | None
    state: str
    ok: bool
    refused: bool
    transient: bool
    result: Answer | None  # the op's answer (None: refused or failed)
    error: str | None
    owner: str
    token: str
    attempt: int
    claimed_at: float
    claim_until: float
    done_at: float
    previous_error: str | None
    source: NotRequired[str]


COMMAND_DEADLINE_S = 300.0

# -- what each op answers (``Result.result``): the agent builds these, adapters/slurm.py reads them --


class JobRunFields(TypedDict):
    """A job's run (``scontrol show job``: ``Restarts``, ``StartTime``; None when unknown)."""

    restarts: int | None
    start_time: str | None


class JobOnNode(JobRunFields):
    """``jobs_on_node``: one job on the node, with its run."""

    id: str
    state: str  # Slurm's word (squeue %T)
    user: str
    nodes: int
    nodelist: str
    name: str


class DrainAnswer(TypedDict):
    """``drain``: the node before, and the reason Pitstop set (None: someone else's drain, left)."""

    node: str
    previous_state: str
    previous_reason: str
    already_drained_by_other: bool
    reason: str | None


class ResumeAnswer(TypedDict):
    """``resume``: whether Pitstop's drain was lifted; ``left_drained``: the fence that stays, and why."""

    node: str
    state: str
    reason: str
    resumed: bool
    left_drained: NotRequired[str]


class RequeueAnswer(TypedDict):
    """``requeue``: the job Slurm requeued (a heterogeneous job's leader); ``released``: its hold
    lifted; ``placed``: the nodes it was pinned to (``onto``), or ``unpinned``: Pitstop's earlier pin
    cleared."""

    job: str
    requeued: str
    already_pending: NotRequired[bool]
    released: NotRequired[bool]
    placed: NotRequired[list[str]]
    unpinned: NotRequired[bool]


class SignalAnswer(TypedDict):
    job: str
    signal: str
    signalled: str


class JobStateAnswer(JobRunFields):
    """``job_state``: ``UNKNOWN`` (and no node list) for a job Slurm does not know."""

    job: str
    state: str
    nodelist: NotRequired[str]
    user: NotRequired[str]
    comment: NotRequired[str]  # the job's --comment: its owner's opt-in to hang remediation


class NodeStateAnswer(TypedDict):
    node: str
    state: str
    reason: str


class CapacityAnswer(TypedDict):
    """``capacity``: whether the gang could start again now without the fenced node, and why."""

    job: str
    state: str
    enough: bool
    need: int | None
    free: int | None
    why: str
    partition: NotRequired[str]
    idle: NotRequired[list[str]]
    own: NotRequired[list[str]]
    nodes: NotRequired[list[str]]  # the gang: its own nodes and the fenced one
    paths: NotRequired[dict[str, list[str]]]  # node -> its switch path in Slurm's topology, leaf first
    slurm_version: NotRequired[str]
    native: NotRequired[str | None]  # the restart Slurm itself gives the job (slurm-expedite)
    elastic: NotRequired[bool]


class CheckStarted(TypedDict):
    """``start_check`` / ``start_gang_check``: the check running (``nodes``: a gang check's)."""

    started: str
    peer: str | None
    note: str
    job: str | None
    nodes: NotRequired[list[str]]


class NodeRestored(TypedDict):
    """The node as a check left it: drained again with its reason."""

    state: str
    reason: str


class CheckProgress(TypedDict):
    """``check_result`` / ``gang_check_result``: pending (``phase``), or done with each tool's output."""

    done: bool
    name: str
    node: str
    peer: str | None
    note: str
    job: str | None
    outputs: dict[str, str]
    error: str | None
    phase: NotRequired[str]
    exit_codes: NotRequired[dict[str, int]]
    stderr: NotRequired[dict[str, str]]
    restored: NotRequired[NodeRestored | None]
    nodes: NotRequired[list[str]]


Answer = (
    list[JobOnNode]
    | DrainAnswer
    | ResumeAnswer
    | RequeueAnswer
    | SignalAnswer
    | JobStateAnswer
    | NodeStateAnswer
    | CapacityAnswer
    | CheckStarted
    | CheckProgress
)

# -- the results of Slurm commands (``<prefix>_slurm_results/<command id>``) -------------------------
# Shared with pitstop.agent.slurm, which imports these names. One record per command id, moved
# through these states: the agent claims it in its own ledger before it runs anything, publishes
# every state to its cluster's results topic, and actuate merges them into Firestore (ResultsMerger).
RESULT_RUNNING = "running"  # claimed: an agent is executing it until ``claim_until`` (epoch s)
RESULT_DONE = "done"  # executed; ``result`` holds the answer; replayed to every later call
RESULT_TRANSIENT = "transient"  # the last attempt hit a passing Slurm hiccup; a retry runs again
RESULT_FAILED = "failed"  # final: refused (``refused``) or a Slurm error a retry would repeat
FINAL_STATES = frozenset({RESULT_DONE, RESULT_FAILED})
# How far along a command's record is within one attempt; a later attempt is further still.
STATE_ORDER = {RESULT_RUNNING: 0, RESULT_TRANSIENT: 1, RESULT_DONE: 2, RESULT_FAILED: 2}
COMMAND_ID = re.compile(r"[-a-z0-9_]{1,128}")

# Every drain Pitstop sets carries this reason, so it can tell its own fences from other people's.
DRAIN_REASON_PREFIX = "pitstop "
# A corroboration's outputs: the GPUs its tools' step asked Slurm for explicitly ("gpu:8"). Without
# it the step may see only part of the node's GPUs (ConstrainDevices), so a low count is no evidence.
GPU_GRANT = "gpu_grant"
INCIDENT = re.compile(r"i[a-z2-7]{9}")


def drain_reason(incident: str, action: str) -> str:
    """The Slurm reason of Pitstop's drain for one incident (validated parts only)."""
    return f"{DRAIN_REASON_PREFIX}{incident} {action}"


def result_state(doc: Mapping[str, object]) -> str:
    """A result document's state; documents from agents before the claim protocol have only ``ok``."""
    state = doc.get("state")
    if isinstance(state, str) and state:
        return state
    return RESULT_DONE if doc.get("ok") else RESULT_FAILED


def _attempt(doc: Mapping[str, object]) -> int:
    v = doc.get("attempt")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def supersedes(new: Mapping[str, object], old: Mapping[str, object] | None) -> bool:
    """Whether a result moves a command's record forward, so messages arriving late or twice
    never undo what is known: nothing replaces a final state (done, failed); a final state
    replaces any other; otherwise a later attempt wins, and within one attempt running <
    transient (a late ``running`` never hides the transient answer of its own attempt)."""
    if old is None:
        return True
    if result_state(old) in FINAL_STATES:
        return False
    if result_state(new) in FINAL_STATES:
        return True
    rank_new = (_attempt(new), STATE_ORDER.get(result_state(new), -1))
    return rank_new > (_attempt(old), STATE_ORDER.get(result_state(old), -1))


# A Slurm host list as ``scontrol show job`` prints NodeList: ``a3-node-[001-003,007],login1``.
_HOST_TERM = re.compile(r"([A-Za-z0-9._-]*)(?:\[([0-9,-]{1,200})\])?([A-Za-z0-9._-]*)", re.ASCII)
MAX_HOSTS = 4096


def expand_hostlist(text: object) -> tuple[str, ...]:
    """The host names of a Slurm host list, in order; () for anything that is not one (bounded)."""
    if not isinstance(text, str) or not text or text == "(null)":
        return ()
    terms = re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text[:4096])
    out: list[str] = []
    for term in terms:
        m = _HOST_TERM.fullmatch(term)
        if m is None:
            return ()
        head, ranges, tail = m.groups()
        if ranges is None:
            out.append(head + tail)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo):
                return ()
            width = len(lo)
            out += [f"{head}{i:0{width}d}{tail}" for i in range(int(lo), int(hi or lo) + 1)]
            if len(out) > MAX_HOSTS:
                return ()
    return tuple(out)
