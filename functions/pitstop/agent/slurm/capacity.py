"""Capacity, read-only: could a job's gang start again now without the fenced node?

A part of its own (commands.py composes the agent's parts by responsibility): it reads nodes,
partitions and reservations and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pitstop.agent.slurm.access import SlurmAccess
from pitstop.agent.slurm.placement import Placement
from pitstop.agent.slurm.text import _HOLDING_STATES, JOB, Args, NodeInfo, SlurmOutputError, _need
from pitstop.core.slurm_wire import CapacityAnswer

# A job says it is elastic (it runs on fewer nodes when it must) with this word in its comment
# (``sbatch --comment``): Pitstop may then weigh shrinking it (core/tradeoff.py).
ELASTIC_WORD = "pitstop:elastic"


def _best_partition(
    partitions: list[str],
    nodes: Mapping[str, tuple[NodeInfo, tuple[str, ...]]],
    fenced: str,
    own: set[str],
    reserved: set[str],
    excluded: set[str],
    allowed: set[str] | None,
) -> tuple[int, str, list[str], list[str]]:
    """The partition with the most nodes the gang could start on: (count, partition, idle, own)."""
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
    return best


def _placed(
    out: CapacityAnswer,
    placement: Placement,
    kv: dict[str, str],
    fenced: str,
    own: set[str],
    idle: list[str],
) -> None:
    """Where each node listed sits in Slurm's topology, Slurm's version and own restart, elasticity."""
    paths = placement.paths()
    listed = {fenced, *own, *idle[:64]}
    out["paths"] = {n: p for n, p in paths.items() if n in listed}
    out["slurm_version"] = placement.version()
    out["native"] = placement.native(kv)
    out["elastic"] = ELASTIC_WORD in kv.get("Comment", "")
    out["nodes"] = sorted(own | {fenced})[:64]


def capacity(slurm: SlurmAccess, args: Args, placement: Placement | None = None) -> CapacityAnswer:
    """Whether the job's gang could start again now without ``node``: ``enough``, ``need``
    (its node count), ``free`` (what was counted) and ``why`` (one line saying so).

    Counted, in each of the job's partitions (the best one answers): nodes that are idle,
    responding, neither drained, down, failed nor in maintenance, and in no active
    reservation (a job in a reservation counts only that reservation's nodes) nor in the
    job's ExcNodeList, plus the job's own nodes that are healthy (they free up when it is
    requeued), never the fenced node. A job Slurm does not know, one already pending, or one
    pinned to the fenced node (ReqNodeList) cannot move now: ``enough`` is False and ``why``
    says so; a pin Pitstop itself set at an earlier requeue is not its owner's and does not hold
    it (``placement``). One that ended on the fault has freed its nodes, which count as idle.

    With ``placement``, the answer also says where each node sits in Slurm's topology (``paths``:
    the fenced node, the job's own and the idle ones listed), Slurm's version, the restart Slurm
    itself gives the job (``native``) and whether the job says it is elastic.
    """
    job = _need(args, "job", JOB)
    fenced = slurm.member(args)
    kv = slurm.show_job(job)
    if kv is None:
        why = f"job {job} is not known to Slurm: nothing to requeue"
        return {"job": job, "state": "UNKNOWN", "enough": False, "need": None, "free": None, "why": why}
    state = kv.get("JobState", "UNKNOWN")
    count = re.match(r"[0-9]+", kv.get("NumNodes", ""))
    partitions = [p for p in kv.get("Partition", "").split(",") if p]
    if count is None or not partitions:
        raise SlurmOutputError(f"no NumNodes or Partition for job {job}")
    need = int(count.group(0))
    nodes = slurm.nodes()
    reservations = slurm.reservations()
    resv = kv.get("Reservation") or None
    reserved = slurm.reserved(reservations, but=resv)
    allowed = slurm.hostnames([reservations[resv].nodes]) if resv in reservations else None
    if resv is not None and allowed is None:
        allowed = set()  # its reservation is gone: it can start nowhere
    own = slurm.hostnames([kv.get("NodeList", "")]) if state in _HOLDING_STATES else set()
    excluded = slurm.hostnames([kv.get("ExcNodeList", "")])
    required = slurm.hostnames([kv.get("ReqNodeList", "")])
    if placement is not None and placement.ours(job, required):
        required = set()  # Pitstop's own pin from an earlier move: the next requeue replaces it
    free, part, idle, mine = _best_partition(partitions, nodes, fenced, own, reserved, excluded, allowed)
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
    out: CapacityAnswer = {
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
    if placement is not None:
        _placed(out, placement, kv, fenced, own, idle)
    return out
