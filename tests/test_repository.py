"""Repository invariants: what is deployed matches what is tested."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}


def test_function_requirements_match_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = _names(pyproject["project"]["dependencies"])
    lines = [
        ln
        for ln in (ROOT / "functions/requirements.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert _names(lines) == runtime
    # Same version floors too: a function must not deploy with older libraries than we test.
    assert sorted(ln.replace(" ", "") for ln in lines) == sorted(
        d.replace(" ", "") for d in pyproject["project"]["dependencies"]
    )


def test_layout_from_the_brief() -> None:
    for d in ("functions", "workflows", "schemas", "infra", "tests"):
        assert (ROOT / d).is_dir(), d
    assert (ROOT / "functions/main.py").is_file()
    assert (ROOT / "functions/pitstop/__init__.py").is_file()


MAX_FUNCTION_LINES = 80


def _long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, def line, length) of each function or method longer than ``limit`` lines.

    Length runs from the ``def`` line to the function's last line; decorators are not counted,
    nested functions count both on their own and inside their parent.
    """
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_long_function_check_counts_def_to_last_line() -> None:
    def lines(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    # 80 lines with its def (the decorator is not counted), then a method of 81 lines at line 83
    source = "@decorator\ndef fits():\n" + lines(79, "    ") + "class C:\n    def over(self):\n"
    source += lines(80, "        ")
    assert _long_functions(source) == [("C.over", 83, 81)]


def test_no_function_longer_than_80_lines() -> None:
    """Long functions hide their steps. functions/pitstop/local/ is exempt: test stand-ins, not shipped."""
    exempt = ROOT / "functions/pitstop/local"
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted((ROOT / "functions").rglob("*.py"))
        if not path.is_relative_to(exempt)
        for name, line, length in _long_functions(path.read_text())
    ]
    assert not offenders, f"longer than {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(offenders)


def test_entry_points_import_only_shipped_layers() -> None:
    """main.py is deployed with core, services and adapters only; import-linter cannot see it."""
    tree = ast.parse((ROOT / "functions/main.py").read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            modules += [f"{n.module}.{a.name}" for a in n.names] if n.module == "pitstop" else [n.module]
    layers = {m.split(".")[1] for m in modules if m.split(".")[0] == "pitstop"}
    assert layers and layers <= {"core", "services", "adapters"}, layers


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle (each once, as a path that returns to its first module): Tarjan's SCCs."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_pitstop_modules() -> None:
    """A cycle means two rooms that cannot change apart (type-only imports count too)."""
    import grimp

    g = grimp.build_graph("pitstop")
    graph = {m: set(g.find_modules_directly_imported_by(m)) & g.modules for m in g.modules}
    assert _cycles(graph) == []


PRODUCT = ("core", "services", "adapters", "agent")  # class size and inheritance: tests/test_shape.py


def test_no_dispatch_by_name() -> None:
    """``getattr(self, f"_{op}")`` hides what runs from a reader and from mypy: dispatch by a table."""
    pattern = re.compile(r"getattr\(\s*self\s*,\s*(f[\"']|op\b|name\b)")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for room in PRODUCT
        for p in sorted((ROOT / "functions/pitstop" / room).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_module_seconds_name_real_modules_and_make_keeps_their_order() -> None:
    """A renamed module would silently lose its place; xdist's reorder would undo the list."""
    listed = yaml.safe_load((ROOT / "tests" / "module-seconds.yaml").read_text())
    missing = [m for m in listed if not (ROOT / m).is_file()]
    assert not missing, missing
    unit = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "/pytest " in line)
    assert "--dist loadfile" in unit and "--no-loadscope-reorder" in unit, unit
