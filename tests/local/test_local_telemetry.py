"""The local stack's telemetry: the Monitoring stand-in's alerting, the training stand-in's heartbeat,
the GPU stand-ins' telemetry faults and the chaos kinds that cause them (no stack needed here;
tests/e2e/test_e2e_telemetry.py runs them on one).

The notifications the stand-in publishes are read back by the real parser (core/alerts.py), as
ingest reads them from the alerts topic.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.local import chaos, trainer
from pitstop.local.alerting import AlertNotification
from pitstop.local.compute_shapes import GpuStateSet
from pitstop.local.gpu_tools import nvidia_smi
from pitstop.local.gpu_tools.state import PRESETS, StateError, check_entry, load
from pitstop.local.telemetry import Alerting
from tests.helpers import PROJECT, ZONE, alert_delivery

CLF = Classifier.default()


class World:
    """A clock, the GPU states, and what the stand-in published (parsed as ingest parses it)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0
        self.states: dict[str, Any] = {}
        self.sent: list[AlertNotification] = []
        self.alerts = Alerting(
            PROJECT,
            ZONE,
            self.sent.append,
            lambda: self.states,
            lambda n: f"70000{n[-3:]}",
            0.1,
            lambda: self.t,
        )

    def events(self) -> list[FaultEvent]:
        return [CLF.classify(alert_delivery(doc)) for doc in self.sent]


def test_a_silent_heartbeat_opens_the_hang_alert_once_and_the_next_beat_closes_it() -> None:
    w = World()
    w.alerts.heartbeat({"cluster": "train", "job": "12"})
    w.t += 11  # the policy's 120 s, scaled by 0.1, is 12 s
    assert w.alerts.tick() == 0
    w.t += 1
    assert w.alerts.tick() == 1 and w.alerts.tick() == 0
    w.t += 30
    w.alerts.heartbeat({"cluster": "train", "job": "12"})  # requeued: the new run beats
    opened, closed = w.events()
    assert (opened["kind"], opened["action"], opened["job"]) == (
        "hang",
        "RESTART_JOB",
        {"project": PROJECT, "cluster": "train", "job": "12"},
    )
    assert opened["source"]["trust"] == "verified"
    assert (closed["kind"], closed["action"]) == ("hang", "NONE")
    assert closed["detail"]["alert"]["incident_id"] == opened["detail"]["alert"]["incident_id"]
    ended, started = closed["detail"]["alert"]["ended_at"], opened["detail"]["alert"]["started_at"]
    assert ended is not None and started is not None and ended - started == 30


def test_a_throttled_gpu_opens_the_degraded_alert_after_the_policy_window_and_healing_closes_it() -> None:
    w = World()
    w.states["a3-node-004"] = PRESETS["straggler"]
    assert w.alerts.tick() == 0
    w.t += 59  # 600 s, scaled: 60 s
    assert w.alerts.tick() == 0
    w.t += 1
    assert w.alerts.tick() == 1
    del w.states["a3-node-004"]
    w.t += 5
    assert w.alerts.tick() == 1
    opened, closed = w.events()
    assert (opened["kind"], opened["action"], opened["detail"]["alert"]["symptom"]) == (
        "degraded",
        "DRAIN_NODE",
        "throttle",
    )
    assert opened["node"] == {
        "project": PROJECT,
        "zone": ZONE,
        "instance": "a3-node-004",
        "instance_id": "70000004",
    }
    assert opened["detail"]["alert"]["observed_value"] == "0.6"
    assert (closed["kind"], closed["action"], closed["node"]) == ("degraded", "NONE", opened["node"])


def test_rising_ecc_errors_open_the_trend_alert_at_once() -> None:
    w = World()
    w.states["a3-node-002"] = PRESETS["degrading"]
    assert w.alerts.tick() == 1
    (ev,) = cast(list[Any], w.events())
    assert (ev["kind"], ev["detail"]["alert"]["symptom"], ev["node"]["instance"]) == (
        "degraded",
        "ecc",
        "a3-node-002",
    )


def test_a_throttle_that_stops_before_the_window_opens_nothing() -> None:
    w = World()
    w.states["a3-node-004"] = PRESETS["straggler"]
    w.alerts.tick()
    w.t += 30
    del w.states["a3-node-004"]
    w.alerts.tick()
    w.states["a3-node-004"] = PRESETS["straggler"]
    w.t += 40  # held again for 40 s only: the window starts over
    assert w.alerts.tick() == 0 and w.sent == []


# -- the GPU stand-ins ----------------------------------------------------------------------------


