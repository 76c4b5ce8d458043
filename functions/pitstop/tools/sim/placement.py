"""Where each simulated node sits (block, sub-block), how widely a gang is spread, and what that costs.

Job nodes fill sub-blocks in index order (``nodes_per_subblock`` each, ``subblocks_per_block`` to a
block). Spares come after them: ``spares_per_subblock`` in each job sub-block, then
``spares_per_block`` in a spare sub-block of each block, and any left over in a block of their own.
Idle nodes are listed in index order, so a topology-blind scheduler's first idle spare is sub-block
0's, whichever block the gang is in.

A gang whose members come to span a wider level of the fabric than it started in (sub-blocks of one
block, or blocks) runs its collectives slower for the rest of its run: ``penalty`` of its throughput
(a documented factor; reference/topology-and-vertex.md: "instances within the same block experience
low network latency", a sub-block "lower network latency than instances in the same block"). The
places are core/topology's, so the strategies that pick by them decide with the product's code.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from pitstop.core.domain import Place
from pitstop.core.topology import TIERS, Tier
from pitstop.tools.sim.scenario import FleetConf

CLUSTER = "sim"


def layout(fleet: FleetConf) -> list[Place | None]:
    """Each physical node's place (job nodes, then spares), or None for all without a topology."""
    physical = fleet["nodes"] + fleet["spares"]
    topo = fleet.get("topology")
    if topo is None:
        return [None] * physical
    per_sub, per_block = topo["nodes_per_subblock"], topo["subblocks_per_block"]
    subs = -(-fleet["nodes"] // per_sub)
    blocks = -(-subs // per_block)
    out: list[Place | None] = [
        _place(i // per_sub // per_block, str(i // per_sub)) for i in range(fleet["nodes"])
    ]
    spares: list[Place | None] = []
    for sb in range(subs):
        spares += [_place(sb // per_block, str(sb))] * topo["spares_per_subblock"]
    for b in range(blocks):
        spares += [_place(b, f"{b}-spare")] * topo["spares_per_block"]
    spares += [_place(blocks, "spare")] * fleet["spares"]  # the rest: a block of their own
    return out + spares[: fleet["spares"]]


def _place(block: int, subblock: str) -> Place:
    return {"source": "compute", "cluster": CLUSTER, "block": f"b{block}", "subblock": f"sb{subblock}"}


Key = tuple[str, str] | None  # (block, sub-block) of a node, None: no place known


def key(place: Place | None) -> Key:
    return None if place is None else (place.get("block", ""), place.get("subblock", ""))


def spread(keys: Iterable[Key]) -> Tier:
    """The widest level a set of nodes spans (core/topology.TIERS): one sub-block, one block, many."""
    seen = set(keys)
    if None in seen or not seen:
        return "unknown"
    blocks = {k[0] for k in seen if k is not None}
    return "cluster" if len(blocks) > 1 else "block" if len(seen) > 1 else "subblock"


def first_of_each(nodes: Iterable[int], key_of: Callable[[int], Hashable], per_place: int = 1) -> list[int]:
    """The first ``per_place`` nodes of each place (whatever ``key_of`` tells apart), in the given order."""
    count: dict[Hashable, int] = {}
    out: list[int] = []
    for n in nodes:
        k = key_of(n)
        if count.get(k, 0) < per_place:
            count[k] = count.get(k, 0) + 1
            out.append(n)
    return out


def wider(now: Tier, home: Tier) -> bool:
    """Whether ``now`` is a wider level than ``home`` (unknown places widen nothing)."""
    known = "unknown" not in (now, home)
    return known and TIERS.index(now) > TIERS.index(home)


def tier_of(spare: Key, gang: set[Key]) -> Tier:
    """Where a spare sits from the gang (the places of its members): the nearest level it shares."""
    if spare is None or None in gang:
        return "unknown"
    if spare in gang:
        return "subblock"
    return "block" if spare[0] in {k[0] for k in gang if k is not None} else "cluster"
