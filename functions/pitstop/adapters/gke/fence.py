"""A node's fence: Pitstop's taint for one incident, and lifting only what Pitstop set.

**fence** adds the taint ``pitstop.dev/remediation=<incident>:NoSchedule`` and a label of the same
key (so later steps find the node by incident). It never sets ``spec.unschedulable``: a cordon
carries no owner, and ``kubectl cordon`` of a node already cordoned sends nothing at all (kubectl's
cordon helper patches only when ``spec.unschedulable`` differs: kubernetes/kubectl
pkg/drain/cordon.go, ``UpdateIfRequired``), so a person's cordon over Pitstop's would leave no trace
and be lifted at unfence (issue 35, 10). A NoSchedule taint keeps every pod that does not tolerate
it off the node as a cordon does (kubernetes.io/docs/concepts/scheduling-eviction/taint-and-
toleration/; the cordon itself is the taint ``node.kubernetes.io/unschedulable:NoSchedule``), and
it is Pitstop's by its key and the incident in its value. **unfence** removes that taint and
nothing else: any cordon stays, whoever set it and whenever. Whether the node was cordoned and
which other taints it had when fenced are kept as annotations written in the same patch
(``pitstop.dev/was-unschedulable``, ``pitstop.dev/taints-before``), for the answers. Every change
is a read-modify-write guarded by ``resourceVersion``.
"""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube
from pitstop.adapters.gke.objects import (
    CORDONED_BY,
    FENCE_KEY,
    INCIDENT,
    TAINTS_BEFORE,
    WAS_UNSCHEDULABLE,
    annotations_of,
    node_health,
    other_cordon_reason,
    refence_answer,
    spec_of,
    subs,
)
from pitstop.adapters.gke.shapes import KubeObject, NodeAnswer, NodePatch, Taint


def fence(kube: Kube, node: str, incident: str) -> NodeAnswer:
    """Taint the node for this incident; another's cordon is kept and reported.

    The answer mirrors the Slurm agent's drain: ``previous_state`` (schedulable | cordoned),
    ``previous_reason``, ``already_drained_by_other`` and ``reason`` (Pitstop's taint, or None
    when another Pitstop incident's fence already holds the node and was left alone).
    """
    if not INCIDENT.fullmatch(incident or ""):
        raise ActuatorError(400, f"not an incident id: {str(incident)[:40]!r}", False)
    taint: Taint = {"key": FENCE_KEY, "value": incident, "effect": "NoSchedule"}

    def decide(cur: KubeObject) -> tuple[NodePatch | None, NodeAnswer]:
        taints = subs(spec_of(cur), "taints")
        ours = next((t for t in taints if t.get("key") == FENCE_KEY), None)
        cordoned = bool(spec_of(cur).get("unschedulable"))
        if ours is not None:  # fenced already: this incident's (a retry) or another's
            return None, refence_answer(node, cur, ours, incident)
        answer: NodeAnswer = {
            "node": node,
            "previous_state": "cordoned" if cordoned else "schedulable",
            "previous_reason": other_cordon_reason(cur) if cordoned else None,
            "already_drained_by_other": cordoned,
            "reason": f"{FENCE_KEY}={incident}:NoSchedule",
        }
        patch: NodePatch = {
            "metadata": {
                "labels": {FENCE_KEY: incident},
                "annotations": {
                    WAS_UNSCHEDULABLE: "true" if cordoned else "false",
                    TAINTS_BEFORE: ",".join(sorted(_blocking(taints)))[:1000],
                },
            },
            "spec": {"taints": [*taints, taint]},
        }
        return patch, answer

    return kube.update_node(node, decide)


def unfence(kube: Kube, node: str, incident: str) -> NodeAnswer:
    """Lift Pitstop's taint for this incident; never a cordon.

    A cordon, or a taint someone else added while the fence held, stays; the answer then says
    ``left_drained: <what>`` and ``resumed: False``.
    """
    if not INCIDENT.fullmatch(incident or ""):
        raise ActuatorError(400, f"cannot tell which incident's fence to lift: {str(incident)[:40]!r}", False)

    def decide(cur: KubeObject) -> tuple[NodePatch | None, NodeAnswer]:
        taints = subs(spec_of(cur), "taints")
        ours = next((t for t in taints if t.get("key") == FENCE_KEY), None)
        cordoned = bool(spec_of(cur).get("unschedulable"))
        out: NodeAnswer = {"node": node, "state": "cordoned" if cordoned else "schedulable"}
        if ours is None:
            if cordoned:
                return None, {**out, "resumed": False, "left_drained": other_cordon_reason(cur)}
            return None, {**out, "resumed": False}
        if ours.get("value") != incident:
            other = f"{FENCE_KEY}={ours.get('value')} (another Pitstop incident's fence)"
            return None, {**out, "resumed": False, "left_drained": other}
        notes = annotations_of(cur)
        patch: NodePatch = {
            "metadata": {
                "labels": {FENCE_KEY: None},
                # CORDONED_BY: an earlier version's mark of its own cordon, which stays (see above)
                "annotations": {WAS_UNSCHEDULABLE: None, CORDONED_BY: None, TAINTS_BEFORE: None},
            },
            "spec": {"taints": [t for t in taints if t.get("key") != FENCE_KEY]},
        }
        if cordoned:
            before = (
                "cordoned before Pitstop's fence" if notes.get(WAS_UNSCHEDULABLE) == "true" else "cordoned"
            )
            return patch, {**out, "resumed": False, "left_drained": f"{before} ({other_cordon_reason(cur)})"}
        since = _blocking(taints) - set(filter(None, str(notes.get(TAINTS_BEFORE) or "").split(",")))
        if since:
            # someone else tainted it while Pitstop's fence held (an upgrade, auto-repair, a
            # remediator): their taint stays; Pitstop lifts only its own
            left = (
                f"tainted by someone else while Pitstop's fence held (new taints {', '.join(sorted(since))})"
            )
            return patch, {**out, "resumed": False, "left_drained": left}
        return patch, {**out, "resumed": True}

    return kube.update_node(node, decide)


# Taints the node lifecycle controller sets from the node's own conditions and the cordon itself:
# they come and go with the node, and say nothing about who fenced it.
_OWN_TAINTS = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def _blocking(taints: list[KubeObject]) -> set[str]:
    """Keys of taints that keep pods off the node, other than Pitstop's and the node's own."""
    return {
        str(t.get("key"))
        for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute")
        and t.get("key") != FENCE_KEY
        and not str(t.get("key")).startswith(_OWN_TAINTS)
    }


def node_healthy(kube: Kube, node: str) -> bool:
    cur = kube.node_or_none(node)
    ok, why = node_health(cur) if cur is not None else (False, "no such node (yet)")
    if not ok:
        log.emit("INFO", "gke node not healthy yet", node=node, why=why)
    return ok
