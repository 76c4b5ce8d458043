"""Unwrapping what a topic delivers: a bare LogEntry, a Pub/Sub push body, or a CloudEvent
(whose message may also be a Cloud Monitoring notification: core/alerts.py).

Shapes: reference/gcp-events.md §3-§4. Real deliveries carry camelCase and snake_case
duplicates (messageId/message_id, publishTime/publish_time); either is accepted.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple

import orjson

PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
_LOG_ENTRY_KEYS = frozenset({"logName", "insertId", "protoPayload", "jsonPayload", "textPayload"})
MAX_ID = 256


class Delivery(NamedTuple):
    """The LogEntry inside an envelope, with the transport's identity of the message.

    A NamedTuple, not a frozen dataclass: one is made per delivery, and a frozen dataclass's
    ``__init__`` (``object.__setattr__`` per field) costs several times a tuple's."""

    entry: dict[str, object] | None  # a LogEntry or a notification, unchecked: read field by field
    message_id: str | None = None
    publish_time: str | None = None
    error: str | None = None
    # A CloudEvent's ``source``: the topic it came through (``//pubsub.googleapis.com/projects/P/topics/T``),
    # set by Pub/Sub and Eventarc, not by whoever published (core/alerts.py relies on it).
    source: str | None = None


def _str(v: object) -> str | None:
    """A short identifier kept from the envelope: at most MAX_ID characters of valid UTF-8."""
    if not isinstance(v, str) or not v:
        return None
    if len(v) <= MAX_ID and v.isascii():
        return v
    return v[:MAX_ID].encode("utf-8", "replace").decode("utf-8")


def _type_name(v: object) -> str:
    """A CloudEvent type for an error message, without echoing arbitrary input."""
    s = _str(v)
    return repr(s[:80]) if s else type(v).__name__


def _from_message(
    msg: Any, fallback_id: Any = None, fallback_time: Any = None, source: Any = None
) -> Delivery:
    if not isinstance(msg, dict):
        return Delivery(None, error="Pub/Sub message is not an object")
    mid = _str(msg.get("messageId")) or _str(msg.get("message_id")) or _str(fallback_id)
    ptime = _str(msg.get("publishTime")) or _str(msg.get("publish_time")) or _str(fallback_time)
    src = _str(source)
    data = msg.get("data")
    if not isinstance(data, str) or not data:
        return Delivery(None, mid, ptime, "Pub/Sub message has no data", src)
    try:  # binascii directly: base64.b64decode(validate=True) is this call behind a Python wrapper
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        return Delivery(None, mid, ptime, "Pub/Sub message data is not valid base64", src)
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Delivery(None, mid, ptime, "Pub/Sub message data is not JSON", src)
    if not isinstance(entry, dict):
        return Delivery(None, mid, ptime, "Pub/Sub message data is not a JSON object", src)
    return Delivery(entry, mid, ptime, source=src)


def unwrap(obj: Any) -> Delivery:
    """Find the LogEntry in any of the three envelopes; never raises."""
    if not isinstance(obj, dict):
        return Delivery(None, error="input is not a JSON object")
    if "specversion" in obj:
        ctype = obj.get("type")
        if ctype != PUBSUB_PUBLISHED:
            return Delivery(
                None, _str(obj.get("id")), error=f"unsupported CloudEvent type {_type_name(ctype)}"
            )
        data = obj.get("data")
        if data is None and isinstance(obj.get("data_base64"), str):
            try:
                data = orjson.loads(base64.b64decode(obj["data_base64"], validate=True))
            except (binascii.Error, ValueError):
                return Delivery(None, _str(obj.get("id")), error="CloudEvent data_base64 is not base64 JSON")
        elif isinstance(data, str):
            try:
                data = orjson.loads(data)
            except orjson.JSONDecodeError:
                return Delivery(None, _str(obj.get("id")), error="CloudEvent data is not JSON")
        if not isinstance(data, dict) or "message" not in data:
            return Delivery(None, _str(obj.get("id")), error="CloudEvent data carries no Pub/Sub message")
        return _from_message(data["message"], obj.get("id"), obj.get("time"), obj.get("source"))
    msg = obj.get("message")
    if isinstance(msg, dict) and ("data" in msg or "messageId" in msg or "message_id" in msg):
        return _from_message(msg)
    if not _LOG_ENTRY_KEYS.isdisjoint(obj) or (isinstance(obj.get("incident"), dict) and "version" in obj):
        return Delivery(obj)  # a bare LogEntry, or a bare notification (judged by core/alerts.py)
    return Delivery(
        None, error="unknown envelope: not a LogEntry, a notification, a Pub/Sub push body or a CloudEvent"
    )
