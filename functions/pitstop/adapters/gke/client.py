"""The Kubernetes API of one GKE cluster: the client, its calls and errors, and the reads every
part of the adapter shares (a node, a JobSet, the pods on a node, the nodes an incident fenced,
a job's Kueue Workload), plus the read-modify-write of a node guarded by its resourceVersion."""

from __future__ import annotations

import base64
import json
import re
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import retry
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.objects import (
    CONFLICT_RETRIES,
    FENCE_KEY,
    INCIDENT,
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KUEUE_GROUP,
    KUEUE_JOB_UID_LABEL,
    KUEUE_VERSION,
    WORKLOADS,
    JobRef,
    meta_of,
    name_of,
    sub,
    subs,
    text,
    valid_object_name,
)
from pitstop.adapters.gke.shapes import KubeObject, MetaPatch, NodeAnswer, NodePatch

DEFAULT_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds for one API call
ApiClient = Any  # kubernetes.client.ApiClient: the client ships no type hints
Decide = Callable[[KubeObject], tuple[NodePatch | None, NodeAnswer]]  # a node read -> (patch, answer)


class KubeApiError(ActuatorError):
    """A Kubernetes API answer other than 2xx: its status, its Status reason and message."""

    def __init__(self, status: int, what: str, body: KubeObject) -> None:
        self.reason = str(body.get("reason") or "")
        self.detail = str(body.get("message") or "")[:300]
        self.body: KubeObject = dict(body)
        retryable = status in (409, 429) or status >= 500
        hint = " (check the actuator's Kubernetes RBAC: infra/gke/clusterrole.yaml)" if status == 403 else ""
        code = status if 400 <= status < 600 else 503
        super().__init__(code, f"{what}: {status} {self.reason} {self.detail}{hint}".strip(), retryable)


