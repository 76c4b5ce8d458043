"""The sink filter files select every reference fault entry and no noise, under Google's filter rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.core import sinks
from pitstop.local.lql import FilterSyntaxError, compile_filter
from tests.helpers import (
    CARRIERS,
    KERNEL_LOG_ID,
    journald_entry,
    legacy_agent_entry,
    load_fixture,
    ops_agent_entry,
    syslog_entry,
    system_event_entry,
)

FILTERS = [compile_filter(f) for f in sinks.sink_filters().values()]


def selected(entry: dict[str, Any]) -> bool:
    return any(f(entry) for f in FILTERS)


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize("case", load_fixture("xid_lines.yaml"), ids=lambda c: c["id"])
def test_every_xid_line_is_selected(case: dict[str, Any], carrier: str) -> None:
    assert selected(CARRIERS[carrier](case["line"]))


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize("case", load_fixture("sxid_lines.yaml"), ids=lambda c: c["id"])
def test_every_nvswitch_line_is_selected(case: dict[str, Any], carrier: str) -> None:
    assert selected(CARRIERS[carrier](case["line"]))


@pytest.mark.parametrize(
    "case",
    [c for c in load_fixture("system_events.yaml") if c["expect"]["kind"] != "unrelated"],
    ids=lambda c: c["id"],
)
def test_every_system_event_is_selected(case: dict[str, Any]) -> None:
    assert selected(system_event_entry(case))


XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, GPU has fallen off the bus."
SXID = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error"
NOISE = {
    "systemd": syslog_entry("systemd[1]: Started Session 42 of user root."),
    "ext4": syslog_entry("kernel: EXT4-fs (sda1): mounted filesystem"),
    "kernel-ext4": ops_agent_entry("EXT4-fs (sda1): mounted filesystem"),
    "other-log": {**syslog_entry(XID79), "logName": "projects/train-prod/logs/my-app"},
    "other-journal-log": {**ops_agent_entry(XID79), "logName": "projects/train-prod/logs/journald"},
    "other-resource": {**syslog_entry(XID79), "resource": {"type": "cloud_run_revision", "labels": {}}},
    "journal-by-logger": journald_entry(XID79, transport="syslog", facility="1"),
    "journal-by-systemd-cat": journald_entry(XID79, transport="stdout", facility="3"),
    "journal-no-transport": journald_entry(XID79, transport=None),
}


@pytest.mark.parametrize("name", sorted(NOISE))
def test_noise_is_not_selected(name: str) -> None:
    assert not selected(NOISE[name])


def _forged(case_id: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    entry = system_event_entry(next(c for c in load_fixture("system_events.yaml") if c["id"] == case_id))
    target = entry
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return entry


@pytest.mark.parametrize(
    "entry",
    [
        _forged("preempted", ("protoPayload", "authenticationInfo", "principalEmail"), "mallory@example.com"),
        _forged("preempted", ("protoPayload", "serviceName"), "evil.googleapis.com"),
        _forged(
            "preempted",
            ("logName",),
            "projects/mock-project/logs/evil-cloudaudit.googleapis.com%2Fsystem_event",
        ),
        _forged("host-error", ("logName",), "projects/skilled-adapter-452/logs/system_event"),
    ],
    ids=["user-principal", "other-service", "lookalike-log", "other-log-id"],
)
def test_forged_system_events_are_not_selected(entry: dict[str, Any]) -> None:
    assert not selected(entry)


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


# -- the Ops Agent configuration GPU VMs run (infra/ops-agent/config.yaml) --------------------

OPS_AGENT = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra/ops-agent/config.yaml").read_text())


def _shipped(entry: dict[str, Any], receiver: str) -> bool:
    """Whether the agent sends ``entry`` from ``receiver``: no exclude_logs processor of its pipeline
    matches it (their conditions use the Cloud Logging filter syntax the local router reads)."""
    logging = OPS_AGENT["logging"]
    (pipeline,) = [p for p in logging["service"]["pipelines"].values() if receiver in p["receivers"]]
    for pid in pipeline.get("processors", []):
        proc = logging["processors"][pid]
        assert proc["type"] == "exclude_logs"
        if any(compile_filter(cond)(entry) for cond in proc["match_any"]):
            return False
    return True


def test_ops_agent_ships_the_kernel_journal_under_the_filters_log_id() -> None:
    receivers = OPS_AGENT["logging"]["receivers"]
    assert receivers[KERNEL_LOG_ID] == {"type": "systemd_journald"}
    assert f'log_id("{KERNEL_LOG_ID}")' in sinks.read_filter("gpu-xid.filter")
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", KERNEL_LOG_ID)  # a receiver id is used as the log id as is
    assert OPS_AGENT["logging"]["service"]["pipelines"]["default_pipeline"]["receivers"] == ["syslog"]


@pytest.mark.parametrize(
    ("entry", "receiver", "shipped", "picked"),
    [
        (ops_agent_entry(XID79), KERNEL_LOG_ID, True, True),
        (ops_agent_entry("EXT4-fs (sda1): mounted filesystem"), KERNEL_LOG_ID, True, False),
        (journald_entry(XID79, transport="syslog", facility="1"), KERNEL_LOG_ID, False, False),
        (journald_entry(XID79, transport="journal"), KERNEL_LOG_ID, False, False),
        (journald_entry(XID79, transport=None), KERNEL_LOG_ID, False, False),
        (syslog_entry(XID79), "syslog", False, True),  # selected when a VM without this config sends it
        (syslog_entry("systemd[1]: Started Session 42."), "syslog", True, False),
        (ops_agent_entry(SXID), KERNEL_LOG_ID, True, True),
        (syslog_entry(SXID), "syslog", False, True),
    ],
    ids=[
        "kernel-xid",
        "kernel-noise",
        "logger",
        "sd-journal-send",
        "no-transport",
        "syslog-xid",
        "syslog-noise",
        "kernel-sxid",
        "syslog-sxid",
    ],
)
def test_agent_and_sink_together(entry: dict[str, Any], receiver: str, shipped: bool, picked: bool) -> None:
    assert _shipped(entry, receiver) is shipped
    assert selected(entry) is picked


def _serial(line: str, log_id: str = "serialconsole.googleapis.com%2Fserial_port_1_output") -> dict[str, Any]:
    """GKE's route for kernel lines: the node VM's serial console (docs/deploy.md, GKE clusters)."""
    entry = legacy_agent_entry(f"[ 7341.112233] {line}")
    entry["logName"] = f"projects/train-prod/logs/{log_id}"
    return entry


@pytest.mark.parametrize(
    ("entry", "picked"),
    [
        (_serial(XID79), True),
        (_serial("EXT4-fs (sda1): mounted filesystem"), False),
        (_serial(XID79, "serialconsole.googleapis.com%2Fserial_port_2_output"), False),
    ],
    ids=["serial-xid", "serial-noise", "other-serial-port"],
)
def test_gke_serial_console_route(entry: dict[str, Any], picked: bool) -> None:
    assert selected(entry) is picked
