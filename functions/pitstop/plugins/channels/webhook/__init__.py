"""A Google Chat or Slack incoming webhook (``PITSTOP_WEBHOOK_URL``, ``PITSTOP_WEBHOOK_FORMAT``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pitstop.adapters.http import check_url
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject
from pitstop.plugins.channels import Channel, Http
from pitstop.plugins.channels.webhook.body import render


@dataclass
class Webhook:
    """A Google Chat or Slack incoming webhook."""

    url: str
    fmt: str = "chat"
    http: Http = field(default_factory=Http)
    name: str = "webhook"

    def deliver(self, n: JsonObject) -> Delivery:
        status = self.http.json(self.url, render(n, self.fmt))
        if status >= 300:
            raise RuntimeError(f"webhook answered {status}")
        return {"status": status}


def build(env: Mapping[str, str], http: Http) -> Channel | None:
    url = env.get("PITSTOP_WEBHOOK_URL")
    if not url:
        return None
    return Webhook(check_url(url), env.get("PITSTOP_WEBHOOK_FORMAT", "chat"), http)
