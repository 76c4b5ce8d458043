"""The adapters' retries, one policy (adapters/retry.py) on google.api_core's retry loop.

First the policy itself; then each call site against its system's stand-in, through the real
client library: a refusal worth another attempt, then success; the attempts or the deadline spent;
and an error no retry can change, asked once. The stand-ins answer as their APIs document:

- Kubernetes: a write guarded by a stale ``resourceVersion`` is 409 Conflict ("please apply your
  changes to the latest version and try again", kubernetes.io/docs/reference/using-api/
  api-concepts/#conflicts); an eviction a PodDisruptionBudget refuses is 429 ("the eviction is not
  currently allowed ... try again later", kubernetes.io/docs/concepts/scheduling-eviction/
  api-eviction/#how-api-initiated-eviction-works), a pod gone is 404; RBAC's refusal is 403.
- Compute Engine: setLabels with a stale ``labelFingerprint`` is 412 conditionNotMet
  (cloud.google.com/compute/docs/labeling-resources#updating_labels).
- Managed Service for Prometheus and the Container API: 429 and 5xx are passing, 4xx is final
  (cloud.google.com/apis/design/errors#handling_errors).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc

from pitstop.adapters import retry
from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke import GkeCluster, fence, parse_job_id
from pitstop.adapters.gke.objects import CONFLICT_RETRIES
from pitstop.adapters.gke.restart import jobset_once
from pitstop.adapters.gke.zone import ClusterZones, ZoneLookupError
from pitstop.adapters.prometheus import PromQLReader
from pitstop.core import degraded
from pitstop.core.ids import request_id
from pitstop.core.scheduling import StepRef
from pitstop.local.fake_compute import FakeCompute
from pitstop.local.fake_compute import serve as serve_compute
from pitstop.local.fake_container import FakeContainer
from pitstop.local.fake_container import serve as serve_container
from pitstop.local.fake_k8s import FakeKube
from pitstop.local.fake_prometheus import FakePrometheus
from pitstop.local.fake_prometheus import serve as serve_prometheus
from tests.adapters.test_gke_adapter import JOB, NODES, PROJECT, ZONE, Clock, jobset, node_of, pods, started

INC = "iaaaaaaaaa"
CTX = StepRef(INC, 1)


class Flaky:
    """A call that fails with each error of ``errors`` in turn, then answers ``ok``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def conflict() -> Exception:
    return gexc.Conflict("stale")  # type: ignore[no-untyped-call]


# -- the policy --------------------------------------------------------------------------------


def test_a_retryable_error_is_tried_again_after_the_policys_waits() -> None:
    waits: list[float] = []
    policy = retry.Policy(lambda e: isinstance(e, gexc.Conflict), 4, retry.Backoff(0.5, 2.0, 1.5))
    flaky = Flaky(conflict(), conflict(), conflict())
    assert retry.call(flaky, policy, sleep=waits.append) == "ok"
    assert (flaky.calls, waits) == (4, [0.5, 1.0, 1.5])  # doubled, capped; no wait after success


def test_spent_attempts_end_with_the_policys_error_and_the_last_one_as_its_cause() -> None:
    policy = retry.conflicts(3, lambda e: ActuatorError(503, "kept changing", True))
    flaky = Flaky(*(retry.StaleReadError(str(i)) for i in range(5)))
    with pytest.raises(ActuatorError, match="kept changing") as err:
        retry.call(flaky, policy)
    assert flaky.calls == 3 and str(err.value.__cause__) == "2"


def test_an_error_the_policy_does_not_name_is_raised_at_once() -> None:
    flaky = Flaky(gexc.Forbidden("no"))  # type: ignore[no-untyped-call]
    with pytest.raises(gexc.Forbidden):
        retry.call(flaky, retry.conflicts(5, lambda e: e))
    assert flaky.calls == 1


def test_a_deadline_cuts_the_last_wait_and_ends_the_retries() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    policy = retry.Policy(lambda e: isinstance(e, gexc.Conflict), backoff=retry.Backoff(1.0, 2.0))
    flaky = Flaky(*(conflict() for _ in range(10)))
    with pytest.raises(gexc.Conflict):
        retry.call(flaky, policy, sleep=sleep, clock=lambda: now[0], deadline=2.5)
    assert now[0] == 2.5 and flaky.calls == 3  # waited 1, then 1.5 (not 2): the last try on the deadline


def test_a_retry_without_a_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="bound"):
        retry.call(Flaky(), retry.Policy(lambda e: True))


# -- Managed Service for Prometheus ------------------------------------------------------------------


