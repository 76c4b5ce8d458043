"""Evaluating Cloud Logging filters locally, so the local sink router applies infra/filters/ as Google would.

Rules from reference/fidelity.md §3.2: precedence NOT > OR > AND (OR binds tighter than
AND; juxtaposition is an implicit AND), ``-`` as NOT, upper-case boolean operators only,
case-insensitive string comparison, ``:`` as substring (``field:*`` for presence), ``=~``/``!~``
as unanchored regular expressions, value lists ``field=("a" OR "b")``, ``log_id()``, and a bare
value as a global restriction over every field. Unsupported syntax is an error, not a guess.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>!=|<=|>=|=~|!~|[=<>:()\-.*,])|(?P<word>[^\s"=<>:()!.,]+))'
)
_MISSING = object()
Predicate = Callable[[Mapping[str, object]], bool]


class FilterSyntaxError(ValueError):
    pass


def _tokens(src: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    src = src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise FilterSyntaxError(f"cannot read filter at {pos}: {src[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        val = m.group(kind)
        out.append(
            ("str", bytes(val[1:-1], "utf-8").decode("unicode_escape")) if kind == "str" else (kind, val)
        )
        pos = m.end()
    return out


def _lookup(entry: Any, path: list[str]) -> Any:
    cur = entry
    for seg in path:
        if isinstance(cur, dict) and seg in cur:
            cur = cur[seg]
        else:
            return _MISSING
    return cur


def _strings(v: Any) -> list[str]:
    if isinstance(v, dict):
        return [s for x in v.values() for s in _strings(x)]
    if isinstance(v, list):
        return [s for x in v for s in _strings(x)]
    if isinstance(v, bool):
        return ["true" if v else "false"]
    if v is None or v is _MISSING:
        return []
    return [str(v)]


def _compare(have: Any, op: str, want: str) -> bool:
    values = have if isinstance(have, list) else [have]  # a repeated field matches if any element does
    for h in values:
        if op == ":" and want == "*":
            return h is not _MISSING
        if h is _MISSING or isinstance(h, dict | list):
            if op == ":" and isinstance(h, dict) and want.lower() in (k.lower() for k in h):
                return True
            continue
        hs = ("true" if h else "false") if isinstance(h, bool) else str(h)
        if op == "=" and hs.lower() == want.lower():
            return True
        if op == ":" and want.lower() in hs.lower():
            return True
        if op == "=~" and re.search(want, hs):
            return True
        if op in ("<", "<=", ">", ">="):
            try:
                a, b = float(hs), float(want)
            except ValueError:
                a, b = hs, want  # type: ignore[assignment]
            if {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]:
                return True
    return False


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks, self.i = _tokens(src), 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise FilterSyntaxError("filter ends too early")
        self.i += 1
        return tok

    def is_word(self, *words: str) -> bool:
        t = self.peek()
        return t is not None and t[0] == "word" and t[1] in words

    def parse(self) -> Predicate:
        p = self.expression()
        if self.peek() is not None:
            raise FilterSyntaxError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return p

    def expression(self) -> Predicate:
        parts = [self.sequence()]
        while self.is_word("AND"):
            self.take()
            parts.append(self.sequence())
        return (lambda e: all(p(e) for p in parts)) if len(parts) > 1 else parts[0]

    def sequence(self) -> Predicate:
        parts = [self.factor()]
        while self.peek() is not None and not self.is_word("AND") and self.peek() != ("op", ")"):
            parts.append(self.factor())
        return (lambda e: all(p(e) for p in parts)) if len(parts) > 1 else parts[0]

    def factor(self) -> Predicate:
        parts = [self.term()]
        while self.is_word("OR"):
            self.take()
            parts.append(self.term())
        return (lambda e: any(p(e) for p in parts)) if len(parts) > 1 else parts[0]

    def term(self) -> Predicate:
        if self.is_word("NOT") or self.peek() == ("op", "-"):
            self.take()
            inner = self.simple()
            return lambda e: not inner(e)
        return self.simple()

    def simple(self) -> Predicate:
        tok = self.take()
        if tok == ("op", "("):
            inner = self.expression()
            if self.take() != ("op", ")"):
                raise FilterSyntaxError("missing )")
            return inner
        if tok[0] == "word" and tok[1] == "log_id" and self.peek() == ("op", "("):
            self.take()
            kind, log_id = self.take()
            if kind != "str" or self.take() != ("op", ")"):
                raise FilterSyntaxError('log_id takes one quoted string: log_id("...")')
            suffix = "/logs/" + urllib.parse.quote(log_id, safe="")
            return lambda e: isinstance(name := e.get("logName"), str) and name.endswith(suffix)
        if tok[0] == "str" and not self._at_comparison():
            needle = tok[1].lower()
            return lambda e: any(needle in s.lower() for s in _strings(e))  # global restriction
        if tok[0] not in ("word", "str"):
            raise FilterSyntaxError(f"unexpected {tok[1]!r}")
        path = [tok[1]]
        while self.peek() == ("op", "."):
            self.take()
            kind, seg = self.take()
            if kind not in ("word", "str"):
                raise FilterSyntaxError("bad field path")
            path.append(seg)
        if not self._at_comparison():
            if len(path) == 1 and tok[0] == "word":
                needle = tok[1].lower()
                return lambda e: any(needle in s.lower() for s in _strings(e))
            raise FilterSyntaxError(f"{'.'.join(path)} needs a comparison")
        op = self.take()[1]
        if op == "-":
            raise FilterSyntaxError("unexpected -")
        values = self.values()
        negate = op in ("!=", "!~")
        base = {"!=": "=", "!~": "=~"}.get(op, op)
        for v in values:
            if base == "=~":
                re.compile(v)

        def pred(e: Mapping[str, object]) -> bool:
            hit = any(_compare(_lookup(e, path), base, v) for v in values)
            return not hit if negate else hit

        return pred

    def _at_comparison(self) -> bool:
        t = self.peek()
        return t is not None and t[0] == "op" and t[1] in ("=", "!=", "<", "<=", ">", ">=", ":", "=~", "!~")

    def values(self) -> list[str]:
        tok = self.take()
        if tok == ("op", "("):
            out = [self.take()[1]]
            while self.is_word("OR"):
                self.take()
                out.append(self.take()[1])
            if self.take() != ("op", ")"):
                raise FilterSyntaxError("missing ) after value list")
            return out
        if tok[0] in ("str", "word") or tok == ("op", "*"):
            return [tok[1]]
        raise FilterSyntaxError(f"expected a value, got {tok[1]!r}")


def compile_filter(src: str) -> Predicate:
    if len(src) > 20_000:
        raise FilterSyntaxError("filters are at most 20,000 characters")
    return _Parser(src).parse()
