"""The zone of a GKE cluster's node, which its log entries do not carry.

A ``k8s_node`` entry names the cluster's location: a regional cluster's region
(reference/gke.md §1), a zonal cluster's own zone even for its nodes in other zones; but every
node action, budget and node key needs the zone. Ingest asks this resolver before the engine
sees the event, in this order:

1. the Node's ``spec.providerID`` (``gce://PROJECT/ZONE/INSTANCE``), through a Kubernetes
   client configured for the entry's cluster (one read, no Compute quota);
2. Compute ``instances.get`` of the instance name (GKE node name == instance name) in each zone
   of the entry's cluster inside the entry's region. The cluster's zones come from the Container
   API's ``clusters.get`` (its ``locations`` and its node pools' ``locations``: the zones its
   nodes may be in; ingest holds ``roles/container.clusterViewer`` there), cached. Exactly one
   zone must hold the instance. The grant behind it is ``compute.instances.get`` with an IAM
   condition admitting only ``gke-*`` instances of the cluster's region (infra/iam.yaml,
   tools/deploy.py ``node_lookup_conditions``): no list call, no other VM of the project.

Either answer must name the same project and instance and lie inside the entry's region.
Answers are cached (bounded, with a TTL); misses are cached for a shorter time, so a storm of
lines about one node costs one lookup, not one per line.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.auth.exceptions import GoogleAuthError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import retry
from pitstop.adapters.gke.client import CONTAINER_API, ApiClient
from pitstop.adapters.gke.objects import as_object, spec_of, subs, text
from pitstop.core import names
from pitstop.core.domain import FaultEvent

LOOKUP_TIMEOUT_S = 5.0
LOOKUP_RETRY = gretry.Retry(initial=0.2, maximum=2.0, timeout=10.0)
CLUSTER_ATTEMPTS = 3  # clusters.get: tries on 429/5xx/connection errors, 0.2 s then 0.4 s apart
# GKE names every node VM gke-<cluster>-<pool>-<hash>-<suffix>; the lookup grant's condition
# admits only instances so named (infra/roles/pitstop-node-lookup.yaml), so no other is asked.
GKE_NODE_PREFIX = "gke-"

# Strict: one project (optionally domain-scoped), one zone, one RFC 1035 instance name.
PROVIDER_ID = re.compile(
    r"gce://((?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9])"
    r"/([a-z]+(?:-[a-z]+)*[0-9]+-[a-z])/([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)",
    re.ASCII,
)


class ZoneLookupError(Exception):
    """A lookup that could not be made now (an API unreachable or refusing): worth a retry."""


@dataclass(frozen=True)
class ZoneAnswer:
    """The zone (None when not found) and how it was found, or why not."""

    zone: str | None
    how: str
    transient: bool = False  # the source could not be asked now (not an answer to cache)


def zone_from_provider_id(provider_id: object, project: str, region: str, instance: str) -> ZoneAnswer:
    """The zone in a Node's providerID, if the ID is well-formed and names this project and instance."""
    m = PROVIDER_ID.fullmatch(provider_id) if isinstance(provider_id, str) else None
    if m is None:
        return ZoneAnswer(None, "node spec.providerID is not gce://PROJECT/ZONE/INSTANCE")
    p, zone, inst = m.groups()
    if p != project or inst != instance:
        return ZoneAnswer(None, "node spec.providerID names another project or instance")
    if not names.zone_in_region(zone, region):
        return ZoneAnswer(None, f"node spec.providerID zone {zone} is not in region {region}")
    return ZoneAnswer(zone, "node spec.providerID")


