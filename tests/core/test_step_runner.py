"""The idempotent step runner (core/steps.py) over its in-memory store: the state machine alone."""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.core import steps
from pitstop.core.domain import StepRecord
from pitstop.core.steps import Claim, MemoryStepStore, Release, StepRunner


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _runner(claim_s: float = 60.0) -> tuple[StepRunner[int], MemoryStepStore, Clock]:
    store, clock = MemoryStepStore(), Clock()
    return StepRunner(store, claim_s, clock), store, clock


PAYLOAD = {"op": "act", "incident": "iabcdefghi", "step": 1}


def test_a_done_record_is_replayed_and_the_handler_runs_once() -> None:
    runner, _, _ = _runner()
    calls: list[int] = []

    def handler(claim: Claim) -> dict[str, Any]:
        calls.append(claim.attempt)
        return {"did": "it"}

    assert runner.run("k", PAYLOAD, handler, "exec-1") == {"did": "it"}
    assert runner.run("k", PAYLOAD, handler, "exec-2") == {"did": "it", "replayed": True}
    assert calls == [1]


def test_a_live_claim_answers_busy_until_it_expires_then_is_taken_over() -> None:
    runner, store, clock = _runner(claim_s=60)
    first = runner.begin("k", PAYLOAD, "exec-1")
    assert isinstance(first, Claim)
    with pytest.raises(steps.BusyError):
        runner.begin("k", PAYLOAD, "exec-2")
    clock.now += 61  # the first attempt is dead
    second = runner.begin("k", PAYLOAD, "exec-2")
    assert isinstance(second, Claim) and second.attempt == 2
    with pytest.raises(steps.ClaimLostError):  # the dead attempt, come back, may not record
        runner.finish(first, {"late": True})
    runner.finish(second, {"ok": True})
    got = store.read("k")
    assert got is not None and got.record["result"] == {"ok": True} and got.record["owner"] == "exec-2"


def test_what_an_attempt_saved_is_handed_to_the_next() -> None:
    runner, _, _ = _runner()

    def plan_then_fail(claim: Claim) -> dict[str, Any]:
        runner.save(claim, {"plan": {"method": "reset"}})
        raise RuntimeError("compute said 503")

    with pytest.raises(RuntimeError):
        runner.run("k", PAYLOAD, plan_then_fail)
    seen: list[dict[str, Any]] = []

    def reuse(claim: Claim) -> dict[str, Any]:
        seen.append(dict(claim.saved))
        return {"method": claim.saved["plan"]["method"]}

    assert runner.run("k", PAYLOAD, reuse) == {"method": "reset"}
    assert seen == [{"plan": {"method": "reset"}}]  # released at once: no wait for the expiry


def test_a_handler_that_did_nothing_releases_and_nothing_is_replayed() -> None:
    runner, store, _ = _runner()
    answer = runner.run("k", PAYLOAD, lambda c: Release({"outcome": "nothing"}, "not ours"))
    assert answer == {"outcome": "nothing"}
    got = store.read("k")
    assert got is not None and got.record["state"] == steps.RELEASED
    assert runner.run("k", PAYLOAD, lambda c: {"second": True}) == {"second": True}


def test_a_kept_release_leaves_its_answer_on_the_record_and_still_runs_again() -> None:
    runner, store, _ = _runner()
    answer = runner.run("k", PAYLOAD, lambda c: Release({"state": "transient"}, "hiccup", keep=True))
    got = store.read("k")
    assert got is not None and got.record["state"] == steps.RELEASED
    assert got.record["result"] == answer == {"state": "transient"}
    assert runner.run("k", PAYLOAD, lambda c: {"second": True}) == {"second": True}


def test_a_key_claimed_for_another_request_is_refused() -> None:
    runner, _, _ = _runner()
    runner.run("k", PAYLOAD, lambda c: {"ok": True})
    with pytest.raises(steps.PayloadMismatchError):
        runner.run("k", {**PAYLOAD, "step": 2}, lambda c: {"ok": True})


def test_a_result_that_could_not_be_written_releases_the_claim() -> None:
    runner, store, _ = _runner()
    real = store.update_held
    failed: list[str] = []

    def flaky(key: str, token: str, fields: StepRecord) -> bool:
        if fields.get("state") == steps.DONE and not failed:
            failed.append(key)
            raise ConnectionError("store unavailable")
        return real(key, token, fields)

    store.update_held = flaky  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        runner.run("k", PAYLOAD, lambda c: {"effect": 1})
    got = store.read("k")
    assert got is not None and got.record["state"] == steps.RELEASED
    assert runner.run("k", PAYLOAD, lambda c: {"effect": 2}) == {"effect": 2}


def test_records_from_before_claims_are_read_by_their_result() -> None:
    assert steps.record_state({"result": {}}) == steps.DONE
    assert steps.record_state({}) == steps.RELEASED
    assert steps.claim_seconds(300) == 330.0
