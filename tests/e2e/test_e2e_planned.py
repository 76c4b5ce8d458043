"""A degraded node's planned move on the whole local stack, real Slurm included (issue 24).

One node's GPU stand-in throttles or counts correctable ECC errors; the Monitoring stand-in opens
the deployed policy's alert after its (scaled) window and publishes the real-format notification;
ingest opens a ``degraded`` incident; the workflow reads the same metric for the job's other
nodes through the real Monitoring client (ListTimeSeries), asks the job to checkpoint (SIGUSR1:
its trap writes a marker), moves the gang at that checkpoint onto a spare, and diagnoses, repairs
and validates the node. Each case is a demo scenario (pitstop.tools.demo_planned), asserted here
fact by fact.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.local.stack import ClusterSpec, Stack
from pitstop.tools import demo_planned
from pitstop.tools.demo import Scenarios

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def sc() -> Iterator[Scenarios]:
    # no Spot VM among them: a replaced node is reported faulty (a Spot VM would be recreated)
    stack = Stack(Path(tempfile.mkdtemp(prefix="pitstop-planned-")), ClusterSpec(nodes=10))
    try:
        stack.up()
        yield Scenarios(stack)
    except BaseException:
        for name in ("ingest", "actuate", "executions", "slurm-agent", "monitoring"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-20:]))
        raise
    finally:
        stack.down()


def test_a_straggler_is_moved_at_its_checkpoint_onto_the_spare(sc: Scenarios) -> None:
    sc.settle()
    r = demo_planned.straggler_spare(sc)
    f = r.facts
    assert f["peers"]["verdict"] == "move" and f["peers"]["node_value"] == 0.6, r.detail
    assert list(f["peers"]["peers"].values()) == [0.0], r.detail  # its peer read through Monitoring
    assert f["resume"]["mode"] == "early" and len(f["now_on"]) == 2, r.detail
    assert ("DRAIN_NODE", "REPLACE_NODE") in f["steps"], r.detail  # the finding: HW thermal slowdown
    assert r.resume_s is not None and r.repair_s is not None and r.resume_s < r.repair_s, r.detail
    assert r.passed, r.detail


def test_an_ecc_trend_is_moved_before_any_xid(sc: Scenarios) -> None:
    sc.settle()
    r = demo_planned.ecc_trend(sc)
    assert r.facts["peers"]["node_value"] == 40.0 and r.facts["xid_incidents"] == 0, r.detail
    assert r.facts["resume"]["mode"] == "early", r.detail
    assert r.passed, r.detail


def test_no_spare_keeps_the_drain_and_the_notification_says_so(sc: Scenarios) -> None:
    sc.settle()
    r = demo_planned.degraded_no_spare(sc)
    assert r.facts["resume"]["mode"] == "after_repair", r.detail
    assert "not enough healthy capacity" in r.facts["resume"]["waiting"][0]["why"], r.detail
    assert "NO SPARE" in r.facts["text"], r.facts["text"]
    assert r.passed, r.detail


def test_a_gang_throttling_alike_is_not_moved_and_a_person_is_paged(sc: Scenarios) -> None:
    sc.settle()
    r = demo_planned.gang_wide_throttle(sc)
    assert not any(r.facts["drained"].values()), r.detail  # the fences were lifted
    assert all("NOT moved" in t for t in r.facts["texts"]), r.facts["texts"]
    assert r.passed, r.detail
