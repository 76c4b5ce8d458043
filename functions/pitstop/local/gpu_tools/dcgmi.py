"""Stand-in ``dcgmi diag -r N -j``: a DCGM 4 (or 3) JSON document with this node's outcome."""

from __future__ import annotations

import json
import sys
from typing import NotRequired, TypedDict

from pitstop.local.gpu_tools.state import NodeState, load_or_say

# (category, test) per level, cumulative, named as DCGM 4 names them.
_SUITE = {
    1: [("Deployment", "software")],
    2: [("Integration", "pcie"), ("Hardware", "memory")],
    3: [("Hardware", "diagnostic"), ("Stress", "targeted_stress"), ("Stress", "targeted_power")],
    4: [("Hardware", "memtest"), ("Stress", "pulse_test")],
}


class DiagWarning(TypedDict):
    error_category: int
    error_id: int
    error_severity: int
    warning: str


class Result(TypedDict, total=False):
    """One GPU's result of a test: DCGM 4 names the entity (``entity_*``), DCGM 3 the ``gpu_id``."""

    entity_group: str
    entity_group_id: int
    entity_id: int
    gpu_id: str
    status: str
    warnings: list[DiagWarning]


class Test(TypedDict):
    name: str
    results: list[Result]
    test_summary: NotRequired[dict[str, str]]  # DCGM 4: the worst status of the test


class Category(TypedDict):
    category: str
    tests: list[Test]


class Diagnostic(TypedDict):
    test_categories: list[Category]
    version: NotRequired[str]  # DCGM 3 puts it here; DCGM 4 in ``metadata``


# The document's keys have spaces (``DCGM Diagnostic``, DCGM 4; ``DCGM GPU Diagnostic``, DCGM 3).
Document = TypedDict(
    "Document",
    {
        "DCGM Diagnostic": Diagnostic,
        "DCGM GPU Diagnostic": Diagnostic,
        "entity_groups": list[dict[str, object]],
        "metadata": dict[str, str],
    },
    total=False,
)

_FAIL_TEXT = "GPU {g} had uncorrectable memory errors and row remapping failed"  # stand-in wording
_WARN_TEXT = "GPU {g} PCIe replay count exceeded the threshold"  # stand-in wording


def _tests(level: int) -> list[tuple[str, str]]:
    return [t for lv in range(1, max(1, min(level, 4)) + 1) for t in _SUITE[lv]]


def _result(s: NodeState, gpu: int, status: str, v4: bool) -> Result:
    r: Result = (
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu} if v4 else {"gpu_id": str(gpu)}
    )
    r["status"] = status
    if status != "Pass":
        text = (_FAIL_TEXT if status == "Fail" else _WARN_TEXT).format(g=gpu)
        r["warnings"] = [{"error_category": 2, "error_id": 0, "error_severity": 2, "warning": text}]
    return r


def document(s: NodeState, level: int) -> Document:
    """The failing or warning test is the last of the suite, on ``dcgm_gpu``; the rest pass."""
    v4 = s.dcgm_schema != "v3"
    suite = _tests(level)
    bad = {"fail": "Fail", "warn": "Warn"}.get(s.dcgm)
    categories: dict[str, list[Test]] = {}
    for n, (category, name) in enumerate(suite):
        statuses = ["Pass"] * s.gpus
        if bad and n == len(suite) - 1 and s.dcgm_gpu < s.gpus:
            statuses[s.dcgm_gpu] = bad
        test: Test = {
            "name": name,
            "results": [_result(s, g, st, v4) for g, st in enumerate(statuses)],
        }
        if v4:
            worst = bad if bad in statuses else "Pass"
            test["test_summary"] = {"status": worst}
        categories.setdefault(category, []).append(test)
    cats: list[Category] = [{"category": c, "tests": t} for c, t in categories.items()]
    if not v4:
        return {"DCGM GPU Diagnostic": {"test_categories": cats, "version": "3.3.9"}}
    ents = [{"device_id": "2330", "entity_id": g, "serial_num": f"165{g:010d}"} for g in range(s.gpus)]
    return {
        "DCGM Diagnostic": {"test_categories": cats},
        "entity_groups": [{"entities": ents, "entity_group": "GPU", "entity_group_id": 1}],
        "metadata": {"Driver Version Detected": "550.90.07", "version": "4.2.3"},
    }


def _level(argv: list[str]) -> int | None:
    for flag in ("-r", "--run"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            value = argv[argv.index(flag) + 1]
            return int(value) if value in ("1", "2", "3", "4") else None
    return None


def main(argv: list[str]) -> int:
    level = _level(argv)
    if argv[:1] != ["diag"] or level is None or not ({"-j", "--json"} & set(argv)):
        print("usage: dcgmi diag -r 1|2|3|4 -j", file=sys.stderr)
        return 2
    s = load_or_say("dcgmi stand-in")
    if s is None:
        return 2
    # jsoncpp's styled writer, as dcgmi prints it: tab indents, " : " between key and value.
    print(json.dumps(document(s, level), indent="\t", separators=(",", " : ")))
    return 1 if s.dcgm == "fail" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
