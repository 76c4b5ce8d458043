"""A hung job on the whole local stack, enforce mode: its heartbeat stops, the Monitoring stand-in's
alert opens its incident, the workflow localises it on real Slurm and concludes.

- a bad node (an NVLink down, found by the ring's NCCL test) and a spare: the culprit's own
  incident fences and replaces it, the gang trains again on the spare, restarted once;
- no bad node: nothing restarted, a page naming every node and check (issue 35 (2));
- a forged heartbeat (one point for a running job, then silence): a job that did not opt in, or
  one whose own series was never established, is not checked, stopped or restarted; a page.

The scenarios are this module's own (tests/pipeline.py drives the stack), not the demo's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pitstop.core.localise import HEARTBEAT_OPT_IN
from pitstop.local import chaos, trainer
from pitstop.local.heartbeats import beating_again, beats, hang_ended
from pitstop.local.stack import HEARTBEAT_EVERY_S, HEARTBEAT_MIN_POINTS, PROJECT, ClusterSpec, WebhookRecord
from tests.pipeline import Pipeline, stack_up

pytestmark = pytest.mark.emulator

GANG = 4  # the hung training job's nodes; the pool has one spare more


@pytest.fixture(scope="module")
def sc() -> Iterator[Pipeline]:
    with stack_up("e2e-hang", ClusterSpec(nodes=14)) as stack:
        yield Pipeline(stack)


def _training(sc: Pipeline) -> tuple[str, list[str]]:
    """A training run (it writes the job heartbeat) on GANG of GANG + 1 nodes of its own, beating."""
    pool = sc.take(GANG + 1)
    job = sc.stack.submit_training(GANG, exclude=[n for n in sc.nodes if n not in pool])
    held: list[str] = sc.wait(lambda: sc.slurm.job_nodes(job), 60, f"job {job} to run")
    sc.wait(lambda: beats(sc.stack, job) > HEARTBEAT_MIN_POINTS, 60, f"job {job} to beat")  # established
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


def test_a_hang_with_no_bad_node_restarts_nothing_and_pages_with_every_node(sc: Pipeline) -> None:
    """Issue 35 (2): no node of the job shows a fault (no stuck tool, no GPU lost, no slow link):
    nothing confirms that a restart would help, or that the job hung at all. Nothing is restarted;
    a person is paged with every node and check (was: one restart in place)."""
    sc.settle()
    job, held = _training(sc)
    chaos.apply(sc.stack, "hang")
    try:
        first = hang_ended(sc.db, job, sc.wait)
        loc = first.get("localisation") or {}

        def paged() -> list[WebhookRecord]:
            return [w for w in sc.notes_for(first["id"]) if "no culprit fenced" in w["body"]["text"]]

        pages = sc.wait(paged, 30, "the page")
        assert loc.get("outcome") == "nothing_found"
        assert [x.get("kind") for x in loc.get("rounds", [])] == ["sweep", "links"]
        assert all(n in pages[0]["body"]["text"] for n in held)  # paged with every node
        assert "not restarted" in pages[0]["body"]["text"]
        assert sc.restarts(job) == 0 and "job_requeued" not in first["timeline"]
    finally:
        sc.slurm.cancel(job)
        chaos.apply(sc.stack, "clear")


def _forged_heartbeat(sc: Pipeline, job: str, points: int = 1) -> None:
    """What any holder of monitoring.timeSeries.create can write (the Ops Agent's and every GKE node's
    service account): a few points of the job heartbeat for a job, then silence. Monitoring's own
    absence alert then fires, and its notification is genuine."""
    client = trainer.heartbeat_client(sc.stack.endpoints["monitoring"])
    for step in range(points):
        trainer.beat(client, PROJECT, sc.stack.spec.name, job, step)
        time.sleep(1.0)


@pytest.mark.parametrize("opted_in", [False, True], ids=["not-opted-in", "opted-in-never-beat"])
def test_a_forged_heartbeat_restarts_nothing(sc: Pipeline, opted_in: bool) -> None:
    """Issue 35 (2): one forged point of a running job's heartbeat, then silence. A job that did not
    opt in, or one that did but whose own series was never established (it never beat here), is not
    checked, stopped or restarted: its hang incident only pages."""
    sc.settle()
    pool = sc.take(2)
    comment = HEARTBEAT_OPT_IN if opted_in else None
    job = sc.slurm.submit(2, "victim", exclude=[n for n in sc.nodes if n not in pool], comment=comment)
    sc.wait(lambda: sc.slurm.job_nodes(job), 60, f"job {job} to run")
    try:
        _forged_heartbeat(sc, job)
        inc = hang_ended(sc.db, job, sc.wait)
        loc = inc.get("localisation") or {}
        assert loc.get("outcome") == "unconfirmed" and not loc.get("rounds"), loc  # nothing checked
        words = "did not opt in" if not opted_in else "holds 1 points"
        assert words in str(loc.get("page")), loc
        sc.wait(
            lambda: [w for w in sc.notes_for(inc["id"]) if "Not acted on" in w["body"]["text"]], 30, "a page"
        )
        running = [j for j in sc.slurm.jobs() if j["id"] == job and j["state"] == "RUNNING"]
        assert sc.restarts(job) == 0 and running, sc.slurm.jobs()  # left running, never stopped
    finally:
        sc.slurm.cancel(job)
