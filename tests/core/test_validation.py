"""Post-repair validation: real nccl-tests and dcgmi samples, the threshold edges, the step-up."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pitstop.core import resources
from pitstop.core.validation import (
    PAGE,
    RETURN_TO_SERVICE,
    DcgmResult,
    NcclResult,
    NcclRow,
    default_validation_table,
    load_validation_table,
    next_action,
    off_fabric,
    parse_all_gather,
    parse_dcgm_diag,
    validate,
)

FIX = Path(__file__).parents[1] / "fixtures" / "validation"
ROOT = Path(__file__).resolve().parents[2]
GIB8 = 8 << 30


def fixture(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def dcgm_v4(tests: list[dict[str, Any]]) -> str:
    """DCGM 4's envelope (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json) around test objects."""
    doc = {
        "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]},
        "metadata": {"version": "4.1.1"},
    }
    return json.dumps(doc, indent="\t")


def issue215_test() -> dict[str, Any]:
    """The real DCGM 4 test object quoted in NVIDIA/DCGM#215 (its cut-off trailing comma dropped)."""
    loaded: dict[str, Any] = json.loads(fixture("dcgmi_diag_v4_issue215_fragment.txt").rstrip().rstrip(","))
    return loaded


DCGM_PASS = parse_dcgm_diag(fixture("dcgmi_diag_v3_pass_8gpu.txt"))


# ------------------------------------------------------------------ the expectation table


def test_table_covers_the_machine_types_with_sources() -> None:
    t = default_validation_table()
    assert set(t.machine_types) == {
        "a3-megagpu-8g",
        "a3-highgpu-8g",
        "a3-ultragpu-8g",
        "a4-highgpu-8g",
        "a4x-highgpu-4g",
    }
    assert (t.busbw_fraction, t.dcgm_level, t.diagnose_dcgm_level) == (0.9, 2, 1)
    mega = t.machine_types["a3-megagpu-8g"]
    assert (mega.busbw_gbps, mega.message_bytes, mega.gpus) == (188.73, GIB8, 8)
    assert t.machine_types["a3-highgpu-8g"].busbw_gbps == 70.90
    assert t.machine_types["a3-highgpu-8g"].message_bytes == 512 << 20
    assert t.machine_types["a4-highgpu-8g"].busbw_gbps == 328.85
    assert t.machine_types["a3-ultragpu-8g"].busbw_gbps is None
    assert t.machine_types["a4x-highgpu-4g"].gpus == 4
    assert all(e.source.startswith("https://github.com/") for e in t.machine_types.values())


def test_table_figures_match_the_samples_they_cite() -> None:
    """Each published figure is the out-of-place busbw of its sample's judged row."""
    t = default_validation_table()
    for mt, name in (
        ("a3-megagpu-8g", "all_gather_a3_megagpu_8g.txt"),
        ("a3-highgpu-8g", "all_gather_a3_highgpu_8g.txt"),
        ("a4-highgpu-8g", "all_gather_a4_highgpu_8g.txt"),
    ):
        e = t.machine_types[mt]
        text = fixture(name)
        assert e.source in text.splitlines()[0]
        row = parse_all_gather(text).row_at(e.message_bytes)
        assert row is not None and row.oop_busbw == e.busbw_gbps


def test_broken_table_names_the_offending_path(tmp_path: Path) -> None:
    doc = yaml.safe_load((resources.schema_dir() / "validation.yaml").read_text())
    doc["defaults"]["busbw_fraction"] = 1.5
    p = tmp_path / "validation.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(resources.DataFileError, match="defaults/busbw_fraction"):
        load_validation_table(p)
    doc["defaults"]["busbw_fraction"] = 0.9
    doc["machine_types"]["a3-megagpu-8g"]["source"] = "somewhere"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(resources.DataFileError, match="machine_types/a3-megagpu-8g/source"):
        load_validation_table(p)


# ------------------------------------------------------------------ nccl-tests parser


def test_parse_a3_mega_sample() -> None:
    r = parse_all_gather(fixture("all_gather_a3_megagpu_8g.txt"))
    assert r.ok and r.error is None
    assert len(r.rows) == 31 and r.rows[0].size_bytes == 0
    assert r.avg_busbw == 53.8932 and r.out_of_bounds == 0 and r.wrong == 0
    row = r.row_at(GIB8)
    assert row is not None
    assert (row.count, row.dtype, row.redop, row.root) == (134217728, "float", "none", -1)
    assert (row.oop_time_us, row.oop_algbw, row.oop_busbw, row.oop_wrong) == (42668.7, 201.32, 188.73, 0)
    assert (row.ip_time_us, row.ip_algbw, row.ip_busbw, row.ip_wrong) == (42630.7, 201.50, 188.90, 0)
    assert row.busbw == 188.73
    one_gib = r.row_at(1 << 30)
    assert one_gib is not None and one_gib.busbw == 182.00


