"""A stand-in for Pitstop's node-problem-detector DaemonSet (infra/gke/npd.yaml) on the fake cluster.

It applies the deployed rule file itself (the ConfigMap's ``kernel-monitor.json``) to each VM's
kernel ring buffer in the fake Compute, so the local GKE path exercises the real rule data. What it
models of NPD (github.com/kubernetes/node-problem-detector, docs/system-log-monitor.md): each rule's
pattern matched against the whole message; a ``permanent`` rule sets its condition True with the
rule's reason and the matched message, and the condition changes (time, message) only when its
status or reason does, so it keeps the boot's first match; at start (a new boot: the ring buffer
was cleared) every condition returns to its default. The kmsg watcher gives the rules the message
only, so a line's syslog facility is ignored here too.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from pitstop.core.domain import JsonObject

MANIFEST = Path(__file__).resolve().parents[3] / "infra" / "gke" / "npd.yaml"
CONFIG_KEY = "kernel-monitor.json"


@dataclass(frozen=True)
class Rule:
    kind: str  # "permanent" (a Node condition) or "temporary" (an Event)
    condition: str | None
    reason: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class Monitor:
    source: str
    defaults: Mapping[str, tuple[str, str]]  # condition type -> (default reason, default message)
    rules: tuple[Rule, ...]


def monitor_config(path: Path = MANIFEST) -> JsonObject:
    """The rule file as deployed: the ConfigMap's kernel-monitor.json in infra/gke/npd.yaml."""
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            got = json.loads(doc["data"][CONFIG_KEY])
            if isinstance(got, dict):
                return got
    raise ValueError(f"{path}: no ConfigMap with {CONFIG_KEY}")


def load(doc: JsonObject) -> Monitor:
    """The rules, checked as NPD would need them (kmsg plugin, conditions declared before use)."""
    if doc.get("plugin") != "kmsg":
        raise ValueError("the kernel monitor must read kmsg")
    defaults = {str(c["type"]): (str(c["reason"]), str(c["message"])) for c in doc.get("conditions") or []}
    rules: list[Rule] = []
    for r in doc.get("rules") or []:
        cond = r.get("condition")
        if r.get("type") == "permanent" and cond not in defaults:
            raise ValueError(f"rule {r.get('reason')}: condition {cond!r} is not declared")
        rules.append(Rule(str(r["type"]), cond, str(r["reason"]), re.compile(str(r["pattern"]), re.DOTALL)))
    return Monitor(str(doc.get("source") or ""), defaults, tuple(rules))


def matches(rule: Rule, message: str) -> bool:
    return rule.pattern.fullmatch(message) is not None


def conditions(mon: Monitor, messages: list[str]) -> dict[str, tuple[str, str, str]]:
    """Condition type -> (status, reason, message) after reading one boot's ring buffer in order."""
    out = {t: ("False", reason, msg) for t, (reason, msg) in mon.defaults.items()}
    for line in messages:
        for rule in mon.rules:
            if rule.kind != "permanent" or rule.condition is None or not matches(rule, line):
                continue
            status, reason, _ = out[rule.condition]
            if status == "False" or reason != rule.reason:
                out[rule.condition] = ("True", rule.reason, line)
    return out


SetCondition = Callable[[str, str, str, str, str], None]  # node, type, status, reason, message


class Npd:
    """One NPD per node, polled: reads each VM's ring buffer and sets the node's conditions."""

    def __init__(self, kmsg: Callable[[], dict[str, list[str]]], set_condition: SetCondition) -> None:
        self.monitor = load(monitor_config())
        self.kmsg, self.set_condition = kmsg, set_condition
        self._seen: dict[str, dict[str, tuple[str, str, str]]] = {}

    def step(self) -> None:
        for node, lines in self.kmsg().items():
            now = conditions(self.monitor, lines)
            if self._seen.get(node) == now:
                continue
            try:
                for kind, (status, reason, message) in now.items():
                    self.set_condition(node, kind, status, reason, message[:1024])
            except KeyError:  # the VM has no Node (yet): try again next time
                continue
            self._seen[node] = now

    def run(self, stop: threading.Event, interval: float = 0.1) -> threading.Thread:
        def loop() -> None:
            while not stop.wait(interval):
                self.step()

        t = threading.Thread(target=loop, name="npd", daemon=True)
        t.start()
        return t
