"""Any Kubernetes cluster on Compute Engine VMs as a scheduler, by kubeconfig: the worked example
of a scheduler folder (README, "Where a change goes"). Its code (``adapter.py``), its policy block
(``policy.schema.json``), its manifest (``plugin.yaml``); its local stand-in is the fake API server
the GKE stack runs (local/fake_k8s.py), reached through ``Wiring.kube_endpoint``."""

from __future__ import annotations

from pitstop.core.policy import Cluster
from pitstop.core.scheduling import Scheduler
from pitstop.plugins.schedulers import Wiring


def build(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.adapters.gke import CheckSettings
    from pitstop.plugins.schedulers.gke import local_api_client
    from pitstop.plugins.schedulers.kubernetes.adapter import KubernetesScheduler

    conf = c.block("kubernetes")
    if w.kube_endpoint:  # the local stack's fake API server stands in for every cluster
        return KubernetesScheduler(local_api_client(w.kube_endpoint), checks=CheckSettings.from_conf(conf))
    return KubernetesScheduler.from_policy(c.name, conf)
