"""Post-repair validation: parse nccl-tests and dcgmi output, judge a node against its machine type.

A repaired node goes back to the gang only on measured health, never on "VM RUNNING". Parsers are
total: output from a dying node is often truncated or garbage, and that must become a clear
failed result, not an exception in the workflow. Expectations are data (schemas/validation.yaml).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pitstop.core import resources
from pitstop.core.actions import Action
from pitstop.core.domain import FabricSpec, Measurement
from pitstop.core.policy_types import ExpectedBaseline, FabricDoc, ValidationDoc

# ---------------------------------------------------------------- expectations (validation.yaml)


@dataclass(frozen=True)
class Fabric:
    """The machine type's own NCCL setup (validation.yaml ``fabric``): how Google's recipes run
    nccl-tests on it. A busbw figure measured otherwise (one rank per node, no network plugin)
    says nothing about the host."""

    name: str
    ranks_per_node: int
    profile: str
    library_path: str
    env: tuple[tuple[str, str], ...]
    profile_env: tuple[tuple[str, str], ...] = ()

    def as_spec(self) -> FabricSpec:
        """What a check carries to the scheduler (and what the scheduler reports it applied)."""
        return {
            "name": self.name,
            "ranks_per_node": self.ranks_per_node,
            "profile": self.profile,
            "profile_env": dict(self.profile_env),
            "library_path": self.library_path,
            "env": dict(self.env),
        }


@dataclass(frozen=True)
class Expectation:
    """What a healthy node of one machine type measures; busbw_gbps None = no published figure."""

    machine_type: str
    gpus: int
    busbw_gbps: float | None
    message_bytes: int
    source: str
    fabric: Fabric | None = None


@dataclass(frozen=True)
class ValidationTable:
    busbw_fraction: float
    dcgm_level: int
    diagnose_dcgm_level: int
    config_only_tests: frozenset[str]
    machine_types: Mapping[str, Expectation]

    def expectation(self, machine_type: str) -> Expectation | None:
        return self.machine_types.get(machine_type)

    def with_overrides(self, expected: Mapping[str, ExpectedBaseline]) -> ValidationTable:
        """An operator's own baselines (policy ``validation.expected``) replace the published ones."""
        merged = dict(self.machine_types)
        for mt, o in expected.items():
            base = merged.get(mt) or Expectation(mt, 8, None, int(o["message_bytes"]), "policy")
            merged[mt] = Expectation(
                mt,
                int(o.get("gpus", base.gpus)),
                float(o["busbw_gbps"]),
                int(o.get("message_bytes", base.message_bytes)),
                "policy.yaml validation.expected",
                base.fabric,  # the figure is the operator's; the fabric's setup stays the table's
            )
        return ValidationTable(
            self.busbw_fraction, self.dcgm_level, self.diagnose_dcgm_level, self.config_only_tests, merged
        )


def _fabric(doc: FabricDoc | None, gpus: int, machine_type: str) -> Fabric | None:
    if doc is None:
        return None
    ranks = int(doc["ranks_per_node"])
    if gpus % ranks:
        raise resources.DataFileError(
            f"validation.yaml: machine_types/{machine_type}/fabric/ranks_per_node {ranks}"
            f" does not divide its {gpus} GPUs"
        )
    return Fabric(
        str(doc["name"]),
        ranks,
        str(doc["profile"]),
        str(doc["library_path"]),
        tuple(sorted((str(k), str(v)) for k, v in doc["env"].items())),
        tuple(sorted((str(k), str(v)) for k, v in (doc.get("profile_env") or {}).items())),
    )


