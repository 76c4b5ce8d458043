"""Faults and history put into a running local stack through the stand-ins' own doors.

The moves the demo's scenarios (tools/demo_runner.py) and the e2e tests both make: a kernel line
into a VM's ring buffer, a Spot preemption, an upcoming maintenance window, a node's remediation
history. Each scenario and each test decides what to check; only the moves are shared, so a
change to a demo scenario cannot change what a test means.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pitstop.core import engine
from pitstop.core.domain import Incident, NodeRef
from pitstop.local.compute_shapes import InstanceView, SystemEvent
from pitstop.local.stack import PROJECT, ZONE, Router, Stack, StackState, admin, emulator_env


def kernel_prints(state: StackState, node: str, line: str, facility: int = 0) -> None:
    """The node's kernel prints ``line``: its ring buffer holds it until the VM next boots (what
    corroboration reads through the scheduler); facility 1 is a line user space wrote to /dev/kmsg."""
    body = {"project": PROJECT, "zone": ZONE, "instance": node, "msg": line, "facility": facility}
    admin(state, "/_admin/kmsg", body)


def instance(state: StackState, node: str) -> InstanceView:
    """The fake Compute's record of the node's live VM (its id changes when it is recreated)."""
    found: InstanceView = next(i for i in admin(state, "/_admin/state")["instances"] if i["name"] == node)
    return found


def preempt(state: StackState, node: str) -> SystemEvent:
    """Compute preempts the node's Spot VM; returns the system event's LogEntry, to publish."""
    entry: SystemEvent = admin(state, "/_admin/preempt", {"project": PROJECT, "zone": ZONE, "instance": node})
    return entry


def maintenance(state: StackState, node: str, starts_in_s: float = 400) -> SystemEvent:
    """Compute schedules maintenance of the node's VM; returns the upcoming-maintenance LogEntry
    (its ``protoPayload.metadata.windowStartTime`` is when the window opens), to publish."""
    body = {"project": PROJECT, "zone": ZONE, "instance": node, "starts_in_s": starts_in_s}
    entry: SystemEvent = admin(state, "/_admin/maintenance", body)
    return entry


def lemon_history(db: Any, node: str, collection: str = "pitstop_nodes") -> None:
    """Three remediations in the last week: the node's next fault makes it a lemon (REPLACE_NODE)."""
    ref: NodeRef = {"project": PROJECT, "zone": ZONE, "instance": node, "instance_id": None}
    now = time.time()
    past = [{"at": now - d * 86400, "action": "RESET_GPU", "incident": f"past{d}"} for d in (1, 3, 6)]
    db.collection(collection).document(engine.node_key(ref)).set(
        {**engine.new_node(ref), "remediations": past}
    )


POISON = b"\x00this is not a log entry"


class Drives(Protocol):
    """What drives a stack in the demo and in the e2e tests alike (tools/demo_stage, tests/pipeline)."""

    router: Router
    state: StackState

    def fault(self, node: str, line: str, insert_id: str | None = None) -> Mapping[str, object]: ...

    def incidents(self, node: str) -> list[Incident]: ...

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any: ...


def poison_beside(drv: Drives, node: str, line: str) -> tuple[list[Any], list[Incident]]:
    """A message no parser accepts, published just before a good fault line on ``node``: the
    dead-lettered messages once the poison is there, and the node's new incidents once the good
    line made one (nothing else may be lost or stopped by the bad one)."""
    before = {i["id"] for i in drv.incidents(node)}
    drv.router.publish_raw(POISON)
    drv.fault(node, line)
    dead = drv.wait(dead_letter_reader(drv.state), 90, "the poison message in the dead-letter topic")

    def new() -> list[Incident]:
        return [i for i in drv.incidents(node) if i["id"] not in before]

    flowed = drv.wait(new, 30, "the good event beside it to flow")
    return dead, flowed


def dead_letter_reader(
    state: StackState, subscription: str = "events-dead-inspect"
) -> Callable[[], list[Any]]:
    """A pull of up to ten messages from the dead-letter topic's inspection subscription (each call
    takes what is there; an empty list when nothing was dead-lettered yet)."""
    from google.cloud import pubsub_v1

    with emulator_env(state.endpoints):
        sub = pubsub_v1.SubscriberClient()
    path = sub.subscription_path(PROJECT, subscription)

    def pull() -> list[Any]:
        return list(sub.pull(subscription=path, max_messages=10, timeout=5).received_messages)

    return pull


def close_with_unfence(state: StackState, db: Any, iid: str, by: str) -> Incident:
    """What `pitstop incidents --close ID --unfence` does, through the GKE adapter
    (services/close.py): the incident as it is after."""
    from pathlib import Path

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.core import policy as policy_mod
    from pitstop.services.close import close_incident
    from pitstop.services.schedulers import Wiring, schedulers_for

    pol = policy_mod.load(Path(state.workdir, "policy.yaml"))
    store = IncidentStore(db, pol.doc["store"]["collection_prefix"])
    schedulers = schedulers_for(pol, Wiring(PROJECT, kube_endpoint=state.endpoints["kube"]))
    close_incident(store, schedulers, iid, by, time.time(), unfence=True)
    closed = store.get(iid)
    if closed is None:
        raise KeyError(f"incident {iid} is gone after its close")
    return closed


class Driver:
    """What a driver of a running stack holds: the stack, the sink's Router (entries in), a
    Firestore client on its emulator and the cluster's node names. The demo's Stage and the e2e
    tests' pipeline are each one."""

    def __init__(self, stack: Stack) -> None:
        from google.cloud import firestore

        assert stack.state is not None
        self.stack, self.state = stack, stack.state
        self.router = Router(self.state)
        with emulator_env(self.state.endpoints):
            self.db = firestore.Client(project=PROJECT)
        self.nodes: list[str] = self.state.cluster["node_names"]
