"""The policy data files: complete, valid, and a broken one fails loudly with its path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _shipped() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((resources.schema_dir() / "xid-policy.yaml").read_text())
    return doc


def _refine_of(doc: dict[str, Any], code: int) -> list[dict[str, Any]]:
    refine: list[dict[str, Any]] = next(r for r in doc["rules"] if code in r["codes"])["refine"]
    return refine


@pytest.mark.parametrize(
    ("code", "clause", "match"),
    [
        (64, {"remap_failur": True}, "Additional properties"),  # a misspelt fact never matches: refused
        (94, {"d_rst": "yes"}, "is not valid"),  # a flag is true or false
        (48, {"memory": "hbm"}, "is not valid"),  # the parser says dram or sram
        (145, {}, "should be non-empty"),
    ],
)
def test_a_refine_clause_names_only_facts_the_parser_produces(
    tmp_path: Path, code: int, clause: dict[str, Any], match: str
) -> None:
    doc = _shipped()
    _refine_of(doc, code)[0]["if"] = clause
    with pytest.raises(resources.DataFileError, match=match):
        catalog.load_xid_policy(_write(tmp_path, doc))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda d: d["decode"]["nvlink5"]["units"][0]["status"].update({"RESET_THE_WORLD": [4]}),
            "not in actions",
        ),
        (lambda d: d["decode"]["xid74"]["registers"]["R0"].update({"cosmic_ray": [31]}), "not in classes"),
        (lambda d: d["decode"]["xid74"]["registers"].update({"R9": {"ignore": [1]}}), "R9"),
        (lambda d: d["sxid"]["fatal"].update({"action": "RESET_NVSWITCH"}), "sxid/fatal/action"),
        (lambda d: d["gpu_unknown"].update({"REBOOT_NODE": "NONE"}), "gpu_unknown"),
        (lambda d: next(r for r in d["rules"] if 45 in r["codes"]).update({"tie": "cousin"}), "tie"),
    ],
    ids=["nvlink5-bucket", "xid74-class", "xid74-register", "sxid-action", "gpu-unknown", "tie"],
)
def test_a_broken_decode_or_sxid_table_fails_loudly(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], match: str
) -> None:
    doc = _shipped()
    edit(doc)
    with pytest.raises(resources.DataFileError, match=match):
        catalog.load_xid_policy(_write(tmp_path, doc))


def test_every_nvlink5_unit_and_xid74_register_of_nvidias_tables_is_in_the_data() -> None:
    doc = _shipped()["decode"]
    units = {n for u in doc["nvlink5"]["units"] for n in u["names"]}
    # NV-CAT "Xid 144-150 Decode": the subcomponents its rows name
    nvidia = (
        "SAW_MVB RLW_CTRL RLW_REMAP RLW_RSPCOL RLW_RXPIPE RLW_SRC_TRACK RLW_TAGSTATE TLW_CTRL TLW_RX_PIPE0"
    )
    nvidia += (
        " TLW_RX_PIPE1 TLW_TX_PIPE0 TLW_TX_PIPE1 TREX NVLPW_CTRL NETIR_INT NETIR_LINK_EVT NETIR_BER_EVENT"
    )
    assert units >= {*nvidia.split(), "NETIR_MFDE_EVENT", "MSE_WATCHDOG"}
    assert set(doc["xid74"]["registers"]) == {"R0", "R2", "R3", "R4"}  # NV-CAT: the registers Hopper fills


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
