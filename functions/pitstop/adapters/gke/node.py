"""What ingest reads from a GKE cluster: the Node an entry names (its zone, its device plugin's word).

Ingest reads Nodes only, as its own identity, in the clusters the policy configures
(``clusters.<name>.gke``) and nowhere else; RBAC grants it ``nodes get`` (infra/gke/). Two uses:

* the zone of a regional cluster's node from ``spec.providerID`` (adapters/gke/zone.py);
* corroboration: the serial console is the route a GKE node's kernel lines usually take, and
  anyone on the VM can write it. The GPU device plugin's ``XidCriticalError`` condition comes
  from NVML, not from text; when it names the line's Xid under the node's current boot, the
  line is believed (core/trust.py ``xid_condition_confirms``).

A Node read is cached briefly, so a storm of lines about one node costs one read per
``ttl_s``. A cluster that cannot be reached leaves the line as it was (recorded, not acted on):
a line is never dropped or redelivered because the second signal is out of reach.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any

import urllib3
from google.auth.exceptions import GoogleAuthError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import ApiClient, gke_api_client, loopback_api_client
from pitstop.adapters.gke.objects import spec_of, text
from pitstop.adapters.gke.shapes import KubeObject
from pitstop.adapters.gke.zone import PROVIDER_ID
from pitstop.core import names, trust
from pitstop.core.domain import FaultEvent, NodeRef
from pitstop.core.policy import Policy

READ_TIMEOUT = (5, 10)  # connect, read (s): ingest must not wait long on a cluster
CONNECT_BACKOFF_S = 30.0  # after clusters.get or credentials failed


class KubeClients:
    """GKE cluster name → an ``ApiClient`` as Pitstop's own identity, made on first use.

    Only clusters the policy names with ``scheduler: gke`` are reachable; ``endpoint`` (the
    local stack's fake API server) stands in for every one of them when set.
    """

    def __init__(
        self,
        policy: Policy,
        project: str,
        endpoint: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint, self.clock = endpoint, clock
        self._failed_until: dict[str, float] = {}
        self.where: dict[str, tuple[str, str | None]] = {}
        for c in policy.clusters:
            if c.scheduler == "gke":
                conf: Mapping[str, object] = c.raw.get("gke") or {}
                loc = conf.get("location")
                self.where[str(conf.get("cluster") or c.name)] = (
                    str(conf.get("project") or project),
                    loc if isinstance(loc, str) else None,
                )
        self._clients: dict[str, ApiClient] = {}

    def clusters_in(self, project: str) -> list[str]:
        return [c for c, (p, _) in self.where.items() if p == project]

    def __call__(self, cluster: str, project: str | None = None) -> ApiClient:
        """The cluster's client, or None when Pitstop may not (or cannot say how to) reach it.

        With ``project``, a cluster of that name in another project is not this one.
        """
        if cluster not in self.where or (project is not None and self.where[cluster][0] != project):
            return None
        if cluster not in self._clients:
            if self._failed_until.get(cluster, 0.0) > self.clock():
                return None  # a storm does not ask a control plane that just failed, line after line
            try:
                api = self._connect(cluster)
            except (ActuatorError, GoogleAuthError, OSError) as exc:
                log.emit("WARNING", "cluster unreachable", cluster=cluster, error=repr(exc)[:200])
                self._failed_until[cluster] = self.clock() + CONNECT_BACKOFF_S
                return None
            if api is None:
                return None
            self._clients[cluster] = api
        return self._clients[cluster]

    def _connect(self, cluster: str) -> ApiClient:
        if self.endpoint:
            return loopback_api_client(self.endpoint, os.environ.get("PITSTOP_KUBE_TOKEN"))
        project, location = self.where[cluster]
        if location is None:
            return None
        import google.auth

        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return gke_api_client(project, location, cluster, creds)


class NodeReader:
    """(project, cluster, node) → the Node object, cached for ``ttl_s`` (None: absent or out of reach)."""

    def __init__(
        self,
        kube: KubeClients,
        ttl_s: float = 5.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.ttl_s, self.max_entries, self.clock = kube, ttl_s, max_entries, clock
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, KubeObject | None]] = OrderedDict()
        self.reads = 0  # answers not served from the cache (tests, metrics)

    def node(self, project: str, cluster: str, name: str) -> KubeObject | None:
        if not (names.valid_project(project) and names.valid_cluster(cluster) and names.valid_instance(name)):
            return None
        key, now = (project, cluster, name), self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        self.reads += 1
        obj = self._read(project, cluster, name)
        self._cache[key] = (now + self.ttl_s, obj)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return obj

    def _read(self, project: str, cluster: str, name: str) -> KubeObject | None:
        try:
            api = self.kube(cluster, project)
            if api is None:
                return None
            core = k8s.CoreV1Api(api)
            resp: Any = core.read_node(name, _preload_content=False, _request_timeout=READ_TIMEOUT)
            obj = json.loads(resp.data or b"{}")
        except ApiException as exc:
            if exc.status != 404:
                log.emit("WARNING", "reading the node failed", cluster=cluster, node=name, status=exc.status)
            return None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.emit("WARNING", "cluster unreachable", cluster=cluster, node=name, error=repr(exc)[:200])
            return None
        return obj if isinstance(obj, dict) else None

    def cluster_of(self, node: NodeRef) -> tuple[str, KubeObject] | None:
        """The configured cluster whose Node is this VM (its providerID names the same project,
        zone and instance), and the Node; None when no configured cluster has it."""
        project, zone, inst = node.get("project"), node.get("zone"), node.get("instance")
        for cluster in self.kube.clusters_in(str(project)):
            obj = self.node(str(project), cluster, str(inst))
            pid = text(spec_of(obj), "providerID") if obj is not None else None
            m = PROVIDER_ID.fullmatch(pid) if pid is not None else None
            if obj is not None and m is not None and m.groups() == (project, zone, inst):
                return cluster, obj
        return None


def corroborate(ev: FaultEvent, reader: NodeReader, watched: Collection[int] | None = None) -> FaultEvent:
    """The event believed when its node's device plugin confirms the Xid; else unchanged.

    A line that names no cluster (the serial console's entries are ``gce_instance``) is first
    placed in the configured GKE cluster that has its VM as a Node, which the event then names.
    """
    node, xid = ev["node"], ev["xid"]
    if not trust.wants_corroboration(ev, watched) or node is None or xid is None:
        return ev
    cluster = node.get("cluster")
    if isinstance(cluster, str):
        obj = reader.node(node["project"], cluster, node["instance"])
    else:
        found = reader.cluster_of(node)
        if found is None:
            return ev
        cluster, obj = found
        ev = {**ev, "node": {**node, "cluster": cluster}}
    why = trust.xid_condition_confirms(obj, xid) if obj is not None else None
    return trust.corroborated(ev, why) if why is not None else ev
