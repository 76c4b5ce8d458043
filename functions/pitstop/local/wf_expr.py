"""The Workflows expression language (the subset Pitstop's workflow uses), parsed and evaluated.

Precedence, high to low (reference/fidelity.md §1.4): ``() . []``, ``not``, unary ``-``,
``* / // %``, ``+ -``, comparisons (``< <= >= > == != in``), ``and``, ``or``. Logical operators
apply to booleans only; ``/`` always yields a double; a missing map key is a KeyError and a
bad index an IndexError, raised as Workflows error maps. Anything outside the subset is
refused when the workflow is loaded, not silently misread.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>\d+\.\d+|\d+)
    | (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>//|==|!=|<=|>=|[-+*/%<>()\[\].,])
    )""",
    re.X,
)
_KEYWORDS = {
    "and",
    "or",
    "not",
    "in",
    "true",
    "false",
    "null",
    "AND",
    "OR",
    "NOT",
    "True",
    "False",
    "TRUE",
    "FALSE",
}


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class WorkflowError(Exception):
    """A Workflows runtime error: ``value`` is what ``except: as: e`` binds (a map or a string)."""

    def __init__(self, value: Any) -> None:
        super().__init__(value.get("message") if isinstance(value, dict) else value)
        self.value = value


def error(tag: str, message: str) -> WorkflowError:
    return WorkflowError({"tags": [tag], "message": message})


class ExprSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class Node:
    kind: str  # lit, list, var, attr, index, call, unary, binary
    a: Any = None
    b: Any = None
    c: Any = None