def load_validation_table(path: Path | None = None) -> ValidationTable:
    loaded = resources.load_yaml(path or resources.schema_dir() / "validation.yaml", "validation.schema.json")
    doc = cast(ValidationDoc, loaded)  # the schema checked it
    d = doc["defaults"]
    types = {
        name: Expectation(
            name,
            e["gpus"],
            None if e["busbw_gbps"] is None else float(e["busbw_gbps"]),
            e["message_bytes"],
            e["source"],
            _fabric(e.get("fabric"), int(e["gpus"]), name),
        )
        for name, e in doc["machine_types"].items()
    }
    return ValidationTable(
        float(d["busbw_fraction"]),
        int(d["dcgm_level"]),
        int(d["diagnose_dcgm_level"]),
        frozenset(doc["dcgm"]["config_only_tests"]),
        types,
    )


@functools.cache
def default_validation_table() -> ValidationTable:
    return load_validation_table()


# ---------------------------------------------------------------- nccl-tests result table

_NCCL_ROW_START = re.compile(r"^\s*\d")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_NGPUS = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+(\d+)\b")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\S+)")


@dataclass(frozen=True)
class NcclRow:
    """One message size: out-of-place and (when printed) in-place time, algbw and busbw."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None  # None when nccl-tests ran without checking (-c 0 prints N/A)
    ip_time_us: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    ip_wrong: int | None = None

    @property
    def busbw(self) -> float:
        """The lower of the two columns: a node is as good as its worse measurement."""
        return self.oop_busbw if self.ip_busbw is None else min(self.oop_busbw, self.ip_busbw)

    @property
    def wrong(self) -> int:
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True)
class NcclResult:
    ok: bool
    rows: tuple[NcclRow, ...] = ()
    avg_busbw: float | None = None
    out_of_bounds: int | None = None
    error: str | None = None
    gpus_per_rank: int | None = None  # the header's nGpus: 1 = one rank per GPU, the fabric's way

    def row_at(self, size_bytes: int) -> NcclRow | None:
        return next((r for r in self.rows if r.size_bytes == size_bytes), None)

    @property
    def wrong(self) -> int:
        return sum(r.wrong for r in self.rows)


def _num(tok: str) -> float:
    v = float(tok)
    if not math.isfinite(v) or v < 0:
        raise ValueError(tok)
    return v


def _wrong(tok: str) -> int | None:
    return None if tok == "N/A" else int(tok)


def _nccl_row(line: str) -> NcclRow:
    """A data row: 9 tokens (out-of-place only) or 13 (with in-place). Raises ValueError."""
    t = line.split()
    if len(t) not in (9, 13):
        raise ValueError(f"{len(t)} columns, expected 9 or 13")
    size, count, root = int(t[0]), int(t[1]), int(t[4])
    if size < 0 or count < 0:
        raise ValueError("negative size")
    oop = (_num(t[5]), _num(t[6]), _num(t[7]), _wrong(t[8]))
    if len(t) == 9:
        return NcclRow(size, count, t[2], t[3], root, *oop)
    return NcclRow(size, count, t[2], t[3], root, *oop, _num(t[9]), _num(t[10]), _num(t[11]), _wrong(t[12]))


def parse_all_gather(text: str) -> NcclResult:
    """Parse ``all_gather_perf`` stdout (any nccl-tests ``*_perf``: the table is the same)."""
    if not isinstance(text, str):
        return NcclResult(False, error="output is not text")
    rows: list[NcclRow] = []
    avg: float | None = None
    oob: int | None = None
    per_rank: int | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if (m := _NGPUS.match(line)) and per_rank is None:
            per_rank = int(m.group(1))
        elif m := _AVG.match(line):
            try:
                avg = _num(m.group(1))
            except ValueError:
                return NcclResult(False, tuple(rows), error=f"line {n}: Avg bus bandwidth {m.group(1)!r}")
        elif m := _OOB.match(line):
            oob = int(m.group(1))
        elif not line.lstrip().startswith("#") and _NCCL_ROW_START.match(line):
            try:
                rows.append(_nccl_row(line))
            except (ValueError, OverflowError) as exc:
                return NcclResult(False, tuple(rows), error=f"line {n}: malformed result row ({exc})")
    if not rows:
        return NcclResult(False, error="no result rows: the test did not run or its output was cut")
    if avg is None:
        return NcclResult(False, tuple(rows), error="no '# Avg bus bandwidth' line: the output is truncated")
    return NcclResult(True, tuple(rows), avg, oob, gpus_per_rank=per_rank)


# ---------------------------------------------------------------- dcgmi diag -j

_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip"}
_STATUS.update({"skipped": "skip", "not run": "not_run", "notrun": "not_run", "not_run": "not_run"})


@dataclass(frozen=True)
class DcgmTest:
    category: str
    name: str
    status: str  # pass | fail | warn | skip | not_run | unknown
    gpus: tuple[int, ...]  # the GPUs with that status (all the test's GPUs for pass)
    messages: tuple[str, ...] = ()


@dataclass(frozen=True)
class DcgmResult:
    """A dcgmi diag document. verdict: pass | fail | warn | error (error = nothing to judge by)."""

    ok: bool
    verdict: str
    schema: str | None = None  # "v3" ("DCGM GPU Diagnostic") or "v4" ("DCGM Diagnostic")
    version: str | None = None
    tests: tuple[DcgmTest, ...] = ()
    error: str | None = None

    @property
    def failing(self) -> tuple[DcgmTest, ...]:
        return tuple(t for t in self.tests if t.status in ("fail", "unknown"))

    @property
    def warned(self) -> tuple[DcgmTest, ...]:
        return tuple(t for t in self.tests if t.status == "warn")

    @property
    def failed_gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for t in self.failing for g in t.gpus}))


def _list(v: Any) -> list[Any]:
    """A JSON array, or nothing: a wrong type in one place must not sink the whole document."""
    return v if isinstance(v, list) else []


def _gpu_ids(result: Mapping[str, object]) -> list[int]:
    """v3: gpu_ids "0,1,2" or 3, or gpu_id; v4: entity_id of entity_group GPU."""
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        raw: Any = result["entity_id"] if group == "GPU" else None
    else:
        raw = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(raw, bool):
        return []
    if isinstance(raw, int):
        return [raw] if 0 <= raw < 4096 else []
    if isinstance(raw, str):
        return [int(p) for p in raw.split(",") if re.fullmatch(r"\s*[0-9]{1,4}\s*", p) and int(p) < 4096]
    return []


def _messages(result: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for w in _list(result.get("warnings")):
        text = w.get("warning") if isinstance(w, Mapping) else w
        if isinstance(text, str):
            out.append(text[:500])
    warning = result.get("warning")
    if isinstance(warning, str):
        out.append(warning[:500])
    return out


def _status(word: object) -> str:
    return _STATUS.get(word.strip().lower(), "unknown") if isinstance(word, str) else "unknown"


def _dcgm_test(category: str, test: Mapping[str, object]) -> list[DcgmTest]:
    """One test object → one DcgmTest per distinct status among its results."""
    name = str(test.get("name", "?"))[:100]
    by_status: dict[str, tuple[list[int], list[str]]] = {}
    for r in _list(test.get("results")):
        if not isinstance(r, Mapping):
            continue
        gpus, msgs = by_status.setdefault(_status(r.get("status")), ([], []))
        gpus.extend(_gpu_ids(r))
        msgs.extend(_messages(r))
    summary = test.get("test_summary")
    if isinstance(summary, Mapping) and not by_status:
        by_status[_status(summary.get("status"))] = ([], _messages(summary))
    return [DcgmTest(category, name, st, tuple(sorted(set(g))), tuple(m)) for st, (g, m) in by_status.items()]


def _verdict(tests: list[DcgmTest]) -> tuple[str, str | None]:
    statuses = {t.status for t in tests}
    if statuses & {"fail", "unknown"}:
        return "fail", None
    if "warn" in statuses:
        return "warn", None
    if "pass" in statuses:
        return "pass", None
    return "error", "no test passed: everything was skipped or not run"


def _json_doc(text: str) -> Any:
    """dcgmi may print a line before its JSON ("Successfully ran diagnostic for group.")."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the output")
    return json.loads(text[start : end + 1])


