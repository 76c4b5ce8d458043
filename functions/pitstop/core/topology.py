"""Where nodes sit, and which spare a gang should move to: pure, from what each platform says.

A node's place comes from its platform, read by an adapter and handed here as it is:

- Compute Engine: ``Instance.resourceStatus.physicalHostTopology`` {cluster, block, subblock, host}
  ("instances within the same block experience low network latency"; a sub-block "lower network
  latency than instances in the same block"; https://cloud.google.com/compute/docs/instances/
  view-instance-topology). The library's ``to_dict`` keeps the proto's ``subblock``.
- GKE: the node labels ``cloud.google.com/gce-topology-block``, ``-subblock`` and ``-host``
  (https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas).
- Slurm: the switch path of the node in its topology (``scontrol show topology``, topology.conf
  ``SwitchName``/``Switches``/``Nodes``, https://slurm.schedmd.com/topology.conf.html), leaf first:
  the leaf switch is the sub-block, its parent the block, the next the cluster (Cluster Toolkit
  writes topology.conf from physicalHostTopology that way). ``topology/block`` gives one level.

On an NVL72 machine type (A4X) the sub-block is the NVLink domain: "An NVLink domain, also known as
a subblock, is the core unit of capacity for A4X Max and A4X machines ... 18 ... instances (72
GPUs)" (https://cloud.google.com/ai-hypercomputer/docs/terminology). A job's NVLink ring cannot
span racks: a spare outside the domain is no spare at all.

Places are compared within one source only (a Slurm switch name is not a Compute sub-block id).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pitstop.core.domain import Place, Vm

BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
HOST_LABEL = "cloud.google.com/gce-topology-host"
MACHINE_LABEL = "node.kubernetes.io/instance-type"

Tier = Literal["subblock", "block", "cluster", "unknown"]
UNNAMED = "(any)"  # the spare of a scheduler that has room for the gang but names none
# Nearest first: a spare in the gang's sub-block, then its block, then anywhere in the cluster.
TIERS: tuple[Tier, ...] = ("subblock", "block", "cluster", "unknown")
TIER_WORDS: Mapping[str, str] = {
    "subblock": "the gang's sub-block",
    "block": "the gang's block",
    "cluster": "another block",
    "unknown": "a node of unknown place",
}


def machine_of(machine_type: object) -> str:
    """``a4x-highgpu-4g`` from a machine type or its URL (instances.get answers a URL)."""
    return str(machine_type or "").rsplit("/", 1)[-1]


def nvl72(machine_type: str, families: Collection[str]) -> bool:
    """Whether the machine type is an NVL72 one (its family prefix is in ``families``)."""
    return any(machine_of(machine_type).startswith(f) for f in families)


def _with_domain(place: Place, families: Collection[str]) -> Place:
    machine = place.get("machine_type", "")
    if machine and nvl72(machine, families) and place.get("subblock"):
        parts = (place.get("cluster", ""), place.get("block", ""), place.get("subblock", ""))
        place["nvlink_domain"] = "/".join(parts)
    return place


def from_vm(vm: Vm, families: Collection[str] = ()) -> Place | None:
    """The VM's place from Compute (None: Compute shows none, e.g. not in a dense deployment)."""
    topo = (vm.get("resource_status") or {}).get("physical_host_topology") or {}
    if not topo.get("block"):
        return None
    place: Place = {"source": "compute", "block": str(topo["block"])}
    if topo.get("cluster"):
        place["cluster"] = str(topo.get("cluster"))
    if topo.get("subblock"):
        place["subblock"] = str(topo.get("subblock"))
    if topo.get("host"):
        place["host"] = str(topo.get("host"))
    if vm.get("machine_type"):
        place["machine_type"] = machine_of(vm.get("machine_type"))
    return _with_domain(place, families)


def from_labels(labels: Mapping[str, str], families: Collection[str] = ()) -> Place | None:
    """A GKE node's place from its labels (None: it carries no topology label)."""
    block, subblock = labels.get(BLOCK_LABEL), labels.get(SUBBLOCK_LABEL)
    if not block and not subblock:
        return None
    place: Place = {"source": "gke"}
    if block:
        place["block"] = block
    if subblock:
        place["subblock"] = subblock
    if labels.get(HOST_LABEL):
        place["host"] = labels[HOST_LABEL]
    if labels.get(MACHINE_LABEL):
        place["machine_type"] = labels[MACHINE_LABEL]
    return _with_domain(place, families)