class ClusterZones:
    """(project, location, cluster) → the zones its nodes may be in, from ``clusters.get``, cached.

    ``session`` is a ``requests``-style session (production: google-auth's ``AuthorizedSession``
    as Pitstop's own identity, made on first use); ``endpoint`` the Container API's root.
    """

    def __init__(
        self,
        session: Any = None,
        endpoint: str | None = None,
        ttl_s: float = 3600.0,
        miss_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._session, self.endpoint = session, (endpoint or CONTAINER_API).rstrip("/")
        self.ttl_s, self.miss_ttl_s, self.clock, self.sleep = ttl_s, miss_ttl_s, clock, sleep
        self._cache: dict[tuple[str, str, str], tuple[float, list[str]]] = {}

    def session(self) -> Any:
        if self._session is None:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            self._session = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
        return self._session

    def __call__(self, project: str, location: str, cluster: str) -> list[str]:
        """The cluster's node zones ([] when there is no such cluster); ``ZoneLookupError`` when
        the Container API cannot answer now."""
        key = (project, location, cluster)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self.clock():
            return hit[1]
        zones = self._get(project, location, cluster)
        self._cache[key] = (self.clock() + (self.ttl_s if zones else self.miss_ttl_s), zones)
        return zones

    def _get(self, project: str, location: str, cluster: str) -> list[str]:
        url = f"{self.endpoint}/projects/{project}/locations/{location}/clusters/{cluster}"

        def attempt() -> list[str]:
            try:
                resp = self.session().get(url, timeout=LOOKUP_TIMEOUT_S)
            except GoogleAuthError as exc:  # no credentials, or a token that cannot be refreshed now
                raise ZoneLookupError(f"clusters.get {cluster}: {str(exc)[:200]}") from exc
            except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
                raise _UnansweredError(f"Container API unreachable ({type(exc).__name__})") from exc
            if resp.status_code == 200:
                return cluster_zones(resp.json())
            if resp.status_code == 404:
                return []
            why = f"clusters.get {cluster}: {resp.status_code} {resp.text[:200]}"
            if resp.status_code != 429 and resp.status_code < 500:
                raise ZoneLookupError(why)  # a refusal (403 ...) does not change on a retry now
            raise _UnansweredError(why)

        return retry.call(attempt, CLUSTER_RETRY, sleep=self.sleep)


class _UnansweredError(ZoneLookupError):
    """clusters.get unreachable, or answering 429 / 5xx: worth another attempt now."""


CLUSTER_RETRY = retry.Policy(
    lambda exc: isinstance(exc, _UnansweredError),
    CLUSTER_ATTEMPTS,
    retry.Backoff(0.2),
    lambda exc: ZoneLookupError(str(exc)),  # the last attempt's why
)


def cluster_zones(cluster: object) -> list[str]:
    """The zones a ``clusters.get`` answer places nodes in: the cluster's ``locations`` and each
    node pool's (a pool may be created with its own). Container API v1 ``Cluster.locations`` and
    ``NodePool.locations``, "the zones in which the ... nodes should be located":
    cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters"""
    doc = as_object(cluster)
    found = [z for obj in (doc, *subs(doc, "nodePools")) for z in _list(obj.get("locations"))]
    return sorted({z for z in found if isinstance(z, str) and names.valid_zone(z)})


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, list) else []


