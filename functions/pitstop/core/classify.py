"""The stateless classifier: any delivered payload → one FaultEvent with a proposed action.

Never raises on input: broken payloads become ``invalid`` events with a reason. The action
proposed here is what the evidence would call for if it is true; whether unverified evidence
may start it is core/trust.py's decision, made by the engine with the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import orjson

from pitstop.core import alerts, trust
from pitstop.core.catalog import (
    SXID_KIND,
    SystemEventRule,
    XidPolicy,
    default_system_events,
    default_xid_policy,
)
from pitstop.core.domain import EventDetail
from pitstop.core.entry import Event, clean, invalid, new_event, new_source
from pitstop.core.envelope import Delivery, unwrap
from pitstop.core.parse import INTERNAL_ERROR, parse_entry
from pitstop.core.xid_line import MAX_LINE, Anomalies

MAX_REASON = 512


def _flag(detail: EventDetail, note: str) -> None:
    """Add one anomaly to an event's detail (bounded like the parser's own)."""
    found = Anomalies(detail.get("anomalies") or ())
    found.add(note)
    detail["anomalies"] = list(found)


def annotate(ev: Event) -> Event:
    """Say in the reason what a reader must know about the evidence: unverified, cut, or odd."""
    src, detail = ev["source"], ev["detail"]
    judged = ev["kind"] not in ("invalid", "unrelated")
    unverified = judged and src.get("trust") != trust.VERIFIED
    if not (unverified or "truncated" in detail or "anomalies" in detail):
        return ev  # the common case: verified evidence, nothing to add
    notes = []
    if unverified:
        notes.append(f"unverified: {src.get('trust_reason') or 'source not checked'}")
    if detail.get("truncated"):
        notes.append(f"message over {MAX_LINE // 1024} KiB, cut before parsing")
    if detail.get("anomalies") and judged:
        notes.append("implausible fields left out or cut: see detail.anomalies")
    if notes:
        ev["reason"] = clean(f"{ev['reason']} [{'; '.join(notes)}]", MAX_REASON)
    return ev


@dataclass(frozen=True)
class Classifier:
    xids: XidPolicy
    system_events: Mapping[str, SystemEventRule]
    alerts_topic: str = alerts.DEFAULT_TOPIC  # the topic Monitoring's Pub/Sub channel publishes to

    @classmethod
    def default(cls) -> Classifier:
        return cls(default_xid_policy(), default_system_events())

    def _decide_xid(self, ev: Event) -> None:
        detail = ev["detail"]
        xid = cast(int, ev["xid"])  # a gpu_xid event names its code (core/parse.py)
        rule = self.xids.rule(xid)
        d = self.xids.decide(xid, detail)
        ev["action"], ev["reason"] = d.action, d.reason
        detail["xid_name"] = rule.name
        if rule.app_fault:
            detail["app_fault"] = True
        if d.decoded is not None:
            detail["decoded"] = d.decoded
        if d.anomaly is not None:
            _flag(detail, f"{d.anomaly}; the code's own rule decided")
        if detail.get("inferred_from"):
            ev["reason"] = f"{d.reason} (no Xid line: the driver reported the GPU off the bus)"
        elif ev["gpu"] is None and d.action in self.xids.gpu_unknown:
            # Precision degrades, not the event: no GPU to act on, so the node-level action.
            ev["action"] = self.xids.gpu_unknown[d.action]
            ev["reason"] = f"{d.reason} [the GPU is unknown: {ev['action']} instead of {d.action}]"

    def _decide_sxid(self, ev: Event) -> None:
        detail = ev["detail"]
        policy = self.xids.sxid
        if policy is None:  # a policy document without an sxid section: recorded only
            ev["reason"] = f"SXid {detail['sxid']}: no NVSwitch policy; recorded"
            return
        severity = detail.get("severity")
        d = policy.decide(severity)
        where = f"NVSwitch {detail['switch_pci']}" if "switch_pci" in detail else "NVSwitch"
        if "link" in detail:
            where += f" link {detail['link']}"
        said = (severity or "severity unknown").replace("_", "-")
        ev["action"], ev["reason"] = d.action, f"SXid {detail['sxid']} ({said}, {where}): {d.reason}"
        if severity == "non_fatal" and policy.lemon:
            detail["counts_toward_lemon"] = True

    def _decide_system_event(self, ev: Event) -> Event:
        method = ev["detail"]["method"]
        se = self.system_events.get(method)
        if se is None:
            return new_event(
                "unrelated",
                f"system event {method} needs no action",
                ev["source"],
                observed_at=ev["observed_at"],
            )
        ev["kind"] = se.kind
        decision_action, decision_reason = se.action, se.reason
        if se.completed is not None and ev["detail"].get("completed"):
            decision_action, decision_reason = se.completed.action, se.completed.reason
        ev["action"], ev["reason"] = decision_action, f"{method}: {decision_reason}"
        return ev

    def decide(self, ev: Event) -> Event:
        """Fill in kind (for system events), action and reason of a parsed event; never raises."""
        try:
            if ev["kind"] == "gpu_xid":
                self._decide_xid(ev)
            elif ev["kind"] == SXID_KIND:
                self._decide_sxid(ev)
            elif ev["kind"] == "system_event":
                ev = self._decide_system_event(ev)
            return annotate(ev)
        except Exception as exc:  # the last guard of "never raises"; the fuzz tests keep it idle
            return invalid(f"{INTERNAL_ERROR}: {type(exc).__name__}", ev.get("source"))

    def from_delivery(self, delivery: Delivery, source: str | None = None) -> Event:
        """The event of an unwrapped delivery: a Monitoring notification (core/alerts.py) or a
        LogEntry, told apart by shape and by the topic it came through (``source``: the
        CloudEvent's, when the caller holds it apart from the message); never raises."""
        entry = delivery.entry
        if entry is None:
            return invalid(delivery.error or "no log entry", new_source(message_id=delivery.message_id))
        try:
            topic = alerts.topic_of(source or delivery.source)
            notification = alerts.looks_like_notification(entry)
            if topic is not None and topic[1] == self.alerts_topic and not notification:
                why = f"the {self.alerts_topic} topic carries Cloud Monitoring notifications only"
                return invalid(why, new_source(message_id=delivery.message_id))
            if notification:
                return annotate(alerts.parse_notification(entry, delivery, topic, self.alerts_topic))
        except Exception as exc:  # the last guard of "never raises"; the fuzz tests keep it idle
            why = f"{INTERNAL_ERROR}: {type(exc).__name__}"
            return invalid(why, new_source(message_id=delivery.message_id))
        return self.decide(parse_entry(entry, delivery))

    def classify(self, payload: Any) -> Event:
        """A decoded JSON payload in any envelope."""
        return self.from_delivery(unwrap(payload))

    def classify_bytes(self, raw: bytes | str) -> Event:
        """One JSON document (a JSON Lines line); malformed JSON is an invalid event."""
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return invalid(f"malformed JSON: {str(exc)[:200]}")
        return self.classify(payload)
