"""A hung job on the whole local stack, enforce mode: its heartbeat stops, the Monitoring stand-in's
alert opens its incident, the workflow localises it on real Slurm and concludes.

- a bad node (an NVLink down, found by the ring's NCCL test) and a spare: the culprit's own
  incident fences and replaces it, the gang trains again on the spare, restarted once;
- no bad node: exactly one in-place restart and a page naming every node; the same job hung again
  within ``windows.hang_localise_s``: a new incident, not localised again.

The scenarios are this module's own (tests/pipeline.py drives the stack), not the demo's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pitstop.local import chaos
from pitstop.local.heartbeats import beating_again, beats, hang_ended
from pitstop.local.stack import HEARTBEAT_EVERY_S, ClusterSpec, WebhookRecord
from tests.pipeline import Pipeline, stack_up

pytestmark = pytest.mark.emulator

GANG = 4  # the hung training job's nodes; the pool has one spare more


@pytest.fixture(scope="module")
def sc() -> Iterator[Pipeline]:
    with stack_up("e2e-hang", ClusterSpec(nodes=13)) as stack:
        yield Pipeline(stack)


def _training(sc: Pipeline) -> tuple[str, list[str]]:
    """A training run (it writes the job heartbeat) on GANG of GANG + 1 nodes of its own, beating."""
    pool = sc.take(GANG + 1)
    job = sc.stack.submit_training(GANG, exclude=[n for n in sc.nodes if n not in pool])
    held: list[str] = sc.wait(lambda: sc.slurm.job_nodes(job), 60, f"job {job} to run")
    sc.wait(lambda: beats(sc.stack, job) > 2, 60, f"job {job} to beat")
    return job, held


def _hung(sc: Pipeline, job: str) -> None:
    """Once the job hangs, a beat already on its way is not the new run's: wait for the next one."""
    time.sleep(2 * HEARTBEAT_EVERY_S)
    beating_again(sc.stack, job, sc.wait, 300)


def test_a_hang_with_a_bad_node_and_a_spare_trains_again_on_the_spare(sc: Pipeline) -> None:
    job, held = _training(sc)
    bad = held[1]
    chaos.apply(sc.stack, "hang", "link", node=bad)
    _hung(sc, job)
    hang = hang_ended(sc.db, job, sc.wait)
    loc = hang.get("localisation") or {}
    culprit = sc.finished(bad, timeout=240)
    now_on = sc.slurm.job_nodes(job)
    try:
        assert hang["state"] == "RESOLVED"
        assert loc.get("culprits") == [bad]
        assert (loc.get("incidents") or {}).get(bad) == culprit["id"]  # the culprit's own incident
        assert (culprit["kind"], culprit["state"]) == ("localised", "RESOLVED")
        assert [r.get("kind") for r in loc.get("rounds") or []] == ["sweep", "links"]
        assert sc.restarts(job) == 1
        assert bad not in now_on and len(now_on) == GANG  # onto the spare
    finally:
        sc.slurm.cancel(job)


def test_a_hang_with_no_bad_node_restarts_in_place_once_pages_and_is_not_localised_twice(
    sc: Pipeline,
) -> None:
    sc.settle()
    job, held = _training(sc)
    chaos.apply(sc.stack, "hang")
    try:
        _hung(sc, job)
        first = hang_ended(sc.db, job, sc.wait)
        loc = first.get("localisation") or {}

        def paged() -> list[WebhookRecord]:
            return [w for w in sc.notes_for(first["id"]) if "no culprit fenced" in w["body"]["text"]]

        pages = sc.wait(paged, 30, "the page")
        restarts = sc.restarts(job)
        chaos.apply(sc.stack, "hang")  # the restarted run hangs too: the job's own fault
        second = hang_ended(sc.db, job, sc.wait, 2)
        assert loc.get("outcome") == "nothing_found"
        assert [x.get("kind") for x in loc.get("rounds", [])] == ["sweep", "links"]
        assert restarts == 1  # restarted in place once
        assert all(n in pages[0]["body"]["text"] for n in held)  # paged with every node
        assert second["id"] != first["id"]  # hung again: a new incident
        plan = second.get("localise")
        assert plan is not None and plan["run"] is False and "localisation" not in second
        assert sc.restarts(job) == 1  # not restarted again
    finally:
        sc.slurm.cancel(job)
        chaos.apply(sc.stack, "clear")