def test_parse_a4_sample() -> None:
    r = parse_all_gather(fixture("all_gather_a4_highgpu_8g.txt"))
    assert r.ok and r.avg_busbw == 120.248 and len(r.rows) == 24
    row = r.row_at(GIB8)
    assert row is not None and (row.oop_busbw, row.ip_busbw, row.oop_time_us) == (328.85, 335.67, 24489.0)


def test_parse_a3_high_sample_with_unchecked_results() -> None:
    r = parse_all_gather(fixture("all_gather_a3_highgpu_8g.txt"))
    assert r.ok and r.avg_busbw == 30.9622 and len(r.rows) == 10
    row = r.row_at(512 << 20)
    assert row is not None and (row.oop_busbw, row.ip_busbw) == (70.90, 71.35)
    assert row.oop_wrong is None and row.ip_wrong is None and r.wrong == 0


def test_redacted_sample_is_an_error_not_a_number() -> None:
    r = parse_all_gather(fixture("all_gather_a3_ultragpu_8g_redacted.txt"))
    assert not r.ok and r.error is not None and "malformed result row" in r.error


def test_truncated_output_is_an_error() -> None:
    text = fixture("all_gather_a3_megagpu_8g.txt")
    head = text[: text.index("# Out of bounds")]
    r = parse_all_gather(head)
    assert not r.ok and r.error is not None and "truncated" in r.error
    assert len(r.rows) == 31  # what was read is kept for the record
    cut = text[: text.index("42668.7") + 3]
    assert not parse_all_gather(cut).ok


@pytest.mark.parametrize(
    "text",
    ["", "Test NCCL failure common.cu:1005 'unhandled system error'", "# only comments\n#", "\x00\xff" * 50],
)
def test_garbage_nccl_output(text: str) -> None:
    r = parse_all_gather(text)
    assert not r.ok and r.error


def test_negative_or_nan_bandwidth_is_malformed() -> None:
    line = "  8589934592  134217728  float  none  -1  42668.7  nan  188.73  0  42630.7  201.50  188.90  0"
    assert not parse_all_gather(line + "\n# Avg bus bandwidth    : 1\n").ok


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789 .#-\nNA/:xe")), max_size=400))
def test_nccl_parser_is_total(text: str) -> None:
    r = parse_all_gather(text)
    assert r.ok or r.error


# ------------------------------------------------------------------ dcgmi parser


def test_parse_dcgm3_real_sample() -> None:
    r = DCGM_PASS
    assert r.ok and r.verdict == "pass" and r.schema == "v3" and r.version == "3.1.0"
    assert len(r.tests) == 10 and r.failing == () and r.failed_gpus == ()
    deny = next(t for t in r.tests if t.name == "Denylist")
    assert deny.category == "Deployment" and deny.gpus == tuple(range(8))
    sw = next(t for t in r.tests if t.name == "software")
    assert sw.category == "Custom" and sw.gpus == tuple(range(8))


def test_parse_dcgm4_real_test_object() -> None:
    r = parse_dcgm_diag(dcgm_v4([issue215_test()]))
    assert r.ok and r.verdict == "pass" and r.schema == "v4" and r.version == "4.1.1"
    (t,) = r.tests
    assert (t.name, t.status, t.gpus) == ("diagnostic", "pass", tuple(range(8)))


def test_dcgm4_failure_names_the_gpu_and_the_message() -> None:
    test = issue215_test()
    test["results"][5]["status"] = "Fail"
    test["results"][5]["warnings"] = [{"error_id": 1, "warning": "GPU 5 failed the diagnostic"}]
    test["test_summary"]["status"] = "Fail"
    r = parse_dcgm_diag(dcgm_v4([test]))
    assert r.ok and r.verdict == "fail" and r.failed_gpus == (5,)
    (bad,) = r.failing
    assert bad.messages == ("GPU 5 failed the diagnostic",)