def test_nvidia_smi_shows_the_throttled_and_the_degrading_gpu() -> None:
    env = {
        "PITSTOP_NODE": "n1",
        "PITSTOP_GPU_STATE": json.dumps({"n1": {**PRESETS["straggler"], "sbe_rate": 40, "ecc_gpu": 3}}),
    }
    out = nvidia_smi.query(load(env))
    gpus = out.split("\nGPU ")[1:]
    assert "        SW Thermal Slowdown               : Active" in gpus[0]
    assert "            HW Thermal Slowdown           : Active" in gpus[0]
    assert "Active\n" not in gpus[1].replace("Not Active\n", "")  # the others run at their clocks
    assert "            DRAM Correctable              : 40" in gpus[3]
    assert "            DRAM Correctable              : 0" in gpus[0]


@pytest.mark.parametrize(
    "entry",
    [{"throttle": 1.5}, {"throttle": True}, {"throttle_reason": "cosmic"}, {"sbe_rate": -1}, {"hung": "yes"}],
)
def test_bad_telemetry_states_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(StateError):
        check_entry(entry)


# -- chaos and the training stand-in ---------------------------------------------------------------


class FakeStack:
    def __init__(self, tmp: Path) -> None:
        self.chaos_dir = tmp
        self.gpu: dict[str, Any] = {}

    @property
    def spec(self) -> Any:
        return type("Spec", (), {"node_names": ["a3-node-000", "a3-node-001"], "scheduler": "slurm"})()

    endpoints: dict[str, str] = {}

    def set_agent(self, up: bool) -> Any:
        raise AssertionError("not here")

    def restart_firestore(self, down_s: float = 2.0) -> None:
        raise AssertionError("not here")

    def set_gpu_state(self, node: str, state: object) -> GpuStateSet:
        self.gpu[node] = state
        return {"instance": node, "host": "host-0", "state": None}


def test_chaos_hang_stops_the_running_runs_and_a_requeued_run_beats_again(tmp_path: Path) -> None:
    stack = FakeStack(tmp_path)
    with pytest.raises(chaos.ChaosError, match="no training run"):
        chaos.apply(stack, "hang")
    (tmp_path / "run-12.json").write_text(json.dumps({"job": "12", "run": 0}))
    done = chaos.apply(stack, "hang", node="a3-node-001")
    assert done["runs"] == {"12": 0} and stack.gpu == {"a3-node-001": "hung"}
    assert trainer.hung(tmp_path, "12", 0) and not trainer.hung(tmp_path, "12", 1)
    assert not trainer.hung(tmp_path, "13", 0)
    chaos.clear_flags(tmp_path)  # what `chaos clear` does to the flags: the hang ends
    assert not trainer.hung(tmp_path, "12", 0)


def test_node_faults_need_their_node(tmp_path: Path) -> None:
    stack = FakeStack(tmp_path)
    for kind in ("straggler", "degrading", "heal"):
        with pytest.raises(chaos.ChaosError, match="needs --node"):
            chaos.apply(stack, kind)
    chaos.apply(stack, "straggler", node="a3-node-000")
    chaos.apply(stack, "heal", node="a3-node-000")
    assert stack.gpu == {"a3-node-000": None}


# -- the docs' heartbeat snippet, as a training loop runs it ----------------------------------------


def test_the_docs_heartbeat_snippet_is_five_lines_that_write_the_policys_metric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snippet in docs/telemetry.md, run as is against the Monitoring stand-in (only the
    client's endpoint differs): it writes what the heartbeat policy watches."""
    from google.cloud import monitoring_v3

    from pitstop.local.fake_monitoring import FakeMonitoring, serve

    doc = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    snippet = doc.split("Five lines in the training loop", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = textwrap.dedent(snippet)
    assert len(code.strip().splitlines()) == 5
    beats: list[Mapping[str, str]] = []
    fake = FakeMonitoring(on_heartbeat=beats.append)
    server, endpoint = serve(fake)
    try:
        client = trainer.heartbeat_client(endpoint)
        monkeypatch.setattr(monitoring_v3, "MetricServiceClient", lambda: client)
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        scope: dict[str, Any] = {"os": os, "time": time, "PROJECT": "train-prod"}
        exec(compile(code, "docs/telemetry.md", "exec"), scope)
        scope["beat"](7)
    finally:
        server.stop(0)
    assert [{k: v for k, v in p.items() if k != "at"} for p in fake.series] == [
        {
            "type": trainer.METRIC,
            "labels": {"cluster": "train", "job": "4242"},
            "value": 7,
            "resource": "global",
        }
    ]
    assert abs(fake.series[0]["at"] - time.time()) < 60  # the point's own end time, as written
    assert beats == [{"cluster": "train", "job": "4242"}]
    policy = json.loads(
        (Path(__file__).resolve().parents[2] / "infra/monitoring/telemetry/job-heartbeat.json").read_text()
    )
    assert (
        f'metric.type="{trainer.METRIC}" AND resource.type="global"'
        == policy["conditions"][0]["conditionAbsent"]["filter"]
    )
