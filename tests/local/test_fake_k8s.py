"""The fake Kubernetes API server, driven by the official ``kubernetes`` client and by kubectl.

What each test asserts is what a real API server does (reference/gke.md §2 and §7, where the
observed client behaviour is recorded). Controller semantics are in tests/local/test_k8s_controllers.py.
Deterministic tests use ``auto=False`` and a frozen clock (``time_scale=0``): the test steps the
controllers and advances the clock itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from pitstop.local.fake_k8s import FakeKube


def got(kube: FakeKube, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """An object that must exist."""
    obj = kube.get(kind, name, namespace)
    assert obj is not None, f"{kind} {name} is gone"
    return obj


new_client: Any = config.new_client_from_config  # the client is typed loosely: use it as Any
k8s: Any = client
Watch: Any = watch.Watch


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def pod(
    name: str, *, node: str | None = None, labels: dict[str, str] | None = None, gpus: int = 0
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "trainer:1"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def job(name: str, *, pods: int = 2, gpus: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    tmpl = pod("unused", labels=labels, gpus=gpus)
    tmpl["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {"metadata": tmpl["metadata"], "spec": tmpl["spec"]},
        },
    }


def pdb(name: str, labels: dict[str, str], **budget: Any) -> dict[str, Any]:
    spec = {"selector": {"matchLabels": labels}, **budget}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": spec,
    }


def jobset(name: str) -> dict[str, Any]:
    tmpl = {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "trainer:1"}]}}
    rjob = {
        "name": "workers",
        "replicas": 1,
        "template": {"spec": {"parallelism": 1, "completions": 1, "template": tmpl}},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicatedJobs": [rjob]},
    }


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKube]:
    k = FakeKube(auto=False, time_scale=0)
    k.start()
    for i in range(3):
        k.add_node(f"gke-n{i}", project="proj", zone="us-central1-a")
    k.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[FakeKube]:
    """Controllers running in the background on a fast clock, for kubectl drain and watches."""
    k = FakeKube(time_scale=0.005)
    k.start()
    for i in range(3):
        k.add_node(f"gke-n{i}", project="proj", zone="us-central1-a")
    k.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield k
    finally:
        k.stop()
        assert not k.errors, k.errors


@pytest.fixture
def api(kube: FakeKube, tmp_path: Path) -> Any:
    return new_client(config_file=str(tmp_path / "kubeconfig"))


def kubectl(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    cmd = [KUBECTL, "--kubeconfig", str(tmp_path / "kubeconfig"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def raw(
    kube: FakeKube,
    path: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    req = urllib.request.Request(kube.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or "{}")
    return body


# --- discovery ----------------------------------------------------------------------------------
def test_discovery_lists_groups_resources_and_subresources(kube: FakeKube, api: Any) -> None:
    assert k8s.VersionApi(api).get_code().major == "1"
    core = {r.name: r for r in k8s.CoreV1Api(api).get_api_resources().resources}
    assert (core["pods/eviction"].group, core["pods/eviction"].version, core["pods/eviction"].kind) == (
        "policy",
        "v1",
        "Eviction",
    )
    assert {"nodes/status", "pods/status"} <= set(core) and core["nodes"].namespaced is False
    groups = {g.name: g.preferred_version.version for g in k8s.ApisApi(api).get_api_versions().groups}
    assert groups == {
        "batch": "v1",
        "policy": "v1",
        "jobset.x-k8s.io": "v1alpha2",
        "kueue.x-k8s.io": "v1beta2",
        "admissionregistration.k8s.io": "v1",  # ValidatingAdmissionPolicy (k8s_admission.py)
    }
    _, js = raw(kube, "/apis/jobset.x-k8s.io/v1alpha2")
    _, wl = raw(kube, "/apis/kueue.x-k8s.io/v1beta2")
    assert {r["name"] for r in js["resources"]} == {"jobsets", "jobsets/status"}
    assert {r["name"] for r in wl["resources"]} == {"workloads", "workloads/status", "topologies"}
    code, _ = raw(kube, "/apis/apps/v1")
    assert code == 404


def test_protobuf_first_and_table_accept_get_json(kube: FakeKube) -> None:
    accept = (
        "application/vnd.kubernetes.protobuf,application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    )
    code, body = raw(kube, "/api/v1/nodes?limit=500", headers={"Accept": accept})
    assert code == 200 and body["kind"] == "NodeList" and len(body["items"]) == 3


# --- objects, selectors, errors -----------------------------------------------------------------
def test_add_node_looks_like_a_gke_gpu_node(kube: FakeKube, api: Any) -> None:
    kube.add_node("gke-x", project="p1", zone="europe-west4-b", gpus=4, labels={"pool": "a3"})
    node = k8s.CoreV1Api(api).read_node("gke-x")  # the client's models validate required fields
    assert node.spec.provider_id == "gce://p1/europe-west4-b/gke-x"
    assert node.metadata.labels["topology.kubernetes.io/zone"] == "europe-west4-b"
    assert node.metadata.labels["pool"] == "a3"
    assert node.status.capacity["nvidia.com/gpu"] == node.status.allocatable["nvidia.com/gpu"] == "4"
    assert [c.status for c in node.status.conditions if c.type == "Ready"] == ["True"]
    assert node.status.node_info.boot_id


def test_list_with_field_and_label_selectors(kube: FakeKube, api: Any) -> None:
    kube.create(pod("a", node="gke-n0", labels={"app": "x", "tier": "1"}))
    kube.create(pod("b", node="gke-n1", labels={"app": "y"}))
    kube.create(
        {
            **pod("c", node="gke-n0", labels={"app": "z"}),
            "metadata": {"name": "c", "namespace": "kube-system"},
        }
    )
    v1 = k8s.CoreV1Api(api)

    def names(**kw: Any) -> list[str]:
        return sorted(p.metadata.name for p in v1.list_pod_for_all_namespaces(**kw).items)

    assert names(field_selector="spec.nodeName=gke-n0") == ["a", "c"]
    assert names(label_selector="app in (x,y)") == ["a", "b"]
    assert names(label_selector="app notin (x),!tier") == ["b", "c"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="app!=x", field_selector="metadata.namespace=default") == ["b"]
    assert [p.metadata.name for p in v1.list_namespaced_pod("default").items] == ["a", "b"]


def test_errors_are_status_bodies(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", "default")
    assert missing.value.status == 404
    assert status_of(missing.value) | {"metadata": {}} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "group": "", "kind": "pods"},
        "code": 404,
    }
    v1.create_namespaced_pod("default", pod("dup"))
    with pytest.raises(ApiException) as dup:
        v1.create_namespaced_pod("default", pod("dup"))
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as no_ns:
        v1.create_namespaced_pod("ghost", pod("p"))
    assert (no_ns.value.status, status_of(no_ns.value)["message"]) == (404, 'namespaces "ghost" not found')
    with pytest.raises(ApiException) as bad_label:
        v1.patch_namespaced_pod("dup", "default", {"metadata": {"labels": {"a": "not valid!"}}})
    assert (bad_label.value.status, status_of(bad_label.value)["reason"]) == (422, "Invalid")
    with pytest.raises(ApiException) as batch_404:
        k8s.BatchV1Api(api).read_namespaced_job("nope", "default")
    assert status_of(batch_404.value)["message"] == 'jobs.batch "nope" not found'


def test_pod_spec_is_immutable_but_status_is_not(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "gke-n0"}})
    assert err.value.status == 422 and "pod updates may not change fields" in status_of(err.value)["message"]
    v1.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "main", "image": "trainer:2"}]}}
    )
    assert got(kube, "Pod", "p", "default")["spec"]["containers"][0]["image"] == "trainer:2"
    # a status change through the main resource is dropped; through /status it lands
    v1.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    assert got(kube, "Pod", "p", "default")["status"]["phase"] == "Pending"
    v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert got(kube, "Pod", "p", "default")["status"]["phase"] == "Running"


# --- resourceVersion ------------------------------------------------------------------------------
def test_resource_version_increases_and_stale_writes_conflict(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    first = v1.read_node("gke-n0")
    listed = v1.list_node()
    assert int(listed.metadata.resource_version) >= int(first.metadata.resource_version)
    v1.patch_node("gke-n0", {"metadata": {"labels": {"a": "1"}}})
    second = v1.read_node("gke-n0")
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert int(v1.list_node().metadata.resource_version) > int(listed.metadata.resource_version)
    first.spec.unschedulable = True
    with pytest.raises(ApiException) as stale_put:
        v1.replace_node("gke-n0", first)
    assert (stale_put.value.status, status_of(stale_put.value)["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status_of(stale_put.value)["message"]
    stale = {
        "metadata": {"resourceVersion": first.metadata.resource_version},
        "spec": {"unschedulable": True},
    }
    with pytest.raises(ApiException) as stale_patch:
        v1.patch_node("gke-n0", stale)
    assert stale_patch.value.status == 409
    assert not got(kube, "Node", "gke-n0")["spec"].get("unschedulable")
    second.spec.unschedulable = True
    assert v1.replace_node("gke-n0", second).spec.unschedulable is True


def test_a_no_op_write_keeps_the_resource_version(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    before = v1.read_node("gke-n0").metadata.resource_version
    after = v1.patch_node("gke-n0", {"metadata": {"labels": {"kubernetes.io/hostname": "gke-n0"}}})
    assert after.metadata.resource_version == before


# --- PATCH formats ----------------------------------------------------------------------------------
def test_strategic_merge_merges_conditions_by_type_and_replaces_taints(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    v1.patch_node("gke-n0", {"spec": {"taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]}})
    v1.patch_node("gke-n0", {"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})
    assert [t.key for t in v1.read_node("gke-n0").spec.taints] == ["b"]
    xid = {"type": "XidCriticalError", "status": "True", "reason": '{"79":true}', "message": "boot-1"}
    v1.patch_node_status("gke-n0", {"status": {"conditions": [xid]}})
    conds = {c.type: c for c in v1.read_node("gke-n0").status.conditions}
    assert conds["XidCriticalError"].reason == '{"79":true}' and conds["Ready"].status == "True"
    v1.patch_node_status(
        "gke-n0", {"status": {"conditions": [{"type": "XidCriticalError", "status": "False"}]}}
    )
    conds = {c.type: c for c in v1.read_node("gke-n0").status.conditions}
    assert conds["XidCriticalError"].status == "False" and conds["XidCriticalError"].reason == '{"79":true}'
    assert ("PATCH", "/api/v1/nodes/gke-n0/status", "application/strategic-merge-patch+json") in kube.requests


def test_json_patch_and_merge_patch(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    ops = [
        {"op": "add", "path": "/spec/unschedulable", "value": True},
        {"op": "add", "path": "/metadata/labels/x", "value": "y"},
    ]
    v1.patch_node("gke-n1", ops)
    node = got(kube, "Node", "gke-n1")
    assert node["spec"]["unschedulable"] is True and node["metadata"]["labels"]["x"] == "y"
    assert ("PATCH", "/api/v1/nodes/gke-n1", "application/json-patch+json") in kube.requests
    with pytest.raises(ApiException) as failed_test:
        v1.patch_node("gke-n1", [{"op": "test", "path": "/spec/unschedulable", "value": False}])
    assert failed_test.value.status == 422
    code, body = raw(
        kube,
        "/api/v1/nodes/gke-n1",
        method="PATCH",
        body=json.dumps({"metadata": {"labels": {"x": None}}}).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert code == 200 and "x" not in body["metadata"]["labels"]


def test_custom_resources_refuse_strategic_merge_and_take_merge_patch(kube: FakeKube, api: Any) -> None:
    co = k8s.CustomObjectsApi(api)
    co.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset("js"))
    smp = json.dumps({"spec": {"suspend": True}}).encode()
    code, body = raw(
        kube,
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/js",
        method="PATCH",
        body=smp,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert (code, body["kind"], body["reason"]) == (415, "Status", "UnsupportedMediaType")
    assert "strategic" not in body["message"] and "merge-patch+json" in body["message"]
    co.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "js", {"spec": {"suspend": True}}
    )
    assert got(kube, "JobSet", "js", "default")["spec"]["suspend"] is True
    assert kube.requests[-1][2] == "application/merge-patch+json"


# --- eviction -------------------------------------------------------------------------------------
def running(kube: FakeKube, name: str, node: str, labels: dict[str, str] | None = None) -> None:
    kube.create(pod(name, node=node, labels=labels))
    kube.step()
    assert got(kube, "Pod", name, "default")["status"]["phase"] == "Running"


def test_eviction_from_the_python_client_marks_then_deletes_with_grace(kube: FakeKube, api: Any) -> None:
    running(kube, "p", "gke-n0")
    k8s.CoreV1Api(api).create_namespaced_pod_eviction("p", "default", {"metadata": {"name": "p"}})
    method, path, ctype = kube.requests[-1]
    assert (method, path, ctype) == ("POST", "/api/v1/namespaces/default/pods/p/eviction", "")  # gke.md §7
    evicted = got(kube, "Pod", "p", "default")
    assert (
        evicted["metadata"]["deletionTimestamp"] and evicted["metadata"]["deletionGracePeriodSeconds"] == 30
    )
    target = [c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"], c["message"]) for c in target] == [
        ("True", "EvictionByEvictionAPI", "Eviction API: evicting")
    ]
    kube.advance(29)
    kube.step()
    assert kube.get("Pod", "p", "default") is not None  # still terminating inside its grace period
    kube.advance(1)
    kube.step()
    assert kube.get("Pod", "p", "default") is None


def test_eviction_404_and_uid_precondition(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    with pytest.raises(ApiException) as missing:
        v1.create_namespaced_pod_eviction("ghost", "default", {"metadata": {"name": "ghost"}})
    assert missing.value.status == 404
    running(kube, "p", "gke-n0")
    body: dict[str, Any] = {
        "metadata": {"name": "p"},
        "deleteOptions": {"preconditions": {"uid": "not-the-uid"}},
    }
    with pytest.raises(ApiException) as wrong_uid:
        v1.create_namespaced_pod_eviction("p", "default", body)
    assert (
        wrong_uid.value.status == 409 and "Precondition failed: UID" in status_of(wrong_uid.value)["message"]
    )
    assert not got(kube, "Pod", "p", "default")["metadata"].get("deletionTimestamp")
    body["deleteOptions"]["preconditions"]["uid"] = got(kube, "Pod", "p", "default")["metadata"]["uid"]
    v1.create_namespaced_pod_eviction("p", "default", body)
    assert got(kube, "Pod", "p", "default")["metadata"]["deletionTimestamp"]


def test_eviction_honours_a_pod_disruption_budget(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    for i in range(2):
        running(kube, f"p{i}", f"gke-n{i}", {"app": "t"})
    kube.create(pdb("budget", {"app": "t"}, minAvailable=1))
    with pytest.raises(ApiException) as stale:  # the disruption controller has not seen it yet
        v1.create_namespaced_pod_eviction("p0", "default", {"metadata": {"name": "p0"}})
    assert stale.value.status == 429 and "still being processed" in str(stale.value.body)
    kube.step()
    budget = k8s.PolicyV1Api(api).read_namespaced_pod_disruption_budget("budget", "default")
    assert (
        budget.status.current_healthy,
        budget.status.desired_healthy,
        budget.status.disruptions_allowed,
    ) == (2, 1, 1)
    v1.create_namespaced_pod_eviction("p0", "default", {"metadata": {"name": "p0"}})
    with pytest.raises(ApiException) as blocked:
        v1.create_namespaced_pod_eviction("p1", "default", {"metadata": {"name": "p1"}})
    status = status_of(blocked.value)
    assert (blocked.value.status, status["reason"]) == (429, "TooManyRequests")
    assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert not got(kube, "Pod", "p1", "default")["metadata"].get("deletionTimestamp")
    # a terminating pod (p0) and a pending one bypass the budget
    v1.create_namespaced_pod_eviction("p0", "default", {"metadata": {"name": "p0"}})
    kube.create(pod("pending", labels={"app": "t"}))
    v1.create_namespaced_pod_eviction("pending", "default", {"metadata": {"name": "pending"}})
    assert kube.get("Pod", "pending", "default") is None  # never bound: no grace period


def test_eviction_with_two_matching_budgets_is_a_server_error(kube: FakeKube, api: Any) -> None:
    running(kube, "p", "gke-n0", {"app": "t"})
    kube.create(pdb("one", {"app": "t"}, minAvailable=0))
    kube.create(pdb("two", {"app": "t"}, maxUnavailable=1))
    kube.step()
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(api).create_namespaced_pod_eviction("p", "default", {"metadata": {"name": "p"}})
    assert err.value.status == 500 and "more than one PodDisruptionBudget" in status_of(err.value)["message"]


# --- deletion and garbage collection -----------------------------------------------------------------
def test_delete_grace_period_zero_removes_at_once(kube: FakeKube, api: Any) -> None:
    running(kube, "p", "gke-n0")
    k8s.CoreV1Api(api).delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert ("DELETE", "/api/v1/namespaces/default/pods/p?gracePeriodSeconds=0", "") in kube.requests
    assert kube.get("Pod", "p", "default") is None


def test_batch_v1_job_delete_orphans_pods_unless_told_otherwise(kube: FakeKube, api: Any) -> None:
    batch = k8s.BatchV1Api(api)
    batch.create_namespaced_job("default", job("orphaner", pods=1, gpus=0))
    batch.create_namespaced_job("default", job("cascader", pods=1, gpus=0))
    kube.settle()
    batch.delete_namespaced_job("orphaner", "default")
    batch.delete_namespaced_job("cascader", "default", propagation_policy="Background")
    kube.settle()
    kube.advance(30)
    kube.settle()
    left = {p["metadata"]["labels"]["job-name"]: p for p in kube.list("Pod", "default")}
    assert set(left) == {"orphaner"} and not left["orphaner"]["metadata"].get("ownerReferences")


# --- watch ------------------------------------------------------------------------------------------
def test_python_watch_streams_events_from_a_resource_version(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    kube.create(pod("w", labels={"app": "x"}))
    v1.patch_namespaced_pod("w", "default", {"metadata": {"labels": {"app": "y"}}})
    kube.create(pod("other", labels={"app": "x"}))
    v1.delete_namespaced_pod("w", "default")
    stream = Watch().stream(v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1)
    seen = [(e["type"], e["object"].metadata.name) for e in stream]
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("ADDED", "other"), ("DELETED", "w")]
    selected = Watch().stream(
        v1.list_namespaced_pod, "default", resource_version=rv, label_selector="app=x", timeout_seconds=1
    )
    # leaving the selection is a DELETED event, as from a real watch cache
    assert [(e["type"], e["object"].metadata.name) for e in selected] == [
        ("ADDED", "w"),
        ("DELETED", "w"),
        ("ADDED", "other"),
    ]


def test_watch_from_a_compacted_resource_version_is_gone(kube: FakeKube, api: Any) -> None:
    v1 = k8s.CoreV1Api(api)
    rv = v1.list_node().metadata.resource_version
    kube.set_gpu_allocatable("gke-n0", 7)
    kube.compact()
    with pytest.raises(ApiException) as gone:
        list(Watch().stream(v1.list_node, resource_version=rv, timeout_seconds=1))
    assert gone.value.status == 410


def test_watch_receives_events_while_it_waits(live: FakeKube, tmp_path: Path) -> None:
    api = new_client(config_file=str(tmp_path / "kubeconfig"))
    v1 = k8s.CoreV1Api(api)
    rv = v1.list_node().metadata.resource_version
    w = Watch()
    timer = threading.Timer(0.3, lambda: live.set_gpu_allocatable("gke-n2", 6))
    timer.start()
    for event in w.stream(v1.list_node, resource_version=rv, timeout_seconds=5):
        if event["object"].metadata.name == "gke-n2":
            assert event["type"] == "MODIFIED" and event["object"].status.allocatable["nvidia.com/gpu"] == "6"
            w.stop()
    timer.join()
    assert got(live, "Node", "gke-n2")["status"]["allocatable"]["nvidia.com/gpu"] == "6"


# --- kubectl ----------------------------------------------------------------------------------------
@needs_kubectl
def test_kubectl_cordon_taint_label(kube: FakeKube, tmp_path: Path) -> None:
    assert kubectl(tmp_path, "cordon", "gke-n0").returncode == 0
    out = kubectl(tmp_path, "taint", "nodes", "gke-n0", "pitstop.dev/remediation=inc-1:NoSchedule")
    assert out.returncode == 0, out.stderr
    out = kubectl(tmp_path, "label", "node", "gke-n0", "cloud.google.com/perform-maintenance=true")
    assert out.returncode == 0, out.stderr
    node = got(kube, "Node", "gke-n0")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        {"key": "pitstop.dev/remediation", "value": "inc-1", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["labels"]["cloud.google.com/perform-maintenance"] == "true"
    patches = [(p.split("?")[0], c) for m, p, c in kube.requests if m == "PATCH"]
    assert patches == [
        ("/api/v1/nodes/gke-n0", "application/strategic-merge-patch+json"),
        ("/api/v1/nodes/gke-n0", "application/strategic-merge-patch+json"),
        ("/api/v1/nodes/gke-n0", "application/merge-patch+json"),
    ]
    out = kubectl(tmp_path, "uncordon", "gke-n0")
    assert out.returncode == 0 and not got(kube, "Node", "gke-n0")["spec"].get("unschedulable")


@needs_kubectl
def test_kubectl_get_jobsets_and_pods(kube: FakeKube, tmp_path: Path) -> None:
    kube.create(jobset("train"))
    kube.create(jobset("eval"))
    out = kubectl(tmp_path, "get", "jobsets", "-o", "name")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["jobset.jobset.x-k8s.io/eval", "jobset.jobset.x-k8s.io/train"]
    out = kubectl(tmp_path, "get", "jobsets")
    assert out.returncode == 0 and "train" in out.stdout
    out = kubectl(tmp_path, "get", "jobset", "train", "-o", "json")
    assert json.loads(out.stdout)["metadata"]["name"] == "train"
    out = kubectl(tmp_path, "get", "pod", "missing")
    assert out.returncode == 1 and 'pods "missing" not found' in out.stderr


@needs_kubectl
def test_kubectl_drain_waits_on_a_pdb_then_completes(live: FakeKube, tmp_path: Path) -> None:
    live.create(job("train", pods=2, labels={"app": "t"}))
    live.create(pdb("budget", {"app": "t"}, minAvailable=2))
    wait_for(lambda: len(running_pods(live)) == 2)
    node = running_pods(live)[0]["spec"]["nodeName"]
    blocked = kubectl(
        tmp_path, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2s"
    )
    assert blocked.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget." in blocked.stderr
    assert got(live, "Node", node)["spec"]["unschedulable"] is True
    live.delete("PodDisruptionBudget", "budget", "default")
    done = kubectl(tmp_path, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=30s")
    assert done.returncode == 0, done.stderr
    assert f"node/{node} drained" in done.stdout
    assert all(p["spec"].get("nodeName") != node for p in live.list("Pod", "default"))
    assert any(m == "GET" and "fieldSelector=spec.nodeName" in p for m, p, _ in live.requests)
    evictions = [c for m, p, c in live.requests if m == "POST" and p.endswith("/eviction")]
    assert evictions and set(evictions) == {"application/json"}


@needs_kubectl
def test_kubectl_get_watch_prints_new_pods(live: FakeKube, tmp_path: Path) -> None:
    cmd = [
        str(KUBECTL),
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
        "get",
        "pods",
        "-w",
        "--request-timeout=3s",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any("watch=true" in p for _, p, _ in live.requests))
    live.create(pod("late-arrival"))
    out, err = proc.communicate(timeout=15)
    assert "late-arrival" in out, err


def running_pods(kube: FakeKube) -> list[dict[str, Any]]:
    return [p for p in kube.list("Pod", "default") if p["status"]["phase"] == "Running"]


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    """Poll a condition of the live fake (its controllers run in the background)."""
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        done.wait(0.05)
    raise AssertionError("condition not reached")


def test_effects_record_cordons_pitstop_taints_and_evictions_only(
    kube: FakeKube, tmp_path: Path, api: Any
) -> None:
    """`pitstop local status` attributes GKE effects from this record: what changed, never a refusal."""
    assert kubectl(tmp_path, "cordon", "gke-n0").returncode == 0
    assert kubectl(tmp_path, "cordon", "gke-n0").returncode == 0  # already cordoned: no change
    assert (
        kubectl(tmp_path, "taint", "nodes", "gke-n0", "pitstop.dev/remediation=inc-1:NoSchedule").returncode
        == 0
    )
    assert kubectl(tmp_path, "taint", "nodes", "gke-n0", "someone.else/x=y:NoSchedule").returncode == 0
    v1 = k8s.CoreV1Api(api)
    for i in range(2):
        running(kube, f"p{i}", f"gke-n{i}", {"app": "t"})
    kube.create(pdb("budget", {"app": "t"}, minAvailable=1))
    kube.step()
    v1.create_namespaced_pod_eviction("p0", "default", {"metadata": {"name": "p0"}})
    with pytest.raises(ApiException):  # the budget refuses: no effect
        v1.create_namespaced_pod_eviction("p1", "default", {"metadata": {"name": "p1"}})
    assert kubectl(tmp_path, "taint", "nodes", "gke-n0", "pitstop.dev/remediation-").returncode == 0
    assert kubectl(tmp_path, "uncordon", "gke-n0").returncode == 0
    seen = [(e["method"], e["node"], e.get("value") or e.get("pod")) for e in kube.effects]
    assert seen == [
        ("cordon", "gke-n0", None),
        ("taint", "gke-n0", "inc-1"),
        ("evict", "gke-n0", "default/p0"),
        ("untaint", "gke-n0", "inc-1"),
        ("uncordon", "gke-n0", None),
    ]
    served = raw(kube, "/_admin/effects")
    assert served[0] == 200 and len(served[1]["effects"]) == 5
