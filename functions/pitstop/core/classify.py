"""The stateless classifier: any delivered payload → one FaultEvent with a proposed action.

Never raises on input: broken payloads become ``invalid`` events with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pitstop.core.catalog import SystemEventRule, XidPolicy, default_system_events, default_xid_policy
from pitstop.core.envelope import unwrap
from pitstop.core.parse import Event, invalid, new_event, parse_entry


@dataclass(frozen=True)
class Classifier:
    xids: XidPolicy
    system_events: Mapping[str, SystemEventRule]

    @classmethod
    def default(cls) -> Classifier:
        return cls(default_xid_policy(), default_system_events())

    def decide(self, ev: Event) -> Event:
        """Fill in kind (for system events), action and reason of a parsed event."""
        kind = ev["kind"]
        if kind == "gpu_xid":
            rule = self.xids.rule(ev["xid"])
            d = self.xids.decide(ev["xid"], ev["detail"])
            ev["action"], ev["reason"] = d.action, d.reason
            ev["detail"]["xid_name"] = rule.name
            if rule.app_fault:
                ev["detail"]["app_fault"] = True
            if ev["detail"].get("inferred_from"):
                ev["reason"] = f"{d.reason} (no Xid line: the driver reported the GPU off the bus)"
        elif kind == "system_event":
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

    def classify(self, payload: Any) -> Event:
        """A decoded JSON payload in any envelope."""
        delivery = unwrap(payload)
        if delivery.entry is None:
            src = {"log_name": None, "insert_id": None, "message_id": delivery.message_id}
            return invalid(delivery.error or "no log entry", src)
        return self.decide(parse_entry(delivery.entry, delivery))

    def classify_bytes(self, raw: bytes | str) -> Event:
        """One JSON document (a JSON Lines line); malformed JSON is an invalid event."""
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return invalid(f"malformed JSON: {str(exc)[:200]}")
        return self.classify(payload)
