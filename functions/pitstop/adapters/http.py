"""HTTPS POST of a JSON body: the one way notify reaches a chat webhook or PagerDuty."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

TIMEOUT_S = 10.0


def check_url(url: str) -> str:
    """Only https leaves the machine; plain http only to the local stack's sinks."""
    if not url.startswith(("https://", "http://127.0.0.1", "http://localhost")):
        raise ValueError("a notification endpoint must be https (or a local http endpoint)")
    return url


def post_json(url: str, body: Mapping[str, object], timeout: float = TIMEOUT_S) -> int:
    """POST ``body``; the HTTP status (an error status is returned, not raised)."""
    req = urllib.request.Request(  # noqa: S310 - scheme checked by check_url
        check_url(url),
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json; charset=UTF-8"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:  # 4xx/5xx: the caller decides what it means
        return int(exc.code)
