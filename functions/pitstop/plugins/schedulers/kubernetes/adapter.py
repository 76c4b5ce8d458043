"""Any Kubernetes cluster on Compute Engine VMs as a scheduler (kubeadm, Rancher, k3s...), reached
through a kubeconfig instead of GKE's control-plane API.

The worked example of a scheduler folder (docs/architecture.md, Where a change goes): the cluster's objects,
fences, gangs (JobSets, batch Jobs, pods) and checks are the same Kubernetes as on GKE, so this
adapter is the GKE one with another way in. The kubeconfig is the content of an environment
variable (deploy maps it from Secret Manager: ``--set-secrets=<env>=<secret>:latest``), never a file
path a log line could name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import CheckSettings, GkeScheduler


def kubeconfig_env(cluster: str) -> str:
    """The variable holding a cluster's kubeconfig unless its policy names another."""
    return "PITSTOP_KUBECONFIG_" + cluster.upper().replace("-", "_")


class KubernetesScheduler(GkeScheduler):
    """The typed scheduler contract for a Kubernetes cluster reached by kubeconfig."""

    name = "kubernetes"

    @classmethod
    def from_policy(
        cls, cluster: str, conf: Mapping[str, object], env: Mapping[str, str] | None = None
    ) -> KubernetesScheduler:
        """Connected on first use; a missing or unreadable kubeconfig fails this cluster's steps (409)."""
        env = os.environ if env is None else env
        var = str(conf.get("kubeconfig_env") or kubeconfig_env(cluster))
        context = conf.get("context")
        context = context if isinstance(context, str) else None  # the policy schema: a string

        def connect() -> Any:
            from kubernetes import config

            text = env.get(var)
            if not text:
                raise ActuatorError(409, f"cluster {cluster}: no kubeconfig in ${var}", False)
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ActuatorError(
                    409, f"cluster {cluster}: ${var} is not a kubeconfig ({exc})", False
                ) from exc
            return config.new_client_from_config_dict(doc, context=context)  # type: ignore[no-untyped-call]

        given = conf.get("evict_deadline_s")
        deadline = float(given) if isinstance(given, int | float) and given else 120.0
        return cls(connect=connect, evict_deadline_s=deadline, checks=CheckSettings.from_conf(conf))