def test_dcgm_warn_skip_unknown_and_runtime_error() -> None:
    test = issue215_test()
    test["results"][2]["status"] = "Warn"
    assert parse_dcgm_diag(dcgm_v4([test])).verdict == "warn"
    for r in test["results"]:
        r["status"] = "Skip"
    skipped = parse_dcgm_diag(dcgm_v4([test]))
    assert not skipped.ok and skipped.verdict == "error"
    test["results"][0]["status"] = "Inconclusive"  # a word never seen is no evidence of health
    assert parse_dcgm_diag(dcgm_v4([test])).verdict == "fail"
    broken = parse_dcgm_diag(json.dumps({"DCGM Diagnostic": {"runtime_error": "hostengine not running"}}))
    assert broken.verdict == "error" and broken.error is not None and "hostengine" in broken.error


def test_dcgm_summary_alone_counts() -> None:
    r = parse_dcgm_diag(dcgm_v4([{"name": "pcie", "test_summary": {"status": "Fail"}}]))
    assert r.verdict == "fail" and r.failing[0].gpus == ()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Error: unable to establish a connection to the specified host: localhost",
        "{",
        "[1, 2]",
        '{"DCGM Diagnostic": 5}',
        '{"DCGM GPU Diagnostic": {"test_categories": [null, 3, {"tests": [null, {"results": [7]}]}]}}',
        '{"other": {}}',
        "{" * 5000 + "}" * 5000,
    ],
)
def test_garbage_dcgm_output(text: str) -> None:
    r = parse_dcgm_diag(text)
    assert not r.ok and r.verdict == "error" and r.error


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(KEYS), kids, max_size=4),
        max_leaves=30,
    )
    if (KEYS := ["DCGM Diagnostic", "test_categories", "tests", "results", "status", "gpu_ids", "name"])
    else st.none()
)
def test_dcgm_parser_is_total(doc: Any) -> None:
    r = parse_dcgm_diag(json.dumps({"DCGM Diagnostic": doc}))
    assert r.verdict in ("pass", "fail", "warn", "error")


# ------------------------------------------------------------------ validate


def row(busbw: float, size: int = GIB8, wrong: int | None = 0) -> NcclResult:
    r = NcclRow(size, size // 64, "float", "none", -1, 1.0, busbw, busbw, wrong, 1.0, busbw, busbw + 1, 0)
    return NcclResult(True, (r,), busbw, 0)


def test_a_healthy_a3_mega_passes() -> None:
    v = validate("a3-megagpu-8g", parse_all_gather(fixture("all_gather_a3_megagpu_8g.txt")), DCGM_PASS)
    assert v.passed and v.verdict == "pass"
    assert (v.busbw, v.expected, v.threshold, v.message_bytes) == (188.73, 188.73, 169.86, GIB8)
    assert next_action("REBOOT_NODE", v) == RETURN_TO_SERVICE
    assert v.as_record()["busbw_gbps"] == 188.73 and v.as_record()["dcgm"] == "pass"


def test_a_degraded_node_fails_with_the_numbers() -> None:
    v = validate("a3-megagpu-8g", row(120.0), DCGM_PASS)
    assert not v.passed and v.verdict == "degraded" and v.hardware_suspect
    assert "120.00" in v.why and "169.86" in v.why and "188.73" in v.why and "8 GiB" in v.why


def test_exactly_at_threshold_passes_one_hundredth_below_fails() -> None:
    assert validate("a3-megagpu-8g", row(169.86), DCGM_PASS).passed
    assert not validate("a3-megagpu-8g", row(169.85), DCGM_PASS).passed
    assert validate("a3-megagpu-8g", row(150.98), DCGM_PASS, policy_fraction=0.8).passed  # 0.8 x 188.73


def test_the_worse_of_the_two_columns_is_judged() -> None:
    r = NcclRow(GIB8, 1, "float", "none", -1, 1.0, 200.0, 188.0, 0, 1.0, 150.0, 150.0, 0)
    v = validate("a3-megagpu-8g", NcclResult(True, (r,), 1.0, 0), DCGM_PASS)
    assert not v.passed and v.busbw == 150.0


def test_unknown_or_unpublished_machine_type_fails_closed() -> None:
    v = validate("n1-standard-4", row(999.0), DCGM_PASS)
    assert not v.passed and v.verdict == "no_expectation" and "unknown type" in v.why
    u = validate("a3-ultragpu-8g", row(999.0), DCGM_PASS)
    assert not u.passed and u.verdict == "no_expectation" and "validation.expected" in u.why
    assert next_action("REBOOT_NODE", u) == PAGE  # no figure is no evidence against the host


def test_operator_baseline_fills_a_missing_figure() -> None:
    t = default_validation_table().with_overrides(
        {"a3-ultragpu-8g": {"busbw_gbps": 300.0, "message_bytes": GIB8}}
    )
    assert validate("a3-ultragpu-8g", row(280.0), DCGM_PASS, table=t).passed
    assert validate("a3-ultragpu-8g", row(260.0), DCGM_PASS, table=t).verdict == "degraded"


def test_dcgm_decides_before_bandwidth() -> None:
    test = issue215_test()
    test["results"][1]["status"] = "Warn"
    warn = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag(dcgm_v4([test])))
    assert not warn.passed and warn.verdict == "dcgm_warn" and not warn.hardware_suspect
    test["results"][1]["status"] = "Fail"
    fail = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag(dcgm_v4([test])))
    assert fail.verdict == "dcgm_fail" and fail.dcgm_failed == ("diagnostic (GPU 1)",)
    bad = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag("garbage"))
    assert bad.verdict == "bad_output" and not bad.hardware_suspect


