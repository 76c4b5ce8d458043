"""Pitstop's node-problem-detector rule file (infra/gke/npd.yaml) and the local NPD stand-in.

The rule file is NPD's system-log-monitor format (github.com/kubernetes/node-problem-detector,
docs/system-log-monitor.md, config/kernel-monitor.json): a kmsg source, declared conditions, rules
whose Go regular expression is matched against the whole kernel message. The pattern must match
every NVRM Xid line shape the parser knows (tests/fixtures/xid_lines.yaml) and name the same Xid
core/corroboration.py then reads out of the condition's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pitstop.core import corroboration, ring_buffer
from pitstop.local import npd

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
XID_LINES = yaml.safe_load((FIXTURES / "xid_lines.yaml").read_text())
SXID_LINES = yaml.safe_load((FIXTURES / "sxid_lines.yaml").read_text())
MONITOR = npd.load(npd.monitor_config())
PERMANENT = [r for r in MONITOR.rules if r.kind == "permanent"]


def _kmsg_message(line: str) -> str:
    """What /dev/kmsg holds for a fixture line: the kernel message without a syslog or dmesg prefix."""
    return line[line.index("NVRM: Xid") :]


def test_the_rule_file_sets_pitstops_condition_from_kmsg() -> None:
    assert npd.monitor_config()["plugin"] == "kmsg"
    assert set(MONITOR.defaults) == {corroboration.NPD_CONDITION}
    assert [r.condition for r in PERMANENT] == [corroboration.NPD_CONDITION]


XID_SHAPED = [c for c in XID_LINES if "NVRM: Xid" in c["line"]]
# The parser also infers Xid 79 from the driver's "GPU has fallen off the bus" lines; the ring-buffer
# judgement (core/ring_buffer.xid_in, the Slurm path) counts NVRM Xid lines only, and so does the rule.
INFERRED = [c for c in XID_LINES if "NVRM: Xid" not in c["line"]]


@pytest.mark.parametrize("case", XID_SHAPED, ids=[c["id"] for c in XID_SHAPED])
def test_the_rule_matches_every_xid_line_shape_and_the_judge_reads_its_xid(case: dict[str, Any]) -> None:
    for line in (case["line"], _kmsg_message(case["line"])):  # as printed, and as kmsg stores it
        got = npd.conditions(MONITOR, [line])[corroboration.NPD_CONDITION]
        assert got[0] == "True", line
        m = ring_buffer.xid_in(got[2])
        assert m is not None and m[0] == case["expect"]["xid"]


@pytest.mark.parametrize("case", INFERRED, ids=[c["id"] for c in INFERRED])
def test_a_line_the_xid_is_only_inferred_from_is_not_matched_as_on_slurm(case: dict[str, Any]) -> None:
    assert ring_buffer.xid_in(case["line"]) is None
    assert npd.conditions(MONITOR, case["line"].splitlines())[corroboration.NPD_CONDITION][0] == "False"


@pytest.mark.parametrize(
    "line",
    [
        *(c["line"] for c in SXID_LINES),  # the NVSwitch driver's SXid lines are not GPU Xids
        "NVRM: GPU at PCI:0000:a1:00: GPU-1234",
        "python3[4242]: training step 100 done, no Xid here",
        "NVRM: Xid 79 seen by my script",  # no PCI address: not the driver's format
        "",
    ],
)
def test_the_rule_matches_no_other_line(line: str) -> None:
    assert npd.conditions(MONITOR, [line])[corroboration.NPD_CONDITION][0] == "False"


def test_the_condition_keeps_the_boots_first_xid_line_and_a_new_boot_starts_clean() -> None:
    first = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    later = "NVRM: Xid (PCI:0000:a1:00): 45, pid=1, name=python3, Ch 0000000c"
    assert npd.conditions(MONITOR, [first, later])[corroboration.NPD_CONDITION][2] == first
    assert npd.conditions(MONITOR, [])[corroboration.NPD_CONDITION][0] == "False"


def test_npd_sees_the_message_only_so_a_root_write_to_kmsg_would_match() -> None:
    """NPD's kmsg watcher hands the rules the message text, not the syslog facility: a line root on
    the node writes to /dev/kmsg (LOG_USER) matches like the driver's. Only root can write /dev/kmsg,
    and root also holds the kubelet's credentials (infra/gke/npd.yaml header): documented, not hidden."""
    stand_in = npd.Npd(
        lambda: {"n": ["NVRM: Xid (PCI:0000:a1:00): 13, written from user space"]}, lambda *a: calls.append(a)
    )
    calls: list[tuple[str, ...]] = []
    stand_in.step()
    assert calls == [("n", corroboration.NPD_CONDITION, "True", "NvrmXid", stand_in.kmsg()["n"][0])]
    stand_in.step()
    assert len(calls) == 1  # nothing changed: nothing written again


def test_a_rule_naming_an_undeclared_condition_is_refused() -> None:
    doc = {**npd.monitor_config(), "conditions": []}
    with pytest.raises(ValueError, match="not declared"):
        npd.load(doc)
    with pytest.raises(ValueError, match="kmsg"):
        npd.load({**npd.monitor_config(), "plugin": "journald"})