def parse_dcgm_diag(text: str) -> DcgmResult:
    """Parse ``dcgmi diag -r N -j`` output, DCGM 3.x or 4.x document shape."""
    if not isinstance(text, str):
        return DcgmResult(False, "error", error="output is not text")
    try:
        doc = _json_doc(text)
    except (ValueError, RecursionError) as exc:
        return DcgmResult(False, "error", error=f"not a dcgmi JSON document: {str(exc)[:200]}")
    if not isinstance(doc, dict):
        return DcgmResult(False, "error", error="not a dcgmi JSON document: top level is not an object")
    schema, root = next(
        ((s, doc[k]) for s, k in (("v4", "DCGM Diagnostic"), ("v3", "DCGM GPU Diagnostic")) if k in doc),
        (None, None),
    )
    if not isinstance(root, dict):
        return DcgmResult(False, "error", error="no 'DCGM Diagnostic' / 'DCGM GPU Diagnostic' object")
    meta = doc.get("metadata")
    version = root.get("version") or (meta.get("version") if isinstance(meta, dict) else None)
    version = version if isinstance(version, str) else None
    if isinstance(root.get("runtime_error"), str):
        return DcgmResult(
            False, "error", schema, version, error=f"DCGM runtime error: {root['runtime_error']}"
        )
    tests: list[DcgmTest] = []
    for cat in _list(root.get("test_categories")):
        if isinstance(cat, dict):
            category = str(cat.get("category", "?"))[:60]
            for t in _list(cat.get("tests")):
                if isinstance(t, dict):
                    tests.extend(_dcgm_test(category, t))
    if not tests:
        return DcgmResult(False, "error", schema, version, error="the document holds no test results")
    verdict, why = _verdict(tests)
    return DcgmResult(why is None, verdict, schema, version, tuple(tests), why)


