"""The registry of schedulers: which adapter serves a cluster, built from its policy entry.

actuate and ``pitstop incidents --close`` hold one :class:`~pitstop.core.scheduling.Scheduler` per
cluster and never ask which kind it is. Adding a scheduler is one adapter module in adapters/
and one row in :data:`FACTORIES`, keyed by the policy's ``scheduler:`` value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pitstop.core.domain import CheckSpec
from pitstop.core.policy import Cluster, Policy
from pitstop.core.policy_types import GkeConfig

if TYPE_CHECKING:
    from pitstop.adapters.gke import GkeScheduler
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    FenceAnswer,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    Scheduler,
    StepRef,
    UnfenceAnswer,
)


@dataclass(frozen=True)
class Wiring:
    """What the factories may need from the function that builds them."""

    project: str
    publisher: Any = None
    results: Any = None  # the Slurm results collection
    subscriber: Any = None
    kube_endpoint: str | None = None  # the local stack's fake API server stands in for every GKE cluster


Factory = Callable[[Cluster, Wiring], Scheduler]


class NoScheduler:
    """Nodes outside any scheduler: nothing to fence, no jobs, healthy when the VM is."""

    name = "none"

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return []

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        return FenceAnswer()

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        return UnfenceAnswer(resumed=False)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        return "nothing: no scheduler"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return JobInfo(job, JobState.UNKNOWN)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return True

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        return RequeueOutcome(job, False, "no scheduler: nothing to requeue")

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(False, "no scheduler: nothing to requeue")

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)


def _slurm(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.adapters.slurm import ResultsMerger, SlurmAgentClient, SlurmScheduler

    conf = c.raw.get("slurm") or {}
    topic = conf.get("command_topic") or f"pitstop-slurm-{c.name}"
    subscriber = w.subscriber or _subscriber()
    sub_path = slurm_results_subscription(subscriber, w.project, c.name)
    client = SlurmAgentClient(
        w.publisher,
        w.publisher.topic_path(w.project, topic),
        w.results,
        merger=ResultsMerger(subscriber, sub_path, w.results),
    )
    return SlurmScheduler(client, str(conf.get("checkpoint_signal") or "SIGUSR1"))


def _gke(c: Cluster, w: Wiring) -> Scheduler:
    return gke_scheduler(c.name, c.raw.get("gke"), w.project, w.kube_endpoint)


def _kubernetes(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.adapters.gke import CheckSettings
    from pitstop.adapters.kubernetes import KubernetesScheduler

    conf = c.raw.get("kubernetes") or {}
    if w.kube_endpoint:  # the local stack's fake API server stands in for every cluster
        return KubernetesScheduler(local_api_client(w.kube_endpoint), checks=CheckSettings.from_conf(conf))
    return KubernetesScheduler.from_policy(c.name, conf)


# policy ``scheduler:`` -> how its adapter is built
FACTORIES: dict[str, Factory] = {"slurm": _slurm, "gke": _gke, "kubernetes": _kubernetes}


def schedulers_for(policy: Policy, wiring: Wiring) -> dict[str, Scheduler]:
    """The scheduler of each cluster in the policy (clusters with ``scheduler: none`` have none)."""
    return {c.name: FACTORIES[c.scheduler](c, wiring) for c in policy.clusters if c.scheduler in FACTORIES}


def slurm_results_subscription(subscriber: Any, project: str, cluster: str) -> str:
    """Where actuate reads a Slurm cluster's results (deploy: infra/resources.yaml); the agent
    publishes them to ``pitstop-slurm-<cluster>-results`` and holds no Firestore access."""
    path: str = subscriber.subscription_path(project, f"pitstop-slurm-{cluster}-results-actuate")
    return path


def _subscriber() -> Any:
    """A Pub/Sub subscriber, created only when a Slurm cluster needs one (the CLI passes none)."""
    from google.cloud.pubsub_v1 import SubscriberClient

    return SubscriberClient()


def gke_scheduler(name: str, gke: GkeConfig | None, project: str, kube_endpoint: str | None) -> GkeScheduler:
    """A GKE cluster's adapter, connected on first use (a cold start never waits on the cluster).

    In production the control plane comes from ``container.clusters.get`` for the policy's
    ``gke: {location, cluster?, project?}``, called as the function's own identity.
    """
    from pitstop.adapters.errors import ActuatorError
    from pitstop.adapters.gke import CheckSettings, GkeScheduler, gke_api_client
    from pitstop.adapters.gke.restart import STUCK_TERMINATING_S

    conf: Mapping[str, object] = gke or {}  # the policy schema checked its types
    deadline = float(gke.get("evict_deadline_s") or 120.0) if gke else 120.0
    checks = CheckSettings.from_conf(conf)
    stuck = float(gke.get("stuck_terminating_s", STUCK_TERMINATING_S)) if gke else STUCK_TERMINATING_S
    if kube_endpoint:
        return GkeScheduler(
            local_api_client(kube_endpoint),
            evict_deadline_s=deadline,
            checks=checks,
            stuck_terminating_s=stuck,
        )
    proj, cluster = str(conf.get("project") or project), str(conf.get("cluster") or name)
    location = conf.get("location")

    def connect() -> Any:
        if not isinstance(location, str):
            raise ActuatorError(409, f"cluster {name} has no gke.location in the policy", False)
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return gke_api_client(proj, location, cluster, credentials)

    return GkeScheduler(connect=connect, evict_deadline_s=deadline, checks=checks, stuck_terminating_s=stuck)


def local_api_client(endpoint: str) -> Any:
    """A Kubernetes client for the local stack's fake API server, as this function's account."""
    import os

    from pitstop.adapters.gke import loopback_api_client

    return loopback_api_client(endpoint, os.environ.get("PITSTOP_KUBE_TOKEN"))