def from_switches(
    path: Sequence[str], machine_type: str = "", families: Collection[str] = ()
) -> Place | None:
    """A Slurm node's place from its switch path, leaf first (None: no topology configured)."""
    if not path:
        return None
    place: Place = {"source": "slurm", "subblock": path[0]}
    if len(path) > 1:
        place["block"] = path[1]
    if len(path) > 2:
        place["cluster"] = path[2]
    if machine_type:
        place["machine_type"] = machine_type
    return _with_domain(place, families)


def shared(a: Place | None, b: Place | None) -> Tier:
    """The nearest level two places share (``unknown``: either has none, or another source's)."""
    if not a or not b or a.get("source") != b.get("source"):
        return "unknown"
    if a.get("block") != b.get("block"):
        return "cluster"
    return "subblock" if a.get("subblock") and a.get("subblock") == b.get("subblock") else "block"


def span(places: Sequence[Place | None]) -> Tier:
    """The widest level a set of places spans: one sub-block, one block, the cluster (or unknown)."""
    if not places:
        return "subblock"
    widest: Tier = "subblock"
    for p in places[1:]:
        t = shared(places[0], p)
        if TIERS.index(t) > TIERS.index(widest):
            widest = t
    return widest


@dataclass(frozen=True)
class Seat:
    """A node and its place (None: its platform did not say); ``returned_at``: when it last came
    back from a Pitstop repair (None: never, as far as Pitstop knows), for the spare's probation."""

    node: str
    place: Place | None = None
    returned_at: float | None = None


@dataclass(frozen=True)
class Pick:
    """The spares a gang moves to, or why there is none it may take.

    ``tier``: where the farthest spare sits relative to the gang; ``before``/``after``: how widely
    the gang is spread without the fenced nodes and with the spares (a move costs only when it
    widens it); ``blocked``: no spare inside the gang's NVLink domain (NVL72), or not enough;
    ``passed_over``: spares listed before the first taken that would spread the gang wider or sit
    farther; ``probation``: spares the pick would have taken but for their recent repair.
    """

    spares: tuple[Seat, ...] = ()
    tier: Tier = "unknown"
    before: Tier = "subblock"
    after: Tier = "subblock"
    blocked: str | None = None
    domain: str | None = None
    passed_over: tuple[str, ...] = field(default_factory=tuple)  # listed earlier, farther away
    probation: tuple[str, ...] = field(default_factory=tuple)  # would have been taken, but just repaired

    @property
    def widens(self) -> bool:
        """Whether the move spreads the gang over a wider level of the fabric, as far as its places
        are known (an unknown place widens nothing anyone can price: no penalty is guessed)."""
        known = self.after != "unknown" and self.before != "unknown"
        return known and TIERS.index(self.after) > TIERS.index(self.before)

    @classmethod
    def unnamed(cls) -> Pick:
        """The scheduler has room for the gang but names no spare: it places the gang itself."""
        return cls((Seat(UNNAMED),), "unknown", "unknown", "unknown")

    @property
    def where(self) -> str:
        """Where the gang went, as a person reads it (``sub-block sb-2``)."""
        if not self.spares:
            return "nowhere"
        if self.spares[0].node == UNNAMED:
            return "a spare the scheduler picks"
        p = self.spares[0].place or {}
        if p.get("subblock"):
            where = f"sub-block {p['subblock']}"
        elif p.get("block"):
            where = f"block {p['block']}"
        else:
            where = ", ".join(s.node for s in self.spares)
        if self.probation:
            where += f" (passed over {', '.join(self.probation)}: back from a repair, on probation)"
        return where


def domain_of(place: Place | None) -> str | None:
    """The NVLink domain a place is in, for a gang known to be NVL72: its sub-block's full path."""
    if not place or not place.get("subblock"):
        return None
    return place.get("nvlink_domain") or "/".join(
        (place.get("cluster", ""), place.get("block", ""), place.get("subblock", ""))
    )


def _nearest_to(anchor: Sequence[Place | None]) -> Callable[[Seat], int]:
    """The index in TIERS of the nearest level a seat shares with any anchor: the least of
    :func:`shared` over them, from sets (a gang of thousands is asked about every spare)."""
    known = [p for p in anchor if p]
    sources = {p.get("source") for p in known}
    blocks = {(p.get("source"), p.get("block")) for p in known}
    subs = {(p.get("source"), p.get("block"), p.get("subblock")) for p in known if p.get("subblock")}

    def nearest(s: Seat) -> int:
        p = s.place
        if not p or p.get("source") not in sources:
            return TIERS.index("unknown")
        if p.get("subblock") and (p.get("source"), p.get("block"), p.get("subblock")) in subs:
            return TIERS.index("subblock")
        return TIERS.index("block" if (p.get("source"), p.get("block")) in blocks else "cluster")

    return nearest


