"""The parts every log entry parser builds an event with (core/parse.py, core/vertex_log.py):
bounded, valid text, a real timestamp, a whole source and an event with every key."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any, cast

from pitstop.core import trust
from pitstop.core.domain import FaultEvent, Source
from pitstop.core.xid_line import MAX_LINE

MAX_LOG_NAME, MAX_ID, MAX_RESOURCE_NAME = 512, 256, 1024
_TIMESTAMP = re.compile(
    r"\d{4}-\d\d-\d\dT(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    re.ASCII,
)
_DATES: dict[str, bool] = {}
MAX_DATE_MEMO = 1024
VERTEX_RESOURCE = "ml_job"  # a Vertex AI training job's own log (core/vertex_log.py)

Event = FaultEvent
# A LogEntry (or a part of one) as delivered: untrusted JSON, each field checked where it is read.
Raw = Mapping[str, object]


def clean(v: str, limit: int) -> str:
    """At most ``limit`` characters, valid UTF-8 (a lone surrogate becomes '?')."""
    v = v[:limit]
    return v if v.isascii() else v.encode("utf-8", "replace").decode("utf-8")


def bounded_text(text: str) -> tuple[str, int | None]:
    """The message cut to MAX_LINE bytes of UTF-8 (on a character boundary), and its original size if cut."""
    if len(text) <= MAX_LINE and text.isascii():
        return text, None
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_LINE:
        return raw.decode("utf-8"), None
    return raw[:MAX_LINE].decode("utf-8", "ignore"), len(raw)


def _real_date(date: str) -> bool:
    """Whether ``YYYY-MM-DD`` is a calendar date of 1971-9998 (remembered: a day's lines share it)."""
    known = _DATES.get(date)
    if known is None:
        try:
            known = 1971 <= dt.date.fromisoformat(date).year <= 9998
        except ValueError:
            known = False
        if len(_DATES) >= MAX_DATE_MEMO:
            _DATES.clear()
        _DATES[date] = known
    return known


def _ts(v: Any) -> str | None:
    """An RFC 3339 timestamp that is a real moment (1971-9998), or None.

    The pattern bounds the time of day and the offset; only the date needs the calendar.
    """
    if not isinstance(v, str) or len(v) > 40 or not _TIMESTAMP.fullmatch(v):
        return None
    return v if _real_date(v[:10]) else None


def new_source(log_name: Any = None, insert_id: Any = None, message_id: str | None = None) -> Source:
    return {
        "log_name": clean(log_name, MAX_LOG_NAME) if isinstance(log_name, str) else None,
        "insert_id": clean(insert_id, MAX_ID) if isinstance(insert_id, str) else None,
        "message_id": message_id,
        "trust": trust.UNVERIFIED,
        "trust_reason": None,
    }


def _full(source: Source | None) -> Source:
    """The source as given when it is whole; else a new one with what it names (trust unverified)."""
    if source is not None and "trust" in source:
        return source
    merged = new_source()
    if source:
        merged.update(source)
    return merged


def new_event(kind: str, reason: str, source: Source | None = None, **fields: Any) -> Event:
    """A FaultEvent with every key present (the schema requires them all); trust defaults to unverified."""
    ev: FaultEvent = {
        "kind": kind,
        "action": "NONE",
        "xid": None,
        "node": None,
        "gpu": None,
        "observed_at": None,
        "source": _full(source),
        "reason": reason,
        "detail": {},
    }
    ev.update(cast(FaultEvent, fields))  # keyword fields name FaultEvent keys (the schema checks events)
    return ev


def invalid(reason: str, source: Source | None = None, **fields: Any) -> Event:
    return new_event("invalid", clean(reason, 512), source, **fields)
