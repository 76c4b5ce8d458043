"""HTTPS POST of a JSON body: the one way notify reaches a chat webhook, PagerDuty or any webhook."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

TIMEOUT_S = 10.0
JSON = "application/json; charset=UTF-8"


def check_url(url: str) -> str:
    """Only https leaves the machine; plain http only to the local stack's sinks."""
    if not url.startswith(("https://", "http://127.0.0.1", "http://localhost")):
        raise ValueError("a notification endpoint must be https (or a local http endpoint)")
    return url


def post_json(url: str, body: Mapping[str, object], timeout: float = TIMEOUT_S) -> int:
    """POST ``body``; the HTTP status (an error status is returned, not raised)."""
    return post_bytes(url, json.dumps(body).encode(), {}, timeout)


def post_bytes(url: str, data: bytes, headers: Mapping[str, str], timeout: float = TIMEOUT_S) -> int:
    """POST ``data`` exactly as given (a signature covers these bytes) with ``headers``; the status."""
    req = urllib.request.Request(  # noqa: S310 - scheme checked by check_url
        check_url(url), data=data, method="POST", headers={"Content-Type": JSON, **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:  # 4xx/5xx: the caller decides what it means
        return int(exc.code)
