"""Reading Kubernetes objects (adapters/gke/objects.py) when a field has the wrong type.

What the API returns is JSON Pitstop did not write: the readers take it as ``Mapping[str, object]``
and read each field through a checked accessor, so a field of the wrong type reads as absent and
the reading goes on (a node with a malformed capacity is "not healthy yet", never a crash). The
property runs every reader over objects whose fields are any JSON value, at the keys they read.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import CheckSettings, objects
from pitstop.adapters.gke.client import control_plane
from pitstop.adapters.gke.objects import (
    FENCE_KEY,
    GPU_RESOURCE,
    allocatable_gpus,
    node_health,
    pod_gpus,
    restart_blockers,
    selector_matches,
    sub,
    subs,
    text,
    whole,
)
from pitstop.adapters.gke.shapes import KubeObject
from pitstop.adapters.gke.zone import cluster_zones
from pitstop.core.scheduling import JobState

# the keys the readers look up, so that a generated value lands where it is read
KEYS = [
    "metadata", "spec", "status", "labels", "annotations", "name", "namespace", "ownerReferences",
    "controller", "kind", "conditions", "type", "taints", "key", "value", "effect", "unschedulable",
    "capacity", "allocatable", GPU_RESOURCE, "phase", "restarts", "active", "suspend",
    "failurePolicy", "rules", "action", "maxRestarts", "replicatedJobs", "template",
    "podFailurePolicy", "onPodConditions", "containers", "resources", "limits", "requests",
    "tolerations", "operator", "nodeSelector", "matchLabels", "matchExpressions", "values",
    "message", "details", "causes", "parallelism", "completions", FENCE_KEY,
]  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.sampled_from(["", "8", "True", "Ready", "In"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    max_leaves=25,
)
OBJECTS = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6)


@settings(max_examples=400, deadline=None)
@given(OBJECTS, OBJECTS)
def test_every_reader_takes_any_json_without_raising(obj: KubeObject, other: KubeObject) -> None:
    healthy, why = node_health(obj)
    assert isinstance(healthy, bool) and isinstance(why, str) and (healthy or why)
    assert isinstance(objects.other_cordon_reason(obj), str)
    ref = objects.owner_ref(obj)
    assert ref is None or (objects.valid_namespace(ref.namespace) and objects.valid_object_name(ref.name))
    for state in (objects.jobset_state(obj, [other]), objects.batch_job_state(obj)):  # the contract's type
        assert type(state) is JobState
        assert state in set(JobState) - {JobState.COMPLETING, JobState.CANCELLED, JobState.UNKNOWN}
    assert all(isinstance(w, str) for w in restart_blockers(obj))
    assert all(isinstance(n, str) for n in objects.pdb_names(obj))
    assert isinstance(selector_matches(obj, other), bool)
    assert pod_gpus(obj) >= 0 and allocatable_gpus(obj) >= 0 and objects.pods_per_job(obj) >= 0
    assert isinstance(objects.placeable(obj, other), bool)
    attempt = objects.attempt_of(obj)
    assert objects.restarts_of(obj) >= 0 and (attempt is None or attempt >= 0)
    assert isinstance(objects.live(obj), bool) and isinstance(objects.fenced_by_pitstop(obj), bool)
    assert all(isinstance(z, str) for z in cluster_zones(obj))


def test_accessors_read_a_field_of_the_wrong_type_as_absent() -> None:
    obj: KubeObject = {"a": "text", "b": [1, {"k": 1}, "x"], "n": True, "m": 3, "o": {"k": "v"}}
    assert sub(obj, "a") == {} and sub(obj, "o") == {"k": "v"} and sub(obj, "missing") == {}
    assert subs(obj, "b") == [{"k": 1}] and subs(obj, "a") == [] and subs(obj, "o") == []
    assert text(obj, "a") == "text" and text(obj, "m") is None
    assert whole(obj, "m") == 3 and whole(obj, "n") is None and whole(obj, "a") is None


def test_a_malformed_gpu_capacity_is_no_capacity_not_a_crash() -> None:
    """Before: ``(status.get("capacity") or {}).get(...)`` raised on a capacity that is a string."""
    node: KubeObject = {
        "metadata": {"labels": {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": "8", "allocatable": [8]},
    }
    assert node_health(node) == (
        False,
        f"GPU node reports no {GPU_RESOURCE} capacity yet (device plugin not registered)",
    )
    assert allocatable_gpus(node) == 0


def test_malformed_pod_templates_and_selectors_read_as_absent() -> None:
    containers = [{"resources": "lots"}, {"resources": {"limits": {GPU_RESOURCE: "4"}}}]
    assert pod_gpus({"containers": containers}) == 4
    # matchLabels that is no object requires nothing (before: AttributeError on .items())
    assert selector_matches({"matchLabels": ["a"]}, {"a": "b"}) is True
    expr = {"matchExpressions": [{"key": 7, "operator": "Exists"}]}
    assert selector_matches(expr, {"7": "x"}) is False  # a key that is no string matches nothing
    js = {
        "spec": {
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [{"template": {"spec": {"podFailurePolicy": "x"}}}],
        }
    }
    assert restart_blockers(js) == []


def test_a_control_plane_whose_ca_is_not_text_is_refused_clearly() -> None:
    with pytest.raises(ActuatorError, match="neither a DNS endpoint nor an IP endpoint with a CA"):
        control_plane({"endpoint": "10.0.0.2", "masterAuth": {"clusterCaCertificate": ["not", "text"]}})
    cluster = {
        "controlPlaneEndpointsConfig": "x",
        "endpoint": "10.0.0.2",
        "masterAuth": {"clusterCaCertificate": "Y2E="},
    }
    assert control_plane(cluster) == ("https://10.0.0.2", b"ca")  # a malformed DNS config: the IP endpoint


@pytest.mark.parametrize(
    ("checks", "why"),
    [
        ({"tools": ["nvidia-smi"]}, "gke.checks.tools must be a mapping"),
        ({"deadline_s": [600]}, "gke.checks.deadline_s must be a number of seconds"),
        ({"ttl_s": "an hour"}, "gke.checks.ttl_s must be a number of seconds"),
    ],
)
def test_malformed_check_settings_are_a_clear_error(checks: dict[str, object], why: str) -> None:
    """Before: an AttributeError or TypeError from deep inside; the policy schema catches these
    first, so this is the adapter's own guard for a policy read without it."""
    with pytest.raises(ValueError, match=why):
        CheckSettings.from_conf({"checks": checks})
