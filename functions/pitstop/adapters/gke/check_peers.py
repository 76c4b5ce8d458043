"""A validation's NCCL peer: chosen among the cluster's healthy nodes, its Job made, then deleted.

A part of the GKE checks by responsibility (check_runs.GkeChecks holds one): the only part that
looks beyond the fenced node (every node and pod, for free GPUs) and the only one that deletes a
Job. Choosing is idempotent: the peer an earlier attempt chose is read back from its Job.
"""

from __future__ import annotations

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.check_jobs import CheckJobs
from pitstop.adapters.gke.checks import (
    CHECK_NODE_ANNOTATION,
    INSTANCE_TYPE_LABEL,
    NODEPOOL_LABEL,
    CheckSettings,
    check_job,
    peer_name,
)
from pitstop.adapters.gke.client import Kube, KubeApiError
from pitstop.adapters.gke.objects import (
    GPU_RESOURCE,
    allocatable_gpus,
    annotations_of,
    labels_of,
    live,
    meta_of,
    name_of,
    node_name_of,
    placeable,
    pod_gpus,
    spec_of,
    text,
    valid_object_name,
)
from pitstop.adapters.gke.shapes import KubeObject, PodSpec


class CheckPeers:
    """The NCCL peers of one cluster's validations."""

    def __init__(self, kube: Kube, settings: CheckSettings, jobs: CheckJobs) -> None:
        self.kube, self.settings, self.jobs = kube, settings, jobs

    def ensure(
        self,
        node: str,
        cur: KubeObject,
        name: str,
        gpus: int,
        pinned: str | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> tuple[str | None, str]:
        """The peer of a validation: the one an earlier attempt chose, else a healthy node with ``gpus``
        free GPUs (same machine type, same node pool first), none in ``skip``, its Job created.
        (peer, why none)."""
        peer_job = peer_name(name)
        found = check_job(self.kube, self.settings.namespace, peer_job)
        if found is not None:
            return text(annotations_of(found), CHECK_NODE_ANNOTATION) or None, ""
        peer = pinned if pinned and valid_object_name(pinned) else self.choose(node, cur, gpus, skip)
        if peer is None:
            kind = text(labels_of(cur), INSTANCE_TYPE_LABEL)
            return None, (
                f"no healthy Ready node{' of type ' + kind if kind else ''} without Pitstop's taint has "
                f"{gpus} free GPUs: NCCL all_gather skipped"
            )
        body = self.jobs.peer_job(peer_job, name, peer, gpus)
        try:
            ns = self.settings.namespace
            self.kube.call(f"create job {ns}/{peer_job}", self.kube.batch.create_namespaced_job, ns, body)
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = check_job(self.kube, self.settings.namespace, peer_job)
            return (text(annotations_of(found), CHECK_NODE_ANNOTATION) or None) if found else None, ""
        return peer, ""

    def choose(self, node: str, cur: KubeObject, gpus: int, skip: frozenset[str] = frozenset()) -> str | None:
        spec: PodSpec = {"tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}
        kind, pool = labels_of(cur).get(INSTANCE_TYPE_LABEL), labels_of(cur).get(NODEPOOL_LABEL)
        nodes = [
            n for n in self.kube.items("list nodes", self.kube.core.list_node)
            if meta_of(n).get("name") != node and meta_of(n).get("name") not in skip and placeable(n, spec)
            and (kind is None or labels_of(n).get(INSTANCE_TYPE_LABEL) == kind)
            and valid_object_name(meta_of(n).get("name"))
        ]  # fmt: skip
        free = {str(name_of(n)): allocatable_gpus(n) for n in nodes}
        for pod in self.kube.items("list pods", self.kube.core.list_pod_for_all_namespaces):
            where = node_name_of(pod)
            if where is not None and where in free and live(pod):
                free[where] -= pod_gpus(spec_of(pod))
        ok = [n for n in nodes if free[str(name_of(n))] >= max(gpus, 1)]
        ok.sort(key=lambda n: (labels_of(n).get(NODEPOOL_LABEL) != pool, str(name_of(n))))
        return str(name_of(ok[0])) if ok else None

    def delete(self, name: str) -> None:
        ns, peer = self.settings.namespace, peer_name(name)
        try:
            self.kube.call(f"delete job {ns}/{peer}", self.kube.batch.delete_namespaced_job, peer, ns,
                       propagation_policy="Background")  # fmt: skip
        except ActuatorError as exc:
            if exc.status != 404:
                log.emit(
                    "WARNING",
                    "gke check: peer job not deleted (its deadline ends it)",
                    job=peer,
                    error=str(exc)[:300],
                )
