"""Can the gang run again now, without the fenced node? Read-only: Kubernetes places the restarted
gang, not Pitstop, so this only counts what the scheduler will find, and says where each node sits
(its ``cloud.google.com/gce-topology-*`` labels) so the gang's choice can be weighed."""

from __future__ import annotations

from pitstop.adapters.gke.client import Kube
from pitstop.adapters.gke.kinds import JobKind, Templates
from pitstop.adapters.gke.objects import (
    JobRef,
    allocatable_gpus,
    annotations_of,
    labels_of,
    live,
    meta_of,
    name_of,
    node_name_of,
    out_of_service,
    owner_ref,
    placeable,
    pod_gpus,
    spec_of,
    sub,
    tas_admitted,
)
from pitstop.adapters.gke.pin import OPT_OUT
from pitstop.adapters.gke.shapes import CapacityAnswer, KubeObject
from pitstop.core import topology

TOPOLOGY_LABELS = (topology.BLOCK_LABEL, topology.SUBBLOCK_LABEL, topology.HOST_LABEL, topology.MACHINE_LABEL)
KUEUE_TAS = "kueue-tas"


def capacity(
    kube: Kube, kind: JobKind, ref: JobRef, node: str, kueue_replaces: bool = True
) -> CapacityAnswer:
    """A job Kueue admits is enough by itself (Kueue re-admits it when its ClusterQueue has quota);
    otherwise the gang's pods are fitted, first fit, onto Ready, healthy, schedulable nodes other
    than ``node`` that carry no Pitstop fence, whose taints they tolerate and whose labels match
    their nodeSelector, with the GPUs left by pods that are not the gang's own (those go when it
    restarts). Affinity, CPU and memory are not counted.

    The answer names the gang's nodes and the spare nodes a pod of it fits on, with their topology
    labels, and the gang's other nodes that do not come back with it (``unusable``: another fence,
    a cordon, NotReady or unhealthy, or gone, so the gang's choice does not pin a pod there);
    ``native`` is ``kueue-tas`` when Kueue admitted it with a topology assignment and replaces a
    failed node within its domain itself (``kueue_replaces``: TASFailedNodeReplacement, beta and on
    by default since Kueue v0.14); ``places``: Pitstop can restart the gang in the domain the
    choice names (a JobSet Kueue does not queue, not opted out, on nodes with GKE's topology
    labels: pin.py).
    """
    templates, kueue = kind.templates(ref)
    if templates is None:
        return {"enough": False, "need": None, "free": None, "why": f"{ref.id} no longer exists"}
    need = sum(n for n, _ in templates)
    nodes = kube.items("list nodes", kube.core.list_node)
    pods = kube.items("list pods", kube.core.list_pod_for_all_namespaces)
    gang, spares, labels = _where(nodes, pods, ref, node, templates)
    out: CapacityAnswer = {"enough": False, "need": need, "free": None, "why": "", "nodes": gang,
                           "spares": spares, "labels": labels,
                           "unusable": _unusable(nodes, gang, node)}  # fmt: skip
    if kueue is not None:
        out["why"] = f"Kueue admits {ref.id} ({kueue}): it re-admits the gang when its quota allows"
        out["enough"] = True
        out["native"] = KUEUE_TAS if kueue_replaces and _tas(kube, ref) else None
        out["places"] = False  # Kueue owns its suspend and its templates (pin.py)
        return out
    known = all(topology.BLOCK_LABEL in labels.get(n, {}) for n in gang)  # a domain to pin it to
    out["places"] = known and _pinnable(kube, ref)
    placed, hosts = _fit(nodes, pods, ref, node, templates)
    selectors = sorted({f"{k}={v}" for _, s in templates for k, v in sub(s, "nodeSelector").items()})
    sel = f" matching {', '.join(selectors)}" if selectors else ""
    said = f"healthy schedulable nodes{sel} besides {node}"
    out["why"] = (
        f"all {need} pods of {ref.id} fit on {hosts} {said}"
        if placed >= need
        else f"only {placed} of {need} pods of {ref.id} fit on {said}"
    )
    out["enough"], out["free"] = placed >= need, placed
    return out


def _pinnable(kube: Kube, ref: JobRef) -> bool:
    """A JobSet its owner did not opt out of pinning: Pitstop can restart it in a domain (pin.py)."""
    js = kube.jobset(ref) if ref.kind == "jobset" else None
    return js is not None and annotations_of(js).get(OPT_OUT) != "off"


def _tas(kube: Kube, ref: JobRef) -> bool:
    js = kube.jobset(ref) if ref.kind == "jobset" else None
    return js is not None and tas_admitted(kube.workload(ref.namespace, meta_of(js).get("uid")))


def _where(
    nodes: list[KubeObject], pods: list[KubeObject], ref: JobRef, node: str, templates: Templates
) -> tuple[list[str], list[str], dict[str, dict[str, str]]]:
    """The gang's nodes, the spares a pod of it fits on (by name), and each one's topology labels."""
    gang = sorted({n for p in pods if owner_ref(p) == ref and live(p) and (n := node_name_of(p))} | {node})
    free = _free(nodes, pods, ref)
    want = max((pod_gpus(s) for _, s in templates), default=0)
    spares = [
        str(name_of(n))
        for n in sorted(nodes, key=lambda n: str(name_of(n)))
        if str(name_of(n)) not in gang
        and free.get(str(name_of(n)), 0) >= want
        and all(placeable(n, s) for _, s in templates)
    ][:64]
    labels = {
        str(name_of(n)): {k: str(v) for k, v in labels_of(n).items() if k in TOPOLOGY_LABELS}
        for n in nodes
        if str(name_of(n)) in {*gang, *spares}
    }
    return gang, spares, labels


def _unusable(nodes: list[KubeObject], gang: list[str], node: str) -> list[str]:
    """The gang's members besides ``node`` that are out of service now or no longer exist."""
    by_name = {str(name_of(n)): n for n in nodes}
    return [m for m in gang if m != node and (m not in by_name or out_of_service(by_name[m]) is not None)]


def _free(nodes: list[KubeObject], pods: list[KubeObject], ref: JobRef) -> dict[str, int]:
    """Each node's GPUs left by pods that are not the gang's own (those go when it restarts)."""
    free = {str(name_of(n)): allocatable_gpus(n) for n in nodes}
    for pod in pods:
        where = node_name_of(pod)
        if where is not None and where in free and live(pod) and owner_ref(pod) != ref:
            free[where] -= pod_gpus(spec_of(pod))
    return free


def _fit(
    nodes: list[KubeObject], pods: list[KubeObject], ref: JobRef, node: str, templates: Templates
) -> tuple[int, int]:
    """(pods placed, nodes used), first fit over the free GPUs of every other placeable node."""
    others = [n for n in nodes if meta_of(n).get("name") != node]
    free = _free(others, pods, ref)
    placed, hosts = 0, set()
    for count, pod_spec in templates:
        fits = [str(name_of(n)) for n in others if placeable(n, pod_spec)]
        want = pod_gpus(pod_spec)
        for _ in range(count):
            host = next((h for h in fits if free[h] >= want), None)
            if host is None:
                break
            free[host] -= want
            placed += 1
            hosts.add(host)
    return placed, len(hosts)
