"""The local stack's PagerDuty: Events API v2's checks on an event, 202 with its body, or 400 with
its error list for an event PagerDuty would refuse."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

PATH = "/pagerduty/v2/enqueue"
LOCAL_ROUTING_KEY = "pitstoplocalroutingkey0000000000"  # 32 characters, as PagerDuty checks
_PD_ACTIONS = frozenset({"trigger", "acknowledge", "resolve"})
_PD_SEVERITIES = frozenset({"critical", "error", "warning", "info"})


def pagerduty_errors(event: Any) -> list[str]:
    """What PagerDuty's Events API v2 would refuse in an event (an empty list: accepted)."""
    if not isinstance(event, dict):
        return ["Event object is invalid"]
    errors = []
    if not isinstance(event.get("routing_key"), str) or len(event["routing_key"]) != 32:
        errors.append("'routing_key' must be a 32-character integration key")
    if event.get("event_action") not in _PD_ACTIONS:
        errors.append("'event_action' is invalid (must be one of: trigger, acknowledge, resolve)")
    if len(str(event.get("dedup_key") or "")) > 255:
        errors.append("'dedup_key' must be 255 characters or less")
    if event.get("event_action") == "trigger":
        found = event.get("payload")
        payload: Mapping[str, object] = found if isinstance(found, dict) else {}
        for key in ("summary", "source", "severity"):
            if not payload.get(key):
                errors.append(f"'payload.{key}' is missing or blank")
        if payload.get("severity") and payload["severity"] not in _PD_SEVERITIES:
            errors.append("'payload.severity' is invalid")
        if len(str(payload.get("summary") or "")) > 1024:
            errors.append("'payload.summary' must be 1024 characters or less")
    return errors


def env(base: str) -> dict[str, str]:
    """The notify function's environment that points this channel at the sink at ``base``."""
    return {"PITSTOP_PAGERDUTY_URL": base + PATH, "PITSTOP_PAGERDUTY_ROUTING_KEY": LOCAL_ROUTING_KEY}


def answer(body: bytes, headers: Mapping[str, str]) -> tuple[int, object]:
    """PagerDuty's answer to one event (the sink records only what it accepted)."""
    doc = json.loads(body or b"null")
    errors = pagerduty_errors(doc)
    if errors:
        return 400, {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
    return 202, {"status": "success", "message": "Event processed", "dedup_key": doc.get("dedup_key")}
