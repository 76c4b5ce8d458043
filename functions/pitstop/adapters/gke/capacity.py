"""Can the gang run again now, without the fenced node? Read-only: Kubernetes places the restarted
gang, not Pitstop, so this only counts what the scheduler will find."""

from __future__ import annotations

from pitstop.adapters.gke.client import Kube
from pitstop.adapters.gke.kinds import JobKind, Templates
from pitstop.adapters.gke.objects import (
    JobRef,
    allocatable_gpus,
    live,
    meta_of,
    name_of,
    node_name_of,
    owner_ref,
    placeable,
    pod_gpus,
    spec_of,
    sub,
)
from pitstop.adapters.gke.shapes import CapacityAnswer


def capacity(kube: Kube, kind: JobKind, ref: JobRef, node: str) -> CapacityAnswer:
    """A job Kueue admits is enough by itself (Kueue re-admits it when its ClusterQueue has quota);
    otherwise the gang's pods are fitted, first fit, onto Ready, healthy, schedulable nodes other
    than ``node`` that carry no Pitstop fence, whose taints they tolerate and whose labels match
    their nodeSelector, with the GPUs left by pods that are not the gang's own (those go when it
    restarts). Affinity, CPU and memory are not counted."""
    templates, kueue = kind.templates(ref)
    if templates is None:
        return {"enough": False, "need": None, "free": None, "why": f"{ref.id} no longer exists"}
    need = sum(n for n, _ in templates)
    if kueue is not None:
        why = f"Kueue admits {ref.id} ({kueue}): it re-admits the gang when its quota allows"
        return {"enough": True, "need": need, "free": None, "why": why}
    placed, hosts = _fit(kube, ref, node, templates)
    selectors = sorted({f"{k}={v}" for _, s in templates for k, v in sub(s, "nodeSelector").items()})
    sel = f" matching {', '.join(selectors)}" if selectors else ""
    where = f"healthy schedulable nodes{sel} besides {node}"
    why = (
        f"all {need} pods of {ref.id} fit on {hosts} {where}"
        if placed >= need
        else f"only {placed} of {need} pods of {ref.id} fit on {where}"
    )
    return {"enough": placed >= need, "need": need, "free": placed, "why": why}


def _fit(kube: Kube, ref: JobRef, node: str, templates: Templates) -> tuple[int, int]:
    """(pods placed, nodes used), first fit over the free GPUs of every other placeable node."""
    nodes = [n for n in kube.items("list nodes", kube.core.list_node) if meta_of(n).get("name") != node]
    free = {str(name_of(n)): allocatable_gpus(n) for n in nodes}
    for pod in kube.items("list pods", kube.core.list_pod_for_all_namespaces):
        where = node_name_of(pod)
        if where is not None and where in free and live(pod) and owner_ref(pod) != ref:
            free[where] -= pod_gpus(spec_of(pod))
    placed, hosts = 0, set()
    for count, pod_spec in templates:
        fits = [str(name_of(n)) for n in nodes if placeable(n, pod_spec)]
        want = pod_gpus(pod_spec)
        for _ in range(count):
            host = next((h for h in fits if free[h] >= want), None)
            if host is None:
                break
            free[host] -= want
            placed += 1
            hosts.add(host)
    return placed, len(hosts)