def tokenize(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    src = src.rstrip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise ExprSyntaxError(f"unexpected character at {pos} in {src!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks, self.i, self.src = tokenize(src), 0, src

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExprSyntaxError(f"expected {value or 'more'} in {self.src!r}")
        self.i += 1
        return tok

    def at(self, *values: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] in values

    def parse(self) -> Node:
        node = self.or_()
        if self.peek() is not None:
            raise ExprSyntaxError(f"unexpected {self.peek()[1]!r} in {self.src!r}")  # type: ignore[index]
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.at("or", "OR"):
            self.take()
            node = Node("binary", "or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.cmp()
        while self.at("and", "AND"):
            self.take()
            node = Node("binary", "and", node, self.cmp())
        return node

    def cmp(self) -> Node:
        node = self.add()
        while self.at("<", "<=", ">", ">=", "==", "!=", "in"):
            op = self.take()[1]
            node = Node("binary", op, node, self.add())
        return node

    def add(self) -> Node:
        node = self.mul()
        while self.at("+", "-"):
            op = self.take()[1]
            node = Node("binary", op, node, self.mul())
        return node

    def mul(self) -> Node:
        node = self.unary()
        while self.at("*", "/", "//", "%"):
            op = self.take()[1]
            node = Node("binary", op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.at("not", "NOT"):
            self.take()
            return Node("unary", "not", self.unary())
        if self.at("-"):
            self.take()
            return Node("unary", "-", self.unary())
        return self.postfix()

    def postfix(self) -> Node:
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                kind, name = self.take()
                if kind != "name":
                    raise ExprSyntaxError(f"expected a name after '.' in {self.src!r}")
                node = Node("attr", node, name)
            elif self.at("["):
                self.take()
                idx = self.or_()
                self.take("]")
                node = Node("index", node, idx)
            elif self.at("("):
                self.take()
                args = []
                while not self.at(")"):
                    args.append(self.or_())
                    if not self.at(")"):
                        self.take(",")
                self.take(")")
                node = Node("call", node, tuple(args))
            else:
                return node

    def primary(self) -> Node:
        kind, val = self.take()
        if kind == "num":
            return Node("lit", float(val) if "." in val else int(val))
        if kind == "str":
            return Node("lit", bytes(val[1:-1], "utf-8").decode("unicode_escape"))
        if kind == "name":
            if val in ("true", "True", "TRUE"):
                return Node("lit", True)
            if val in ("false", "False", "FALSE"):
                return Node("lit", False)
            if val == "null":
                return Node("lit", None)
            if val in _KEYWORDS:
                raise ExprSyntaxError(f"unexpected keyword {val!r} in {self.src!r}")
            return Node("var", val)
        if val == "(":
            node = self.or_()
            self.take(")")
            return node
        if val == "[":
            items = []
            while not self.at("]"):
                items.append(self.or_())
                if not self.at("]"):
                    self.take(",")
            self.take("]")
            return Node("list", tuple(items))
        raise ExprSyntaxError(f"unexpected {val!r} in {self.src!r}")


def parse(src: str) -> Node:
    return _Parser(src).parse()


def _name_of(node: Node) -> str | None:
    """``sys.get_env`` for a dotted name node, so calls resolve against the standard library."""
    if node.kind == "var":
        return str(node.a)
    if node.kind == "attr":
        head = _name_of(node.a)
        return f"{head}.{node.b}" if head else None
    return None


def _type(v: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "double",
        str: "string",
        list: "list",
        dict: "map",
        type(None): "null",
    }.get(type(v), type(v).__name__)


class Evaluator:
    def __init__(self, functions: Mapping[str, Callable[..., Any]], values: Mapping[str, object]) -> None:
        self.functions, self.values = functions, values  # values: stdlib constants, e.g. http.default_retry

    def eval(self, node: Node, scope: Mapping[str, object]) -> Any:
        k = node.kind
        if k == "lit":
            return node.a
        if k == "list":
            return [self.eval(x, scope) for x in node.a]
        if k == "var":
            if node.a in scope:
                return scope[node.a]
            if node.a in self.values:
                return self.values[node.a]
            raise error("KeyError", f"variable '{node.a}' is not defined")
        if k == "attr":
            dotted = _name_of(node)
            if dotted and dotted in self.values and (node.a.kind != "var" or node.a.a not in scope):
                return self.values[dotted]
            base = self.eval(node.a, scope)
            if not isinstance(base, dict):
                raise error("TypeError", f"cannot read key '{node.b}' of a {_type(base)}")
            if node.b not in base:
                raise error("KeyError", f"key not found: {node.b}")
            return base[node.b]
        if k == "index":
            base, idx = self.eval(node.a, scope), self.eval(node.b, scope)
            if isinstance(base, dict):
                if not isinstance(idx, str):
                    raise error("TypeError", "map keys are strings")
                if idx not in base:
                    raise error("KeyError", f"key not found: {idx}")
                return base[idx]
            if isinstance(base, list):
                if not isinstance(idx, int) or isinstance(idx, bool):
                    raise error("TypeError", "list index must be an integer")
                if not 0 <= idx < len(base):
                    raise error("IndexError", f"list index {idx} out of range")
                return base[idx]
            raise error("TypeError", f"cannot index a {_type(base)}")
        if k == "call":
            name = _name_of(node.a)
            if name is None or name not in self.functions:
                raise error("KeyError", f"function '{name}' is not supported by this runner")
            return self.functions[name](*[self.eval(a, scope) for a in node.b])
        if k == "unary":
            v = self.eval(node.b, scope)
            if node.a == "not":
                if not isinstance(v, bool):
                    raise error("TypeError", "not applies to booleans only")
                return not v
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise error("TypeError", "unary minus applies to numbers only")
            return -v
        return self._binary(node, scope)

    def _binary(self, node: Node, scope: Mapping[str, object]) -> Any:
        op = node.a
        if op in ("and", "or"):
            left = self.eval(node.b, scope)
            if not isinstance(left, bool):
                raise error("TypeError", f"{op} applies to booleans only")
            if (op == "and" and not left) or (op == "or" and left):
                return left
            right = self.eval(node.c, scope)
            if not isinstance(right, bool):
                raise error("TypeError", f"{op} applies to booleans only")
            return right
        a, b = self.eval(node.b, scope), self.eval(node.c, scope)
        if op == "in":
            if isinstance(b, list):
                return a in b
            if isinstance(b, dict):
                return a in b
            raise error("TypeError", "in needs a list or a map")
        if op in ("==", "!="):
            eq = a == b and (isinstance(a, bool) == isinstance(b, bool))
            return eq if op == "==" else not eq
        num = (int, float)
        if op in ("<", "<=", ">", ">="):
            if not (
                (
                    isinstance(a, num)
                    and isinstance(b, num)
                    and not isinstance(a, bool)
                    and not isinstance(b, bool)
                )
                or (isinstance(a, str) and isinstance(b, str))
            ):
                raise error("TypeError", f"cannot compare {_type(a)} and {_type(b)}")
            return bool(_COMPARE[op](a, b))
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if op == "+" and isinstance(a, list) and isinstance(b, list):
            return a + b
        if not (isinstance(a, num) and isinstance(b, num)) or isinstance(a, bool) or isinstance(b, bool):
            raise error("TypeError", f"unsupported operand types for {op}: {_type(a)} and {_type(b)}")
        if op in ("/", "//", "%") and b == 0:
            raise error("ZeroDivisionError", "division by zero")
        if op == "/":
            return float(a) / float(b)
        return {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "//": lambda: a // b,
            "%": lambda: a % b,
        }[op]()
