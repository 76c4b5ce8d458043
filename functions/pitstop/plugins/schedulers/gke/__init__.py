"""GKE (adapters/gke/): a cluster's control plane from ``container.clusters.get``, connected on
first use so a cold start never waits on it; the local stack's fake API server stands in for it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pitstop.core.policy import Cluster
from pitstop.core.policy_types import GkeConfig
from pitstop.core.scheduling import Scheduler
from pitstop.plugins.schedulers import Wiring

if TYPE_CHECKING:
    from pitstop.adapters.gke import GkeScheduler


def build(c: Cluster, w: Wiring) -> Scheduler:
    return gke_scheduler(c.name, c.raw.get("gke"), w.project, w.kube_endpoint)


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
    replaces = conf.get("kueue_failed_node_replacement") is not False
    if kube_endpoint:
        return GkeScheduler(
            local_api_client(kube_endpoint),
            evict_deadline_s=deadline,
            checks=checks,
            stuck_terminating_s=stuck,
            kueue_replaces=replaces,
        )
    proj, cluster = str(conf.get("project") or project), str(conf.get("cluster") or name)
    location = conf.get("location")

    def connect() -> Any:
        if not isinstance(location, str):
            raise ActuatorError(409, f"cluster {name} has no gke.location in the policy", False)
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return gke_api_client(proj, location, cluster, credentials)

    return GkeScheduler(
        connect=connect,
        evict_deadline_s=deadline,
        checks=checks,
        stuck_terminating_s=stuck,
        kueue_replaces=replaces,
    )


def local_api_client(endpoint: str) -> Any:
    """A Kubernetes client for the local stack's fake API server, as this function's account."""
    from pitstop.adapters.gke import loopback_api_client

    return loopback_api_client(endpoint, os.environ.get("PITSTOP_KUBE_TOKEN"))
