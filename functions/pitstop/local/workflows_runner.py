"""A strict local runner for Cloud Workflows YAML: the constructs Pitstop's workflow uses, nothing more.

Semantics follow reference/fidelity.md §1: first-match ``switch`` (no fall-through),
``next: end``, try/retry/except where a retry re-runs the whole try block with
``http.default_retry*`` predicates and truncated exponential backoff, subworkflows with
defaults, ``for`` with loop-local variables, HTTP errors as ``HttpError`` maps
(``ConnectionFailedError``/``TimeoutError`` for transport failures), ``sys.sleep`` scaled by
``time_scale`` for tests. Unsupported constructs (parallel, connectors, callbacks, ...) are
refused when the workflow is loaded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import yaml

from pitstop.core.domain import JsonObject
from pitstop.local.wf_expr import Evaluator, Node, WorkflowError, error, parse

STEP_KINDS = {
    "assign": {"assign", "next"},
    "call": {"call", "args", "result", "next"},
    "switch": {"switch", "next"},
    "return": {"return"},
    "raise": {"raise"},
    "try": {"try", "retry", "except", "next"},
    "steps": {"steps", "next"},
    "for": {"for", "next"},
    "next": {"next"},
}
BUILTIN_CALLS = {"http.get", "http.post", "http.request", "sys.sleep", "sys.log"}
RETRYABLE_HTTP = {429, 502, 503, 504}
RETRYABLE_HTTP_NON_IDEMPOTENT = {429, 503}


class WorkflowDefinitionError(ValueError):
    """The YAML uses something this runner does not support (or is malformed)."""


class _Return(Exception):  # noqa: N818 - control flow, not an error
    def __init__(self, value: Any) -> None:
        self.value = value


class _Jump(Exception):  # noqa: N818 - control flow
    def __init__(self, target: str) -> None:
        self.target = target


def _default_predicate(e: Any) -> bool:
    if not isinstance(e, dict):
        return False
    tags = e.get("tags") or []
    if "HttpError" in tags and e.get("code") in RETRYABLE_HTTP:
        return True
    return bool({"ConnectionError", "ConnectionFailedError", "TimeoutError"} & set(tags))


def _default_predicate_non_idempotent(e: Any) -> bool:
    if not isinstance(e, dict):
        return False
    tags = e.get("tags") or []
    if "HttpError" in tags and e.get("code") in RETRYABLE_HTTP_NON_IDEMPOTENT:
        return True
    return "ConnectionFailedError" in tags


@dataclass(frozen=True)
class RoutineRef:
    """A subworkflow named in an expression, e.g. ``predicate: ${my_predicate}``."""

    name: str


@dataclass(frozen=True)
class _Builtin:
    name: str
    fn: Callable[[Any], bool]


_DEFAULT_BACKOFF = {"initial_delay": 1, "max_delay": 60, "multiplier": 1.25}
_VALUES: dict[str, object] = {
    "http.default_retry_predicate": _Builtin("http.default_retry_predicate", _default_predicate),
    "http.default_retry_predicate_non_idempotent": _Builtin(
        "http.default_retry_predicate_non_idempotent", _default_predicate_non_idempotent
    ),
    "http.default_retry": {
        "predicate": _Builtin("p", _default_predicate),
        "max_retries": 5,
        "backoff": _DEFAULT_BACKOFF,
    },
    "http.default_retry_non_idempotent": {
        "predicate": _Builtin("p", _default_predicate_non_idempotent),
        "max_retries": 5,
        "backoff": _DEFAULT_BACKOFF,
    },
}


class HttpCall(TypedDict):
    """One request an execution sent (``body``: what the workflow passed, any JSON value)."""

    method: str
    url: str
    body: object


class HttpAnswer(TypedDict):
    """http.* calls' result as Workflows gives it to the workflow: ``body`` parsed when JSON."""

    code: int
    headers: dict[str, str]
    body: object


# A workflow's variables: any JSON value, and the built-in predicates.
Scope = dict[str, object]


@dataclass
class ExecutionTrace:
    steps: list[str] = field(default_factory=list)
    http: list[HttpCall] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)


