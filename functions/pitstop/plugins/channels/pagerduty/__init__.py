"""PagerDuty Events API v2 (``PITSTOP_PAGERDUTY_ROUTING_KEY``, ``PITSTOP_PAGERDUTY_URL``): the
worked example of a channel folder (README, "Where a change goes")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pitstop.adapters.http import check_url
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject
from pitstop.plugins.channels import Channel, Http
from pitstop.plugins.channels.pagerduty.body import pagerduty_action, pagerduty_event

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


@dataclass
class PagerDuty:
    """A failure or a page triggers the incident's alert, its end resolves it."""

    routing_key: str
    url: str = PAGERDUTY_URL
    http: Http = field(default_factory=Http)
    name: str = "pagerduty"

    def deliver(self, n: JsonObject) -> Delivery:
        action = pagerduty_action(n)
        if action is None:
            return {"skipped": "nothing for a person to do"}
        body = pagerduty_event(n, self.routing_key, action)
        status = self.http.json(self.url, body)
        if status == 400:  # PagerDuty says the event is invalid: sending it again cannot help
            return {"rejected": 400, "event_action": action}
        if status >= 300:  # 429 (throttled) and 5xx: redelivered later
            raise RuntimeError(f"pagerduty answered {status}")
        return {"status": status, "event_action": action, "dedup_key": body["dedup_key"]}


def build(env: Mapping[str, str], http: Http) -> Channel | None:
    key = env.get("PITSTOP_PAGERDUTY_ROUTING_KEY")
    if not key:
        return None
    return PagerDuty(key.strip(), check_url(env.get("PITSTOP_PAGERDUTY_URL") or PAGERDUTY_URL), http)
