"""Act only on evidence that is what it claims to be: the forgery matrix, and the trust decision.

Each forgery is something a user on a GPU VM (or with log-writing rights) can produce today. At
the classify level each one is either invalid (never an action) or marked unverified with the
reason why; the trust decision (core/trust.py) then keeps unverified evidence from starting
anything under the default policy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pitstop.core import policy, trust
from pitstop.core.actions import RANK, Action
from pitstop.core.classify import Classifier
from pitstop.core.trust import allowed_action, decide, text_provenance
from pitstop.core.xid_line import MAX_LINE
from pitstop.tools import replay
from tests.helpers import (
    assert_valid_event,
    gke_journal_entry,
    journald_entry,
    legacy_agent_entry,
    load_fixture,
    ops_agent_entry,
    syslog_entry,
    system_event_entry,
)

CLF = Classifier.default()
DEFAULT = policy.from_doc(None)
ENFORCE = policy.from_doc({"mode": "enforce"})
ACT = policy.from_doc({"mode": "enforce", "trust": {"text_syslog": "act"}})
XID79 = "NVRM: Xid (PCI:0000:04:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
LOGGER_LINE = f"Nov 21 10:42:31 a3-node-001 mallory: {XID79}"  # what `logger '...'` leaves in /var/log/syslog
AUDIT = "cloudaudit.googleapis.com%2Fsystem_event"


def _preempted(**proto: Any) -> dict[str, Any]:
    e = system_event_entry(next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted"))
    e["protoPayload"].update(proto)
    return e


def _with(entry: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {**entry, **top}


# name -> (entry, expected kind, expected trust, words the reason must contain)
FORGERIES: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "logger-in-text-syslog": (
        syslog_entry(LOGGER_LINE),
        "gpu_xid",
        "unverified",
        "text syslog: anyone on the VM",
    ),
    "logger-legacy-agent": (legacy_agent_entry(LOGGER_LINE), "gpu_xid", "unverified", "legacy logging agent"),
    "journal-by-logger": (
        journald_entry(XID79, transport="syslog", facility="1"),
        "gpu_xid",
        "unverified",
        "without _TRANSPORT=kernel",
    ),
    "journal-by-systemd-cat": (
        journald_entry(XID79, transport="stdout"),
        "gpu_xid",
        "unverified",
        "stdout transport",
    ),
    "journal-no-transport": (
        journald_entry(XID79, transport=None),
        "gpu_xid",
        "unverified",
        "_TRANSPORT=kernel",
    ),
    "journal-transport-case": (
        journald_entry(XID79, transport="Kernel"),
        "gpu_xid",
        "unverified",
        "_TRANSPORT=kernel",
    ),
    "journal-user-kmsg": (
        journald_entry(XID79, facility="1"),
        "gpu_xid",
        "unverified",
        "/dev/kmsg from user space",
    ),
    "gke-journal-no-transport": (
        gke_journal_entry(XID79, transport=None),
        "gpu_xid",
        "unverified",
        "_TRANSPORT",
    ),
    "user-authored-system-event": (
        _preempted(authenticationInfo={"principalEmail": "mallory@example.com"}),
        "invalid",
        "unverified",
        "not authored by Google",
    ),
    "system-event-other-service": (
        _preempted(serviceName="mallory.example.com"),
        "invalid",
        "unverified",
        "serviceName",
    ),
    "lookalike-log-name": (
        _with(_preempted(), logName=f"projects/mock-project/logs/evil-{AUDIT}"),
        "invalid",
        "unverified",
        "log name must be exactly",
    ),
    "another-projects-log": (
        _with(_preempted(), logName=f"projects/p/logs/{AUDIT}"),
        "invalid",
        "unverified",
        "log name must be exactly",
    ),
    "name-all": (ops_agent_entry(XID79, instance="all"), "invalid", "verified", "Slurm keyword ALL"),
    "name-ALL": (syslog_entry(XID79, instance="ALL"), "invalid", "unverified", "Slurm keyword ALL"),
    "name-hostlist-range": (
        ops_agent_entry(XID79, instance="a3-node-[000-003]"),
        "invalid",
        "verified",
        "hostlist",
    ),
    "name-hostlist-list": (
        ops_agent_entry(XID79, instance="a3-node-001,a3-node-002"),
        "invalid",
        "verified",
        "hostlist",
    ),
    "ten-megabyte-line": (
        syslog_entry(XID79 + " " + "A" * 10_000_000),
        "gpu_xid",
        "unverified",
        "cut before parsing",
    ),
    "pid-of-5000-digits": (  # the fault stands; the pid is left out and flagged (issue 22)
        ops_agent_entry(XID79.replace("pid='<unknown>'", "pid=" + "7" * 5000)),
        "gpu_xid",
        "verified",
        "implausible fields left out",
    ),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgery_matrix(name: str) -> None:
    entry, kind, level, words = FORGERIES[name]
    ev = CLF.classify(entry)
    assert_valid_event(ev)
    assert ev["kind"] == kind
    assert ev["source"]["trust"] == level
    assert words in ev["reason"], ev["reason"]
    if kind == "invalid":
        assert ev["action"] == "NONE" and ev["node"] is None
    for pol in (DEFAULT, ENFORCE):
        d = decide(ev, pol)
        assert d.action == "NONE" or ev["source"]["trust"] == "verified"


def test_logger_line_proposes_nothing_under_the_default_policy() -> None:
    ev = CLF.classify(syslog_entry(LOGGER_LINE))
    assert ev["action"] == "REBOOT_NODE"  # what the line would call for if it were true
    for pol in (DEFAULT, ENFORCE):
        d = decide(ev, pol)
        assert d.action == "NONE" and d.proposed == "REBOOT_NODE" and d.lowered
        assert "text syslog: anyone on the VM can write this line" in d.reason
        assert "recorded and notified" in d.reason


def test_the_real_kernel_line_is_believed() -> None:
    ev = CLF.classify(ops_agent_entry(XID79))
    assert ev["source"]["trust"] == "verified" and ev["action"] == "REBOOT_NODE"
    assert "unverified" not in ev["reason"]
    assert decide(ev, DEFAULT).action == "REBOOT_NODE" and not decide(ev, DEFAULT).lowered


def test_the_ten_megabyte_line_says_it_was_cut() -> None:
    ev = CLF.classify(ops_agent_entry(XID79 + " " + "A" * 10_000_000))
    assert ev["kind"] == "gpu_xid" and ev["xid"] == 79 and ev["source"]["trust"] == "verified"
    assert ev["detail"]["truncated"] is True
    assert ev["detail"]["original_bytes"] == len(XID79) + 1 + 10_000_000
    assert len(ev["detail"]["message"]) <= 512
    assert MAX_LINE == 64 * 1024


def test_journal_trust_belongs_to_the_text_that_is_read() -> None:
    entry = journald_entry("EXT4-fs (sda1): mounted filesystem")
    entry["jsonPayload"]["message"] = XID79  # a second, forged text next to the kernel's
    ev = CLF.classify(entry)
    assert ev["kind"] == "unrelated" and ev["action"] == "NONE"


def test_verified_system_event_is_still_verified() -> None:
    ev = CLF.classify(_preempted())
    assert ev["kind"] == "preemption" and ev["action"] == "RESCHEDULE_JOB"
    assert ev["source"]["trust"] == "verified"
    assert decide(ev, DEFAULT).action == "RESCHEDULE_JOB"


@pytest.mark.parametrize(
    ("entry", "carrier", "level"),
    [
        (ops_agent_entry("x"), "journald", "verified"),
        (journald_entry("x", transport="journal"), "journald", "unverified"),
        (syslog_entry("x"), "syslog", "unverified"),
        (legacy_agent_entry("x"), "legacy_agent", "unverified"),
        (gke_journal_entry("x"), "journald", "verified"),
        ({"jsonPayload": {"MESSAGE": [1, 2], "_TRANSPORT": "kernel"}}, "journald", "verified"),
        ({"jsonPayload": "nope"}, "none", "unverified"),
        ({}, "none", "unverified"),
    ],
)
def test_text_provenance(entry: dict[str, Any], carrier: str, level: str) -> None:
    p = text_provenance(entry)
    assert (p.carrier, p.trust) == (carrier, level)
    assert p.reason


# -- the pure decision ------------------------------------------------------------------------

ALL_ACTIONS = [a.value for a in Action]


@pytest.mark.parametrize("proposed", ALL_ACTIONS)
@pytest.mark.parametrize("mode", ["record", "act", "bogus"])
def test_verified_evidence_is_never_changed(proposed: str, mode: str) -> None:
    d = allowed_action("verified", proposed, mode)
    assert (d.action, d.lowered, d.reason) == (proposed, False, "")


@pytest.mark.parametrize("proposed", ALL_ACTIONS)
@pytest.mark.parametrize("level", ["unverified", "", "VERIFIED", "garbage"])
def test_record_mode_starts_nothing_on_unverified_evidence(proposed: str, level: str) -> None:
    d = allowed_action(level, proposed, "record", "text syslog: anyone on the VM can write this line")
    assert d.action == "NONE"
    assert d.lowered is (proposed != "NONE")
    if d.lowered:
        assert "recorded and notified" in d.reason and proposed in d.reason and "text syslog" in d.reason


@pytest.mark.parametrize("proposed", ALL_ACTIONS)
def test_act_mode_fences_and_resets_but_never_replaces(proposed: str) -> None:
    d = allowed_action("unverified", proposed, "act")
    if proposed == "REPLACE_NODE":
        assert d.action == "REBOOT_NODE" and d.lowered and "never replaces a host" in d.reason
    else:
        assert d.action == proposed and not d.lowered
    assert RANK[d.action] <= RANK["REBOOT_NODE"]


def test_unknown_mode_fails_closed() -> None:
    d = allowed_action("unverified", "REBOOT_NODE", "yolo")
    assert d.action == "NONE" and "not a known mode" in d.reason


def test_decide_reads_event_policy_and_escalated_action() -> None:
    ev = CLF.classify(syslog_entry(XID79))
    assert decide(ev, ACT).action == "REBOOT_NODE"
    # the engine passes the action after ladder/lemon escalation: history cannot make it a replace
    d = decide(ev, ACT, "REPLACE_NODE")
    assert d.action == "REBOOT_NODE" and d.proposed == "REPLACE_NODE"
    assert decide(ev, DEFAULT, "REPLACE_NODE").action == "NONE"
    assert decide({"action": "REBOOT_NODE"}, ENFORCE).action == "NONE"  # no trust recorded: unverified


def test_policy_knob() -> None:
    assert DEFAULT.trust_text_syslog == "record" == trust.DEFAULT_TEXT_SYSLOG
    assert ACT.trust_text_syslog == "act"
    with pytest.raises(Exception, match="text_syslog"):
        policy.from_doc({"trust": {"text_syslog": "always"}})


# -- the whole file at once ---------------------------------------------------------------------


def _jsonl(tmp_path: Path, entries: list[Any]) -> Path:
    src = tmp_path / "forgeries.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return src


def test_classify_cli_prints_one_line_per_forgery(tmp_path: Path) -> None:
    entries = [FORGERIES[n][0] for n in FORGERIES] + [ops_agent_entry(XID79, instance="a3-node-007")]
    src = _jsonl(tmp_path, entries)
    with src.open("a") as f:
        f.write("{not json\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop.tools.cli", "classify", str(src)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
    out = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(out) == len(FORGERIES) + 2
    assert [e["kind"] for e in out[: len(FORGERIES)]] == [FORGERIES[n][1] for n in FORGERIES]
    assert [e["source"]["trust"] for e in out[: len(FORGERIES)]] == [FORGERIES[n][2] for n in FORGERIES]
    assert out[-2]["kind"] == "gpu_xid" and out[-2]["source"]["trust"] == "verified"
    assert out[-1]["kind"] == "invalid"
    for e in out:
        assert_valid_event(e)


def test_replay_runs_through_every_forgery(tmp_path: Path) -> None:
    entries = [FORGERIES[n][0] for n in FORGERIES]
    report = replay.replay(replay.read_jsonl(_jsonl(tmp_path, entries)), ENFORCE)
    assert report["entries"] == len(FORGERIES)
    assert report["by_kind"]["invalid"] == sum(1 for n in FORGERIES if FORGERIES[n][1] == "invalid")