@pytest.fixture
def prometheus() -> Iterator[tuple[PromQLReader, FakePrometheus, list[float]]]:
    fake = FakePrometheus("pitstop-local", "train", ZONE, ["gke-n-0"], dict)
    server, url = serve_prometheus(fake)
    waits: list[float] = []
    try:
        yield PromQLReader(url, sleep=waits.append), fake, waits
    finally:
        server.shutdown()


def test_prometheus_429_and_503_are_retried_and_a_bad_query_is_not(prometheus: Any) -> None:
    reader, fake, waits = prometheus
    rule = degraded.default_policy().prometheus["throttle"]
    fake.faults[:] = [429, 503]
    assert reader.node_values("pitstop-local", rule, ["gke-n-0"], 1_800_000_000.0) == {"gke-n-0": 0.0}
    assert waits == [0.5, 1.0]
    waits.clear()
    with pytest.raises(gexc.BadRequest, match="bad_data"):
        reader.query_range("pitstop-local", "up{", {"start": "1", "end": "2", "step": "60"})
    assert waits == []


# -- Compute Engine --------------------------------------------------------------------------------


@pytest.fixture
def compute() -> Iterator[tuple[FakeCompute, ComputeAdapter]]:
    fake = FakeCompute()
    fake.add_instance(PROJECT, ZONE, "vm-a")
    server, endpoint = serve_compute(fake)
    try:
        yield fake, ComputeAdapter(endpoint)
    finally:
        server.shutdown()


def test_set_labels_reads_a_stale_fingerprint_once_more_then_gives_up(compute: Any) -> None:
    fake, adapter = compute
    fake.inject("set_labels", 412, "conditionNotMet", count=2)
    rid = request_id(INC, 1, "fence", "label")
    with pytest.raises(ActuatorError) as err:
        adapter.set_labels(PROJECT, ZONE, "vm-a", {"pitstop-state": "fenced"}, request_id=rid)
    assert err.value.status == 412
    assert len([c for c in fake.calls if c["method"] == "set_labels"]) == 2


def test_set_labels_refused_otherwise_is_asked_once(compute: Any) -> None:
    fake, adapter = compute
    fake.inject("set_labels", 403, "forbidden")
    rid = request_id(INC, 1, "fence", "label")
    with pytest.raises(ActuatorError) as err:
        adapter.set_labels(PROJECT, ZONE, "vm-a", {"pitstop-state": "fenced"}, request_id=rid)
    assert err.value.status == 403 and not err.value.retryable
    assert len([c for c in fake.calls if c["method"] == "set_labels"]) == 1


# -- the Container API's clusters.get ----------------------------------------------------------------


def test_clusters_get_unavailable_twice_then_answering_finds_the_zones() -> None:
    fake = FakeContainer()
    fake.add_cluster(PROJECT, "us-central1", "train", ["us-central1-a"])
    server, endpoint = serve_container(fake)
    waits: list[float] = []
    try:
        fake.fail(2, 503)
        zones = ClusterZones(requests.Session(), endpoint, sleep=waits.append)
        assert zones(PROJECT, "us-central1", "train") == ["us-central1-a"]
        assert (len(fake.requests), waits) == (3, [0.2, 0.4])
        fake.fail(1, 403)
        with pytest.raises(ZoneLookupError, match="403"):
            ClusterZones(requests.Session(), endpoint, sleep=waits.append)(PROJECT, "us-central1", "other")
        assert len(fake.requests) == 4
    finally:
        server.shutdown()


# -- Kubernetes ------------------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    k = FakeKube(vm_status=None, auto=False)
    k.start()
    for n in NODES:
        k.add_node(n, project=PROJECT, zone=ZONE)
    yield k
    k.stop()


@pytest.fixture
def clock(kube: FakeKube) -> Clock:
    return Clock(kube)


@pytest.fixture
def sched(api: Any, clock: Clock) -> GkeCluster:
    return GkeCluster(api, evict_deadline_s=10, wait_s=10, clock=clock, sleep=clock.sleep)


def sent(kube: FakeKube, method: str, suffix: str) -> int:
    return len([r for r in kube.requests if r[0] == method and r[1].split("?")[0].endswith(suffix)])


