"""The moves a scenario makes on the GKE stand-in, through its HTTP API as a user would.

A JobSet gang on chosen nodes (free to move to spares once it runs), where its current attempt
runs, its restarts, the GPU device plugin's reaction to an Xid, whether a node is back in service,
what a watch saw Pitstop do to a node or a pod. The demo's GKE scenarios (tools/demo_runner.py)
and the e2e tests (tests/pipeline.py) each write their own checks over these moves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from pitstop.core.domain import JsonObject
from pitstop.local.gke_stack import (
    FENCE_KEY,
    GPU,
    GPUS_PER_NODE,
    JOBSET_LABEL,
    POOL_LABEL,
    Kube,
    jobset,
    jobset_summary,
    node_summary,
    running,
)

POD_GRACE_S = 30  # the gangs' terminationGracePeriodSeconds: what a checkpoint gets after SIGTERM
Wait = Callable[[Callable[[], Any], float, str], Any]


@dataclass
class Gang:
    """One scenario's JobSet: where it started, and the nodes it may move to."""

    name: str
    members: list[str]
    spares: list[str]


class Gangs:
    """JobSets placed on named nodes of the fake API server, and what became of them and their nodes."""

    def __init__(self, url: str, wait: Wait) -> None:
        self.kube, self.wait = Kube(url), wait

    def gang(self, name: str, members: list[str], spares: list[str]) -> Gang:
        """A JobSet running on exactly ``members``, free to move to ``spares`` once it started."""
        for n in members:
            self.kube.label_node(n, POOL_LABEL, name)
        self.kube.create_jobset(jobset(name, len(members), pool=name, grace_s=POD_GRACE_S))
        self.wait(
            lambda: self.placed(name) == sorted(members) and running(self.kube, name) == len(members),
            30,
            f"JobSet {name} to run on {members}",
        )
        for n in spares:
            self.kube.label_node(n, POOL_LABEL, name)
        return Gang(name, members, spares)

    def placed(self, name: str) -> list[str]:
        """The nodes the JobSet's current attempt runs on."""
        js = self.kube.jobset(name)
        return (
            [] if js is None else list(jobset_summary(js, self.kube.pods(f"{JOBSET_LABEL}={name}"))["nodes"])
        )

    def restarts(self, name: str) -> int:
        """The JobSet's ``status.restarts`` (-1: no such JobSet)."""
        js = self.kube.jobset(name)
        return -1 if js is None else int((js.get("status") or {}).get("restarts") or 0)

    def pinned(self, name: str) -> str:
        """The topology nodeSelector a move Pitstop placed left on the JobSet (its
        ``pitstop.dev/pinned`` annotation; empty: none)."""
        js = self.kube.jobset(name)
        return (
            ""
            if js is None
            else str(((js.get("metadata") or {}).get("annotations") or {}).get("pitstop.dev/pinned", ""))
        )

    def moved(self, g: Gang, bad: list[str]) -> list[str]:
        """Once the gang runs again in full, the nodes it runs on (none of them ``bad``)."""
        want = len(g.members)

        def off_bad() -> list[str] | None:
            where = self.placed(g.name)
            ok = len(where) == want and running(self.kube, g.name) == want and not set(where) & set(bad)
            return where if ok else None

        where: list[str] = self.wait(off_bad, 60, f"JobSet {g.name} to run again off {bad}")
        return where

    def done_with(self, g: Gang) -> None:
        """Remove the gang and its pool labels, so its nodes are free for the next one."""
        self.kube.delete_jobset(g.name)
        self.wait(lambda: not self.kube.pods(f"{JOBSET_LABEL}={g.name}"), 60, f"JobSet {g.name}'s pods to go")
        for n in [*g.members, *g.spares]:
            self.kube.label_node(n, POOL_LABEL, None)

    def device_plugin_xid(self, node: str, xid: int) -> None:
        """What GKE's GPU device plugin does on a critical Xid: XidCriticalError under this boot, one
        GPU less allocatable (reference/gke.md §2); only a reboot clears them."""
        boot = self.kube.node(node)["status"]["nodeInfo"]["bootID"]
        cond = {"type": "XidCriticalError", "status": "True", "reason": json.dumps({str(xid): True})}
        status = {"conditions": [{**cond, "message": boot}], "allocatable": {GPU: str(GPUS_PER_NODE - 1)}}
        self.kube.set_node_status(node, status)

    def node_back(self, node: str) -> bool:
        """In service: Ready, schedulable, no Pitstop taint, every GPU allocatable, no Xid condition."""
        n = node_summary(self.kube.node(node))
        pitstop = [t for t in n["taints"] if t.startswith(FENCE_KEY)]
        return bool(
            n["ready"]
            and not n["unschedulable"]
            and not pitstop
            and n["gpu_allocatable"] == GPUS_PER_NODE
            and not n["xid_critical"]
        )


def fenced_by(events: list[JsonObject], node: str, iid: str) -> bool:
    """Whether a node watch saw the node carry Pitstop's taint for this incident (its fence)."""
    taint = {"key": FENCE_KEY, "value": iid, "effect": "NoSchedule"}
    return any(
        e["object"]["metadata"]["name"] == node
        and any({k: t.get(k) for k in taint} == taint for t in e["object"]["spec"].get("taints") or [])
        for e in events
    )


class Eviction(TypedDict):
    pod: str
    at: float
    grace: int | None


def evictions(events: list[JsonObject], node: str) -> list[Eviction]:
    """Pods on the node a pod watch saw evicted through the Eviction API: when, and the grace
    period their deletion started with."""
    out: dict[str, Eviction] = {}
    for e in events:
        pod = e["object"]
        conds = (pod.get("status") or {}).get("conditions") or []
        evicted = any(
            c["type"] == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI" for c in conds
        )
        if pod.get("spec", {}).get("nodeName") != node or not evicted:
            continue
        name = pod["metadata"]["name"]
        seen = out.setdefault(name, {"pod": name, "at": e["at"], "grace": None})
        if seen["grace"] is None:  # the grace period the deletion started with (it ends at 0)
            seen["grace"] = pod["metadata"].get("deletionGracePeriodSeconds")
    return list(out.values())
