"""Every key workflows/remediate.yaml reads of an actuate answer is declared by that op's answer type.

The answers are TypedDicts (core/answers.py) and the workflow is their other reader: a key it
reads as ``result.key`` must be required in every shape the op's handler may answer, a key it reads
with ``map.get`` or ``"key" in result`` declared in one of them; every probe the workflow polls
answers ``done``. A key renamed or dropped on one side fails here, not in a workflow execution.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pitstop.core.ops import Op
from pitstop.services.actuate.registry import OPS, PROBE_OPS

WORKFLOW = Path(__file__).resolve().parents[2] / "workflows" / "remediate.yaml"
_OPS = {o.value for o in Op}


def _calls(node: object) -> Iterator[tuple[Op, str]]:
    """(op, result variable) of every actuate call whose answer the workflow keeps."""
    if isinstance(node, dict):
        args = node.get("args")
        if isinstance(args, dict) and args.get("op") in _OPS and isinstance(node.get("result"), str):
            yield Op(args["op"]), node["result"]
        for value in node.values():
            yield from _calls(value)
    elif isinstance(node, list):
        for value in node:
            yield from _calls(value)


def _shapes(op: Op) -> list[Any]:
    """The TypedDict classes the op's handler is annotated to answer (a Release is fail's unrecorded
    one); Any: typeshed gives a class no ``__required_keys__``, a TypedDict class has them."""
    hint = typing.get_type_hints(OPS[op].handler)["return"]
    return [t for t in (typing.get_args(hint) or (hint,)) if typing.is_typeddict(t)]


def _required(shape: Any) -> set[str]:
    """The keys a TypedDict requires. Its ``__required_keys__`` cannot be trusted here: with postponed
    annotations Python 3.11 does not see ``NotRequired``, so each annotation is evaluated instead."""
    hints = typing.get_type_hints(shape, include_extras=True)
    total = {k: cls.__total__ for cls in reversed(shape.__mro__) for k in inspect.get_annotations(cls)}
    out = set()
    for key, hint in hints.items():
        origin = typing.get_origin(hint)
        if origin is typing.Required or (total.get(key, True) and origin is not typing.NotRequired):
            out.add(key)
    return out


def _reads() -> tuple[set[tuple[Op, str]], set[tuple[Op, str]]]:
    """(op, key) the workflow reads: as ``var.key`` (required), and with map.get or ``in`` (optional)."""
    text = WORKFLOW.read_text()
    required: set[tuple[Op, str]] = set()
    optional: set[tuple[Op, str]] = set()
    for op, var in _calls(yaml.safe_load(text)):
        required |= {(op, k) for k in re.findall(rf"\b{var}\.(\w+)", text)}
        optional |= {(op, k) for k in re.findall(rf'map\.get\({var}, "(\w+)"\)', text)}
        optional |= {(op, k) for k in re.findall(rf'"(\w+)" in {var}\b', text)}
    return required, optional


def test_the_workflow_reads_only_keys_its_ops_answer() -> None:
    required, optional = _reads()
    # the parser found the workflow's reads (a silent empty set would pass anything)
    assert {
        (Op.CLAIM, "ours"),
        (Op.CLAIM, "plan"),
        (Op.ACT, "operation"),
        (Op.CHECKPOINT, "wait_s"),
    } <= required
    assert {
        (Op.JUDGE_CORROBORATION, "stand_down"),
        (Op.ACT, "verify_wait_s"),
        (Op.CONCLUDE, "resumed"),
    } <= optional
    missing = [
        f"{op}.{key}"
        for op, key in sorted(required)
        if not _shapes(op) or any(key not in _required(t) for t in _shapes(op))
    ]
    missing += [
        f"{op} {key}?"
        for op, key in sorted(optional)
        if not any(key in typing.get_type_hints(t) for t in _shapes(op))
    ]
    assert missing == []


def test_every_probe_answers_done() -> None:
    assert PROBE_OPS
    for op in PROBE_OPS:
        shapes = _shapes(op)
        assert shapes and all("done" in _required(t) for t in shapes), op