# ---------------------------------------------------------------- decisions

PAGE = "PAGE"  # a human looks; the node stays fenced
GPUS_MISSING = "gpus_missing"
RETURN_TO_SERVICE = "RETURN_TO_SERVICE"


@dataclass(frozen=True)
class Validation:
    """The verdict on a repaired node; ``as_record()`` goes on the incident and into the notification.

    verdict: pass | degraded (busbw short) | dcgm_fail | dcgm_warn | dcgm_config (a configuration
    check failed) | dcgm_unknown (a status word not understood) | corrupt (#wrong > 0) | bad_output
    (unparseable nccl/dcgm) | no_expectation (machine type without a figure) | bad_policy |
    gpus_missing (the node's own nvidia-smi counts fewer GPUs than the VM has, or one lost: the
    count speaks before any test that cannot run without them); after a second peer was asked
    (core/checks.py): degraded_one_peer | corrupt_one_peer (no finding).
    Only "degraded", "dcgm_fail", "corrupt" and "gpus_missing" are evidence against the hardware.
    """

    passed: bool
    verdict: str
    why: str
    busbw: float | None = None
    expected: float | None = None
    threshold: float | None = None
    message_bytes: int | None = None
    dcgm_verdict: str | None = None
    dcgm_failed: tuple[str, ...] = field(default=())

    @property
    def hardware_suspect(self) -> bool:
        return self.verdict in ("degraded", "dcgm_fail", "corrupt", GPUS_MISSING)

    def as_record(self) -> Measurement:
        return {
            "passed": self.passed,
            "verdict": self.verdict,
            "why": self.why,
            "busbw_gbps": self.busbw,
            "expected_gbps": self.expected,
            "threshold_gbps": self.threshold,
            "message_bytes": self.message_bytes,
            "dcgm": self.dcgm_verdict,
            "dcgm_failed": list(self.dcgm_failed),
        }


def _named(tests: tuple[DcgmTest, ...]) -> tuple[str, ...]:
    return tuple(f"{t.name} (GPU {','.join(map(str, t.gpus)) or '?'})" for t in tests)


