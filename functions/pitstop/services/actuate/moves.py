"""The gang's choice at a fault, in actuate: what the scheduler, Compute and the fleet's history say,
handed to core (core/topology.pick for the spare, core/tradeoff.weigh for the price); the choice
is recorded on the incident (RecordChoice) before anything moves."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pitstop.adapters.errors import ActuatorError
from pitstop.core import checks, engine, topology, tradeoff
from pitstop.core.aggregate import RecordChoice
from pitstop.core.domain import MoveChoice, NodeRef
from pitstop.core.scheduling import Capacity, Placer
from pitstop.core.states import State
from pitstop.core.store import InStates
from pitstop.core.timeline import repair_s, returned_at
from pitstop.services.actuate.context import Step

FLEET_TTL_S = 600.0  # the fleet's measured repairs are read at most this often per instance
DEFAULT_GPUS = 8  # per node, when Compute lists no accelerators (a VM it cannot read)
_fleet: dict[int, tuple[float, dict[str, list[float]]]] = {}  # id(store) -> (read at, action -> seconds)


@dataclass(frozen=True)
class Move:
    """What the step does with one job: requeue it now (``go``; ``onto``: pinned to these nodes) or
    leave it where it is until the node is back; ``why`` says which, with the numbers."""

    go: bool
    why: str
    onto: tuple[str, ...]
    choice: MoveChoice


def measured_repairs(s: Step) -> dict[str, list[float]]:
    """How long each action's repairs took in this fleet (acted -> healthy of resolved incidents),
    read from the store at most every FLEET_TTL_S per instance."""
    key, now = id(s.deps.store), time.monotonic()
    cached = _fleet.get(key)
    if cached is not None and now - cached[0] < FLEET_TTL_S:
        return cached[1]
    out: dict[str, list[float]] = {}
    for inc in s.deps.store.query(InStates(frozenset({State.RESOLVED}))):
        took = repair_s(inc)
        if took is not None:
            out.setdefault(str(inc["action"]), []).append(took)
    _fleet[key] = (now, out)
    return out


def returned(s: Step, spares: Sequence[topology.Seat]) -> tuple[topology.Seat, ...]:
    """Each spare with when it last came back from a Pitstop repair: its node document's latest
    incident, acted on and healthy again (spares are named as the fenced node is, in its zone)."""
    if s.inc["node"] is None:
        return tuple(spares)  # a job's incident: no zone to name its spares' documents by
    project, zone, _ = s.node()
    out = []
    for seat in spares:
        ref = NodeRef(project=project, zone=zone, instance=seat.node, instance_id=None)
        doc = s.deps.store.records.node(engine.node_key(ref))
        iid = doc.get("latest_incident") if doc else None
        inc = s.deps.store.get(iid) if iid else None
        out.append(replace(seat, returned_at=returned_at(inc) if inc else None))
    return tuple(out)


def _machine(s: Step) -> tuple[str, int]:
    """The fenced VM's machine type and GPUs per node (Compute), or what is assumed without them."""
    try:
        vm = s.vm()
    except ActuatorError:
        return "", DEFAULT_GPUS
    return topology.machine_of(vm.get("machine_type")), checks.gpus_of(vm) or DEFAULT_GPUS


def choose(s: Step, job: str, cap: Capacity) -> Move:
    """Price waiting, moving, shrinking and holding for this job and take the least (recorded)."""
    moves = s.deps.policy.moves
    costs = tradeoff.costs_of(moves)
    machine, per_node = _machine(s)
    nvl72 = topology.nvl72(machine, moves["nvlink_domain_families"])
    fenced = {s.instance, *cap.unusable}  # a member another fence holds does not come back either
    nodes = max(len(cap.gang), cap.need or 0, 1)
    need = max(1, sum(1 for seat in cap.gang if seat.node in fenced))
    placer = isinstance(s.scheduler, Placer) and cap.places
    if cap.enough and not cap.spares and not nvl72:
        pick = topology.Pick.unnamed()  # room for the gang, but the scheduler names no spare
    elif cap.enough or nvl72:
        spares = returned(s, cap.spares) if moves["probation_s"] > 0 else cap.spares
        pick = topology.pick(cap.gang, fenced, spares, need, nvl72, s.deps.clock(), moves["probation_s"])
    else:
        pick = topology.Pick(blocked=cap.why or "not enough healthy capacity")
    action = str(s.inc["action"])
    repair, source = tradeoff.repair_estimate(action, measured_repairs(s).get(action, []), costs)
    sit = tradeoff.Situation(
        action, nodes, nodes * per_node, repair, source, pick,
        elastic=cap.elastic and placer, placed=placer and cap.native is None,
    )  # fmt: skip
    weighed = tradeoff.weigh(sit, costs)
    doc = weighed.doc(sit, costs, job, s.deps.clock())
    doc["native"] = cap.native
    if nvl72 and placer and weighed.decision == tradeoff.WAIT:
        doc["stay_on"] = sorted(seat.node for seat in cap.gang)  # its NVLink domain: no other node
    s.decide(RecordChoice(s.at, doc))
    staying = tuple(sorted(seat.node for seat in cap.gang if seat.node not in fenced))
    if weighed.decision == tradeoff.MOVE:
        named = sit.placed and pick.spares[0].node != topology.UNNAMED
        onto = tuple(sorted({*staying, *(seat.node for seat in pick.spares)})) if named else ()
        return Move(True, f"healthy capacity for the gang now: {weighed.why}", onto, doc)
    if weighed.decision == tradeoff.SHRINK:
        return Move(True, weighed.why, staying, doc)
    if weighed.decision == tradeoff.HOLD:
        return Move(True, weighed.why, (), doc)
    lead = "" if cap.enough else f"not enough healthy capacity to move the gang now ({cap.why}): "
    return Move(False, f"{lead}{weighed.why}; requeued once the node is back", (), doc)