class Workflow:
    def __init__(
        self,
        source: str,
        env: Mapping[str, str] | None = None,
        time_scale: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        doc = yaml.safe_load(source)
        if isinstance(doc, list):
            doc = {"main": {"steps": doc}}
        if not isinstance(doc, dict) or "main" not in doc:
            raise WorkflowDefinitionError("a workflow needs a main routine")
        self.routines: dict[str, JsonObject] = {}  # the YAML document: open shape, read as it runs
        for name, body in doc.items():
            if not isinstance(body, dict) or set(body) - {"params", "steps"} or "steps" not in body:
                raise WorkflowDefinitionError(f"routine {name}: only params and steps are supported")
            self.routines[name] = body
        self.env = dict(env or {})
        self.time_scale, self._sleep = time_scale, sleep
        self._run_env = threading.local()  # built-in per-execution variables
        self._exprs: dict[str, Node] = {}
        for rname, body in self.routines.items():
            self._check_steps(body["steps"], where=rname)
        self.evaluator = Evaluator(
            self._functions(), {**_VALUES, **{r: RoutineRef(r) for r in self.routines}}
        )

    # -- loading (strict) ----------------------------------------------------------

    def _check_steps(self, steps: Any, where: str) -> None:
        if not isinstance(steps, list) or not steps:
            raise WorkflowDefinitionError(f"{where}: steps must be a non-empty list")
        for item in steps:
            if not isinstance(item, dict) or len(item) != 1:
                raise WorkflowDefinitionError(f"{where}: each step is a map with exactly one name")
            ((name, body),) = item.items()
            if not isinstance(body, dict):
                raise WorkflowDefinitionError(f"{where}.{name}: step body must be a map")
            kind = next(
                (
                    k
                    for k in ("assign", "call", "switch", "return", "raise", "try", "for", "steps")
                    if k in body
                ),
                "next" if "next" in body else None,
            )
            if kind is None or set(body) - STEP_KINDS[kind]:
                raise WorkflowDefinitionError(f"{where}.{name}: unsupported step keys {sorted(body)}")
            if kind == "call":
                target = body["call"]
                if target not in BUILTIN_CALLS and target not in self.routines:
                    raise WorkflowDefinitionError(f"{where}.{name}: call target {target!r} is not supported")
            if kind == "switch":
                for cond in body["switch"]:
                    allowed = {"condition", "next", "steps", "return", "raise", "assign"}
                    if set(cond) - allowed or "condition" not in cond:
                        raise WorkflowDefinitionError(
                            f"{where}.{name}: unsupported switch keys {sorted(cond)}"
                        )
                    if "steps" in cond:
                        self._check_steps(cond["steps"], f"{where}.{name}")
            if kind == "try":
                t = body["try"]
                if "steps" in t:
                    self._check_steps(t["steps"], f"{where}.{name}.try")
                else:
                    self._check_steps([{"try_body": t}], f"{where}.{name}.try")
                if "except" in body:
                    if set(body["except"]) - {"as", "steps"}:
                        raise WorkflowDefinitionError(f"{where}.{name}: except takes as and steps")
                    self._check_steps(body["except"]["steps"], f"{where}.{name}.except")
            if kind == "steps":
                self._check_steps(body["steps"], f"{where}.{name}")
            if kind == "for":
                f = body["for"]
                if set(f) - {"value", "index", "in", "range", "steps"} or "value" not in f:
                    raise WorkflowDefinitionError(f"{where}.{name}: unsupported for keys {sorted(f)}")
                self._check_steps(f["steps"], f"{where}.{name}.for")
            self._compile(body)

    def _compile(self, value: Any) -> None:
        """Parse every expression up front, so a typo fails at load time."""
        if isinstance(value, str):
            if "${" in value:
                if not (value.startswith("${") and value.endswith("}")):
                    raise WorkflowDefinitionError(f"expressions must be a whole value: {value!r}")
                src = value[2:-1]
                if src not in self._exprs:
                    try:
                        self._exprs[src] = parse(src)
                    except ValueError as exc:
                        raise WorkflowDefinitionError(str(exc)) from exc
        elif isinstance(value, dict):
            for v in value.values():
                self._compile(v)
        elif isinstance(value, list):
            for v in value:
                self._compile(v)

    # -- standard library --------------------------------------------------------------

    def _functions(self) -> dict[str, Callable[..., Any]]:
        def default(v: Any, d: Any) -> Any:
            return d if v is None else v

        def map_get(m: Any, key: Any) -> Any:
            if not isinstance(m, dict):
                return None
            keys = key if isinstance(key, list) else [key]
            cur: Any = m
            for k in keys:
                if not isinstance(cur, dict) or k not in cur:
                    return None
                cur = cur[k]
            return cur

        def get_env(name: str) -> Any:
            per_run = getattr(self._run_env, "env", {})
            if name in per_run:
                return per_run[name]
            if name in self.env:
                return self.env[name]
            raise error("KeyError", f"environment variable {name} is not set")

        def to_string(v: Any) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, str | int | float):
                return str(v)
            raise error("TypeError", "string() takes a number, boolean or string")

        def number_pair(name: str, fn: Any) -> Any:
            def call(a: Any, b: Any) -> Any:
                ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
                if not ok:
                    raise error("TypeError", f"{name}() takes two numbers")
                return fn(a, b)

            return call

        def length(v: Any) -> int:
            if isinstance(v, str | list | dict):
                return len(v)
            raise error("TypeError", "len() takes a string, list or map")

        return {
            "default": default,
            "map.get": map_get,
            "sys.get_env": get_env,
            "sys.now": lambda: time.time(),
            "string": to_string,
            "len": length,
            "keys": lambda m: list(m.keys()),
            "int": lambda v: int(v),
            "double": lambda v: float(v),
            "math.floor": lambda v: math.floor(v),
            "math.min": number_pair("math.min", min),  # Workflows standard library: math.min, math.max
            "math.max": number_pair("math.max", max),
            "json.encode_to_string": lambda v: json.dumps(v, separators=(",", ":")),
        }

    # -- evaluation ----------------------------------------------------------------------

    def value(self, v: Any, scope: Scope) -> Any:
        if isinstance(v, str) and v.startswith("${") and v.endswith("}"):
            return self.evaluator.eval(self._exprs[v[2:-1]], scope)
        if isinstance(v, dict):
            return {k: self.value(x, scope) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x, scope) for x in v]
        return v

    def run(
        self, argument: Any = None, trace: ExecutionTrace | None = None, env: Mapping[str, str] | None = None
    ) -> Any:
        """Run main; return its result or raise WorkflowError (the execution FAILED)."""
        trace = trace or ExecutionTrace()
        self._run_env.env = dict(env or {})
        params = self.routines["main"].get("params") or []
        args = {params[0]: argument} if params else {}
        return self._call_routine("main", args, trace, depth=0)

    def _call_routine(self, name: str, args: Mapping[str, object], trace: ExecutionTrace, depth: int) -> Any:
        if depth > 20:
            raise error("RecursionError", "maximum call stack depth exceeded")
        routine = self.routines[name]
        scope: Scope = {}
        for p in routine.get("params") or []:
            if isinstance(p, dict):
                ((pname, pdefault),) = p.items()
                scope[pname] = args.get(pname, pdefault)
            elif p in args:
                scope[p] = args[p]
            elif name != "main":
                raise error("TypeError", f"missing argument {p} for {name}")
        extra = set(args) - set(scope)
        if extra and name != "main":
            raise error("TypeError", f"unexpected arguments {sorted(extra)} for {name}")
        try:
            self._run_steps(routine["steps"], scope, trace, depth)
        except _Return as r:
            return r.value
        except _Jump as j:
            if j.target == "end":
                return None
            raise WorkflowDefinitionError(f"jump to unknown step {j.target!r}") from None
        return None

    def _run_steps(self, steps: list[JsonObject], scope: Scope, trace: ExecutionTrace, depth: int) -> None:
        names = [next(iter(s)) for s in steps]
        i = 0
        while i < len(steps):
            name = names[i]
            body = steps[i][name]
            try:
                nxt = self._run_step(name, body, scope, trace, depth)
            except _Jump as j:
                if j.target in names:
                    i = names.index(j.target)
                    continue
                raise
            if nxt is None:
                i += 1
            elif nxt in names:
                i = names.index(nxt)
            else:
                raise _Jump(nxt)

    def _run_step(
        self, name: str, body: JsonObject, scope: Scope, trace: ExecutionTrace, depth: int
    ) -> str | None:
        trace.steps.append(name)
        if "assign" in body:
            for item in body["assign"]:
                ((target, v),) = item.items()
                self._assign(target, self.value(v, scope), scope)
        elif "call" in body:
            result = self._call(body["call"], self.value(body.get("args", {}), scope), trace, depth)
            if "result" in body:
                scope[body["result"]] = result
        elif "switch" in body:
            for cond in body["switch"]:
                ok = self.value(cond["condition"], scope)
                if not isinstance(ok, bool):
                    raise error("TypeError", f"switch condition in {name} is not a boolean")
                if not ok:
                    continue
                for item in cond.get("assign", []):
                    ((target, v),) = item.items()
                    self._assign(target, self.value(v, scope), scope)
                if "steps" in cond:
                    self._run_steps(cond["steps"], scope, trace, depth)
                if "return" in cond:
                    raise _Return(self.value(cond["return"], scope))
                if "raise" in cond:
                    raise WorkflowError(self.value(cond["raise"], scope))
                if "next" in cond:
                    return self._next(cond["next"])
                break  # the first match runs, and only it
        elif "return" in body:
            raise _Return(self.value(body["return"], scope))
        elif "raise" in body:
            raise WorkflowError(self.value(body["raise"], scope))
        elif "try" in body:
            self._try(name, body, scope, trace, depth)
        elif "steps" in body:
            self._run_steps(body["steps"], scope, trace, depth)
        elif "for" in body:
            self._for(body["for"], scope, trace, depth)
        return self._next(body["next"]) if "next" in body else None

    @staticmethod
    def _next(target: str) -> str:
        if target == "end":
            raise _Jump("end")
        return target

    @staticmethod
    def _assign(target: str, value: object, scope: Scope) -> None:
        parts = target.split(".")
        if len(parts) == 1:
            scope[target] = value
            return
        cur = scope.get(parts[0])
        for p in parts[1:-1]:
            if not isinstance(cur, dict) or p not in cur:
                raise error("KeyError", f"key not found: {p}")
            cur = cur[p]
        if not isinstance(cur, dict):
            raise error("TypeError", f"cannot assign into {target}")
        cur[parts[-1]] = value

    def _try(self, name: str, body: JsonObject, scope: Scope, trace: ExecutionTrace, depth: int) -> None:
        t = body["try"]
        block = t.get("steps", [{f"{name}_try": t}])
        retry = self.value(body["retry"], scope) if "retry" in body else None
        attempt = 0
        while True:
            try:
                self._run_steps(block, scope, trace, depth)
                return
            except WorkflowError as exc:
                if (
                    retry is not None
                    and attempt < int(retry.get("max_retries", 0))
                    and self._should_retry(retry, exc.value, trace, depth)
                ):
                    backoff = retry.get("backoff") or _DEFAULT_BACKOFF
                    delay = min(
                        float(backoff["initial_delay"]) * float(backoff["multiplier"]) ** attempt,
                        float(backoff["max_delay"]),
                    )
                    attempt += 1
                    self.sleep(delay, trace)
                    continue
                if "except" not in body:
                    raise
                exc_body = body["except"]
                if "as" in exc_body:
                    scope[exc_body["as"]] = exc.value
                self._run_steps(exc_body["steps"], scope, trace, depth)
                return

    def _should_retry(self, retry: Mapping[str, object], err: Any, trace: ExecutionTrace, depth: int) -> bool:
        pred = retry.get("predicate")
        if isinstance(pred, _Builtin):
            return pred.fn(err)
        if isinstance(pred, RoutineRef):
            out = self._call_routine(pred.name, {self._first_param(pred.name): err}, trace, depth + 1)
            if not isinstance(out, bool):
                raise error("TypeError", f"retry predicate {pred} must return a boolean")
            return out
        raise WorkflowDefinitionError(f"unsupported retry predicate {pred!r}")

    def _first_param(self, routine: str) -> str:
        params = self.routines[routine].get("params") or []
        if len(params) != 1:
            raise WorkflowDefinitionError(f"predicate {routine} must take exactly one parameter")
        p = params[0]
        return str(next(iter(p)) if isinstance(p, dict) else p)

    def _for(self, spec: JsonObject, scope: Scope, trace: ExecutionTrace, depth: int) -> None:
        if "in" in spec:
            items = self.value(spec["in"], scope)
            if not isinstance(items, list):
                raise error("TypeError", "for: in must be a list")
        else:
            lo, hi = self.value(spec["range"], scope)
            items = list(range(int(lo), int(hi) + 1))
        before = set(scope)
        try:
            for idx, item in enumerate(items):
                scope[spec["value"]] = item
                if "index" in spec:
                    scope[spec["index"]] = idx
                try:
                    self._run_steps(spec["steps"], scope, trace, depth)
                except _Jump as j:
                    if j.target == "break":
                        break
                    if j.target == "continue":
                        continue
                    raise
        finally:
            for k in set(scope) - before:  # variables created in the loop do not outlive it
                del scope[k]

    def sleep(self, seconds: float, trace: ExecutionTrace) -> None:
        trace.sleeps.append(seconds)
        self._sleep(max(0.0, seconds * self.time_scale))

    def _call(self, target: str, args: Any, trace: ExecutionTrace, depth: int) -> Any:
        if target in self.routines:
            if not isinstance(args, dict):
                raise error("TypeError", "args must be a map")
            return self._call_routine(target, args, trace, depth + 1)
        if target == "sys.sleep":
            self.sleep(float(args["seconds"]), trace)
            return None
        if target == "sys.log":
            trace.logs.append(args.get("data", args.get("text")))
            return None
        method = target.split(".")[1].upper() if target != "http.request" else str(args.get("method", "GET"))
        return self._http(method, args, trace)

    def _http(self, method: str, args: JsonObject, trace: ExecutionTrace) -> HttpAnswer:
        unknown = set(args) - {"url", "method", "headers", "body", "query", "auth", "timeout"}
        if unknown:
            raise error("TypeError", f"unsupported http args {sorted(unknown)}")
        auth = args.get("auth")
        if auth is not None and auth.get("type") not in ("OIDC", "OAuth2"):
            raise error("ValueError", "auth type must be OIDC or OAuth2")
        url = str(args["url"])
        if args.get("query"):
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(args["query"])
        headers = dict(args.get("headers") or {})
        data = None
        if "body" in args and args["body"] is not None:
            data = json.dumps(args["body"]).encode()
            headers.setdefault("Content-Type", "application/json")
        if auth is not None:
            headers["Authorization"] = "Bearer local-oidc-token"  # accepted and ignored locally
        timeout = float(args.get("timeout", 300))
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        trace.http.append({"method": method, "url": url, "body": args.get("body")})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback in tests
                return self._response(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as e:
            out = self._response(e.code, dict(e.headers), e.read())
            raise WorkflowError(
                {
                    "tags": ["HttpError"],
                    "code": e.code,
                    "message": f"HTTP server responded with error code {e.code}",
                    "headers": out["headers"],
                    "body": out["body"],
                }
            ) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, socket.timeout | TimeoutError):
                raise WorkflowError(
                    {"tags": ["TimeoutError", "OSError"], "message": "request timed out"}
                ) from None
            raise WorkflowError(
                {"tags": ["ConnectionFailedError"], "message": f"connection failed: {e.reason}"}
            ) from None
        except TimeoutError:
            raise WorkflowError(
                {"tags": ["TimeoutError", "OSError"], "message": "request timed out"}
            ) from None
        except ConnectionError as e:
            raise WorkflowError({"tags": ["ConnectionError"], "message": f"connection broken: {e}"}) from None

    @staticmethod
    def _response(code: int, headers: dict[str, str], raw: bytes) -> HttpAnswer:
        body: object = raw.decode("utf-8", errors="replace")
        if "json" in headers.get("Content-Type", headers.get("content-type", "")) and raw:
            with contextlib.suppress(json.JSONDecodeError):
                body = json.loads(raw)
        return {"code": code, "headers": headers, "body": body}


def runner_for(
    source_path: str, env: Mapping[str, str] | None = None, time_scale: float = 1.0
) -> Callable[[str, str, dict[str, str]], tuple[str, str | None, str | None]]:
    """An ExecutionsService runner: executes the YAML for each created execution."""
    with open(source_path, encoding="utf-8") as f:
        wf = Workflow(f.read(), env or dict(os.environ), time_scale)

    def run(name: str, argument: str, labels: dict[str, str]) -> tuple[str, str | None, str | None]:
        parts = name.split("/")  # projects/P/locations/L/workflows/W/executions/E
        builtin = {
            "GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": parts[-1],
            "GOOGLE_CLOUD_PROJECT_ID": parts[1],
            "GOOGLE_CLOUD_LOCATION": parts[3],
            "GOOGLE_CLOUD_WORKFLOW_ID": parts[5],
        }
        try:
            result = wf.run(json.loads(argument or "null"), env=builtin)
        except WorkflowError as exc:
            return "FAILED", None, json.dumps(exc.value)
        return "SUCCEEDED", json.dumps(result), None

    return run
