"""A degraded node's planned move on the whole local stack, real Slurm included (issue 24).

One node's GPU stand-in throttles or counts correctable ECC errors; the Monitoring stand-in opens
the deployed policy's alert after its (scaled) window and publishes the real-format notification;
ingest opens a ``degraded`` incident; the workflow reads the same metric for the job's other
nodes through the real Monitoring client (ListTimeSeries), asks the job to checkpoint (SIGUSR1:
its trap writes a marker), moves the gang at that checkpoint onto a spare, and diagnoses, repairs
and validates the node. The scenarios are this module's own (tests/pipeline.py drives the stack).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.local.stack import ClusterSpec
from tests.pipeline import Pipeline, stack_up

pytestmark = pytest.mark.emulator

STRAGGLER = {"throttle": 0.6, "throttle_reason": "thermal"}  # HW thermal slowdown: the finding
ECC_TREND = {"sbe_rate": 40, "ecc_gpu": 2, "remap": "pending", "remap_gpu": 2}
POWER_CAPPED = {"throttle": 0.5, "throttle_reason": "power"}  # the job's own power cap: every node alike
TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def sc() -> Iterator[Pipeline]:
    # no Spot VM among them: a replaced node is reported faulty (a Spot VM would be recreated)
    with stack_up("e2e-planned", ClusterSpec(nodes=10)) as stack:
        yield Pipeline(stack)


def _checkpointing_job(sc: Pipeline, nodes: list[str]) -> tuple[str, list[str], Path]:
    """A gang of two that checkpoints on SIGUSR1 (a marker file, exit 0), as a training job would."""
    marker = Path(sc.slurm.workdir) / f"checkpoint-{uuid.uuid4().hex[:6]}"
    job, held = sc.job_among(2, nodes, f"trap 'touch {marker}; exit 0' USR1; sleep 3600 & wait")
    return job, held, marker


def _moved(sc: Pipeline, nodes: list[str], state: dict[str, Any]) -> dict[str, Any]:
    """A gang of two with one spare among ``nodes``; one member degrades; what became of it."""
    sc.settle()
    job, held, marker = _checkpointing_job(sc, nodes)
    bad = held[0]
    sc.gpu_state(bad, state)
    inc = sc.finished(bad, timeout=TIMEOUT_S)
    now_on = sc.slurm.job_nodes(job)
    resume_s, repair_s = sc.resume_and_repair(inc)
    sc.slurm.cancel(job)
    return {
        "inc": inc,
        "bad": bad,
        "checkpointed": marker.exists(),
        "now_on": now_on,
        "resume_s": resume_s,
        "repair_s": repair_s,
        "reports": len(sc.calls("report_host_as_faulty", bad)),
        "xid_incidents": [i for i in sc.incidents(bad) if i["kind"] == "gpu_xid"],
    }


def _moved_onto_the_spare(m: dict[str, Any]) -> None:
    """What every planned move does: checkpoint, move early onto the spare, replace the host
    (its finding confirmed by the diagnostic), validate it; no Xid incident on the way."""
    inc = m["inc"]
    assert (inc["state"], inc["kind"]) == ("RESOLVED", "degraded"), inc
    assert (inc.get("corroboration") or {}).get("verdict") == "move", inc
    assert m["checkpointed"]
    assert (inc.get("resume") or {}).get("mode") == "early", inc
    assert m["bad"] not in m["now_on"] and len(m["now_on"]) == 2, m["now_on"]
    assert ("DRAIN_NODE", "REPLACE_NODE") in [(e["from"], e["to"]) for e in inc.get("escalations", [])]
    assert (inc.get("diagnosis") or {}).get("confirmed") is True, inc
    assert m["reports"] == 1
    assert (inc.get("validation") or {}).get("passed"), inc
    assert m["xid_incidents"] == []
    assert m["resume_s"] is not None


def test_a_straggler_is_moved_at_its_checkpoint_onto_the_spare(sc: Pipeline) -> None:
    m = _moved(sc, sc.take(3), STRAGGLER)
    peers = m["inc"].get("corroboration") or {}
    assert peers["node_value"] == 0.6, peers
    assert list(peers["peers"].values()) == [0.0], peers  # its peer read through Monitoring
    assert m["repair_s"] is not None and m["resume_s"] < m["repair_s"], m  # the finding: HW thermal slowdown
    _moved_onto_the_spare(m)


def test_an_ecc_trend_is_moved_before_any_xid(sc: Pipeline) -> None:
    m = _moved(sc, sc.take(3), ECC_TREND)
    assert (m["inc"].get("corroboration") or {})["node_value"] == 40.0, m["inc"]
    _moved_onto_the_spare(m)


def test_no_spare_keeps_the_drain_and_the_notification_says_so(sc: Pipeline) -> None:
    sc.settle()
    job, held, marker = _checkpointing_job(sc, sc.take(2))
    bad = held[0]
    sc.gpu_state(bad, STRAGGLER)
    inc = sc.finished(bad, timeout=TIMEOUT_S)
    notes = sc.wait(lambda: sc.notes_for(inc["id"]), 30, "the notification")
    text = " ".join(str(n["body"].get("text")) for n in notes)
    restarts = sc.restarts(job)
    sc.slurm.cancel(job)
    tl, resume = inc["timeline"], inc.get("resume") or {}
    assert inc["state"] == "RESOLVED" and marker.exists(), inc
    assert resume.get("mode") == "after_repair", resume
    assert "not enough healthy capacity" in resume["waiting"][0]["why"], resume
    assert tl.get("job_requeued", 0) >= (tl.get("healthy") or 1e18), tl  # requeued once the node was back
    assert restarts == 1
    assert "NO SPARE" in text, text


def _notes(sc: Pipeline, iid: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = sc.wait(lambda: sc.notes_for(iid), 30, "the notification")
    return found


def test_a_gang_throttling_alike_is_not_moved_and_a_person_is_paged(sc: Pipeline) -> None:
    sc.settle()
    job, held, _ = _checkpointing_job(sc, sc.take(2))
    for n in held:
        sc.gpu_state(n, POWER_CAPPED)
    incs = [sc.finished(n, timeout=TIMEOUT_S) for n in held]
    drained = [sc.drained(n) for n in held]
    # notify delivers after the incident resolved: wait for each one's note, not read it at once
    texts = [" ".join(str(x["body"].get("text")) for x in _notes(sc, i["id"])) for i in incs]
    restarts = sc.restarts(job)
    for n in held:
        sc.gpu_state(n, None)
    sc.slurm.cancel(job)
    assert all(i["state"] == "RESOLVED" for i in incs), incs
    assert all((i.get("corroboration") or {}).get("verdict") == "gang_wide" for i in incs), incs
    assert not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs), incs
    assert restarts == 0
    assert not any(drained)  # the fences were lifted
    assert all("NOT moved" in t for t in texts), texts
