"""Schedulers, one folder each: ``<name>/__init__.py`` defines ``build(cluster, wiring)``, which
returns the cluster's :class:`~pitstop.core.scheduling.Scheduler`; the folder's
``policy.schema.json`` is its block of a policy cluster (core/plugins.policy_schema), its
``plugin.yaml`` its order and deploy fragment. services/schedulers.py builds one per cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pitstop.core.policy import Cluster
from pitstop.core.scheduling import Scheduler


@dataclass(frozen=True)
class Wiring:
    """What the factories may need from the function that builds them."""

    project: str
    publisher: Any = None
    results: Any = None  # the Slurm results collection
    subscriber: Any = None
    kube_endpoint: str | None = None  # the local stack's fake API server stands in for every GKE cluster
    endpoints: tuple[tuple[str, str], ...] = ()  # a local stand-in per scheduler name (e.g. vertex)

    def endpoint(self, name: str) -> str | None:
        """The local stand-in that replaces this scheduler's API, if the caller runs one."""
        return dict(self.endpoints).get(name)


Factory = Callable[[Cluster, Wiring], Scheduler]
