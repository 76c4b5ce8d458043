"""``pitstop doctor``: JobSets whose template cannot restart their gang after a disruption, and the
restart mechanisms of the cluster's own that Pitstop leaves a gang's restart to."""

from __future__ import annotations

from pitstop.adapters.gke.client import ApiClient, Kube, KubeApiError
from pitstop.adapters.gke.objects import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KUEUE_GROUP,
    KUEUE_VERSION,
    PINNED,
    WORKLOADS,
    annotations_of,
    meta_of,
    restart_blockers,
    spec_of,
    subs,
    tas_admitted,
)
from pitstop.adapters.gke.shapes import KubeObject

TOPOLOGIES = "topologies"


def doctor_findings(api_client: ApiClient) -> list[str]:
    """One line per JobSet whose template cannot restart its gang after a disruption.

    Pitstop's gang restart relies on the JobSet's own failure policy; without one (or with a
    Job that ignores DisruptionTarget) evicting a member fails the JobSet or replaces one pod.
    """
    kube = Kube(api_client)
    try:
        items = kube.items(
            "list jobsets", kube.custom.list_cluster_custom_object, JOBSET_GROUP, JOBSET_VERSION, JOBSETS
        )
    except KubeApiError as exc:
        if exc.status == 404:
            return []  # JobSet is not installed: nothing to check
        raise
    out: list[str] = []
    for js in items:
        where = f"jobset/{meta_of(js).get('namespace')}/{meta_of(js).get('name')}"
        out += [f"{where}: {why}" for why in restart_blockers(js)]
    return out


def native_mechanisms(api_client: ApiClient, kueue_replaces: bool = True) -> list[str]:
    """One line per restart mechanism of the cluster's own, and what Pitstop does with it.

    JobSet's failure policy restarts the whole gang once Pitstop evicted one pod; Kueue's Topology
    Aware Scheduling replaces a failed node of a workload it admitted with a topology assignment
    within its domain (TASFailedNodeReplacement, beta and on by default since v0.14:
    kubernetes-sigs/kueue site/.../concepts/topology_aware_scheduling.md), so Pitstop evicts only the
    fenced node's pods and does not restart that gang itself (``kueue_replaces``: the policy's
    ``gke.kueue_failed_node_replacement``)."""
    kube = Kube(api_client)
    jobsets = _listed(kube, JOBSET_GROUP, JOBSET_VERSION, JOBSETS)
    out = []
    if jobsets is not None:
        with_policy = sum(1 for js in jobsets if spec_of(js).get("failurePolicy"))
        out.append(
            f"jobset: {with_policy} of {len(jobsets)} JobSet(s) restart as a gang by their own failurePolicy"
            " (Pitstop evicts one pod of the current attempt; the JobSet controller restarts it once)"
        )
        out += _pinned(jobsets)
    topologies = _listed(kube, KUEUE_GROUP, KUEUE_VERSION, TOPOLOGIES)
    if not topologies:
        said = "not installed" if topologies is None else "no Topology"
        out.append(f"kueue: {said}: no topology-aware node replacement; Pitstop restarts Kueue jobs itself")
        return out
    for t in topologies:
        levels = ", ".join(str(lv.get("nodeLabel")) for lv in subs(spec_of(t), "levels"))
        out.append(f"kueue: Topology {meta_of(t).get('name')} (levels: {levels})")
    admitted = [w for w in _listed(kube, KUEUE_GROUP, KUEUE_VERSION, WORKLOADS) or [] if tas_admitted(w)]
    if kueue_replaces:
        out.append(
            f"kueue: {len(admitted)} workload(s) admitted with a topology assignment: Kueue replaces a failed"
            " node within its domain (TASFailedNodeReplacement); Pitstop evicts only the fenced node's pods"
        )
    else:
        out.append(
            f"kueue: {len(admitted)} workload(s) admitted with a topology assignment, but the policy says"
            " this Kueue does not replace failed nodes (gke.kueue_failed_node_replacement: false): Pitstop"
            " restarts them itself"
        )
    return out


def _pinned(jobsets: list[KubeObject]) -> list[str]:
    """The JobSets a move of Pitstop's left in a topology domain (adapters/gke/pin.py: the selector
    stays with the JobSet), each with its selector: what to lift by hand if the domain must go."""
    pinned = [js for js in jobsets if annotations_of(js).get(PINNED)]
    if not pinned:
        return []
    said = ", ".join(
        f"{meta_of(js).get('namespace')}/{meta_of(js).get('name')} ({annotations_of(js).get(PINNED)})"
        for js in pinned[:8]
    )
    more = f" and {len(pinned) - 8} more" if len(pinned) > 8 else ""
    return [f"jobset: {len(pinned)} JobSet(s) pinned to a topology domain by a Pitstop move: {said}{more}"]


def _listed(kube: Kube, group: str, version: str, plural: str) -> list[KubeObject] | None:
    """Every object of a custom resource in the cluster; None when its API is not served."""
    try:
        return kube.items(f"list {plural}", kube.custom.list_cluster_custom_object, group, version, plural)
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
