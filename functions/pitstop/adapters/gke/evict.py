"""Eviction through the Eviction API: each pod with its own grace period (SIGTERM is Kubernetes'
checkpoint signal), PodDisruptionBudgets honoured (429 retried with backoff until a deadline, then
the error names the budget)."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client as k8s

from pitstop.adapters import retry
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube, KubeApiError
from pitstop.adapters.gke.objects import (
    JobRef,
    labels_of,
    live,
    meta_of,
    owner_ref,
    pdb_names,
    selector_matches,
    spec_of,
    sub,
)
from pitstop.adapters.gke.shapes import KubeObject

# A 429 (a budget refused, or its status not caught up) is tried again 0.5 s later, then twice as
# long each time up to 8 s, until the caller's deadline.
BUDGET_BACKOFF = retry.Backoff(0.5, 2.0, 8.0)


def _budget_refused(exc: Exception) -> bool:
    return isinstance(exc, KubeApiError) and exc.status == 429


class Evictor:
    def __init__(
        self, kube: Kube, deadline_s: float, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> None:
        self.kube, self.deadline_s, self.clock, self.sleep = kube, deadline_s, clock, sleep

    def evict(self, pod: KubeObject, deadline: float, uid: str | None = None) -> str:
        """Evict one pod with its own grace period: ``evicted``, ``gone`` (404) or ``replaced`` (409).

        A 429 (a PodDisruptionBudget, or its status not caught up) is retried with backoff until
        ``deadline``; then a final 409 names the budget.
        """
        ns, name = str(meta_of(pod).get("namespace")), str(meta_of(pod).get("name"))
        opts = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)) if uid else None
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=ns),
            delete_options=opts,
        )

        def attempt() -> str:
            try:
                self.kube.call(
                    f"evict pod {ns}/{name}", self.kube.core.create_namespaced_pod_eviction, name, ns, body,
                    _headers={"Content-Type": "application/json"},  # the client sends none by itself
                )  # fmt: skip
            except KubeApiError as exc:
                if exc.status == 404:
                    return "gone"
                if exc.status == 409 and uid:
                    return "replaced"
                if exc.status == 500 and "DisruptionBudget" in exc.detail + str(exc.body):
                    raise ActuatorError(409, f"cannot evict {ns}/{name}: {exc.detail}", False) from exc
                raise
            return "evicted"

        def blocked(exc: Exception) -> Exception:
            return self.blocked(pod, exc) if isinstance(exc, KubeApiError) else exc

        policy = retry.Policy(_budget_refused, backoff=BUDGET_BACKOFF, give_up=blocked)
        return retry.call(attempt, policy, sleep=self.sleep, clock=self.clock, deadline=deadline)

    def blocked(self, pod: KubeObject, exc: KubeApiError) -> ActuatorError:
        """The final error of an eviction a budget kept refusing: which budget, for the incident."""
        ns, name = meta_of(pod).get("namespace"), meta_of(pod).get("name")
        names = pdb_names(exc.body)
        if not names:
            try:
                pdbs = self.kube.items(
                    f"list pdbs in {ns}", self.kube.policy.list_namespaced_pod_disruption_budget, ns
                )
                pod_labels = labels_of(pod)
                names = sorted(
                    str(meta_of(b).get("name"))
                    for b in pdbs
                    if selector_matches(sub(spec_of(b), "selector"), pod_labels)
                )
            except ActuatorError:
                names = []
        by = f"PodDisruptionBudget {', '.join(names)}" if names else "a PodDisruptionBudget"
        return ActuatorError(
            409,
            f"eviction of pod {ns}/{name} blocked by {by} for {self.deadline_s:.0f}s "
            f"(429 {exc.detail}); relax the budget or move the pod, then retry",
            False,
        )

    def on_fenced(self, ref: JobRef, incident: str) -> list[str]:
        """Evict the job's live pods on the nodes fenced for this incident; the pods evicted or gone."""
        deadline = self.clock() + self.deadline_s
        done: list[str] = []
        for node in self.kube.fenced_nodes(incident):
            for pod in self.kube.pods_on(node):
                if owner_ref(pod) == ref and live(pod) and not meta_of(pod).get("deletionTimestamp"):
                    self.evict(pod, deadline)
                    done.append(f"{meta_of(pod).get('namespace')}/{meta_of(pod).get('name')}")
        return done
