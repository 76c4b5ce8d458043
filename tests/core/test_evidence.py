"""Evidence as a type (core/evidence.py): only Pitstop's own probes make it, and it says what matched.

A value made anywhere else is refused at run time (the private token), and a constructor called
outside its probe's judge fails this walk over the product code, so no new input can quietly
become evidence for a disruption.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pitstop.core import evidence
from pitstop.core.evidence import Evidence, Probe

ROOT = Path(__file__).resolve().parents[2] / "functions"
# Each constructor and the probe it speaks for (the module that may call it: evidence.PROBE_MODULES).
CONSTRUCTORS: dict[str, Probe] = {
    "kernel_line": Probe.NODE_CHECK,
    "node_condition": Probe.NODE_CHECK,
    "gpu_state": Probe.NODE_CHECK,
    "scheduler_state": Probe.NODE_CHECK,
    "compute_record": Probe.COMPUTE,
    "telemetry_reading": Probe.TELEMETRY,
    "sweep_finding": Probe.SWEEP,
    "diagnostic_finding": Probe.DIAGNOSTIC,
    "validation_finding": Probe.VALIDATION,
}


def test_evidence_cannot_be_made_but_by_its_constructors() -> None:
    with pytest.raises(TypeError, match="probe's constructor"):
        Evidence(Probe.NODE_CHECK, "a3-node-001", "Xid 79", 1.0)
    with pytest.raises(TypeError):
        Evidence(Probe.NODE_CHECK, "a3-node-001", "Xid 79", 1.0, _token=object())


def test_every_constructor_is_listed_and_makes_its_probes_evidence() -> None:
    public = {n for n, v in vars(evidence).items() if callable(v) and not n.startswith("_")}
    assert public - {"Evidence", "Probe", "EvidenceRecord", "dataclass", "field", "StrEnum"} == set(
        CONSTRUCTORS
    )
    made = {
        "kernel_line": evidence.kernel_line("n", 79, False, "0000:a1:00", 10.0),
        "node_condition": evidence.node_condition("n", "w", 79, None, None),
        "gpu_state": evidence.gpu_state("n", "7 of 8 GPUs visible", None),
        "scheduler_state": evidence.scheduler_state("n", "down"),
        "compute_record": evidence.compute_record("n", "preemption", "stopped", 1.0),
        "telemetry_reading": evidence.telemetry_reading("n", "throttle", "0.6", 1.0),
        "sweep_finding": evidence.sweep_finding("n", "nvidia-smi hung", 1.0),
        "diagnostic_finding": evidence.diagnostic_finding("n", "row remap failed", None),
        "validation_finding": evidence.validation_finding("n", "7 of 8 GPUs"),
    }
    for name, ev in made.items():
        assert ev.probe == CONSTRUCTORS[name] and ev.node == "n"
        json.dumps(ev.record())  # what the incident keeps is JSON


def test_a_kernel_line_says_what_it_matched() -> None:
    rec = evidence.kernel_line("a3-node-001", 79, False, "0000:a1:00", 1_800_000_001.5).record()
    assert (rec["probe"], rec["node"], rec["xid"], rec["gpu"], rec["at"]) == (
        "node_check", "a3-node-001", 79, "0000:a1:00", 1_800_000_001.5)  # fmt: skip
    sx = evidence.kernel_line("n", 24007, True, "0000:c3:00.0", 1.0)
    assert (sx.sxid, sx.xid) == (24007, None)


def _calls(tree: ast.AST) -> list[tuple[str, int]]:
    """Names called as ``evidence.X``/``proof.X`` (any alias of the module) or imported from it."""
    aliases = {"evidence"}
    direct: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pitstop.core.evidence":
            direct |= {a.asname or a.name for a in node.names}
        if isinstance(node, ast.ImportFrom) and node.module == "pitstop.core":
            aliases |= {a.asname or a.name for a in node.names if a.name == "evidence"}
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "pitstop.core.evidence"}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            out.append((f.attr, node.lineno))
        elif isinstance(f, ast.Name) and f.id in direct:
            out.append((f.id, node.lineno))
    return out


def test_only_each_probes_judge_makes_its_evidence() -> None:
    """Walks the product code: a constructor called outside its probe's module, or ``Evidence(...)``
    called anywhere but core/evidence.py, fails here."""
    wrong = []
    for path in sorted((ROOT / "pitstop").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module == "pitstop.core.evidence":
            continue
        for name, line in _calls(ast.parse(path.read_text(), str(path))):
            if name == "Evidence" or (
                name in CONSTRUCTORS and evidence.PROBE_MODULES[CONSTRUCTORS[name]] != module
            ):
                wrong.append(f"{module}:{line} {name}")
    assert wrong == []


def test_the_walk_finds_a_call_from_elsewhere() -> None:
    """The walk itself can fail: a service that made evidence from an alert would be caught."""
    src = "from pitstop.core import evidence as proof\nproof.telemetry_reading('n', 's', 'w', 1.0)\n"
    assert _calls(ast.parse(src)) == [("telemetry_reading", 2)]
    src = "from pitstop.core.evidence import Evidence\nEvidence('p', 'n', 'w', None)\n"
    assert _calls(ast.parse(src)) == [("Evidence", 2)]
