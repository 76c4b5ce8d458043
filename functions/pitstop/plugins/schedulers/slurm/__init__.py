"""Slurm through Pitstop's agent on the login node (adapters/slurm.py): commands out on the
cluster's topic, results back on its results topic; the agent holds no Firestore access."""

from __future__ import annotations

from typing import Any

from pitstop.core.policy import Cluster
from pitstop.core.scheduling import Scheduler
from pitstop.plugins.schedulers import Wiring


def build(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.adapters.slurm import ResultsMerger, SlurmAgentClient, SlurmScheduler

    conf = c.block("slurm")
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


def slurm_results_subscription(subscriber: Any, project: str, cluster: str) -> str:
    """Where actuate reads a Slurm cluster's results (deploy: infra/resources.yaml); the agent
    publishes them to ``pitstop-slurm-<cluster>-results`` and holds no Firestore access."""
    path: str = subscriber.subscription_path(project, f"pitstop-slurm-{cluster}-results-actuate")
    return path


def _subscriber() -> Any:
    """A Pub/Sub subscriber, created only when a Slurm cluster needs one (the CLI passes none)."""
    from google.cloud.pubsub_v1 import SubscriberClient

    return SubscriberClient()
