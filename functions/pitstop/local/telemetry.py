"""The Monitoring stand-in's alerting: Pitstop's telemetry policies evaluated on the stack's signals.

Two signals, as in production:

* job heartbeats: the points the training jobs write with the real client library
  (``custom.googleapis.com/pitstop/job/heartbeat``, labels cluster and job: docs/telemetry.md),
  received by the fake Monitoring's CreateTimeSeries; none for the heartbeat policy's absence
  window means the job is hung;
* node telemetry: what the GPU stand-ins report for a node (the fake Compute's per-host GPU
  state: throttling, correctable ECC errors), read against the node policies' thresholds for their
  duration.

Windows are the deployed policies' own (infra/monitoring/telemetry/), multiplied by ``scale`` so a
rehearsal takes seconds. Each condition that starts holding opens one alert incident and
publishes its ``open`` notification; when it stops holding, ``closed``: schema version 1.2, as
Monitoring publishes them (pitstop.local.alerting), to the alerts topic ingest subscribes to.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.core.domain import JsonObject
from pitstop.local import alerting
from pitstop.local.alerting import AlertNotification
from pitstop.local.gpu_tools.state import GpuEntry, NodeState, check_entry, node_state

HEARTBEAT = "custom.googleapis.com/pitstop/job/heartbeat"
Publish = Callable[[AlertNotification], None]
Lookup = Callable[[str], str]  # instance name -> its numeric id (the fake Compute's, now)


def _seconds(v: str) -> float:
    return float(v.rstrip("s"))


def _condition(stem: str) -> JsonObject:
    cond = alerting.policies()[stem]["conditions"][0]
    return dict(next(v for k, v in cond.items() if k.startswith("condition")))


@dataclass
class _Open:
    incident: str
    since: float
    stem: str
    labels: dict[str, str]
    node: str | None = None
    observed: str = "0"


@dataclass
class Alerting:
    """Heartbeats in, node states polled, notifications out (one ``open`` and one ``closed`` each)."""

    project: str
    zone: str
    publish: Publish
    gpu_state: Callable[[], Mapping[str, GpuEntry]]  # instance name -> its GPU state entry
    instance_id: Lookup
    scale: float = 1.0
    clock: Callable[[], float] = time.time
    beats: dict[tuple[str, str], float] = field(default_factory=dict)
    open: dict[tuple[str, ...], _Open] = field(default_factory=dict)
    pending: dict[tuple[str, ...], float] = field(default_factory=dict)  # node conditions holding since
    lock: threading.Lock = field(default_factory=threading.Lock)

    def heartbeat(self, labels: Mapping[str, str], at: float | None = None) -> None:
        """A point of the heartbeat metric: the job is alive (and a hung one back, if it was open)."""
        key = (str(labels.get("cluster", "")), str(labels.get("job", "")))
        now = self.clock() if at is None else at
        with self.lock:
            self.beats[key] = now
            was = self.open.pop(("job-heartbeat", *key), None)
        if was is not None:
            self._send(was, "closed", now)

    def tick(self) -> int:
        """Evaluate every policy once; how many notifications were published."""
        now = self.clock()
        return self._jobs(now) + self._nodes(now)

    def _jobs(self, now: float) -> int:
        window = _seconds(_condition("job-heartbeat")["duration"]) * self.scale
        sent = 0
        with self.lock:
            due = [
                k
                for k, t in self.beats.items()
                if now - t >= window and ("job-heartbeat", *k) not in self.open
            ]
            for cluster, job in due:
                labels = {"cluster": cluster, "job": job}
                self.open[("job-heartbeat", cluster, job)] = _Open(
                    f"0.{uuid.uuid4().hex[:12]}", now, "job-heartbeat", labels
                )
        for cluster, job in due:
            self._send(self.open[("job-heartbeat", cluster, job)], "open", now)
            sent += 1
        return sent

    def _nodes(self, now: float) -> int:
        states = self.gpu_state()
        sent = 0
        for stem, value in (("gpu-throttle", _throttle), ("gpu-ecc-trend", _sbe_rate)):
            cond = _condition(stem)
            line, hold = float(cond["thresholdValue"]), _seconds(cond["duration"]) * self.scale
            known = {k[1] for k in (*self.open, *self.pending) if k[0] == stem}  # held, or was
            for node in sorted(set(states) | known):
                v = value(node_state(node, states.get(node) or {}))
                sent += self._node(stem, node, v, v > line, hold, now)
        return sent

    def _node(self, stem: str, node: str, value: float, holds: bool, hold_s: float, now: float) -> int:
        key = (stem, node)
        if not holds:
            self.pending.pop(key, None)
            was = self.open.pop(key, None)
            if was is not None:
                self._send(was, "closed", now)
            return int(was is not None)
        since = self.pending.setdefault(key, now)
        if key in self.open or now - since < hold_s:
            return 0
        self.open[key] = _Open(f"0.{uuid.uuid4().hex[:12]}", now, stem, {}, node, f"{value:g}")
        self._send(self.open[key], "open", now)
        return 1

    def _send(self, a: _Open, state: str, now: float) -> None:
        if a.node is None:
            kind, labels, display = "global", {"project_id": self.project}, ""
        else:
            labels = {"project_id": self.project, "zone": self.zone, "instance_id": self.instance_id(a.node)}
            kind, display = "gce_instance", a.node
        self.publish(
            alerting.notification(
                a.stem,
                state,
                incident_id=a.incident,
                project=self.project,
                metric_labels=a.labels,
                started_at=int(a.since),
                ended_at=int(now) if state == "closed" else None,
                observed=a.observed,
                resource_type=kind,
                resource_labels=labels,
                display_name=display,
            )
        )

    def run(self, stop: threading.Event, every_s: float = 1.0) -> None:
        """Evaluate until ``stop`` is set (the stand-in's own thread)."""
        while not stop.wait(every_s):
            self.tick()


def _throttle(s: NodeState) -> float:
    return s.throttle


def _sbe_rate(s: NodeState) -> float:
    return float(s.sbe_rate)


def gpu_state_reader(path: str | None) -> Callable[[], dict[str, GpuEntry]]:
    """The fake Compute's per-instance GPU state file, read fresh each time (missing: all healthy)."""

    def read() -> dict[str, GpuEntry]:
        if not path:
            return {}
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return {}
        out: dict[str, GpuEntry] = {}
        for node, entry in doc.items() if isinstance(doc, dict) else ():
            try:
                out[str(node)] = check_entry(entry)
            except ValueError:
                continue
        return out

    return read
