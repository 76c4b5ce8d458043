"""The per-node outcome the GPU stand-ins print: healthy unless the state file says otherwise."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

# PCI bus ids of the 8 GPUs of an A3 node (as nvidia-smi prints them on a3-megagpu-8g).
PCI_BUSES = ("04", "05", "0b", "0c", "84", "85", "8b", "8c", "90", "91", "92", "93", "94", "95", "96", "97")


class StateError(ValueError):
    """The state file is unreadable or malformed: the stand-in fails like a broken tool."""


@dataclass(frozen=True)
class NodeState:
    """Keys of one node's entry: {"gpus": 7, "total_gpus": 8, "busbw": 120, "dcgm": "fail", ...}."""

    node: str
    total_gpus: int = 8
    gpus: int = 8  # visible; the rest print as "GPU is lost"
    busbw: float = 190.0  # GB/s at the largest message size
    dcgm: str = "pass"  # pass | fail | warn
    dcgm_gpu: int = 0  # the GPU a failing or warning test names
    dcgm_schema: str = "v4"  # v4 ("DCGM Diagnostic") or v3 ("DCGM GPU Diagnostic")
    remap: str = "none"  # none | pending | failure
    remap_gpu: int = 0
    nvlink_down: tuple[int, ...] = field(default=())  # GPU indices with links down
    product: str = "NVIDIA H100 80GB HBM3"

    def pci(self, index: int) -> str:
        return f"00000000:{PCI_BUSES[index % len(PCI_BUSES)].upper()}:00.0"


def _entry(doc: Any, node: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise StateError("state must be a JSON object keyed by node name")
    entry = doc.get(node, {})
    if not isinstance(entry, dict):
        raise StateError(f"state for {node!r} must be an object")
    return entry


def load(env: dict[str, str] | None = None) -> NodeState:
    """This node's state from PITSTOP_GPU_STATE (path or inline JSON); defaults when absent."""
    env = dict(os.environ) if env is None else env
    node = env.get("PITSTOP_NODE") or env.get("SLURMD_NODENAME") or socket.gethostname()
    raw = env.get("PITSTOP_GPU_STATE", "")
    if not raw:
        return NodeState(node)
    try:
        if raw.lstrip().startswith("{"):
            text = raw
        else:
            with open(raw, encoding="utf-8") as f:
                text = f.read()
        e = _entry(json.loads(text), node)
        total = int(e.get("total_gpus", 8))
        return NodeState(
            node,
            total,
            int(e.get("gpus", total)),
            float(e.get("busbw", 190.0)),
            str(e.get("dcgm", "pass")),
            int(e.get("dcgm_gpu", 0)),
            str(e.get("dcgm_schema", "v4")),
            str(e.get("remap", "none")),
            int(e.get("remap_gpu", 0)),
            tuple(int(g) for g in e.get("nvlink_down", ())),
            str(e.get("product", "NVIDIA H100 80GB HBM3")),
        )
    except (OSError, ValueError, TypeError) as exc:
        raise StateError(f"PITSTOP_GPU_STATE: {exc}") from exc
