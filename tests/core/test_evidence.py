"""Evidence as a type (core/evidence.py): only Pitstop's own probes make it, and it says what matched.

A value made anywhere else is refused at run time (the private token), and a constructor called
outside its probe's judge fails this walk over the product code, so no new input can quietly
become evidence for a disruption.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

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
    others = {"Evidence", "Probe", "EvidenceRecord", "dataclass", "field", "StrEnum", "Waiver", "describe"}
    assert public - others == set(CONSTRUCTORS) | {"recorded"}
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
            if (
                name == "Evidence"
                or (name in CONSTRUCTORS and evidence.PROBE_MODULES[CONSTRUCTORS[name]] != module)
                or (name == "recorded" and module != "pitstop.core.aggregate")  # read back for an op only
            ):
                wrong.append(f"{module}:{line} {name}")
    assert wrong == []


def test_the_walk_finds_a_call_from_elsewhere() -> None:
    """The walk itself can fail: a service that made evidence from an alert would be caught."""
    src = "from pitstop.core import evidence as proof\nproof.telemetry_reading('n', 's', 'w', 1.0)\n"
    assert _calls(ast.parse(src)) == [("telemetry_reading", 2)]
    src = "from pitstop.core.evidence import Evidence\nEvidence('p', 'n', 'w', None)\n"
    assert _calls(ast.parse(src)) == [("Evidence", 2)]


# -- what a disruptive op rests on (core/aggregate.op_warrant, services/actuate's handlers) ----------


def _confirmed(node: str = "a3-node-001", probe: str = "node_check") -> dict[str, object]:
    found = evidence.kernel_line(node, 79, False, "0000:a1:00", 1.0).record()
    return {"confirmed": True, "evidence": {**found, "probe": probe}}


def test_a_kept_record_is_read_back_only_when_confirmed_about_this_node_by_a_known_probe() -> None:
    got = evidence.recorded(_confirmed(), "a3-node-001")
    assert got is not None and (got.probe, got.node, got.xid, got.gpu) == (
        Probe.NODE_CHECK, "a3-node-001", 79, "0000:a1:00"
    )  # fmt: skip
    assert evidence.recorded({**_confirmed(), "confirmed": False}, "a3-node-001") is None
    assert evidence.recorded(_confirmed(), "a3-node-002") is None  # another node's finding
    assert evidence.recorded(_confirmed(probe="alert"), "a3-node-001") is None  # no such probe
    assert evidence.recorded({"confirmed": True}, "a3-node-001") is None  # nothing matched was kept
    assert evidence.recorded(None, "a3-node-001") is None


def _incident(corroboration: object, kind: str = "gpu_xid") -> Any:
    return {
        "id": "iaaaaaaaaa", "kind": kind, "action": "REBOOT_NODE", "state": "FENCED", "step": 1,
        "node": {"project": "p", "zone": "us-central1-a", "instance": "a3-node-001", "instance_id": "1"},
        **({"corroboration": corroboration} if corroboration is not None else {}),
    }  # fmt: skip


def test_a_disruptive_op_rests_on_kept_evidence_or_an_explicit_waiver_else_it_is_refused() -> None:
    from pitstop.core.aggregate import op_warrant
    from pitstop.core.ops import Op
    from pitstop.core.steps import Refusal

    got = op_warrant(_incident(_confirmed()), Op.ACT, corroborate=True)
    assert isinstance(got, Evidence) and got.xid == 79
    assert isinstance(op_warrant(_incident(None), Op.ACT, corroborate=True), Refusal)  # not asked yet
    kept_nothing = op_warrant(_incident({"confirmed": True}), Op.ACT, corroborate=True)
    assert isinstance(kept_nothing, Refusal) and "kept no evidence" in kept_nothing.why
    off = op_warrant(_incident(None), Op.ACT, corroborate=False)
    assert isinstance(off, evidence.Waiver) and "corroboration.enabled is false" in off.why
    own_gate = op_warrant(_incident(None, kind="hang"), Op.RESCHEDULE, corroborate=True)
    assert isinstance(own_gate, evidence.Waiver)


def test_every_disruptive_handler_takes_a_warrant_and_no_other_does() -> None:
    """The registry's disruptive ops are exactly those whose handler cannot be called without a
    Warrant (its second parameter), so a new op that disrupts cannot skip what it rests on."""
    import inspect
    import typing

    from pitstop.core.ops import Op
    from pitstop.services.actuate.registry import OPS

    disruptive = {op for op, spec in OPS.items() if spec.disruptive}
    assert disruptive == {
        Op.CHECKPOINT, Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.ACT, Op.RESCHEDULE, Op.RESUBMIT
    }  # fmt: skip
    for op, spec in OPS.items():
        params = list(inspect.signature(spec.handler).parameters)
        hints = typing.get_type_hints(spec.handler)
        if op in disruptive:
            assert len(params) == 2 and hints[params[1]] == evidence.Warrant, op
        else:
            assert len(params) == 1, op
    with pytest.raises(TypeError):
        type(OPS[Op.ACT])(None, OPS[Op.ACT].kind)  # no handler at all


def test_a_degraded_node_moves_only_on_its_own_reading_whatever_the_policy_says_of_log_lines() -> None:
    from pitstop.core.aggregate import op_warrant
    from pitstop.core.ops import Op
    from pitstop.core.steps import Refusal

    for corroborate in (True, False):
        assert isinstance(op_warrant(_incident(None, kind="degraded"), Op.CHECKPOINT, corroborate), Refusal)
        unconfirmed = _incident({"confirmed": False}, kind="degraded")
        assert isinstance(op_warrant(unconfirmed, Op.CHECKPOINT, corroborate), Refusal)
    reading = evidence.telemetry_reading("a3-node-001", "throttle", "0.6 of the time", 1.0).record()
    confirmed = _incident({"confirmed": True, "evidence": reading}, kind="degraded")
    read = op_warrant(confirmed, Op.CHECKPOINT, True)
    assert isinstance(read, Evidence) and read.probe == Probe.TELEMETRY
