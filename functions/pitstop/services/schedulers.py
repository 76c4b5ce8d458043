"""The registry of schedulers: which adapter serves a cluster, built from its policy entry.

actuate and ``pitstop incidents --close`` hold one :class:`~pitstop.core.scheduling.Scheduler` per
cluster and never ask which kind it is. Adding a scheduler is one adapter module in adapters/
and one row in :data:`FACTORIES`, keyed by the policy's ``scheduler:`` value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pitstop.core.policy import Cluster, Policy

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

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        from pitstop.adapters.errors import ActuatorError

        raise ActuatorError(409, "no scheduler to run a check on the node through", False)


class DictScheduler(Protocol):
    """The older adapter shape: methods keyed by a ``<incident>-<step>`` string, answers as dicts."""

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]: ...
    def fence(self, node: str, incident: str, action: str, ctx: str) -> dict[str, Any] | None: ...
    def unfence(self, node: str, ctx: str, incident: str | None = None) -> dict[str, Any] | None: ...
    def checkpoint(self, job: str, signal: str, ctx: str) -> None: ...
    def job_info(self, job: str, ctx: str) -> dict[str, Any]: ...
    def node_healthy(self, node: str, ctx: str) -> bool: ...
    def requeue(self, job: str, ctx: str, restarts: int | None = None) -> None: ...
    def capacity(self, job: str, node: str, ctx: str) -> dict[str, Any]: ...
    def start_check(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]: ...
    def check_result(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]: ...


def job_of(doc: Mapping[str, Any], job: str | None = None) -> JobInfo:
    """A job as an adapter's dict describes it (``id`` or ``job``, ``state``, its run)."""
    return JobInfo(str(job or doc.get("id") or doc.get("job")), JobState.of(doc.get("state")), JobRun.of(doc))


class Translated:
    """An adapter of the dict shape behind the typed contract: the one place its answers are read."""

    def __init__(self, inner: DictScheduler, name: str, signal: str = "SIGUSR1", how: str = "") -> None:
        """``signal``: what the adapter's checkpoint sends; ``how``: how that asks the job to save
        its state, for the record (the signal itself when empty)."""
        self.inner, self.name, self.signal, self.how = inner, name, signal, how or signal

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [job_of(j) for j in self.inner.jobs_on(node, ref.key)]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        a = self.inner.fence(node, ref.incident, action, ref.key) or {}
        return FenceAnswer(
            a.get("previous_state"),
            a.get("previous_reason"),
            bool(a.get("already_drained_by_other")),
            a.get("reason"),
        )

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        a = self.inner.unfence(node, ref.key, ref.incident) or {}
        left = a.get("left_drained")
        return UnfenceAnswer(bool(a.get("resumed")), str(left)[:200] if left else None)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        self.inner.checkpoint(job, self.signal, ref.key)
        return self.how

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return job_of(self.inner.job_info(job, ref.key), job)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return bool(self.inner.node_healthy(node, ref.key))

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        outcome = getattr(self.inner, "requeue_outcome", None)
        if outcome is None:
            self.inner.requeue(job, ref.key, run.restarts)
            return RequeueOutcome(job, True, "requeued")
        a: Mapping[str, Any] = outcome(job, ref.key, run.restarts)
        return RequeueOutcome(job, not a.get("owner_action"), str(a.get("outcome")), a.get("owner_action"))

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        a = self.inner.capacity(job, node, ref.key)
        return Capacity(a.get("enough") is True, str(a.get("why") or ""), a.get("need"), a.get("free"))

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        a = self.inner.start_check(node, check, ref.key)
        return CheckStart(str(a.get("started") or check.get("name")), a.get("peer"), a.get("note"))

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        a = self.inner.check_result(node, check, ref.key)
        outputs = a.get("outputs") if isinstance(a.get("outputs"), Mapping) else {}
        return CheckResult(
            bool(a.get("done")), dict(outputs or {}), a.get("peer"), a.get("error"), a.get("note")
        )


def _slurm(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.adapters.scheduler import ResultsMerger, SlurmScheduler

    conf = c.raw.get("slurm") or {}
    topic = conf.get("command_topic") or f"pitstop-slurm-{c.name}"
    subscriber = w.subscriber or _subscriber()
    sub_path = slurm_results_subscription(subscriber, w.project, c.name)
    inner = SlurmScheduler(
        w.publisher,
        w.publisher.topic_path(w.project, topic),
        w.results,
        merger=ResultsMerger(subscriber, sub_path, w.results),
    )
    return Translated(inner, "slurm", str(conf.get("checkpoint_signal") or "SIGUSR1"))


def _gke(c: Cluster, w: Wiring) -> Scheduler:
    return gke_scheduler(c.name, c.raw.get("gke") or {}, w.project, w.kube_endpoint)


# policy ``scheduler:`` -> how its adapter is built
FACTORIES: dict[str, Factory] = {"slurm": _slurm, "gke": _gke}


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


def gke_scheduler(
    name: str, conf: Mapping[str, Any], project: str, kube_endpoint: str | None
) -> GkeScheduler:
    """A GKE cluster's adapter, connected on first use (a cold start never waits on the cluster).

    In production the control plane comes from ``container.clusters.get`` for the policy's
    ``gke: {location, cluster?, project?}``, called as the function's own identity.
    """
    from pitstop.adapters.errors import ActuatorError
    from pitstop.adapters.gke import CheckSettings, GkeScheduler, gke_api_client

    deadline = float(conf.get("evict_deadline_s") or 120.0)
    checks = CheckSettings.from_conf(conf)
    if kube_endpoint:
        return GkeScheduler(local_api_client(kube_endpoint), evict_deadline_s=deadline, checks=checks)
    proj, cluster = str(conf.get("project") or project), str(conf.get("cluster") or name)
    location = conf.get("location")

    def connect() -> Any:
        if not isinstance(location, str):
            raise ActuatorError(409, f"cluster {name} has no gke.location in the policy", False)
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return gke_api_client(proj, location, cluster, credentials)

    return GkeScheduler(connect=connect, evict_deadline_s=deadline, checks=checks)


def local_api_client(endpoint: str) -> Any:
    """A Kubernetes client for an unauthenticated loopback API server (the local stack's fake)."""
    from kubernetes import client as k8s

    cfg: Any = k8s.Configuration()
    cfg.host = endpoint.rstrip("/")
    return k8s.ApiClient(cfg)
