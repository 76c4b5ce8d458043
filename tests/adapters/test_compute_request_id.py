"""Compute Engine request ids: deterministic per effect, sent on every mutating call, honoured by the fake.

The real google-cloud-compute client talks to the fake over HTTP, as actuate does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.core.ids import derived_request_id, request_id
from pitstop.local.fake_compute import REQUEST_ID_WINDOW_S, FakeCompute, serve

P, Z = "train-prod", "us-central1-a"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world() -> Iterator[tuple[FakeCompute, ComputeAdapter, Clock]]:
    clock = Clock()
    fake = FakeCompute(time_scale=0.001, clock=clock)
    fake.add_instance(P, Z, "vm-a", mig="grp")
    fake.add_instance(P, Z, "vm-b", mig="grp")
    server, endpoint = serve(fake)
    try:
        yield fake, ComputeAdapter(endpoint), clock
    finally:
        server.shutdown()


def test_request_id_is_a_deterministic_uuid_per_effect() -> None:
    rid = request_id("iabcdefgh2", 1, "act")
    assert rid == request_id("iabcdefgh2", 1, "act")
    parsed = uuid.UUID(rid)
    assert parsed.version == 5 and str(parsed) == rid and parsed.int != 0
    others = {
        request_id("iabcdefgh2", 2, "act"),
        request_id("iabcdefgh3", 1, "act"),
        request_id("iabcdefgh2", 1, "fence"),
        request_id("iabcdefgh2", 1, "act", "label"),
        request_id("iabcdefgh2-1", 1, "act"),
        request_id("iabcdefgh2", 11, "act"),
    }
    assert rid not in others and len(others) == 6
    # the parts cannot run into each other
    assert request_id("a-1", 2, "x") != request_id("a", 12, "x")
    assert request_id("a", 1, "x", "y") != request_id("a", 1, "xy")
    assert derived_request_id(rid, "retry") == derived_request_id(rid, "retry") != rid
    for bad in (("", 1, "act"), ("i", -1, "act"), ("i", True, "act"), ("i", 1, "")):
        with pytest.raises(ValueError):
            request_id(*bad)


def test_a_repeated_request_id_resets_once_and_answers_with_the_original_operation(
    world: tuple[FakeCompute, ComputeAdapter, Clock],
) -> None:
    fake, compute, clock = world
    rid = request_id("iabcdefgh2", 1, "act")
    first = compute.reset(P, Z, "vm-a", request_id=rid)
    clock.now += 1  # the retry arrives while the reset is still running
    again = compute.reset(P, Z, "vm-a", request_id=rid)
    assert again == first
    assert len(fake.effects_on("vm-a", "reset")) == 1
    assert [c.get("replayed", False) for c in fake.calls] == [False, True]
    assert [c["request_id"] for c in fake.calls] == [rid, rid]
    clock.now += 60  # the reset is done
    other = compute.reset(P, Z, "vm-a", request_id=request_id("iabcdefgh2", 2, "act"))
    assert other != first
    assert len(fake.effects_on("vm-a", "reset")) == 2
    assert fake.effects_on("vm-b") == []
    snapshot = fake.snapshot()  # what `pitstop local status` shows
    assert len(snapshot["effects"]) == 2 and len(snapshot["calls"]) == 3


def test_request_ids_are_remembered_per_project_for_an_hour(
    world: tuple[FakeCompute, ComputeAdapter, Clock],
) -> None:
    fake, compute, clock = world
    fake.add_instance("other-proj", Z, "vm-a")
    rid = request_id("iabcdefgh2", 1, "act")
    compute.reset(P, Z, "vm-a", request_id=rid)
    compute.reset("other-proj", Z, "vm-a", request_id=rid)  # another project: another request
    assert len(fake.effects) == 2
    clock.now += REQUEST_ID_WINDOW_S - 5
    compute.reset(P, Z, "vm-a", request_id=rid)
    assert len(fake.effects) == 2
    clock.now += 10  # past the hour the fake promises (Compute promises no more)
    compute.reset(P, Z, "vm-a", request_id=rid)
    assert len(fake.effects) == 3


def test_every_mutating_call_sends_its_request_id(world: tuple[FakeCompute, ComputeAdapter, Clock]) -> None:
    fake, compute, clock = world
    fake.instances[f"projects/{P}/zones/{Z}/instances/vm-b"].maintenance = {"canReschedule": True}
    ids = {m: request_id("iabcdefgh2", 1, "act", m) for m in ("report", "maint", "recreate", "labels")}
    report = compute.report_host_as_faulty(
        P, Z, "vm-a", "UNRECOVERABLE_GPU_ERROR", "Xid 79", request_id=ids["report"]
    )
    assert (
        compute.report_host_as_faulty(
            P, Z, "vm-a", "UNRECOVERABLE_GPU_ERROR", "Xid 79", request_id=ids["report"]
        )
        == report
    )
    maint = compute.perform_maintenance(P, Z, "vm-b", request_id=ids["maint"])
    assert compute.perform_maintenance(P, Z, "vm-b", request_id=ids["maint"]) == maint
    clock.now += 3600  # both operations done
    recreate = compute.recreate(P, Z, "grp", "vm-b", request_id=ids["recreate"])
    assert compute.recreate(P, Z, "grp", "vm-b", request_id=ids["recreate"]) == recreate
    compute.set_labels(P, Z, "vm-a", {"pitstop-state": "fenced"}, request_id=ids["labels"])
    compute.set_labels(P, Z, "vm-a", {"pitstop-state": "fenced"}, request_id=ids["labels"])
    effects = [(e["method"], e["instances"], e["request_id"]) for e in fake.effects]
    assert effects == [
        ("report_host_as_faulty", ["vm-a"], ids["report"]),
        ("perform_maintenance", ["vm-b"], ids["maint"]),
        ("recreate", ["vm-b"], ids["recreate"]),
        ("set_labels", ["vm-a"], ids["labels"]),
    ]
    assert fake.instances[f"projects/{P}/zones/{Z}/instances/vm-a"].reports == 1


def test_set_labels_after_a_stale_fingerprint_is_a_new_request(
    world: tuple[FakeCompute, ComputeAdapter, Clock],
) -> None:
    fake, compute, _ = world
    fake.inject(
        "set_labels",
        412,
        "conditionNotMet",
        "Labels fingerprint either invalid or resource labels have changed",
    )
    rid = request_id("iabcdefgh2", 1, "fence", "label")
    compute.set_labels(P, Z, "vm-a", {"pitstop-state": "fenced"}, request_id=rid)
    sent = [c["request_id"] for c in fake.calls if c["method"] == "set_labels"]
    assert sent == [rid, derived_request_id(rid, "fingerprint-retry")]
    assert len(fake.effects_on("vm-a", "set_labels")) == 1
    assert fake.instances[f"projects/{P}/zones/{Z}/instances/vm-a"].labels == {"pitstop-state": "fenced"}


def test_request_ids_must_be_uuids(world: tuple[FakeCompute, ComputeAdapter, Clock]) -> None:
    fake, compute, _ = world
    for bad in ("retry-1", str(uuid.UUID(int=0))):
        with pytest.raises(ActuatorError) as e:
            compute.reset(P, Z, "vm-a", request_id=bad)
        assert e.value.status == 400 and not e.value.retryable
    assert fake.calls == []  # refused before anything was sent
    # the fake refuses them too, as Compute does
    status, body = fake.dispatch(
        "POST", f"/compute/v1/projects/{P}/zones/{Z}/instances/vm-a/reset?requestId=x", {}
    )
    assert status == 400 and isinstance(body, dict) and body["error"]["errors"][0]["reason"] == "invalid"
    assert fake.effects == []


def test_every_mutating_method_requires_a_request_id() -> None:
    import inspect

    for name in ("reset", "report_host_as_faulty", "perform_maintenance", "recreate", "set_labels"):
        param = inspect.signature(getattr(ComputeAdapter, name)).parameters["request_id"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default is inspect.Parameter.empty, f"{name}: an effect without an id is not deduped"
