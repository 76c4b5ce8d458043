"""A generic webhook: the notification as a JSON POST to any URL (``PITSTOP_GENERIC_WEBHOOK_URL``),
signed with HMAC-SHA256 when a key is set (``PITSTOP_GENERIC_WEBHOOK_KEY``; body.py says how)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pitstop.adapters.http import check_url
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject
from pitstop.plugins.channels import Channel, Http
from pitstop.plugins.channels.generic_webhook import body

RETRIED = frozenset({408, 425, 429})  # the receiver asks to be tried again later (as 5xx)


@dataclass
class GenericWebhook:
    url: str
    key: bytes | None = None
    http: Http = field(default_factory=Http)
    clock: Callable[[], float] = time.time
    name: str = "generic_webhook"

    def deliver(self, n: JsonObject) -> Delivery:
        data = body.payload(n)
        headers = {body.DELIVERY_HEADER: str(n.get("id") or "")}
        if self.key:
            headers[body.SIGNATURE_HEADER] = body.signature(self.key, data, int(self.clock()))
        status = self.http.raw(self.url, data, headers)
        if 400 <= status < 500 and status not in RETRIED:  # refused: sending it again cannot help
            return {"rejected": status}
        if status >= 300:
            raise RuntimeError(f"generic webhook answered {status}")
        return {"status": status}


def build(env: Mapping[str, str], http: Http) -> Channel | None:
    url = env.get("PITSTOP_GENERIC_WEBHOOK_URL")
    if not url:
        return None
    key = env.get("PITSTOP_GENERIC_WEBHOOK_KEY", "").strip()
    return GenericWebhook(check_url(url.strip()), key.encode() if key else None, http)
