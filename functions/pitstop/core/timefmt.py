"""Timestamps as Google's APIs write them (RFC 3339) read as epoch seconds, in one place."""

from __future__ import annotations

import datetime as dt


def to_epoch(ts: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp; None for none or one that does not parse.

    Cloud Logging writes nanoseconds (9 fractional digits) and Python parses at most 6, so the
    fraction is cut to microseconds first.
    """
    if not ts:
        return None
    s = ts.replace("Z", "+00:00")
    if "." in s:
        head, _, rest = s.partition(".")
        frac = len(rest) - len(rest.lstrip("0123456789"))  # the fraction ends where the offset starts
        digits, tz = rest[:frac], rest[frac:]
        s = f"{head}.{digits[:6]}{tz}"
    try:
        return dt.datetime.fromisoformat(s).timestamp()
    except ValueError:
        return None


def to_rfc3339(ts: float) -> str:
    """Epoch seconds as people read them in a message: RFC 3339, whole seconds, UTC."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