def dcgm_gate(dcgm: DcgmResult, config_only: frozenset[str] = frozenset()) -> Validation | None:
    """A DCGM result that already decides the validation, or None when it passed.

    Only a hardware test that failed is evidence against the hardware (``dcgm_fail``). A failed
    configuration-only check (``config_only``: persistence mode, graphics processes, ...) says the
    node is set up wrong, and a status word this parser does not know says nothing: both keep the
    node fenced and page (``dcgm_config``, ``dcgm_unknown``), never replace a host.
    """
    if dcgm.verdict == "error":
        return Validation(
            False, "bad_output", f"DCGM diagnostic unusable: {dcgm.error}", dcgm_verdict="error"
        )
    hardware = tuple(t for t in dcgm.failing if t.status == "fail" and t.name not in config_only)
    if hardware:
        names = _named(hardware)
        why = f"DCGM diagnostic failed: {'; '.join(names)}"
        return Validation(False, "dcgm_fail", why, dcgm_verdict="fail", dcgm_failed=names)
    config = tuple(t for t in dcgm.failing if t.status == "fail")
    if config:
        names = _named(config)
        why = f"DCGM configuration checks failed ({'; '.join(names)}): the node is set up wrong, not broken"
        return Validation(False, "dcgm_config", why, dcgm_verdict="fail", dcgm_failed=names)
    if dcgm.failing:  # only statuses this parser does not know
        names = _named(dcgm.failing)
        why = f"DCGM reported a status Pitstop cannot read ({'; '.join(names)}): no evidence either way"
        return Validation(False, "dcgm_unknown", why, dcgm_verdict="unknown", dcgm_failed=names)
    if dcgm.verdict == "warn":
        warned = tuple(t.name for t in dcgm.warned)
        why = f"DCGM diagnostic warned ({', '.join(warned)}): a node returns only on a clean pass"
        return Validation(False, "dcgm_warn", why, dcgm_verdict="warn", dcgm_failed=warned)
    return None


def validate(
    machine_type: str,
    nccl: NcclResult,
    dcgm: DcgmResult,
    policy_fraction: float | None = None,
    table: ValidationTable | None = None,
) -> Validation:
    """Pass when DCGM passes and busbw at the judged size >= fraction x the machine type's figure.

    Fails closed: an unknown machine type, one without a figure, or unparseable output never passes.
    The threshold is rounded to 0.01 GB/s, the resolution nccl-tests prints.
    """
    table = table or default_validation_table()
    fraction = table.busbw_fraction if policy_fraction is None else policy_fraction
    if not (isinstance(fraction, int | float) and 0 < fraction <= 1):
        return Validation(False, "bad_policy", f"validation.busbw_fraction {fraction!r} is not in (0, 1]")
    exp = table.expectation(machine_type)
    if exp is None or exp.busbw_gbps is None:
        why = (
            f"no expected bus bandwidth for machine type {machine_type!r}"
            + (" (none published; set validation.expected in policy.yaml)" if exp else " (unknown type)")
            + ": cannot judge the node, so it stays fenced"
        )
        return Validation(False, "no_expectation", why, dcgm_verdict=dcgm.verdict)
    if gate := dcgm_gate(dcgm, table.config_only_tests):
        return gate
    return judge_busbw(machine_type, exp, fraction, nccl, dcgm.verdict)


