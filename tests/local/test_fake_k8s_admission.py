"""ValidatingAdmissionPolicy in the fake Kubernetes API server (local/k8s_admission.py).

Pitstop's deployed policy (infra/gke/clusterrole.yaml) is applied with kubectl and then enforced
on requests the official ``kubernetes`` client sends with a bearer token, as GKE would for
actuate's service account. The refusal is the API server's: 422 ``Invalid``, message
``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>' with binding '<b>' denied
request: <message>`` (kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/;
the body as k8s.io/apiserver pkg/admission/plugin/policy/validating/dispatcher.go builds it).
"""

from __future__ import annotations

import copy
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pitstop.local import gke_stack
from pitstop.local.fake_k8s import FakeKube
from pitstop.local.k8s_admission import BINDING as BINDING_KIND
from pitstop.local.k8s_admission import POLICY as POLICY_KIND
from pitstop.local.k8s_admission import Policies, Request
from pitstop.local.k8s_store import BY_KIND, ApiError, Store

k8s: Any = client
ROOT = Path(__file__).resolve().parents[2]
ACTUATE = "pitstop-actuate@p-1234.iam.gserviceaccount.com"
TOKENS = {"t-actuate": ACTUATE, "t-other": "someone@example.com"}
POLICY = "pitstop-actuator-suspend-only"
VAPS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def deployed_admission(actuate: str = ACTUATE) -> str:
    """The policy and binding of infra/gke/clusterrole.yaml, as deploy substitutes them."""
    return gke_stack.admission_manifest(actuate)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[FakeKube]:
    k = FakeKube(auto=False, time_scale=0, tokens=TOKENS)
    k.start()
    k.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield k
    finally:
        k.stop()


def as_user(kube: FakeKube, token: str) -> Any:
    """A kubernetes client that sends ``token`` as its bearer token (as actuate's does on GKE)."""
    cfg = k8s.Configuration()
    cfg.host = kube.url
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


def kubectl_apply(tmp_path: Path, manifest: str) -> None:
    argv = ["kubectl", "--kubeconfig", str(tmp_path / "kubeconfig"), "apply", "--validate=false", "-f", "-"]
    done = subprocess.run(argv, input=manifest, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def training(kube: FakeKube) -> None:
    tpl = {"spec": {"restartPolicy": "Never", "containers": [{"name": "t", "image": "trainer:1"}]}}
    job_spec = {"parallelism": 1, "completions": 1, "template": tpl}
    kube.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "default", "annotations": {"owner": "ml"}},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": job_spec}}]},
        }
    )
    kube.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "solo", "namespace": "default"},
            "spec": {**job_spec, "suspend": False},
        }
    )


def patch_jobset(api: Any, body: dict[str, Any]) -> Any:
    return k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", body
    )


def refused(call: Any) -> dict[str, Any]:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 422
    body: dict[str, Any] = json.loads(err.value.body or "{}")
    return body


IMAGE = {"spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {"template": {}}}}]}}


def test_actuates_template_edit_is_refused_and_its_suspend_admitted_through_the_kubernetes_client(
    kube: FakeKube, tmp_path: Path
) -> None:
    kubectl_apply(tmp_path, deployed_admission())
    training(kube)
    actuate, other = as_user(kube, "t-actuate"), as_user(kube, "t-other")
    stop = {"spec": {"suspend": True}, "metadata": {"annotations": {"pitstop.dev/stopped-for": "i-1"}}}
    assert patch_jobset(actuate, stop)["spec"]["suspend"] is True  # Pitstop's stop

    evil = {"spec": {**IMAGE["spec"], "suspend": False}}
    body = refused(lambda: patch_jobset(actuate, evil))
    said = (
        f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
        "Pitstop may change only the topology keys of a JobSet's pod templates' nodeSelector"
    )
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'jobsets.jobset.x-k8s.io "train" is forbidden: {said}',
        "reason": "Invalid",
        "details": {
            "name": "train",
            "group": "jobset.x-k8s.io",
            "kind": "jobsets",
            "causes": [{"message": said}],
        },
        "code": 422,
    }
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is True  # nothing of the refused patch stored
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]

    labels = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "other"}}}
    assert "labels" in refused(lambda: patch_jobset(actuate, labels))["message"]
    theirs = {"metadata": {"annotations": {"owner": None}}}
    assert "pitstop.dev/ annotations" in refused(lambda: patch_jobset(actuate, theirs))["message"]

    batch = k8s.BatchV1Api(actuate)
    assert batch.patch_namespaced_job("solo", "default", {"spec": {"suspend": True}}).spec.suspend is True
    deadline = {"spec": {"activeDeadlineSeconds": 5}}
    refused(lambda: batch.patch_namespaced_job("solo", "default", deadline))

    theirs_ok = patch_jobset(other, labels)["metadata"]["labels"]  # not actuate: not the policy's to limit
    assert theirs_ok["kueue.x-k8s.io/queue-name"] == "other"
    decided = [(d["user"], d["resource"], d["allowed"]) for d in kube.policies.decisions]
    assert decided == [
        (ACTUATE, "jobsets.jobset.x-k8s.io", True),
        *[(ACTUATE, "jobsets.jobset.x-k8s.io", False)] * 3,
        (ACTUATE, "jobs.batch", True),
        (ACTUATE, "jobs.batch", False),
    ]