def _span_after(staying: Sequence[Place | None], before: Tier) -> Callable[[Seat], int]:
    """The index in TIERS of the span the gang would have with this spare beside its staying
    members: :func:`span` of them all, which is the wider of ``before`` and the level the spare
    shares with the first of them (span measures from the first place)."""
    if not staying:
        return lambda s: TIERS.index("subblock")
    first, wide = staying[0], TIERS.index(before)
    return lambda s: max(wide, TIERS.index(shared(first, s.place)))


def _best(seats: Sequence[Seat], need: int, rank: Callable[[Seat], tuple[int, ...]]) -> tuple[Seat, ...]:
    """The ``need`` best-ranked seats, ties in the order listed (a stable sort)."""
    return tuple(sorted(seats, key=rank)[:need])


def on_probation(seat: Seat, now: float, probation_s: float) -> bool:
    """Whether the spare came back from a Pitstop repair less than ``probation_s`` ago."""
    return seat.returned_at is not None and now - seat.returned_at < probation_s


def pick(
    gang: Sequence[Seat],
    fenced: Collection[str],
    spares: Sequence[Seat],
    need: int,
    nvl72: bool = False,
    now: float = 0.0,
    probation_s: float = 0.0,
) -> Pick:
    """The ``need`` spares that spread the gang least: ranked by the span the gang has after the move
    (the fabric's cost depends on the widest level it spans, not on its nearest member), then a
    spare back from a Pitstop repair less than ``probation_s`` before ``now`` after the others of
    that span (a fault not really fixed relapses inside the job), then the nearest level it shares
    with the gang (sub-block, block, anywhere), then the scheduler's order. Probation never costs a
    wider span: a just-repaired spare is still taken when it is the only one of the best span.
    Spares are ranked one by one against the staying members.

    An NVL72 gang (``nvl72``: its machine type's sub-block is one NVLink domain) takes only spares
    of its own domain; fewer than ``need`` there, or a domain nobody can name, and it takes none
    (``blocked`` says why).

    ``gang``: every member with its place, the fenced ones among them (their place is where the
    gang was); ``spares``: the idle healthy nodes the scheduler may place it on.
    """
    staying = [s for s in gang if s.node not in fenced]
    anchor = [s.place for s in (staying or gang)]
    before = span([s.place for s in staying])
    home = next((s.place for s in gang if s.node in fenced and s.place), anchor[0] if anchor else None)
    domain = domain_of(home) if nvl72 else None
    if nvl72 and domain is None:
        return Pick(before=before, blocked="the gang's NVLink domain is not known", domain="unknown")
    free = [s for s in spares if s.node not in fenced]
    allowed = [s for s in free if domain is None or shared(home, s.place) == "subblock"]
    if len(allowed) < need:
        why = (
            f"no spare in the gang's NVLink domain {domain} ({len(allowed)} of {need} free there)"
            if domain is not None
            else f"{len(allowed)} spare(s) for {need} needed"
        )
        return Pick(before=before, blocked=why, domain=domain)

    nearest, wide = _nearest_to(anchor), _span_after([s.place for s in staying], before)
    level = {id(s): (wide(s), nearest(s)) for s in allowed}  # (span after the move, nearest level)
    held = {id(s): on_probation(s, now, probation_s) for s in allowed}
    chosen = _best(allowed, need, lambda s: (level[id(s)][0], held[id(s)], level[id(s)][1]))
    taken = {id(s) for s in chosen}
    passed = tuple(s.node for s in _best(allowed, need, lambda s: level[id(s)]) if id(s) not in taken)
    tier = TIERS[max(nearest(s) for s in chosen)] if chosen else "subblock"
    first = allowed.index(chosen[0]) if chosen else 0
    skipped = tuple(
        s.node for s in allowed[:first] if level[id(s)] > level[id(chosen[0])] and s.node not in passed
    )
    after = span([*(s.place for s in staying), *(s.place for s in chosen)])
    return Pick(chosen, tier, before, after, None, domain, skipped, passed)
