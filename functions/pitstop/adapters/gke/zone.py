"""The zone of a regional GKE cluster's node, which its log entries do not carry.

A ``k8s_node`` entry of a regional cluster names the region (reference/gke.md §1), but every
node action, budget and node key needs the zone. Ingest asks this resolver before the engine
sees the event, in this order:

1. the Node's ``spec.providerID`` (``gce://PROJECT/ZONE/INSTANCE``), through a Kubernetes
   client configured for the entry's cluster (one read, no Compute quota);
2. Compute ``instances.aggregatedList`` filtered by the instance name (GKE node name ==
   instance name); the zone is the scope key (``zones/ZONE``).

Either answer must name the same project and instance and lie inside the entry's region.
Answers are cached (bounded, with a TTL); misses are cached for a shorter time, so a storm of
lines about one node costs one lookup, not one per line.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.core import names

LOOKUP_TIMEOUT_S = 5.0
LOOKUP_RETRY = gretry.Retry(initial=0.2, maximum=2.0, timeout=10.0)

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


class ZoneResolver:
    """(project, region, instance[, cluster]) → zone, cached.

    ``kube_for(cluster)`` gives an ``ApiClient`` for a cluster Pitstop may read (None if none);
    ``instances`` is a ``compute_v1.InstancesClient`` (anything with ``aggregated_list``).
    """

    def __init__(
        self,
        kube_for: Callable[[str], Any] | None = None,
        instances: Any = None,
        ttl_s: float = 3600.0,
        miss_ttl_s: float = 60.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube_for, self.instances = kube_for, instances
        self.ttl_s, self.miss_ttl_s, self.max_entries, self.clock = ttl_s, miss_ttl_s, max_entries, clock
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, ZoneAnswer]] = OrderedDict()
        self.lookups = 0  # answers not served from the cache (for tests and metrics)

    def resolve(self, project: str, region: str, instance: str, cluster: str | None = None) -> ZoneAnswer:
        """The node's zone; ``ZoneLookupError`` when no source could be asked (retry later)."""
        if not (
            names.valid_project(project) and names.valid_region(region) and names.valid_instance(instance)
        ):
            return ZoneAnswer(None, "project, region or instance name is not valid")
        key = (project, region, instance)
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return hit[1]
        self.lookups += 1
        answer = self._lookup(project, region, instance, cluster)
        self._cache[key] = (now + (self.ttl_s if answer.zone else self.miss_ttl_s), answer)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return answer

    def _lookup(self, project: str, region: str, instance: str, cluster: str | None) -> ZoneAnswer:
        api = self.kube_for(cluster) if self.kube_for is not None and cluster else None
        node = self._from_node(api, project, region, instance) if api is not None else None
        if node is not None and node.zone:
            return node
        if self.instances is not None:
            return self._from_compute(project, region, instance)
        if node is None:
            raise ZoneLookupError("no Kubernetes client for the cluster and no Compute client configured")
        if node.transient:
            raise ZoneLookupError(node.how)
        return node

    @staticmethod
    def _from_node(api: Any, project: str, region: str, instance: str) -> ZoneAnswer:
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
        node = json.loads(resp.data or b"{}")
        spec = node.get("spec") if isinstance(node, dict) else None
        pid = spec.get("providerID") if isinstance(spec, dict) else None
        return zone_from_provider_id(pid, project, region, instance)

    def _from_compute(self, project: str, region: str, instance: str) -> ZoneAnswer:
        try:
            pairs = self.instances.aggregated_list(
                request={"project": project, "filter": f'name = "{instance}"'},
                retry=LOOKUP_RETRY,  # bounded: an outage fails the delivery (redelivered), not hangs it
                timeout=LOOKUP_TIMEOUT_S,
            )
            zones = sorted(_zones_holding(pairs, instance))
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise ZoneLookupError(f"instances.aggregatedList: {str(exc)[:200]}") from exc
        inside = [z for z in zones if names.zone_in_region(z, region)]
        if len(inside) == 1:
            return ZoneAnswer(inside[0], "compute instances.aggregatedList")
        if not inside:
            return ZoneAnswer(None, f"no instance {instance} in region {region} of project {project}")
        return ZoneAnswer(
            None, f"instance name {instance} is in several zones of {region}: {', '.join(inside)}"
        )


def _zones_holding(pairs: Any, instance: str) -> set[str]:
    """The zones of an aggregatedList answer (scope ``zones/ZONE``) that hold the named instance."""
    out: set[str] = set()
    for scope, scoped in pairs:
        found = getattr(scoped, "instances", None) or (
            scoped.get("instances") if isinstance(scoped, Mapping) else None
        )
        for inst in found or []:
            name = getattr(inst, "name", None) or (inst.get("name") if isinstance(inst, Mapping) else None)
            zone = str(scope).removeprefix("zones/")
            if name == instance and str(scope).startswith("zones/") and names.valid_zone(zone):
                out.add(zone)
    return out


def fill_zone(ev: dict[str, Any], resolver: ZoneResolver) -> str | None:
    """Give a regional GKE event its node's zone, in place; None when done (or nothing to do), else why not.

    ``ZoneLookupError`` propagates: the delivery should be retried, not dropped.
    """
    node = ev.get("node")
    if not isinstance(node, dict) or node.get("zone") is not None or not node.get("region"):
        return None
    answer = resolver.resolve(node["project"], node["region"], node["instance"], node.get("cluster"))
    if answer.zone is None:
        return f"zone of {node['instance']} in region {node['region']} not found: {answer.how}"
    node["zone"] = answer.zone
    return None
