"""Stand-in nccl-tests ``all_gather_perf``: the result table for this node and one peer.

busbw rises with message size and reaches the node's ``busbw`` at the largest size (-e), so a
"degraded" node (busbw 120 on a3-megagpu-8g) prints a table whose large rows fail validation; a
"corrupt" node's ring (``wrong`` > 0, either end) prints that many #wrong elements in every row.

Launched by ``srun`` across several nodes (as nccl-tests built with MPI runs), it behaves like
the real thing: only rank 0 prints, its header says ``nGpus`` (-g, the GPUs each process drives)
and lists every GPU's rank per process per node of the step (SLURM_STEP_NODELIST, the tasks per
node from SLURM_STEP_TASKS_PER_NODE), and the ring runs at the speed of its slowest node, so one
degraded node shows in the table whichever node rank 0 landed on.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from pitstop.local.gpu_tools.state import NodeState, StateError, expand_hostlist, load, node_name

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_HALF = 64 << 20  # the size at which the curve reaches half its peak
_COLS = "   time   algbw   busbw #wrong  "
_UNITS_ROW = "   (us)  (GB/s)  (GB/s)         "
_HEADER = (
    "#       size         count      type   redop    root  " + _COLS + _COLS,
    "#        (B)    (elements)                            " + _UNITS_ROW + _UNITS_ROW,
)


def size_arg(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(m[1]) * _UNITS[m[2]]


def _args(argv: list[str]) -> tuple[int, int, int, int]:
    """(-b, -e, -f, -g): sizes, step factor and the GPUs each process drives (nccl-tests' default 1)."""
    opts = {"-b": "8", "-e": "8G", "-f": "2", "-g": "1"}
    for i, a in enumerate(argv[:-1]):
        if a in opts:
            opts[a] = argv[i + 1]
    lo, hi, factor, per_proc = size_arg(opts["-b"]), size_arg(opts["-e"]), int(opts["-f"]), int(opts["-g"])
    if not 0 < lo <= hi or factor < 2 or per_proc < 1:
        raise ValueError("need 0 < -b <= -e, -f >= 2 and -g >= 1")
    return lo, hi, factor, per_proc


def _row(size: int, ranks: int, busbw: float, wrong: int = 0) -> str:
    algbw = busbw * ranks / (ranks - 1)
    t_us = size / (algbw * 1e3) if algbw > 0 else 0.0
    count = size // (4 * ranks)
    cols = f"{t_us:8.1f} {algbw:7.2f} {busbw:7.2f} {wrong:6d}"
    return f"{size:12d}  {count:12d}     float    none      -1  {cols}  {cols}"


def table(
    s: NodeState, lo: int, hi: int, factor: int, hosts: list[str] | None = None, per_proc: int = 1
) -> str:
    """The table for ``s`` (its GPUs on each of ``hosts``; default: this node and one peer), each
    process driving ``per_proc`` GPUs (nccl-tests -g: one Pid per process in the rank list)."""
    hosts = hosts or [s.node, "peer"]
    ranks = len(hosts) * s.gpus
    out = [
        f"# nThread 1 nGpus {per_proc} minBytes {lo} maxBytes {hi} step: {factor}(factor) warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for r in range(ranks):
        host, dev = hosts[r // s.gpus], r % s.gpus
        where = f"device {dev:2d} [0000:{s.pci(dev)[9:11].lower()}:00] {s.product}"
        out.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r // per_proc:6d} on {host} {where}")
    out += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place", *_HEADER]
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    peak = s.busbw * (hi + _HALF) / hi
    values = [round(peak * z / (z + _HALF), 2) for z in sizes]
    out += [_row(z, ranks, v, s.wrong) for z, v in zip(sizes, values, strict=True)]
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(values) / len(values):.4f}", "#"]
    return "\n".join(out) + "\n"


def _rank() -> int:
    for var in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def step_states(s: NodeState) -> tuple[NodeState, list[str] | None]:
    """Under a multi-node Slurm step (or a GKE ring pair's launcher): the ring's state (this node's,
    at the slowest node's busbw, with every node's wrong data) and its hosts; else this node alone
    (and a nameless peer)."""
    hosts = expand_hostlist(os.environ.get("SLURM_STEP_NODELIST", ""))
    peer = os.environ.get("PITSTOP_PEER_NODE", "")  # a GKE ring pair's launcher names its peer's node
    if len(hosts) < 2 and peer:
        hosts = [node_name(), peer]
    if len(hosts) < 2:
        return s, None
    ring = [load(node=h) for h in hosts]
    slowest = min(ring, key=lambda n: n.busbw)
    wrong = max(s.wrong, *(n.wrong for n in ring))
    return dataclasses.replace(s, busbw=min(s.busbw, slowest.busbw), wrong=wrong), hosts


def main(argv: list[str]) -> int:
    if _rank() != 0:  # as with nccl-tests under MPI, the other ranks print nothing
        return 0
    try:
        lo, hi, factor, per_proc = _args(argv)
        s, hosts = step_states(load())
    except (ValueError, StateError) as exc:
        print(f"all_gather_perf stand-in: {exc}", file=sys.stderr)
        return 2
    if s.gpus <= 0:
        print("Test NCCL failure: no CUDA devices", file=sys.stderr)
        return 1
    # a Slurm step's ranks must cover the node's GPUs; a GKE ring pair's pod holds only its share
    if hosts and os.environ.get("SLURM_STEP_NODELIST") and _tasks_per_node() * per_proc != s.gpus:
        print(
            f"all_gather_perf stand-in: {_tasks_per_node()} ranks x -g {per_proc} != {s.gpus} GPUs",
            file=sys.stderr,
        )
        return 1
    sys.stdout.write(table(s, lo, hi, factor, hosts, per_proc))
    return 0


def _tasks_per_node() -> int:
    """The step's tasks on each node (srun sets SLURM_STEP_TASKS_PER_NODE, e.g. "8(x2)" or "1(x2)")."""
    raw = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or "1"
    m = re.match(r"(\d+)", raw)
    return int(m.group(1)) if m else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
