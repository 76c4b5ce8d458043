"""The per-node outcome the GPU stand-ins print: healthy unless the state file says otherwise."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

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
    kmsg: tuple[tuple[int, str], ...] = field(default=())  # (facility, message) since boot
    # Telemetry faults (what the Monitoring stand-in's policies read, and nvidia-smi -q shows):
    throttle: float = 0.0  # share of the time GPU ``throttle_gpu`` is held below its clocks
    throttle_reason: str = "thermal"  # thermal | power
    throttle_gpu: int = 0
    sbe_rate: int = 0  # correctable (single-bit) ECC errors an hour on GPU ``ecc_gpu``
    ecc_gpu: int = 0
    hung: bool = False  # a GPU stuck without an Xid: its collectives never finish
    wrong: int = 0  # elements an all_gather through this node gets wrong (nccl-tests' #wrong)
    kmsg_at: tuple[float | None, ...] = field(default=())  # when each kmsg line was printed (epoch s)
    boot: float | None = None  # when the VM booted (epoch s): dmesg counts its lines' seconds from it

    def pci(self, index: int) -> str:
        return f"00000000:{PCI_BUSES[index % len(PCI_BUSES)].upper()}:00.0"


class KmsgLine(TypedDict):
    """One line of a stand-in kernel ring buffer (``at``: when the kernel printed it, epoch s)."""

    msg: str
    facility: int
    at: NotRequired[float]


# One node's entry, checked key by key by check_entry (the keys of NodeState but ``node``).
GpuEntry = dict[str, object]

# What the fake Compute's admin API (``/_admin/gpu_state``) may set for a host, key by key.
_INT_KEYS = ("total_gpus", "gpus", "dcgm_gpu", "remap_gpu", "throttle_gpu", "ecc_gpu", "wrong")
_CHOICES = {
    "dcgm": ("pass", "fail", "warn"),
    "dcgm_schema": ("v4", "v3"),
    "remap": ("none", "pending", "failure"),
    "throttle_reason": ("thermal", "power"),
}
# Named outcomes for the admin API and the demo: ``{"state": "degraded"}``.
PRESETS: dict[str, GpuEntry] = {
    "degraded": {"busbw": 120.0},  # NVLink/NIC trouble: all_gather far below a3-megagpu-8g's ~190 GB/s
    "corrupt": {"wrong": 4},  # data corrupted in the ring (a GPU, NVLink or NIC): nccl-tests' #wrong > 0
    "gpu_lost": {"gpus": 7},  # one GPU fallen off the bus
    "dcgm_fail": {"dcgm": "fail"},
    "remap_failure": {"remap": "failure", "dcgm": "fail"},
    # issue 24: faults that print no Xid (pitstop local chaos hang|straggler|degrading --node N)
    "hung": {"hung": True, "dcgm": "fail"},  # a GPU stuck mid-collective: the quick diagnostic fails on it
    # an NVLink down on one GPU: the node's collectives crawl at a fifth of its peers' busbw; nvidia-smi -q
    # shows nothing, ``nvidia-smi nvlink --status`` (the diagnostic) does
    "hung_link": {"busbw": 38.0, "nvlink_down": [3]},
    "straggler": {"throttle": 0.6, "throttle_reason": "thermal"},  # held below its clocks 60 % of the time
    "degrading": {"sbe_rate": 40},  # correctable ECC errors rising: 40 an hour (the policy's line is 10)
}


KMSG_MAX = 256  # lines a stand-in ring buffer keeps (the oldest fall out, as in a real one)


def check_kmsg_line(line: object) -> KmsgLine:
    """One ring-buffer line: printable text up to 512 characters, a syslog facility 0-23."""
    if not isinstance(line, dict) or set(line) - {"msg", "facility", "at"}:
        raise StateError("a kernel line is {msg, facility, at}")
    msg, fac, at = line.get("msg"), line.get("facility", 0), line.get("at")
    if not isinstance(msg, str) or not msg.isprintable() or not 0 < len(msg) <= 512:
        raise StateError("msg must be printable text of 1-512 characters")
    if isinstance(fac, bool) or not isinstance(fac, int) or not 0 <= fac <= 23:
        raise StateError("facility must be a syslog facility 0-23")
    out: KmsgLine = {"msg": msg, "facility": fac}
    if at is not None:
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 < at < 1e11:
            raise StateError("at must be an epoch time")
        out["at"] = float(at)
    return out


def check_entry(entry: object) -> GpuEntry:
    """One node's state, checked key by key (unknown keys and wrong types are refused): the
    entry as the stand-ins will read it. A preset name stands for its entry."""
    if isinstance(entry, str):
        if entry not in PRESETS:
            raise StateError(f"unknown GPU state preset {entry!r} (known: {', '.join(sorted(PRESETS))})")
        entry = PRESETS[entry]
    if not isinstance(entry, dict):
        raise StateError("a GPU state must be an object or a preset name")
    out: GpuEntry = {}
    for k, v in entry.items():
        if k in _INT_KEYS:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 64:
                raise StateError(f"{k} must be an integer 0-64")
        elif k == "busbw":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 10_000:
                raise StateError("busbw must be a number of GB/s")
            v = float(v)
        elif k in _CHOICES:
            if v not in _CHOICES[k]:
                raise StateError(f"{k} must be one of {', '.join(_CHOICES[k])}")
        elif k == "throttle":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise StateError("throttle must be a share of the time, 0-1")
            v = float(v)
        elif k == "sbe_rate":
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000:
                raise StateError("sbe_rate must be a whole number of errors an hour")
        elif k == "hung":
            if not isinstance(v, bool):
                raise StateError("hung must be true or false")
        elif k == "nvlink_down":
            if not isinstance(v, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in v):
                raise StateError("nvlink_down must be a list of GPU indices")
        elif k == "kmsg":
            if not isinstance(v, list) or len(v) > KMSG_MAX:
                raise StateError(f"kmsg must be a list of at most {KMSG_MAX} kernel lines")
            v = [check_kmsg_line(x) for x in v]
        elif k == "boot":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1e11:
                raise StateError("boot must be an epoch time")
            v = float(v)
        elif k == "product":
            if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9 ._-]{1,64}", v):
                raise StateError("product must be a short name")
        else:
            raise StateError(f"unknown GPU state key {k!r}")
        out[k] = v
    return out


def _entry(doc: object, node: str) -> Mapping[str, object]:
    if not isinstance(doc, dict):
        raise StateError("state must be a JSON object keyed by node name")
    entry = doc.get(node, {})
    if not isinstance(entry, dict):
        raise StateError(f"state for {node!r} must be an object")
    return entry


def node_name(env: dict[str, str] | None = None) -> str:
    """The node this process runs on: PITSTOP_NODE, else Slurm's SLURMD_NODENAME (a job step's
    node, right also when several slurmd run on one machine), else the host name."""
    env = dict(os.environ) if env is None else env
    return env.get("PITSTOP_NODE") or env.get("SLURMD_NODENAME") or socket.gethostname()


def load(env: dict[str, str] | None = None, node: str | None = None) -> NodeState:
    """A node's state (this node's unless named) from PITSTOP_GPU_STATE (path or inline JSON);
    defaults when absent."""
    env = dict(os.environ) if env is None else env
    node = node or node_name(env)
    raw = env.get("PITSTOP_GPU_STATE", "")
    if not raw:
        return NodeState(node)
    try:
        if raw.lstrip().startswith("{"):
            text = raw
        else:
            with open(raw, encoding="utf-8") as f:
                text = f.read()
        return node_state(node, _entry(json.loads(text), node))
    except (OSError, ValueError, TypeError) as exc:
        raise StateError(f"PITSTOP_GPU_STATE: {exc}") from exc


def _int(v: object) -> int:
    if isinstance(v, int | float | str):
        return int(v)
    raise TypeError(f"not a number: {v!r}")


def _float(v: object) -> float:
    if isinstance(v, int | float | str):
        return float(v)
    raise TypeError(f"not a number: {v!r}")


def _items(v: object) -> list[object]:
    if isinstance(v, list | tuple):
        return list(v)
    raise TypeError(f"not a list: {v!r}")


def _kmsg(x: object) -> tuple[int, str]:
    if not isinstance(x, Mapping):
        raise TypeError(f"not a kernel line: {x!r}")
    return _int(x.get("facility", 0)), str(x["msg"])


def _kmsg_at(x: object) -> float | None:
    at = x.get("at") if isinstance(x, Mapping) else None
    return None if at is None else _float(at)


def node_state(node: str, e: Mapping[str, object]) -> NodeState:
    """A node's entry (as check_entry leaves it, or read from the state file) as its NodeState;
    absent keys take the defaults (ValueError or TypeError: a value of the wrong kind)."""
    total = _int(e.get("total_gpus", 8))
    return NodeState(
        node,
        total,
        _int(e.get("gpus", total)),
        _float(e.get("busbw", 190.0)),
        str(e.get("dcgm", "pass")),
        _int(e.get("dcgm_gpu", 0)),
        str(e.get("dcgm_schema", "v4")),
        str(e.get("remap", "none")),
        _int(e.get("remap_gpu", 0)),
        tuple(_int(g) for g in _items(e.get("nvlink_down", ()))),
        str(e.get("product", "NVIDIA H100 80GB HBM3")),
        tuple(_kmsg(x) for x in _items(e.get("kmsg", ()))),
        _float(e.get("throttle", 0.0)),
        str(e.get("throttle_reason", "thermal")),
        _int(e.get("throttle_gpu", 0)),
        _int(e.get("sbe_rate", 0)),
        _int(e.get("ecc_gpu", 0)),
        bool(e.get("hung", False)),
        _int(e.get("wrong", 0)),
        tuple(_kmsg_at(x) for x in _items(e.get("kmsg", ()))),
        None if e.get("boot") is None else _float(e.get("boot")),
    )


def load_or_say(tool: str) -> NodeState | None:
    """This node's state for a stand-in tool; None (said on stderr) when it cannot be read."""
    try:
        return load()
    except StateError as exc:
        print(f"{tool}: {exc}", file=sys.stderr)
        return None


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``a3-node-[001-003,007],login``) as names, in order.

    Enough of the syntax for SLURM_STEP_NODELIST: comma-separated names, each with bracketed
    ranges (zero padding kept); a name may carry several bracket groups.
    """
    names: list[str] = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text.strip()):
        names.extend(_expand_one(part))
    return names


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if m is None:
        return [name] if name else []
    head, tail = name[: m.start()], name[m.end() :]
    out: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise StateError(f"bad host range {rng!r} in {name!r}")
        width = len(lo)
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(_expand_one(f"{head}{n:0{width}d}{tail}"))
    return out
