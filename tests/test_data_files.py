"""The policy data files: complete, valid, and a broken one fails loudly with its path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pitstop.core import catalog, resources
from pitstop.core.actions import RANK, Action


def test_xid_policy_covers_nvidia_catalog() -> None:
    policy = catalog.default_xid_policy()
    missing = [x for x in range(1, 173) if x not in policy.rules]
    assert missing == []
    for code, rule in policy.rules.items():
        assert rule.reason, code
        assert rule.action in RANK


def test_recovery_codes_cover_nvml_enum() -> None:
    policy = catalog.default_xid_policy()
    assert sorted(policy.recovery) == list(range(8))


def test_application_faults_flagged() -> None:
    policy = catalog.default_xid_policy()
    for code in (13, 31, 43, 45):
        assert policy.rules[code].app_fault
        assert policy.rules[code].action in (Action.NONE, Action.RESTART_JOB)


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_bad_action_names_offending_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((resources.schema_dir() / "xid-policy.yaml").read_text())
    doc["rules"][3]["action"] = "NUKE_NODE"
    with pytest.raises(resources.DataFileError, match=r"rules/3/action"):
        catalog.load_xid_policy(_write(tmp_path, doc))


def test_duplicate_code_rejected(tmp_path: Path) -> None:
    doc = yaml.safe_load((resources.schema_dir() / "xid-policy.yaml").read_text())
    doc["rules"].append({"codes": [79], "name": "DUP", "bucket": "IGNORE", "reason": "a duplicate entry"})
    with pytest.raises(resources.DataFileError, match="listed twice"):
        catalog.load_xid_policy(_write(tmp_path, doc))


def test_unknown_bucket_rejected(tmp_path: Path) -> None:
    doc = yaml.safe_load((resources.schema_dir() / "xid-policy.yaml").read_text())
    doc["rules"][0]["bucket"] = "NO_SUCH_BUCKET"
    del doc["rules"][0]["action"]
    with pytest.raises(resources.DataFileError, match="bucket"):
        catalog.load_xid_policy(_write(tmp_path, doc))


def test_not_yaml_rejected(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("rules: [unclosed")
    with pytest.raises(resources.DataFileError, match="not valid YAML"):
        catalog.load_xid_policy(p)


def test_system_event_policy_kinds() -> None:
    se = catalog.default_system_events()
    assert se["compute.instances.preempted"].action == "RESCHEDULE_JOB"
    assert se["compute.instances.upcomingMaintenance"].action == "DRAIN_NODE"
    assert se["compute.instances.upcomingMaintenance"].completed is not None


def test_action_rank_orders_disruption() -> None:
    order = sorted(RANK, key=RANK.__getitem__)
    assert order[0] == "NONE"
    assert order[-1] == "REPLACE_NODE"
    assert RANK["RESET_GPU"] < RANK["REBOOT_NODE"] < RANK["REPLACE_NODE"]
