"""The shape of the product's classes: none over 300 lines, no inheritance chain deeper than one.

The rule, as this test applies it to functions/pitstop/{core,services,adapters,agent}:

- **Size.** A class spans its ``class`` line to its last line (nested classes count inside it and
  on their own). Over ``MAX_CLASS_LINES`` it holds several responsibilities: divide it by
  responsibility into parts that are composed (held as attributes), not stacked as base classes.
- **Depth.** A class's depth is the number of product classes above it: 0 for one with no product
  base, else one more than its deepest product base. Depth 1 is allowed (one base of ours, e.g. an
  implementation of an abstract base); depth 2 or more is a chain whose levels share state a reader
  must follow up the tree. Bases outside the product (the standard library's, a library's) end the
  chain: they are not counted and not followed.
- **No shared private names across a base.** The one allowed level must be an interface, not a
  split: a class and a product base of it may not both name the same private attribute or method
  (``self._lock``, ``def _summed``, ``_db: Client``; dunders and name-mangled ``__x`` aside). A mixin
  that reads its host's ``_lock``, or a subclass that calls its base's ``_helper``, is one class cut
  in two by line count; compose the parts instead (hold one, pass it what it needs).
- **Not counted.** Classes whose purpose is their hierarchy or whose base is a type-level marker:
  anything reaching ``Protocol``, ``TypedDict``, ``NamedTuple``, ``Enum`` (and its kinds), or an
  exception (a builtin one, or a library's ``...Error``/``...Exception``: error hierarchies are how
  ``except`` chooses), and the ``Generic[...]`` marker. Such a class is exempt itself and, as a
  base, adds no level to the classes below it.

Bases are resolved by name through each module's own classes and its ``from ... import`` /
``import ... as`` lines; a base named through a module attribute (``mod.Class``) resolves the
same way. A base that cannot be resolved to a product class is taken as outside the product.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "functions" / "pitstop"
PRODUCT = ("core", "services", "adapters", "agent")
MAX_CLASS_LINES = 300
MAX_DEPTH = 1

# Bases that make a class a type-level or error hierarchy (see the module docstring).
MARKERS = frozenset(
    {
        "Protocol",
        "TypedDict",
        "NamedTuple",
        "Enum",
        "IntEnum",
        "StrEnum",
        "Flag",
        "IntFlag",
        "BaseException",
        "Exception",
        "Generic",
    }
)


@dataclass(frozen=True)
class ClassInfo:
    key: str  # "room/module.py:Qualified.Name"
    lines: int
    bases: tuple[str, ...]  # each resolved: a product class key, or a dotted outside name
    privates: frozenset[str] = frozenset()  # the private names it defines or uses on self/cls


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _privates(cls: ast.ClassDef) -> frozenset[str]:
    """Private names a class defines (methods, class attributes) or touches as ``self._x``/``cls._x``."""
    found: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and _private(stmt.name):
            found.add(stmt.name)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        found.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
            and _private(node.attr)
        ):
            found.add(node.attr)
    return frozenset(found)


def _path_of(module: str, root: Path) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _base_name(node: ast.expr) -> str | None:
    """A base's dotted name (``Generic[T]`` is ``Generic``); None for anything computed."""
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _base_name(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _imports(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> dotted target (``pitstop.x.Y`` or ``typing.Protocol``)."""
    names: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                source = ".".join([*anchor, *([source] if source else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
    return names


def _classes(root: Path) -> dict[str, ClassInfo]:
    """Every class of the product rooms, keyed ``room/module.py:Name``, bases resolved."""
    infos: dict[str, ClassInfo] = {}
    by_dotted: dict[str, str] = {}  # "pitstop.adapters.gke.checks.GkeChecks" -> key
    raw: list[tuple[str, Path, ast.Module, str, list[tuple[str, ast.ClassDef]]]] = []
    for room in PRODUCT:
        for path in sorted((root / room).rglob("*.py")):
            tree = ast.parse(path.read_text())
            module = _module_name_at(path, root)
            found: list[tuple[str, ast.ClassDef]] = []

            def visit(node: ast.AST, prefix: str, found: list[tuple[str, ast.ClassDef]] = found) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ClassDef):
                        found.append((f"{prefix}{child.name}", child))
                        visit(child, f"{prefix}{child.name}.")
                    elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue  # a class made inside a function is local to it
                    else:
                        visit(child, prefix)

            visit(tree, "")
            rel = path.relative_to(root).as_posix()
            for qual, _ in found:
                by_dotted[f"{module}.{qual}"] = f"{rel}:{qual}"
            raw.append((rel, path, tree, module, found))
    for rel, path, tree, module, found in raw:
        imports = _imports(tree, module, path.name == "__init__.py")
        for qual, node in found:
            bases = []
            for b in node.bases:
                name = _base_name(b)
                if name is None:
                    continue
                head, _, rest = name.partition(".")
                local = f"{module}.{name}"
                if local in by_dotted:
                    bases.append(by_dotted[local])
                    continue
                target = imports.get(head, head) + (f".{rest}" if rest else "")
                bases.append(_reexported(target, by_dotted, root))
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            infos[f"{rel}:{qual}"] = ClassInfo(f"{rel}:{qual}", length, tuple(bases), _privates(node))
    return infos


def _module_name_at(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(["pitstop", *parts])


def _reexported(target: str, by_dotted: dict[str, str], root: Path, hops: int = 0) -> str:
    """A dotted name resolved to a product class key, following a package's re-exports."""
    if target in by_dotted:
        return by_dotted[target]
    module, _, name = target.rpartition(".")
    if hops > 5 or not module.startswith("pitstop."):
        return target
    path = _path_of(module.removeprefix("pitstop."), root)
    if path is None:
        return target
    imports = _imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
    if name in imports:
        return _reexported(imports[name], by_dotted, root, hops + 1)
    return target


def _is_marked(key: str, infos: dict[str, ClassInfo], seen: frozenset[str] = frozenset()) -> bool:
    """Whether a class reaches a marker base (a Protocol, TypedDict, Enum or exception kind)."""
    info = infos.get(key)
    if info is None:  # outside the product: its last name tells
        last = key.rpartition(".")[2]
        builtin = getattr(builtins, last, None) if "." not in key else None
        error = isinstance(builtin, type) and issubclass(builtin, BaseException)
        return last in MARKERS or error or last.endswith(("Error", "Exception"))
    if key in seen:
        return False
    return any(_is_marked(b, infos, seen | {key}) for b in info.bases)


def _depth(key: str, infos: dict[str, ClassInfo], seen: frozenset[str] = frozenset()) -> int:
    """Product classes above ``key`` in its longest chain (marked classes and outside ones add none)."""
    if key in seen:
        return 0
    ours = [b for b in infos[key].bases if b in infos and not _is_marked(b, infos)]
    return max((1 + _depth(b, infos, seen | {key}) for b in ours), default=0)


def shape_offenders(root: Path) -> list[str]:
    """Every class over the size limit and every chain deeper than the limit, as ``key: why``."""
    infos = _classes(root)
    out = []
    for key, info in sorted(infos.items()):
        if info.lines > MAX_CLASS_LINES:
            out.append(f"{key}: {info.lines} lines")
        if _is_marked(key, infos):
            continue
        if _depth(key, infos) > MAX_DEPTH:
            out.append(f"{key}: inheritance chain {_depth(key, infos)} deep")
        for base in info.bases:
            shared = sorted(info.privates & infos[base].privates) if base in infos else []
            if shared and not _is_marked(base, infos):
                out.append(f"{key}: shares private names with its base {base}: {', '.join(shared[:5])}")
    return out


def _keys(offenders: list[str]) -> set[str]:
    return {o.split(": ", 1)[0] for o in offenders}


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pitstop" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for room in PRODUCT:
        (root / "pitstop" / room).mkdir(parents=True, exist_ok=True)
    return root / "pitstop"


def test_the_checker_finds_a_chain_across_modules_and_a_long_class(tmp_path: Path) -> None:
    def body(n: int) -> str:
        return "".join(f"    x{i} = {i}\n" for i in range(n))

    root = _write(
        tmp_path,
        {
            "agent/a.py": "class Access:\n    pass\n",
            "agent/b.py": "from pitstop.agent.a import Access\nclass Setup(Access):\n    pass\n",
            "agent/__init__.py": "from pitstop.agent.b import Setup\n",
            "agent/c.py": "from pitstop.agent import Setup\nclass Runs(Setup):\n    pass\n",
            "core/big.py": "class Big:\n" + body(MAX_CLASS_LINES),  # one line over
            "core/fits.py": "class Fits:\n" + body(MAX_CLASS_LINES - 1),
        },
    )
    assert _keys(shape_offenders(root)) == {"agent/c.py:Runs", "core/big.py:Big"}


def test_the_checker_lets_one_level_and_type_hierarchies_pass(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "core/port.py": (
                "import typing\nfrom enum import StrEnum\nfrom typing import Generic, Protocol, TypeVar\n"
                "T = TypeVar('T')\n"
                "class Port(Protocol):\n    pass\n"
                "class Store(Port):\n    pass\n"
                "class Memory(Store):\n    pass\n"  # Port is a Protocol: Memory is one level deep
                "class Kind(StrEnum):\n    A = 'a'\n"
                "class Shape(typing.NamedTuple):\n    x: int\n"
                "class Box(Generic[T]):\n    pass\n"
                "class IntBox(Box[int]):\n    pass\n"
            ),
            "core/errors.py": (
                "class Refused(Exception):\n    pass\nclass Output(Refused):\n    pass\n"
                "class Parse(Output):\n    pass\n"
                "class Bad(ValueError):\n    pass\nclass Worse(Bad):\n    pass\n"
                "class Worst(Worse):\n    pass\n"
                "from google.api_core import exceptions as gexc\n"
                "class Api(gexc.GoogleAPICallError):\n    pass\nclass Api2(Api):\n    pass\n"
                "class Api3(Api2):\n    pass\n"
            ),
            "services/handler.py": (
                "from http.server import BaseHTTPRequestHandler\n"
                "class Handler(BaseHTTPRequestHandler):\n    pass\n"
                "class Quiet(Handler):\n    pass\n"
            ),
        },
    )
    assert shape_offenders(root) == []


def test_the_checker_finds_a_mixin_that_shares_its_hosts_private_state(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "adapters/counts.py": (
                "class Counts:\n    def put(self):\n        with self._lock:\n            pass\n"
            ),
            "adapters/store.py": (
                "import threading\nfrom pitstop.adapters.counts import Counts\n"
                "class Store(Counts):\n    def __init__(self):\n        self._lock = threading.Lock()\n"
                "class Plain:\n    def _helper(self):\n        pass\n"
                "class Impl(Plain):\n    def run(self):\n        return 1\n"  # no private name shared
            ),
        },
    )
    found = shape_offenders(root)
    assert _keys(found) == {"adapters/store.py:Store"} and found[0].endswith(": _lock"), found


def test_no_big_class_and_no_deep_chain_in_product_code() -> None:
    """Every offender fails the test: there is no allow-list (the last divided class, issue 34's
    coalescer, left it; a class that outgrows the rule is divided, not listed)."""
    found = shape_offenders(PACKAGE)
    assert not found, "\n".join(found)
