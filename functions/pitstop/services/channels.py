"""The channels notify delivers to, and the one table that knows them.

A channel turns a notification into its body (core/notifications.py) and posts it (adapters/http.py).
Adding one is a body function in core, a class here, and its row in :data:`CHANNELS` saying which
environment (set by deploy from Secret Manager) configures it; notify delivers to every channel
configured, each exactly once per notification.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pitstop.adapters.http import check_url, post_json
from pitstop.core import notifications
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject

Post = Callable[[str, Mapping[str, object]], int]  # a JSON body posted as it is; the HTTP status
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


class Channel(Protocol):
    name: str

    def deliver(self, n: JsonObject) -> Delivery:
        """Deliver the notification (as published: notify's edge); what was done (recorded once),
        or raise to be retried."""
        ...


@dataclass
class Webhook:
    """A Google Chat or Slack incoming webhook."""

    url: str
    fmt: str = "chat"
    post: Post = post_json
    name: str = "webhook"

    def deliver(self, n: JsonObject) -> Delivery:
        status = self.post(self.url, notifications.render(n, self.fmt))
        if status >= 300:
            raise RuntimeError(f"webhook answered {status}")
        return {"status": status}


@dataclass
class PagerDuty:
    """PagerDuty Events API v2: a failure or a page triggers the incident's alert, its end resolves it."""

    routing_key: str
    url: str = PAGERDUTY_URL
    post: Post = post_json
    name: str = "pagerduty"

    def deliver(self, n: JsonObject) -> Delivery:
        action = notifications.pagerduty_action(n)
        if action is None:
            return {"skipped": "nothing for a person to do"}
        body = notifications.pagerduty_event(n, self.routing_key, action)
        status = self.post(self.url, body)
        if status == 400:  # PagerDuty says the event is invalid: sending it again cannot help
            return {"rejected": 400, "event_action": action}
        if status >= 300:  # 429 (throttled) and 5xx: redelivered later
            raise RuntimeError(f"pagerduty answered {status}")
        return {"status": status, "event_action": action, "dedup_key": body["dedup_key"]}


def _webhook(env: Mapping[str, str], post: Post) -> Channel | None:
    url = env.get("PITSTOP_WEBHOOK_URL")
    if not url:
        return None
    return Webhook(check_url(url), env.get("PITSTOP_WEBHOOK_FORMAT", "chat"), post)


def _pagerduty(env: Mapping[str, str], post: Post) -> Channel | None:
    key = env.get("PITSTOP_PAGERDUTY_ROUTING_KEY")
    if not key:
        return None
    return PagerDuty(key.strip(), check_url(env.get("PITSTOP_PAGERDUTY_URL") or PAGERDUTY_URL), post)


# name -> how its configuration is read (deploy sets these variables; secrets come from Secret Manager)
CHANNELS: dict[str, Callable[[Mapping[str, str], Post], Channel | None]] = {
    "webhook": _webhook,
    "pagerduty": _pagerduty,
}


def configured(env: Mapping[str, str], post: Post = post_json) -> list[Channel]:
    """Every channel the environment configures, in the table's order."""
    return [ch for make in CHANNELS.values() if (ch := make(env, post)) is not None]