def _named_test(name: str, status: str) -> dict[str, Any]:
    return {"name": name, "results": [{"entity_group": "GPU", "entity_id": 0, "status": status}]}


def test_a_failed_configuration_check_or_an_unknown_status_pages_and_never_replaces() -> None:
    """Issue 21 (5): persistence mode or a graphics process says the node is set up wrong, and a
    status word the parser does not know says nothing: neither is evidence against the hardware."""
    for name in ("Persistence Mode", "Graphics Processes"):
        cfg = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag(dcgm_v4([_named_test(name, "Fail")])))
        assert cfg.verdict == "dcgm_config" and not cfg.hardware_suspect and not cfg.passed, cfg
        assert next_action("REBOOT_NODE", cfg) == PAGE
    odd = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag(dcgm_v4([_named_test("memtest", "Borked")])))
    assert odd.verdict == "dcgm_unknown" and next_action("RESET_GPU", odd) == PAGE
    both = [_named_test("Persistence Mode", "Fail"), _named_test("memtest", "Fail")]
    hw = validate("a3-megagpu-8g", row(188.0), parse_dcgm_diag(dcgm_v4(both)))
    assert hw.verdict == "dcgm_fail" and hw.dcgm_failed == ("memtest (GPU 0)",)  # hardware still counts
    assert next_action("RESET_GPU", hw) == "REPLACE_NODE"


def test_bad_nccl_output_missing_row_corrupt_data_and_bad_policy() -> None:
    assert validate("a3-megagpu-8g", parse_all_gather(""), DCGM_PASS).verdict == "bad_output"
    high = parse_all_gather(fixture("all_gather_a3_highgpu_8g.txt"))  # ends at 512 MiB
    missing = validate("a3-megagpu-8g", high, DCGM_PASS)
    assert missing.verdict == "bad_output" and "8589934592-byte row" in missing.why
    assert validate("a3-highgpu-8g", high, DCGM_PASS).passed
    corrupt = validate("a3-megagpu-8g", row(188.0, wrong=3), DCGM_PASS)
    assert corrupt.verdict == "corrupt" and corrupt.hardware_suspect
    for f in (0.0, 1.01, float("nan")):
        assert validate("a3-megagpu-8g", row(188.0), DCGM_PASS, policy_fraction=f).verdict == "bad_policy"


def test_corrupt_data_against_one_peer_is_no_finding_until_a_second_peer_returns_it_too() -> None:
    """Issue 21: nccl-tests' #wrong > 0 may be the peer's (its GPU, NIC or the path) as much as the
    node's: one peer's run pages; wrong data against a second, different peer steps up."""
    corrupt = validate("a3-megagpu-8g", row(188.0, wrong=3), DCGM_PASS)
    assert next_action("REBOOT_NODE", corrupt) == PAGE
    assert next_action("REBOOT_NODE", corrupt, peer_corroborated=True) == "REPLACE_NODE"
    assert next_action("REPLACE_NODE", corrupt, peer_corroborated=True) == PAGE