class ZoneResolver:
    """(project, region, instance[, cluster]) → zone, cached.

    ``kube_for(cluster)`` gives an ``ApiClient`` for a cluster Pitstop may read (None if none);
    ``instances`` is a ``compute_v1.InstancesClient`` (anything with ``get``); ``clusters`` a
    ``ClusterZones`` (the zones to ask ``instances.get`` in).
    """

    def __init__(
        self,
        kube_for: Callable[[str], ApiClient] | None = None,
        instances: Any = None,
        clusters: Callable[[str, str, str], list[str]] | None = None,
        ttl_s: float = 3600.0,
        miss_ttl_s: float = 60.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube_for, self.instances, self.clusters = kube_for, instances, clusters
        self.ttl_s, self.miss_ttl_s, self.max_entries, self.clock = ttl_s, miss_ttl_s, max_entries, clock
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, ZoneAnswer]] = OrderedDict()
        self.lookups = 0  # answers not served from the cache (for tests and metrics)

    def resolve(
        self,
        project: str,
        region: str,
        instance: str,
        cluster: str | None = None,
        location: str | None = None,
    ) -> ZoneAnswer:
        """The node's zone; ``ZoneLookupError`` when no source could be asked (retry later).
        ``location``: a zonal cluster's zone (clusters.get is asked there), else its region."""
        if not (
            names.valid_project(project) and names.valid_region(region) and names.valid_instance(instance)
        ):
            return ZoneAnswer(None, "project, region or instance name is not valid")
        if cluster is not None and not names.valid_instance(cluster):
            return ZoneAnswer(None, "cluster name is not valid")
        if location is not None and not names.zone_in_region(location, region):
            return ZoneAnswer(None, "cluster location is not a zone of the region")
        key = (project, region, instance)
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return hit[1]
        self.lookups += 1
        answer = self._lookup(project, region, instance, cluster, location)
        self._cache[key] = (now + (self.ttl_s if answer.zone else self.miss_ttl_s), answer)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return answer

    def _lookup(
        self, project: str, region: str, instance: str, cluster: str | None, location: str | None
    ) -> ZoneAnswer:
        api = self.kube_for(cluster) if self.kube_for is not None and cluster else None
        node = self._from_node(api, project, region, instance) if api is not None else None
        if node is not None and node.zone:
            return node
        if self.instances is not None and self.clusters is not None:
            return self._from_compute(project, region, instance, cluster, location)
        if node is None:
            raise ZoneLookupError("no Kubernetes client for the cluster and no Compute client configured")
        if node.transient:
            raise ZoneLookupError(node.how)
        return node

    @staticmethod
    def _from_node(api: ApiClient, project: str, region: str, instance: str) -> ZoneAnswer:
        try:
            resp: Any = k8s.CoreV1Api(api).read_node(
                instance, _preload_content=False, _request_timeout=(5, 15)
            )
        except ApiException as exc:
            if exc.status == 404:
                return ZoneAnswer(None, "no such Kubernetes node")
            return ZoneAnswer(None, f"reading the node failed ({exc.status})", transient=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return ZoneAnswer(None, f"Kubernetes API unreachable ({type(exc).__name__})", transient=True)
        try:
            node = as_object(json.loads(resp.data or b"{}"))
        except ValueError:
            return ZoneAnswer(None, "the Kubernetes API answered something not JSON", transient=True)
        return zone_from_provider_id(text(spec_of(node), "providerID"), project, region, instance)

    def _from_compute(
        self, project: str, region: str, instance: str, cluster: str | None, location: str | None = None
    ) -> ZoneAnswer:
        """``instances.get`` in each of the cluster's zones inside the region; exactly one must hold it."""
        if cluster is None:
            return ZoneAnswer(None, "the entry names no cluster: its zones are unknown")
        if not instance.startswith(GKE_NODE_PREFIX):
            return ZoneAnswer(None, f"{instance} is not a GKE node VM name ({GKE_NODE_PREFIX}...)")
        assert self.clusters is not None
        zones = [
            z for z in self.clusters(project, location or region, cluster) if names.zone_in_region(z, region)
        ]
        if not zones:
            return ZoneAnswer(None, f"cluster {cluster} has no zones in {region} (clusters.get)")
        inside = [z for z in zones if self._holds(project, z, instance)]
        if len(inside) == 1:
            return ZoneAnswer(inside[0], "compute instances.get")
        if not inside:
            return ZoneAnswer(None, f"no instance {instance} in the zones of {cluster} ({', '.join(zones)})")
        return ZoneAnswer(
            None, f"instance name {instance} is in several zones of {region}: {', '.join(inside)}"
        )

    def _holds(self, project: str, zone: str, instance: str) -> bool:
        """Whether ``instances.get`` finds this very instance (project, zone and name) in ``zone``."""
        try:
            inst = self.instances.get(
                request={"project": project, "zone": zone, "instance": instance},
                retry=LOOKUP_RETRY,  # bounded: an outage fails the delivery (redelivered), not hangs it
                timeout=LOOKUP_TIMEOUT_S,
            )
        except gexc.NotFound:
            return False
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise ZoneLookupError(f"instances.get in {zone}: {str(exc)[:200]}") from exc
        link = str(getattr(inst, "self_link", "") or "")
        where = f"/projects/{project}/zones/{zone}/instances/{instance}"
        return getattr(inst, "name", None) == instance and link.endswith(where)


def fill_zone(ev: FaultEvent, resolver: ZoneResolver) -> str | None:
    """Give a regional GKE event its node's zone, in place; None when done (or nothing to do), else why not.

    ``ZoneLookupError`` propagates: the delivery should be retried, not dropped.
    """
    node = ev.get("node")
    region = node.get("region") if node is not None else None
    if node is None or node.get("zone") is not None or not region:
        return None
    location = node.get("location")
    answer = resolver.resolve(node["project"], region, node["instance"], node.get("cluster"), location)
    if answer.zone is None:
        return f"zone of {node['instance']} in region {region} not found: {answer.how}"
    node["zone"] = answer.zone
    node.pop("location", None)  # the cluster's, not the node's: what acts on the node needs the zone
    return None
