"""The generic webhook's body and signature, built without I/O (imports no google.*, no I/O layer:
lint-imports checks it).

The body is the notification as JSON (its own fields, and ``text``: the lines every channel shows),
serialised one way only so that the signature covers exactly the bytes sent. The signature header
is ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`` under a shared key (RFC 2104 HMAC,
FIPS 180-4 SHA-256): a receiver recomputes it, compares in constant time and refuses an old ``t``,
so a captured request cannot be replayed later. ``X-Pitstop-Delivery`` carries the notification's
id: a redelivery after a lost answer has the same id, for the receiver to drop.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from pitstop.core.notifications import Notification, text_lines

SCHEMA = "pitstop.notification/v1"
FIELDS = ("id", "kind", "severity", "summary", "incident", "durations_s", "jobs", "todo")
SIGNATURE_HEADER = "X-Pitstop-Signature"
DELIVERY_HEADER = "X-Pitstop-Delivery"
TOLERANCE_S = 300  # a receiver refuses a signature older (or newer) than this
_SIGNATURE = re.compile(r"t=([0-9]{1,12}),v1=([0-9a-f]{64})")


def payload(n: Notification) -> bytes:
    """The JSON document posted: the notification's own fields and its text, keys sorted."""
    doc = {k: n[k] for k in FIELDS if k in n}
    doc["schema"] = SCHEMA
    doc["text"] = "\n".join(text_lines(n))
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: bytes, at: int, data: bytes) -> str:
    return hmac.new(key, str(at).encode() + b"." + data, hashlib.sha256).hexdigest()


def signature(key: bytes, data: bytes, at: int) -> str:
    """The signature header's value for ``data`` sent at ``at`` (unix seconds)."""
    return f"t={at},v1={_mac(key, at, data)}"


def verify(key: bytes, data: bytes, header: str | None, now: float, tolerance_s: float = TOLERANCE_S) -> bool:
    """Whether ``header`` signs ``data`` under ``key`` within ``tolerance_s`` of ``now``."""
    m = _SIGNATURE.fullmatch(header or "")
    if m is None or abs(now - int(m[1])) > tolerance_s:
        return False
    return hmac.compare_digest(m[2], _mac(key, int(m[1]), data))
