"""A hung JobSet on the whole local GKE stack, enforce mode: its heartbeat stops, the Monitoring
stand-in's alert opens its incident, and the workflow localises it the stop-time way (adapters/gke/
gang.py): the JobSet is suspended, its pods leave, a sweep pod runs the stand-in ``nvidia-smi -q`` on
every node it ran on (the culprit's GPU, which NVML cannot open, set by ``pitstop local chaos hang
--node``; or, ``hang link``, its NVLink down, which only the ring pairs' stand-in ``all_gather_perf``
shows), the culprit gets its own incident and is fenced, and the JobSet is resumed once onto the
spare. Facts are read from the fake API server (suspend, restarts, where the pods run, the taint)
and from Firestore (the hang incident's localisation, the culprit's incident).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from pitstop.core.domain import Incident
from pitstop.local import chaos, gke_stack, trainer
from pitstop.local.heartbeats import beats, hang_incidents
from pitstop.local.realtime import breakdown
from pitstop.local.stack import HEARTBEAT_MIN_POINTS, PROJECT, ClusterSpec
from tests.pipeline import GkePipeline, stack_up

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def sc() -> Iterator[GkePipeline]:
    with stack_up("e2e-gke-hang", ClusterSpec.gke(8), compute_scale=0.03) as stack:
        yield GkePipeline(stack)


class Beating:
    """The training job's heartbeat (the real Monitoring client, as docs/telemetry.md's snippet writes it)."""

    def __init__(self, endpoint: str, job: str) -> None:
        self.client, self.stop, self.job = trainer.heartbeat_client(endpoint), threading.Event(), job
        self.step = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self.step += 1
            trainer.beat(self.client, PROJECT, "train", self.job, self.step)


def hang_on_gke(sc: GkePipeline, name: str, link: bool) -> tuple[Incident, str, list[str]]:
    """A JobSet of three on nodes of its own and a spare; its middle node's GPU stuck (or,
    ``link``, its NVLink down), its heartbeat stopped. (the hang incident, the bad node, where the
    gang runs again)."""
    job = f"jobset/default/{name}"
    *members, spare = sc.take(4)
    gang = sc.gangs.gang(name, members, [spare])
    bad = members[1]
    beating = Beating(sc.stack.endpoints["monitoring"], job)
    beating.thread.start()
    sc.wait(lambda: beats(sc.stack, job) > HEARTBEAT_MIN_POINTS, 30, "the job's heartbeat")  # established
    chaos.apply(sc.stack, "hang", "link" if link else None, node=bad)
    beating.stop.set()  # the job hangs: no more beats
    stopped = time.time()

    def ended() -> Incident | None:
        incs = hang_incidents(sc.db, job)
        return incs[0] if incs and incs[0]["state"] in ("RESOLVED", "FAILED") else None

    hang: Incident = sc.wait(ended, 240, "the hang incident to end")
    where = sc.gangs.moved(gang, [bad])
    times = breakdown(stopped, hang, None, time.time(), sc.stack.alert_scale)
    print(f"gke {name}: {json.dumps(times)}")  # where the time went (docs/telemetry.md), not asserted
    assert spare in where and sc.gangs.restarts(name) == 0  # suspend and resume: not a JobSet restart
    js = sc.kube.jobset(name) or {}
    assert not js["spec"].get("suspend")
    assert "pitstop.dev/stopped-for" not in js["metadata"].get("annotations", {})
    assert hang["timeline"].get("job_running")  # the workflow saw it run again before it closed
    # the stop and the resume passed the deployed admission policy, judged as actuate's requests
    judged = [d for d in sc.kube.admission() if d["name"] == name and d["resource"].startswith("jobsets.")]
    assert len(judged) >= 2 and all(d["allowed"] for d in judged), judged
    assert {d["user"] for d in judged} == {gke_stack.service_account("actuate", PROJECT)}
    assert [d for d in sc.kube.admission() if not d["allowed"]] == []
    return hang, bad, where


def test_a_hung_jobset_with_a_stuck_gpu_is_stopped_swept_and_resumed_on_the_spare(sc: GkePipeline) -> None:
    hang, bad, where = hang_on_gke(sc, "hang", link=False)
    loc = hang.get("localisation") or {}
    assert hang["state"] == "RESOLVED" and loc.get("culprits") == [bad], loc
    assert len(loc.get("nodes") or []) == 3 and bad not in where
    assert [r["kind"] for r in loc["rounds"]] == ["sweep"]  # found by the node checks: no ring test
    culprit = sc.incidents(bad)[0]
    assert culprit["kind"] == "localised" and culprit["id"] == loc["incidents"][bad]


def test_a_hung_jobset_with_an_nvlink_down_is_found_by_the_ring_pairs(sc: GkePipeline) -> None:
    hang, bad, where = hang_on_gke(sc, "hang-link", link=True)
    loc = hang.get("localisation") or {}
    assert hang["state"] == "RESOLVED" and loc.get("culprits") == [bad], loc
    assert [r["kind"] for r in loc["rounds"]] == ["sweep", "links"] and bad not in where
    assert loc["rounds"][0]["culprits"] == [] and loc["rounds"][1]["culprits"] == [bad]