def test_a_node_patch_refused_as_stale_is_read_and_decided_again(kube: FakeKube, sched: GkeCluster) -> None:
    kube.fail("PATCH", "Node", 409, "Conflict", times=2)
    fence.fence(sched.kube, NODES[0], INC)
    assert sent(kube, "PATCH", f"/nodes/{NODES[0]}") == 3
    assert sent(kube, "GET", f"/nodes/{NODES[0]}") == 3  # each attempt read the node again
    fenced = kube.get("Node", NODES[0])
    assert fenced is not None  # Pitstop's fence is its own taint, once (never a cordon: issue 35, 10)
    taints = [t for t in fenced["spec"].get("taints") or [] if t["key"] == "pitstop.dev/remediation"]
    assert taints == [{"key": "pitstop.dev/remediation", "value": INC, "effect": "NoSchedule"}]


def test_a_node_that_keeps_changing_is_a_retryable_503_after_the_attempts(
    kube: FakeKube, sched: GkeCluster
) -> None:
    kube.fail("PATCH", "Node", 409, "Conflict", times=CONFLICT_RETRIES)
    with pytest.raises(ActuatorError, match="kept changing") as err:
        fence.fence(sched.kube, NODES[1], INC)
    assert err.value.status == 503 and err.value.retryable
    assert sent(kube, "PATCH", f"/nodes/{NODES[1]}") == CONFLICT_RETRIES


def test_a_node_patch_forbidden_is_sent_once(kube: FakeKube, sched: GkeCluster) -> None:
    kube.fail("PATCH", "Node", 403, "Forbidden")
    with pytest.raises(ActuatorError) as err:
        fence.fence(sched.kube, NODES[2], INC)
    assert err.value.status == 403 and sent(kube, "PATCH", f"/nodes/{NODES[2]}") == 1


def test_an_eviction_a_budget_refuses_twice_goes_through_after_the_backoff(
    kube: FakeKube, sched: GkeCluster, clock: Clock
) -> None:
    started(kube, jobset())
    pod = pods(kube)[0]
    kube.fail("POST", "Pod", 429, "TooManyRequests", times=2, sub="eviction")
    assert sched.evictor.evict(pod, deadline=clock() + 10) == "evicted"
    assert sent(kube, "POST", "/eviction") == 3 and clock.t == 1.5  # waited 0.5 s, then 1 s


def test_an_eviction_forbidden_is_asked_once(kube: FakeKube, sched: GkeCluster, clock: Clock) -> None:
    started(kube, jobset())
    kube.fail("POST", "Pod", 403, "Forbidden", sub="eviction")
    with pytest.raises(ActuatorError) as err:
        sched.evictor.evict(pods(kube)[0], deadline=clock() + 10)
    assert err.value.status == 403 and sent(kube, "POST", "/eviction") == 1 and clock.t == 0


def test_a_restart_whose_pod_went_away_reads_the_jobset_again(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    sched.fence(node_of(kube, 0), CTX, "REBOOT_NODE")
    kube.fail("POST", "Pod", 404, "NotFound", sub="eviction")  # gone between the list and the eviction
    out = jobset_once(sched.evictor, parse_job_id(JOB), INC, 0)
    assert out["outcome"] == "restart triggered" and out.get("restarted") is True
    assert sent(kube, "POST", "/eviction") == 2 and sent(kube, "GET", "/jobsets/train") == 2


def test_a_restart_whose_pods_keep_going_away_is_a_retryable_503(kube: FakeKube, sched: GkeCluster) -> None:
    started(kube, jobset())
    kube.fail("POST", "Pod", 404, "NotFound", times=CONFLICT_RETRIES, sub="eviction")
    with pytest.raises(ActuatorError, match="kept disappearing") as err:
        jobset_once(sched.evictor, parse_job_id(JOB), INC, 0)
    assert err.value.retryable and sent(kube, "POST", "/eviction") == CONFLICT_RETRIES


def test_a_gang_stop_forbidden_is_sent_once_and_one_refused_as_stale_is_read_again(
    kube: FakeKube, sched: GkeCluster
) -> None:
    started(kube, jobset())
    jr = parse_job_id(JOB)
    target = sched.kinds["jobset"].stoppable(jr)
    assert target is not None
    kube.fail("PATCH", "JobSet", 403, "Forbidden")
    with pytest.raises(ActuatorError) as err:
        sched.gang._stop(jr, target, CTX.key)
    assert err.value.status == 403 and sent(kube, "PATCH", "/jobsets/train") == 1
    kube.fail("PATCH", "JobSet", 409, "Conflict")
    nodes, why = sched.gang._stop(jr, target, CTX.key)
    assert why == "" and len(nodes) == 2 and sent(kube, "PATCH", "/jobsets/train") == 3
    js = kube.get("JobSet", "train", "default")
    assert js is not None and js["spec"]["suspend"] is True