@pytest.mark.parametrize(
    ("action", "busbw", "dcgm", "expected"),
    [
        # issue 21 (5): busbw short against one peer is no finding: a page, never REPLACE
        ("RESET_GPU", 120.0, DCGM_PASS, PAGE),
        ("REBOOT_NODE", 120.0, DCGM_PASS, PAGE),
        ("DRAIN_NODE", 120.0, DCGM_PASS, PAGE),
        ("REPLACE_NODE", 120.0, DCGM_PASS, PAGE),
        ("REBOOT_NODE", 188.0, DcgmResult(False, "error", error="x"), PAGE),
        ("RESTART_JOB", 120.0, DCGM_PASS, PAGE),
        ("REPLACE_NODE", 188.0, DCGM_PASS, RETURN_TO_SERVICE),
    ],
)
def test_next_action(action: str, busbw: float, dcgm: DcgmResult, expected: str) -> None:
    assert next_action(action, validate("a3-megagpu-8g", row(busbw), dcgm)) == expected


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("RESET_GPU", "REPLACE_NODE"),
        ("REBOOT_NODE", "REPLACE_NODE"),
        ("DRAIN_NODE", "REPLACE_NODE"),
        ("REPLACE_NODE", PAGE),
        ("RESTART_JOB", PAGE),
    ],
)
def test_a_shortfall_corroborated_by_a_second_peer_steps_up_after_a_repair(
    action: str, expected: str
) -> None:
    v = validate("a3-megagpu-8g", row(120.0), DCGM_PASS)
    assert next_action(action, v, peer_corroborated=True) == expected


# ------------------------------------------------------------------ the fabric's NCCL setup


def test_every_gpudirect_machine_type_carries_its_fabric_setup_from_googles_recipes() -> None:
    """A3 Mega: GPUDirect-TCPXO (cluster-toolkit a3-megagpu-8g/nccl-tests/run-nccl-tests.sh sources
    /var/lib/tcpxo/lib64/nccl-env-profile.sh with NCCL_LIB_DIR set, exports NCCL_FASTRAK_*, runs 8
    tasks per node with -g 1); A3 Ultra and A4: GPUDirect-RDMA through the gIB plugin
    (set_nccl_env.sh, NCCL_NET=gIB, /usr/local/gib/lib64; a3-ultragpu-8g run-nccl-tests.sh,
    a4-highgpu-8g run-nccl-tests-via-ramble.sh)."""
    t = default_validation_table()
    mega = t.machine_types["a3-megagpu-8g"].fabric
    assert mega is not None and mega.name == "GPUDirect-TCPXO" and mega.ranks_per_node == 8
    assert (
        mega.profile == "/var/lib/tcpxo/lib64/nccl-env-profile.sh"
        and mega.library_path == "/var/lib/tcpxo/lib64"
    )
    assert dict(mega.profile_env) == {"NCCL_LIB_DIR": "/var/lib/tcpxo/lib64"}
    assert (
        dict(mega.env)["NCCL_FASTRAK_CTRL_DEV"] == "enp0s12"
        and dict(mega.env)["NCCL_SOCKET_IFNAME"] == "enp0s12"
    )
    assert len(dict(mega.env)["NCCL_FASTRAK_IFNAME"].split(",")) == 8  # one per GPU NIC
    for mt in ("a3-ultragpu-8g", "a4-highgpu-8g"):
        gib = t.machine_types[mt].fabric
        assert gib is not None and gib.ranks_per_node == 8 and dict(gib.env)["NCCL_NET"] == "gIB", mt
        assert (
            gib.profile == "/usr/local/gib/scripts/set_nccl_env.sh"
            and gib.library_path == "/usr/local/gib/lib64"
        )
    assert (
        t.machine_types["a3-highgpu-8g"].fabric is None
    )  # TCPX: no setup recorded, so busbw alone never condemns
    # an operator's own busbw figure keeps the fabric's setup
    over = t.with_overrides({"a3-megagpu-8g": {"busbw_gbps": 150.0}})
    assert over.machine_types["a3-megagpu-8g"].fabric == mega


def test_a_fabric_whose_ranks_do_not_divide_the_gpus_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "schemas" / "validation.yaml").read_text())
    doc["machine_types"]["a3-megagpu-8g"]["fabric"]["ranks_per_node"] = 3
    bad = tmp_path / "validation.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(resources.DataFileError, match="ranks_per_node 3"):
        load_validation_table(bad)
    doc["machine_types"]["a3-megagpu-8g"]["fabric"]["ranks_per_node"] = 8
    doc["machine_types"]["a3-megagpu-8g"]["fabric"]["env"]["LD_PRELOAD"] = (
        "/tmp/x.so"  # not an NCCL_ variable
    )
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(resources.DataFileError):
        load_validation_table(bad)


def gathered(per_rank: int | None) -> NcclResult:
    return dataclasses.replace(row(120.0), gpus_per_rank=per_rank)


