"""The demo's degraded-node scenarios (issue 24): a planned move at the job's checkpoint onto a spare.

Each runs on the Slurm stack through the whole path: the GPU stand-in of one node throttles or
counts correctable ECC errors, the Monitoring stand-in's policy opens its alert after the policy's
(scaled) window, ingest opens a ``degraded`` incident, the workflow holds the node against the
job's other nodes (Cloud Monitoring's ListTimeSeries on the stand-in), asks the job to checkpoint
(SIGUSR1: the job's trap writes a marker and exits), moves the gang onto a spare at that
checkpoint, then diagnoses, repairs and validates the node. ``resume_s`` is from the alert's open
(the incident's ``detected``) to the gang observed running again.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pitstop.core.timeline import durations
from pitstop.tools.demo_stage import GkeStage, Result, SlurmStage

STRAGGLER = {"throttle": 0.6, "throttle_reason": "thermal"}  # HW thermal slowdown: the finding
ECC_TREND = {"sbe_rate": 40, "ecc_gpu": 2, "remap": "pending", "remap_gpu": 2}
POWER_CAPPED = {"throttle": 0.5, "throttle_reason": "power"}  # the job's own power cap: every node alike
TIMEOUT_S = 240.0


def pool(sc: SlurmStage) -> list[str]:
    """The ten nodes these scenarios use: the ten before the back-to-training ones (``fresh``) on
    the demo's cluster, all of them on a cluster of their own (tests/e2e/test_e2e_planned.py)."""
    return sc.nodes[-20:-10] if len(sc.nodes) >= 20 else sc.nodes[-10:]


def _checkpointing_job(sc: SlurmStage, size: int, nodes: list[str]) -> tuple[str, list[str], Path]:
    """A gang that checkpoints on SIGUSR1 (a marker file, exit 0), as a training job's handler would."""
    marker = Path(sc.slurm.workdir) / f"checkpoint-{uuid.uuid4().hex[:6]}"
    script = f"trap 'touch {marker}; exit 0' USR1; sleep 3600 & wait"
    job, held = sc.job_among(size, nodes, script)
    return job, held, marker


def _moved(sc: SlurmStage, name: str, kind: str, state: dict[str, Any]) -> Result:
    """A gang of two with one spare; one member degrades; the gang moves onto the spare."""

    nodes = pool(sc)[0:3] if kind == "throttle" else pool(sc)[3:6]
    job, held, marker = _checkpointing_job(sc, 2, nodes)
    bad = held[0]
    sc.gpu_state(bad, state)
    inc = sc.finished(bad, timeout=TIMEOUT_S)
    now_on = sc.job_nodes(job)
    r = sc.timed(Result(name, False, "", durations(inc), inc["id"]), inc)
    peers, resume = inc.get("corroboration") or {}, inc.get("resume") or {}
    steps = [(e["from"], e["to"]) for e in inc.get("escalations", [])]
    xids = [i for i in sc.incidents(bad) if i["kind"] == "gpu_xid"]
    r.passed = bool(
        inc["state"] == "RESOLVED"
        and inc["kind"] == "degraded"
        and peers.get("verdict") == "move"
        and marker.exists()
        and resume.get("mode") == "early"
        and bad not in now_on
        and len(now_on) == 2
        and ("DRAIN_NODE", "REPLACE_NODE") in steps
        and (inc.get("diagnosis") or {}).get("confirmed") is True
        and len(sc.calls("report_host_as_faulty", bad)) == 1
        and (inc.get("validation") or {}).get("passed")
        and not xids
        and r.resume_s is not None
    )
    r.detail = (
        f"{kind} on {bad} of job {job} ({','.join(held)}): {peers.get('why')};"
        f" checkpointed={marker.exists()}, running on {','.join(now_on)} {r.resume_s} s after the alert"
        " opened; diagnosis: "
        f"{(inc.get('diagnosis') or {}).get('why')}; node repaired in {r.repair_s} s"
    )
    r.facts = {"peers": peers, "resume": resume, "steps": steps, "now_on": now_on, "xid_incidents": len(xids)}
    sc.cancel(job)
    return r


def straggler_spare(sc: SlurmStage) -> Result:
    """A thermally throttled node among unthrottled peers: the gang moves at its checkpoint, the
    node check shows its hardware thermal slowdown active (the finding): host reported faulty, validated."""
    return _moved(sc, "straggler_spare", "throttle", STRAGGLER)


def ecc_trend(sc: SlurmStage) -> Result:
    """Correctable ECC errors rising on one GPU (a row remap pending): the gang moves before any Xid."""
    return _moved(sc, "ecc_trend", "ecc", ECC_TREND)


def degraded_no_spare(sc: SlurmStage) -> Result:
    """No spare for the gang: today's drain (checkpoint, drain, repair, requeue), and the
    notification says so."""

    job, held, marker = _checkpointing_job(sc, 2, pool(sc)[6:8])
    bad = held[0]
    sc.gpu_state(bad, STRAGGLER)
    inc = sc.finished(bad, timeout=TIMEOUT_S)
    tl, resume = inc["timeline"], inc.get("resume") or {}
    notes = sc.wait(lambda: sc.notes_for(inc["id"]), 30, "the notification")
    text = " ".join(str(n["body"].get("text")) for n in notes)
    r = sc.timed(Result("degraded_no_spare", False, "", durations(inc), inc["id"]), inc)
    r.passed = bool(
        inc["state"] == "RESOLVED"
        and marker.exists()
        and resume.get("mode") == "after_repair"
        and tl.get("job_requeued", 0) >= (tl.get("healthy") or 1e18)
        and sc.restarts(job) == 1
        and "NO SPARE" in text
    )
    r.detail = f"job {job} on {','.join(held)}; {(resume.get('waiting') or [{}])[0].get('why')}"
    r.facts = {"resume": resume, "text": text}
    sc.cancel(job)
    return r


def note_text(sc: SlurmStage | GkeStage, iid: str) -> str:
    """What the webhook said about an incident, once notify delivered it (after it resolved)."""
    notes: list[dict[str, Any]] = sc.wait(lambda: sc.notes_for(iid), 30, "the notification")
    return " ".join(str(x["body"].get("text")) for x in notes)


def gang_wide_throttle(sc: SlurmStage) -> Result:
    """Every node of the job throttles alike (its own power cap): no move, no repair, a page."""

    job, held, _ = _checkpointing_job(sc, 2, pool(sc)[8:10])
    for n in held:
        sc.gpu_state(n, POWER_CAPPED)
    incs = [sc.finished(n, timeout=TIMEOUT_S) for n in held]
    drained = {n: "drain" in sc.slurm.node_states().get(n, "") for n in held}
    # notify delivers after the incident resolved: wait for each one's note, not read it at once
    texts = [note_text(sc, str(i["id"])) for i in incs]
    r = Result("gang_wide_throttle", False, "", durations(incs[0]), incs[0]["id"])
    r.passed = bool(
        all(i["state"] == "RESOLVED" for i in incs)
        and all((i.get("corroboration") or {}).get("verdict") == "gang_wide" for i in incs)
        and not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs)
        and sc.restarts(job) == 0
        and not any(drained.values())
        and all("NOT moved" in t for t in texts)
    )
    r.detail = f"job {job} on {','.join(held)}: {(incs[0].get('corroboration') or {}).get('why')}"
    r.facts = {"drained": drained, "texts": texts}
    for n in held:
        sc.gpu_state(n, None)
    sc.cancel(job)
    return r
