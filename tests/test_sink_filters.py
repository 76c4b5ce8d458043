"""The sink filter files select every reference fault entry and no noise, under Google's filter rules."""

from __future__ import annotations

from typing import Any

import pytest

from pitstop.core import sinks
from pitstop.local.lql import FilterSyntaxError, compile_filter

from .helpers import CARRIERS, load_fixture, ops_agent_entry, system_event_entry

FILTERS = [compile_filter(f) for f in sinks.sink_filters().values()]


def selected(entry: dict[str, Any]) -> bool:
    return any(f(entry) for f in FILTERS)


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize("case", load_fixture("xid_lines.yaml"), ids=lambda c: c["id"])
def test_every_xid_line_is_selected(case: dict[str, Any], carrier: str) -> None:
    assert selected(CARRIERS[carrier](case["line"]))


@pytest.mark.parametrize(
    "case",
    [c for c in load_fixture("system_events.yaml") if c["expect"]["kind"] != "unrelated"],
    ids=lambda c: c["id"],
)
def test_every_system_event_is_selected(case: dict[str, Any]) -> None:
    assert selected(system_event_entry(case))


NOISE = [
    ops_agent_entry("systemd[1]: Started Session 42 of user root."),
    ops_agent_entry("kernel: EXT4-fs (sda1): mounted filesystem"),
    {
        **ops_agent_entry("NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus."),
        "logName": "projects/train-prod/logs/my-app",
    },
    {
        **ops_agent_entry("NVRM: Xid (PCI:0000:a1:00): 79"),
        "resource": {"type": "cloud_run_revision", "labels": {}},
    },
]


@pytest.mark.parametrize("entry", NOISE, ids=["systemd", "ext4", "other-log", "other-resource"])
def test_noise_is_not_selected(entry: dict[str, Any]) -> None:
    assert not selected(entry)


def test_unrelated_system_event_is_not_selected() -> None:
    case = next(c for c in load_fixture("system_events.yaml") if c["expect"]["kind"] == "unrelated")
    assert not selected(system_event_entry(case))


E = {
    "a": "x",
    "b": "y",
    "textPayload": "robot arm",
    "logName": "projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event",
    "labels": {"k": "V"},
    "n": 5,
    "tags": ["one", "two"],
}


@pytest.mark.parametrize(
    ("flt", "want"),
    [
        # OR binds tighter than AND: ("a" OR NOT "b") AND (NOT "c" OR "d") from the doc's example
        ('a="x" OR NOT b="y" AND NOT a="c" OR b="d"', True),
        ('a="nope" OR b="y" AND a="x"', True),
        ('a="x" OR b="nope" AND a="nope"', False),  # SQL precedence would say True
        ('a="x" b="nope"', False),  # juxtaposition is AND
        ('a="X"', True),  # case-insensitive
        ("NOT textPayload:robot", False),
        ("-textPayload:arm", False),
        ('textPayload:"bot a"', True),
        ("labels.k:*", True),
        ("labels.missing:*", False),
        ('a=("q" OR "x")', True),
        ('log_id("cloudaudit.googleapis.com/system_event")', True),
        ('log_id("syslog")', False),
        ('textPayload=~"^rob.t"', True),
        ('textPayload=~"^ROBOT"', False),  # regexes are case-sensitive
        ('textPayload!~"zzz"', True),
        ("n>=5 AND n<6", True),
        ('tags="two"', True),
        ('"robot"', True),  # global restriction
        ('a!="x"', False),
    ],
)
def test_filter_language_rules(flt: str, want: bool) -> None:
    assert compile_filter(flt)(E) is want


@pytest.mark.parametrize("flt", ['a="x" AND', '(a="x"', "a =", "log_id(syslog)", "a.=1"])
def test_bad_filters_are_refused(flt: str) -> None:
    with pytest.raises(FilterSyntaxError):
        compile_filter(flt)