def test_off_fabric_says_why_a_figure_was_not_measured_the_fabrics_way() -> None:
    t = default_validation_table()
    mega = t.machine_types["a3-megagpu-8g"]
    assert mega.fabric is not None
    setup = mega.fabric.as_spec()
    assert off_fabric(mega, gathered(1), setup) is None
    one_rank = off_fabric(mega, gathered(8), setup)
    assert one_rank is not None and "8 GPUs per rank" in one_rank and "8 ranks per node" in one_rank
    assert "did not run with the fabric's NCCL setup" in str(off_fabric(mega, gathered(1), None))
    tampered = {**setup, "env": {**setup["env"], "NCCL_SOCKET_IFNAME": "eth0"}}
    assert off_fabric(mega, gathered(1), tampered) is not None
    tcpx = t.machine_types["a3-highgpu-8g"]
    assert "no fabric NCCL setup" in str(off_fabric(tcpx, gathered(1), setup))


# nccl-tests' header line (src/common.cu: "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: ...");
# Google's published samples leave it out, so without it the layout is unknown.
HEADER = (
    "# nThread 1 nGpus {} minBytes 8388608 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 200 "
)
HEADER += "agg iters: 1 validation: 1 graph: 0\n"


def test_the_nccl_header_says_how_many_gpus_each_rank_drove() -> None:
    sample = fixture("all_gather_a3_megagpu_8g.txt")
    assert parse_all_gather(sample).gpus_per_rank is None
    assert parse_all_gather(HEADER.format(1) + sample).gpus_per_rank == 1
    assert parse_all_gather(HEADER.format(8) + sample).gpus_per_rank == 8


# ------------------------------------------------------------------ stand-ins, round trip


def run_tool(tool: str, args: list[str], state: dict[str, Any] | str, node: str = "a3m-1") -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "functions"), PITSTOP_NODE=node)
    env["PITSTOP_GPU_STATE"] = state if isinstance(state, str) else json.dumps(state)
    p = subprocess.run(
        [sys.executable, "-m", f"pitstop.local.gpu_tools.{tool}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return p.returncode, p.stdout


def validate_node(state: dict[str, Any], machine_type: str = "a3-megagpu-8g") -> Any:
    _, nccl = run_tool("all_gather_perf", ["-b", "1M", "-e", "8G", "-f", "2", "-g", "1"], state)
    _, dcgm = run_tool("dcgmi", ["diag", "-r", "2", "-j"], state)
    return validate(machine_type, parse_all_gather(nccl), parse_dcgm_diag(dcgm))


def test_round_trip_healthy_node_returns() -> None:
    v = validate_node({})
    assert v.passed and v.busbw == 190.0


def test_round_trip_degraded_node_steps_up(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"a3m-1": {"busbw": 120}, "a3m-2": {}}))
    _, out = run_tool("all_gather_perf", ["-b", "1G", "-e", "8G"], str(state))
    v = validate("a3-megagpu-8g", parse_all_gather(out), DCGM_PASS)
    assert v.verdict == "degraded" and v.busbw == 120.0
    assert next_action("REBOOT_NODE", v) == PAGE  # one peer's figure: no finding
    assert next_action("REBOOT_NODE", v, peer_corroborated=True) == "REPLACE_NODE"
    _, healthy = run_tool("all_gather_perf", ["-b", "1G", "-e", "8G"], str(state), node="a3m-2")
    assert validate("a3-megagpu-8g", parse_all_gather(healthy), DCGM_PASS).passed


def test_round_trip_dcgm_fail_warn_and_v3() -> None:
    code, out = run_tool("dcgmi", ["diag", "-r", "2", "-j"], {"a3m-1": {"dcgm": "fail", "dcgm_gpu": 6}})
    r = parse_dcgm_diag(out)
    assert code != 0 and r.verdict == "fail" and r.failed_gpus == (6,) and r.schema == "v4"
    assert validate_node({"a3m-1": {"dcgm": "warn"}}).verdict == "dcgm_warn"
    _, v3 = run_tool("dcgmi", ["diag", "-r", "1", "-j"], {"a3m-1": {"dcgm_schema": "v3"}})
    assert parse_dcgm_diag(v3).schema == "v3" and parse_dcgm_diag(v3).verdict == "pass"


def test_round_trip_broken_state_is_unusable_output() -> None:
    code, out = run_tool("all_gather_perf", ["-e", "8G"], "/nonexistent/state.json")
    assert code == 2 and out == "" and not parse_all_gather(out).ok
    v = validate_node({"a3m-1": "not an object"})
    assert v.verdict == "bad_output" and next_action("REBOOT_NODE", v) == PAGE
