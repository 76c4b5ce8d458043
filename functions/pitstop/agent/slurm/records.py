"""The agent's own records of a check: its validated arguments, its ``state.json`` and the runner's
``result.json``. Only the agent writes them (in a 0o700 directory per check, under the check's
lock), so what it reads back is what it wrote: no further check on load.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pitstop.core.domain import FabricSpec
from pitstop.core.slurm_wire import CheckStarted, NodeRestored

CheckKind = Literal["diagnose", "validate", "revalidate", "corroborate", "sweep", "links"]


class ToolsDoc(TypedDict):
    """The tools a check runs (access.CheckTools, frozen into its state when it starts)."""

    nvidia_smi: list[str]
    all_gather_perf: list[str]
    srun_mpi: str | None
    dmesg: NotRequired[list[str]]  # ``dmesg`` when absent
    clock: NotRequired[list[str]]  # a corroboration's clock read (``date`` and ``/proc/uptime``)
    dcgmi: NotRequired[list[str]]  # a check on a fenced node only
    gres: NotRequired[str | None]
    fabric_root: NotRequired[str]


class CheckState(TypedDict, total=False):
    """A check as ``state.json`` keeps it: its arguments (checks.check_spec, gang._gang_spec),
    then what its start set up, then how it finished. ``undone``: a start taken back (only
    ``name``, ``node`` and ``undone`` are left)."""

    name: str
    node: str
    incident: str
    kind: CheckKind
    # the arguments of a start
    dcgm_level: int
    gpus: int
    message_bytes: int
    want_peer: bool
    fabric: FabricSpec | None
    exclude_peers: list[str]
    job: str | None  # a gang check's from its arguments, else the holder (or borrowed) job
    timeout_s: int
    pairs: list[list[str]]
    # what its start set up
    reason: str  # the drain put back afterwards, exactly
    partitions: list[str]
    partition: str
    nodes: list[str]  # a gang check's
    peer: str | None
    note: str
    user: str
    borrowed: bool
    tools: ToolsDoc
    minutes: int
    started: CheckStarted | None
    respawns: int
    created_at: float
    # how it finished
    finished: bool
    finished_at: float
    restored: NodeRestored
    undone: str


class RunOutcome(TypedDict):
    """``result.json``: the output keys the runner wrote (``<key>.out``), exit codes, what failed."""

    keys: list[str]
    exit_codes: dict[str, int]
    error: str | None
