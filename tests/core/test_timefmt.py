"""RFC 3339 timestamps as Google's APIs write them, read as epoch seconds (core/timefmt.py)."""

from __future__ import annotations

from pitstop.core.timefmt import to_epoch


def test_cloud_loggings_nanoseconds_and_offsets_are_read() -> None:
    # Cloud Logging's LogEntry.timestamp carries nanoseconds ("2024-01-01T00:00:00.123456789Z",
    # https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry); Python reads microseconds.
    assert to_epoch("2024-01-01T00:00:00.123456789Z") == 1704067200.123456
    assert to_epoch("2024-01-01T01:00:00+01:00") == 1704067200.0
    assert to_epoch("2024-01-01T00:00:00.5Z") == 1704067200.5


def test_a_fraction_before_a_numeric_offset_keeps_the_offset() -> None:
    # RFC 3339 section 5.6: time-secfrac then time-offset ("-00:30" is an offset, not more fraction).
    assert to_epoch("2024-01-01T00:00:00.5-00:30") == 1704067200.5 + 1800
    assert to_epoch("2024-01-01T01:00:00.123456789+01:00") == 1704067200.123456


def test_nothing_or_garbage_is_none() -> None:
    assert to_epoch(None) is None and to_epoch("") is None
    assert to_epoch("yesterday") is None and to_epoch("2024-13-01T00:00:00Z") is None