class Kube:
    """One cluster's API, connected on first use: a cold start never waits on ``clusters.get``, and a
    cluster that cannot be reached fails only its own incidents."""

    def __init__(
        self,
        api_client: ApiClient = None,
        connect: Callable[[], ApiClient] | None = None,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
    ) -> None:
        if (api_client is None) == (connect is None):
            raise ValueError("a GKE adapter needs an api_client or a connect() that builds one")
        self._client, self._connect, self._lock = api_client, connect, threading.Lock()
        self.timeout = timeout

    @property
    def client(self) -> ApiClient:
        with self._lock:
            if self._client is None and self._connect is not None:
                self._client = self._connect()
            return self._client

    @property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.client)

    @property
    def batch(self) -> Any:
        return k8s.BatchV1Api(self.client)

    @property
    def custom(self) -> Any:
        return k8s.CustomObjectsApi(self.client)

    @property
    def policy(self) -> Any:
        return k8s.PolicyV1Api(self.client)

    def call(self, what: str, fn: Callable[..., Any], *args: object, **kwargs: object) -> KubeObject:
        """One API call, its JSON answer as an object; errors as KubeApiError / a retryable 503.

        Raw JSON (no model classes): a field the client's models do not know is kept, and a
        read-modify-write never drops it. A body (shapes.py) goes to ``fn`` as it is.
        """
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            raise KubeApiError(exc.status or 503, what, status_body(exc.body)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(503, f"{what}: Kubernetes API unreachable ({str(exc)[:200]})", True) from exc
        try:
            out = json.loads(resp.data) if resp.data else {}
        except ValueError as exc:
            raise ActuatorError(503, f"{what}: the Kubernetes API answered something not JSON", True) from exc
        return out if isinstance(out, dict) else {}

    def node(self, node: str) -> KubeObject:
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        return self.call(f"get node {node}", self.core.read_node, node)

    def node_or_none(self, node: str) -> KubeObject | None:
        try:
            return self.node(node)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def get_or_none(self, what: str, fn: Callable[..., Any], *args: object) -> KubeObject | None:
        """An object, or None when it does not exist (404)."""
        try:
            return self.call(what, fn, *args)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def jobset(self, ref: JobRef) -> KubeObject | None:
        return self.get_or_none(
            f"get jobset {ref.namespace}/{ref.name}",
            self.custom.get_namespaced_custom_object,
            JOBSET_GROUP, JOBSET_VERSION, ref.namespace, JOBSETS, ref.name,
        )  # fmt: skip

    def items(self, what: str, fn: Callable[..., Any], *args: object, **kwargs: object) -> list[KubeObject]:
        return subs(self.call(what, fn, *args, **kwargs), "items")

    def pods_on(self, node: str) -> list[KubeObject]:
        return self.items(
            f"list pods on {node}",
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )

    def fenced_nodes(self, incident: str) -> list[str]:
        """The nodes Pitstop fenced for the incident (by the label fence sets)."""
        if INCIDENT.fullmatch(incident) is None:
            return []
        nodes = self.items("list fenced nodes", self.core.list_node, label_selector=f"{FENCE_KEY}={incident}")
        return sorted(name for n in nodes if (name := name_of(n)) is not None and valid_object_name(name))

    def workload(self, ns: str, uid: object) -> KubeObject | None:
        """The Kueue Workload of a job (label ``kueue.x-k8s.io/job-uid``); None without one or Kueue."""
        if not isinstance(uid, str) or not re.fullmatch(r"[-a-z0-9]{1,63}", uid):
            return None
        try:
            found = self.items(
                f"list workloads in {ns}",
                self.custom.list_namespaced_custom_object,
                KUEUE_GROUP, KUEUE_VERSION, ns, WORKLOADS,
                label_selector=f"{KUEUE_JOB_UID_LABEL}={uid}",
            )  # fmt: skip
        except KubeApiError as exc:
            if exc.status == 404:  # Kueue is not installed
                return None
            raise
        return found[0] if found else None

    def update_node(self, node: str, decide: Decide) -> NodeAnswer:
        """Read, decide a patch, write it guarded by resourceVersion; again on 409. The answer decided.

        A node that does not exist (a preempted Spot VM's Node removed) has nothing to change:
        ``state: absent``, and the next step finds it again by name when GKE recreates it.
        """

        def attempt() -> NodeAnswer:
            cur = self.node_or_none(node)
            if cur is None:
                return {"node": node, "state": "absent", "previous_state": "absent", "resumed": False}
            patch, answer = decide(cur)
            if patch is None:
                return answer
            meta: MetaPatch = patch.get("metadata") or {}
            meta["resourceVersion"] = text(meta_of(cur), "resourceVersion")
            patch["metadata"] = meta
            try:
                self.call(f"patch node {node}", self.core.patch_node, node, patch)
            except KubeApiError as exc:
                if exc.status in (404, 409):  # changed or gone since the read: read again
                    raise retry.StaleReadError(exc.message) from exc
                raise
            return answer

        why = f"node {node} kept changing under Pitstop's update (409 Conflict)"
        return retry.call(attempt, retry.conflicts(CONFLICT_RETRIES, lambda _: ActuatorError(503, why, True)))


def status_body(body: object) -> KubeObject:
    """A Status object from an error answer's body (bytes or text); empty if it is not one."""
    if isinstance(body, bytes | bytearray):
        body = body.decode("utf-8", "replace")
    try:
        out = json.loads(body) if isinstance(body, str) and body else {}
    except ValueError:
        return {"message": str(body)[:300]}
    return out if isinstance(out, dict) else {}


def loopback_api_client(endpoint: str, token: str | None) -> ApiClient:
    """A client for a loopback API server (the local stack's fake) sending ``token``, the calling
    function's own, as its bearer token: the fake knows it as that function's account
    (local/gke_stack.py ``identities``), as GKE knows the token of a Google identity."""
    cfg: Any = k8s.Configuration()
    cfg.host = endpoint.rstrip("/")
    if token:
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


# -- production access to a GKE control plane ---------------------------------------------------

CONTAINER_API = "https://container.googleapis.com/v1"
_LOCATION = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+(?:-[a-z])?", re.ASCII)
_CLUSTER = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?", re.ASCII)
_PROJECT = re.compile(r"(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)


def control_plane(cluster: KubeObject) -> tuple[str, bytes | None]:
    """The endpoint to call and the CA to trust, from ``clusters.get``: the DNS endpoint when the
    cluster has one (it works for private clusters and carries a publicly trusted certificate:
    no cluster CA), else the IP endpoint with the cluster's own CA."""
    dns = sub(sub(cluster, "controlPlaneEndpointsConfig"), "dnsEndpointConfig").get("endpoint")
    if isinstance(dns, str) and re.fullmatch(r"[a-z0-9][-a-z0-9.]{1,252}", dns):
        return f"https://{dns}", None
    endpoint = cluster.get("endpoint")
    ca = text(sub(cluster, "masterAuth"), "clusterCaCertificate")
    if not isinstance(endpoint, str) or not re.fullmatch(r"[0-9a-fA-F.:\[\]]{2,64}", endpoint) or not ca:
        raise ActuatorError(409, "cluster has neither a DNS endpoint nor an IP endpoint with a CA", False)
    return f"https://{endpoint}", base64.b64decode(ca)


def gke_api_client(project: str, location: str, cluster: str, credentials: Any) -> ApiClient:
    """An ``ApiClient`` for a GKE cluster, authenticated as ``credentials`` (Pitstop's own identity).

    ``container.clusters.get`` (REST) gives the endpoint and CA; every request carries a fresh
    Google access token (refreshed before it expires). RBAC: infra/gke/clusterrole.yaml.
    """
    from google.auth.transport.requests import AuthorizedSession, Request

    if not (_PROJECT.fullmatch(project) and _LOCATION.fullmatch(location) and _CLUSTER.fullmatch(cluster)):
        raise ActuatorError(400, "invalid project, location or cluster name", False)
    url = f"{CONTAINER_API}/projects/{project}/locations/{location}/clusters/{cluster}"
    resp = AuthorizedSession(credentials).get(url, timeout=30)  # type: ignore[no-untyped-call]
    if resp.status_code != 200:
        retryable = resp.status_code == 429 or resp.status_code >= 500
        code = resp.status_code if 400 <= resp.status_code < 600 else 503
        raise ActuatorError(code, f"clusters.get {cluster}: {resp.status_code} {resp.text[:200]}", retryable)
    host, ca = control_plane(resp.json())
    cfg: Any = k8s.Configuration()
    cfg.host = host
    if ca is not None:
        with tempfile.NamedTemporaryFile("wb", prefix="pitstop-gke-ca-", suffix=".pem", delete=False) as f:
            f.write(ca)
        cfg.ssl_ca_cert = f.name

    def refresh(conf: Any) -> None:
        if not credentials.valid:
            credentials.refresh(Request())
        conf.api_key = {"BearerToken": f"Bearer {credentials.token}"}

    refresh(cfg)  # the client sends the token only if one is set before its hook runs
    cfg.refresh_api_key_hook = refresh
    return k8s.ApiClient(cfg)
