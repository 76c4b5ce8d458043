"""The local stack's generic webhook receiver: it checks the signature as a receiver must (and
refuses a bad or stale one with 401), then records the notification."""

from __future__ import annotations

import time
from collections.abc import Mapping

from pitstop.plugins.channels.generic_webhook import body

PATH = "/generic"
LOCAL_KEY = "pitstop-local-generic-webhook-key"


def env(base: str) -> dict[str, str]:
    """The notify function's environment that points this channel at the sink at ``base``."""
    return {"PITSTOP_GENERIC_WEBHOOK_URL": base + PATH, "PITSTOP_GENERIC_WEBHOOK_KEY": LOCAL_KEY}


def answer(data: bytes, headers: Mapping[str, str]) -> tuple[int, object]:
    """204 for a notification signed with the local key, 401 otherwise."""
    if not body.verify(LOCAL_KEY.encode(), data, headers.get(body.SIGNATURE_HEADER), time.time()):
        return 401, {"error": "bad or stale signature"}
    return 204, None