def test_actuates_topology_pin_is_admitted_and_nothing_else_of_a_pod_template(
    kube: FakeKube, tmp_path: Path
) -> None:
    """A move placed in a block (adapters/gke/pin.py): suspend, the two topology keys of the pod
    templates' nodeSelector and Pitstop's marks, in one update; any other template change is refused."""
    from pitstop.adapters.gke.pin import pinned_body

    kubectl_apply(tmp_path, deployed_admission())
    training(kube)
    actuate = as_user(kube, "t-actuate")
    js = kube.get("JobSet", "train", "default")
    assert js is not None
    block, sub = "cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"

    def tampered(edit: Any) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(json.dumps(pinned_body(js, {block: "b1", sub: "s2"}, "i-1-1")))
        edit(body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"])
        return body

    topology_only = "Pitstop may change only the topology keys of a JobSet's pod templates' nodeSelector"
    for edit in (
        lambda pod: pod["spec"]["containers"][0].update(image="evil:1"),
        lambda pod: pod["spec"]["nodeSelector"].update(pool="other"),
        lambda pod: pod.setdefault("metadata", {}).update(labels={"x": "y"}),
        lambda pod: pod["spec"].update(hostNetwork=True),
    ):
        assert topology_only in refused(lambda e=edit: patch_jobset(actuate, tampered(e)))["message"]
    more = tampered(lambda pod: None)
    more["spec"]["replicatedJobs"].append(copy.deepcopy(more["spec"]["replicatedJobs"][0]) | {"name": "x"})
    assert topology_only in refused(lambda: patch_jobset(actuate, more))["message"]

    done = patch_jobset(actuate, tampered(lambda pod: None))
    assert done["spec"]["suspend"] is True
    pod = done["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {block: "b1", sub: "s2"}
    assert done["metadata"]["annotations"]["pitstop.dev/pinned"] == f"{block}=b1,{sub}=s2"


def test_an_unknown_token_is_unauthorized_and_no_token_is_anonymous(kube: FakeKube) -> None:
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(as_user(kube, "t-forged")).list_node()
    assert err.value.status == 401 and json.loads(err.value.body or "{}")["reason"] == "Unauthorized"
    req = urllib.request.Request(kube.url + "/api/v1/nodes")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def custom_policy(expression: str, *, failure: str = "Fail", actions: tuple[str, ...] = ("Deny",)) -> str:
    """A policy on batch Jobs and a binding limited to namespaces labelled ``team=ml``."""
    rule = {
        "apiGroups": ["batch"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["jobs"],
    }
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "failurePolicy": failure,
            "matchConstraints": {"resourceRules": [rule]},
            "validations": [{"expression": expression, "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "b"},
        "spec": {
            "policyName": "p",
            "validationActions": list(actions),
            "matchResources": {"namespaceSelector": {"matchLabels": {"team": "ml"}}},
        },
    }
    return yaml.safe_dump_all([policy, binding])


def job_in(namespace: str, name: str = "j") -> dict[str, Any]:
    tpl = {"spec": {"restartPolicy": "Never", "containers": [{"name": "t", "image": "x"}]}}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"template": tpl}}


def post_job(kube: FakeKube, namespace: str, name: str = "j") -> tuple[int, dict[str, Any]]:
    data = json.dumps(job_in(namespace, name)).encode()
    req = urllib.request.Request(
        f"{kube.url}/apis/batch/v1/namespaces/{namespace}/jobs",
        data=data,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def namespaces(kube: FakeKube) -> None:
    kube.create({"kind": "Namespace", "metadata": {"name": "ml", "labels": {"team": "ml"}}})
    kube.create({"kind": "Namespace", "metadata": {"name": "web", "labels": {"team": "web"}}})


def test_the_bindings_match_resources_reason_and_validation_actions(kube: FakeKube, tmp_path: Path) -> None:
    namespaces(kube)
    kubectl_apply(tmp_path, custom_policy("object.spec.template.spec.containers.size() > 1"))
    code, body = post_job(kube, "ml")
    assert (code, body["reason"]) == (403, "Forbidden")  # the validation's reason and its code
    assert "failed expression: object.spec.template.spec.containers.size() > 1" in body["message"]
    assert post_job(kube, "web")[0] == 201  # outside the binding's namespaceSelector
    kubectl_apply(tmp_path, custom_policy("false", actions=("Warn", "Audit")))
    assert post_job(kube, "ml", "k")[0] == 201  # Warn and Audit never refuse
    assert [d["allowed"] for d in kube.policies.decisions] == [False, False]


@pytest.mark.parametrize(("failure", "admitted"), [("Fail", False), ("Ignore", True)])
def test_an_expression_that_fails_follows_the_failure_policy(
    kube: FakeKube, tmp_path: Path, failure: str, admitted: bool
) -> None:
    namespaces(kube)
    kubectl_apply(tmp_path, custom_policy("object.spec.missing == 1", failure=failure))
    code, body = post_job(kube, "ml")
    assert (code == 201) is admitted
    if not admitted:
        assert "resulted in error" in body["message"] and body["reason"] == "Invalid"


def test_a_policy_the_fake_cannot_evaluate_is_refused_when_applied(kube: FakeKube) -> None:
    doc = yaml.safe_load_all(custom_policy("true"))
    policy = next(iter(doc))
    policy["spec"]["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    req = urllib.request.Request(
        kube.url + VAPS,
        data=json.dumps(policy).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 422 and "paramKind" in json.loads(err.value.read())["message"]
    assert kube.list("ValidatingAdmissionPolicy") == []


def test_the_deployed_manifest_holds_the_policy_the_stack_applies() -> None:
    """The stack's copy is infra/gke/clusterrole.yaml's own two documents, actuate's name put in."""
    docs = [d for d in yaml.safe_load_all((ROOT / "infra/gke/clusterrole.yaml").read_text()) if d]
    deployed = [d for d in docs if d["apiVersion"].startswith("admissionregistration.k8s.io/")]
    applied = list(yaml.safe_load_all(deployed_admission("a@b")))
    assert len(applied) == len(deployed) == 2
    assert applied[0]["spec"]["matchConditions"][0]["expression"] == 'request.userInfo.username == "a@b"'
    assert [d["kind"] for d in applied] == [d["kind"] for d in deployed]


RULE = {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["UPDATE", "DELETE"]}


def rules_policy(constraints: dict[str, Any], expression: str = "false") -> dict[str, Any]:
    spec = {"matchConstraints": constraints, "validations": [{"expression": expression}]}
    return {"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"}, "spec": spec}


def request(operation: str, kind: str = "Job", sub: str = "", namespace: str | None = "default") -> Request:
    return Request("u", ("system:authenticated",), operation, BY_KIND[kind], sub, "x", namespace)


def judged(store: Store, req: Request, old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """True when the request was refused."""
    try:
        Policies(store).review(req, old, new)
    except ApiError as err:
        assert err.code == 422
        return True
    return False


JOB = {"metadata": {"name": "x", "namespace": "default", "labels": {"team": "ml"}}, "spec": {}}


@pytest.mark.parametrize(
    ("rules", "binding_scope", "req", "refused"),
    [
        ({"resources": ["jobs"]}, None, request("UPDATE"), True),
        ({"resources": ["jobs"]}, None, request("UPDATE", sub="status"), False),  # a subresource: named
        ({"resources": ["jobs/status"]}, None, request("UPDATE", sub="status"), True),
        ({"resources": ["*"]}, None, request("UPDATE", sub="status"), False),
        ({"resources": ["*/*"]}, None, request("UPDATE", sub="status"), True),
        ({"resources": ["jobs"], "scope": "Cluster"}, None, request("UPDATE"), False),
        ({"resources": ["jobs"], "operations": ["CREATE"]}, None, request("UPDATE"), False),
        (
            {"resources": ["jobs"]},
            {"objectSelector": {"matchLabels": {"team": "web"}}},
            request("UPDATE"),
            False,
        ),
        (
            {"resources": ["jobs"]},
            {"objectSelector": {"matchLabels": {"team": "ml"}}},
            request("UPDATE"),
            True,
        ),
        (
            {"resources": ["jobs"]},
            {"resourceRules": [{**RULE, "resources": ["pods"]}]},
            request("UPDATE"),
            False,
        ),
        (
            {"resources": ["jobs"]},
            {"excludeResourceRules": [{**RULE, "resources": ["jobs"]}]},
            request("UPDATE"),
            False,
        ),
        ({"resources": ["jobs"], "operations": ["DELETE"]}, None, request("DELETE"), True),
    ],
)
def test_what_a_policy_and_its_binding_match(
    rules: dict[str, Any], binding_scope: dict[str, Any] | None, req: Request, refused: bool
) -> None:
    """matchConstraints and the binding's matchResources, as the API reference defines them: a
    rule names subresources explicitly ("jobs" is not "jobs/status"; "*" matches no subresource,
    "*/*" every one), scope and operations count, and the binding narrows what its policy matched."""
    store = Store(time_scale=0)
    store.create("Namespace", {"metadata": {"name": "default"}})
    rule = {**RULE, **rules}
    store.create(POLICY_KIND, rules_policy({"resourceRules": [rule]}))
    spec: dict[str, Any] = {"policyName": "p", "validationActions": ["Deny"]}
    if binding_scope is not None:
        spec["matchResources"] = binding_scope
    store.create(BINDING_KIND, {"metadata": {"name": "b"}, "spec": spec})
    new = None if req.operation == "DELETE" else JOB  # a DELETE's object is null
    assert judged(store, req, JOB, new) is refused
