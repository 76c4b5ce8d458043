"""No code but core/aggregate.py (and the engine it calls) writes an incident's fields.

``Incident`` is read-only to mypy (its items are ReadOnly), so a top-level write anywhere fails the
type check. This test walks the product code for what mypy does not see: a write *into* an
incident's nested values (its timeline, workflow run, lists), a mutating call on them, and any use
of the writable twin ``Draft`` outside the writer. It fails on one; the synthetic cases below show
that it can.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "functions" / "pitstop"
# The one writer: decide, the engine's decisions it calls, the state table's move, and the type.
WRITERS = frozenset({"core/aggregate.py", "core/engine.py", "core/lifecycle.py", "core/domain.py"})
INCIDENT_TYPES = frozenset({"Incident", "Draft"})
# Where an incident comes from: a store read, a decision's outcome, an actuate step's own.
INCIDENT_ATTRS = frozenset({"inc", "incident"})
STORE_READS = frozenset({"get", "incident_as_decided", "latest_incident", "with_shards", "as_incident"})
MUTATORS = frozenset(
    {"append", "extend", "update", "setdefault", "pop", "popitem", "insert", "clear", "remove", "__setitem__"}
)


def _annotated_incident(ann: ast.expr | None) -> bool:
    return ann is not None and any(isinstance(n, ast.Name) and n.id in INCIDENT_TYPES for n in ast.walk(ann))


class _Writes(ast.NodeVisitor):
    """Writes into incidents, per function: names typed or read as incidents, and ``x.inc``."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self._names: list[set[str]] = [set()]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        names = {a.arg for a in [*node.args.args, *node.args.kwonlyargs] if _annotated_incident(a.annotation)}
        self._names.append(names)
        self.generic_visit(node)
        self._names.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and _annotated_incident(node.annotation):
            self._names[-1].add(node.target.id)
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node.lineno)
            if isinstance(target, ast.Name) and self._reads_incident(node.value):
                self._names[-1].add(target.id)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in MUTATORS and self._rooted(f.value):
            self.found.append((node.lineno, f"{ast.unparse(f)}(...)"))
        self.generic_visit(node)

    def _check_target(self, target: ast.expr, line: int) -> None:
        if isinstance(target, ast.Subscript) and self._rooted(target.value):
            self.found.append((line, f"{ast.unparse(target)} = ..."))
        elif isinstance(target, ast.Tuple):
            for elt in target.elts:
                self._check_target(elt, line)

    def _rooted(self, expr: ast.expr) -> bool:
        """The expression is an incident, or a value inside one (``inc["timeline"]["x"]``)."""
        while isinstance(expr, ast.Subscript):
            expr = expr.value
        if isinstance(expr, ast.Name):
            return expr.id in self._names[-1]
        return isinstance(expr, ast.Attribute) and expr.attr in INCIDENT_ATTRS

    def _reads_incident(self, value: ast.expr) -> bool:
        if isinstance(value, ast.Attribute) and value.attr in INCIDENT_ATTRS:
            return True
        f = value.func if isinstance(value, ast.Call) else None
        return isinstance(f, ast.Attribute) and f.attr in STORE_READS and "store" in ast.unparse(f.value)


def writes_in(source: str) -> list[tuple[int, str]]:
    visitor = _Writes()
    visitor.visit(ast.parse(source))
    return visitor.found


def _draft_uses(source: str) -> list[int]:
    tree = ast.parse(source)
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "Draft"] + [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and any(a.name == "Draft" for a in n.names)
    ]


def _product() -> Iterator[tuple[str, str]]:
    for path in sorted(PRODUCT.rglob("*.py")):
        rel = path.relative_to(PRODUCT).as_posix()
        if rel not in WRITERS:
            yield rel, path.read_text(encoding="utf-8")


def test_no_product_code_writes_into_an_incident() -> None:
    found = [f"{rel}:{line}: {what}" for rel, src in _product() for line, what in writes_in(src)]
    assert found == []


def test_only_the_writer_names_the_writable_incident() -> None:
    found = [f"{rel}:{line}" for rel, src in _product() for line in _draft_uses(src)]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'def f(inc: Incident) -> None:\n    inc["timeline"]["fenced"] = 1.0\n',
        'def f(inc: Incident | None) -> None:\n    inc["escalations"].append({})\n',
        'def f(s: Step) -> None:\n    s.inc["workflow"]["state"] = "x"\n',
        'def f(store: S) -> None:\n    doc = store.get("i1")\n    doc["timeline"].pop("resolved")\n',
        'def f(out: O) -> None:\n    del out.incident["closure"]\n',
        'def f() -> None:\n    x: Incident = g()\n    x["counts"]["events"] += 1\n',
    ],
)
def test_the_walk_finds_a_write(source: str) -> None:
    assert writes_in(source), source


def test_the_walk_leaves_other_documents_alone() -> None:
    source = "\n".join(
        [
            "def f(node: NodeDoc, inc: Incident) -> None:",
            '    node["block"] = inc["id"]',
            "    x = {}",
            '    x["a"] = 1',
        ]
    )
    assert writes_in(source) == []