def judge_busbw(
    machine_type: str, exp: Expectation, fraction: float, nccl: NcclResult, dcgm_verdict: str
) -> Validation:
    """The busbw half of a validation (DCGM judged already): pass, degraded, corrupt or bad_output."""
    if exp.busbw_gbps is None:
        return Validation(False, "no_expectation", f"no expected bus bandwidth for {machine_type}")
    expected = exp.busbw_gbps
    threshold = round(fraction * expected, 2)

    def result(verdict: str, why: str, got: float | None = None) -> Validation:
        return Validation(
            verdict == "pass", verdict, why, got, expected, threshold, exp.message_bytes, dcgm_verdict
        )

    if not nccl.ok:
        return result("bad_output", f"all_gather output unusable: {nccl.error}")
    row = nccl.row_at(exp.message_bytes)
    if row is None:
        return result(
            "bad_output", f"all_gather has no {exp.message_bytes}-byte row to judge {machine_type} by"
        )
    got = row.busbw
    if nccl.wrong or (nccl.out_of_bounds or 0) > 0:
        why = f"all_gather returned wrong data ({nccl.wrong} #wrong, {nccl.out_of_bounds} out of bounds)"
        return result("corrupt", why, got)
    size = _human_bytes(exp.message_bytes)
    ratio = f"({fraction:g} x {expected:.2f} expected for {machine_type})"
    if got < threshold:
        return result("degraded", f"busbw {got:.2f} GB/s at {size} < {threshold:.2f} GB/s {ratio}", got)
    return result("pass", f"DCGM pass; busbw {got:.2f} GB/s at {size} >= {threshold:.2f} GB/s {ratio}", got)


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


_REPAIRS = frozenset({Action.RESET_GPU, Action.REBOOT_NODE, Action.DRAIN_NODE})


def off_fabric(exp: Expectation, nccl: NcclResult, applied: Mapping[str, object] | None) -> str | None:
    """Why an NCCL figure was not measured the fabric's way, or None when it was.

    The fabric's way is the table's ``fabric`` setup, reported applied by the scheduler, and the
    rank layout nccl-tests itself prints (``nGpus`` per rank). One rank driving every GPU of a
    node or no network plugin measures the wrong thing: a shortfall then says nothing of the host.
    """
    f = exp.fabric
    if f is None:
        return f"validation.yaml has no fabric NCCL setup for {exp.machine_type}"
    if not isinstance(applied, Mapping) or dict(applied) != f.as_spec():
        return f"the check did not run with the fabric's NCCL setup ({f.name})"
    want = exp.gpus // f.ranks_per_node
    if nccl.gpus_per_rank != want:
        got = "an unknown number of" if nccl.gpus_per_rank is None else str(nccl.gpus_per_rank)
        return (
            f"all_gather ran {got} GPUs per rank; the fabric's setup runs {want}"
            f" ({f.ranks_per_node} ranks per node)"
        )
    return None


_REPAIRS = frozenset({Action.RESET_GPU, Action.REBOOT_NODE, Action.DRAIN_NODE})


PEER_VERDICTS = frozenset({"degraded", "corrupt"})  # an NCCL result that may be the peer's as well


def next_action(current_action: str, validation: Validation, peer_corroborated: bool = False) -> str:
    """What follows a validation: return the node, step up to REPLACE_NODE, or PAGE a human.

    Only evidence against the hardware after a reset, reboot or maintenance steps up to
    REPLACE_NODE: a DCGM hardware failure on the node, or an NCCL result against the node (a busbw
    shortfall measured with the fabric's setup, or corrupt data: nccl-tests' #wrong > 0) that a
    second, different healthy peer reproduced (``peer_corroborated``; one peer's result may be that
    peer's, the path's or the fabric's). A replaced node that fails, or any result that says
    nothing about the hardware (no figure, unusable output, a DCGM warning), pages and keeps the
    node fenced: an irreversible action is never taken on missing evidence.
    """
    if validation.passed:
        return RETURN_TO_SERVICE
    if validation.verdict in PEER_VERDICTS and not peer_corroborated:
        return PAGE
    if current_action in _REPAIRS and validation.hardware_suspect:
        return Action.REPLACE_NODE.value
    return PAGE


__all__ = [
    "PAGE",
    "PEER_VERDICTS",
    "RETURN_TO_SERVICE",
    "DcgmResult",
    "DcgmTest",
    "Expectation",
    "Fabric",
    "NcclResult",
    "NcclRow",
    "Validation",
    "ValidationTable",
    "dcgm_gate",
    "default_validation_table",
    "judge_busbw",
    "load_validation_table",
    "next_action",
    "off_fabric",
    "parse_all_gather",
    "parse_dcgm_diag",
    "validate",
]
