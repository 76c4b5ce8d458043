"""The stack's controller: a supervisor for the function processes and the chaos endpoint.

It lives in the process that owns the stack (`pitstop local up`'s background process, the
demo, a test) and has two parts:

- a supervisor loop that starts a function process (and the scheduler) again when it has died,
  as Cloud Run starts a new instance: same command, environment and port. A process stopped on
  purpose (``Stack.set_agent(False)``) is not restarted; the agent is not supervised at all,
  so ``agent-down`` stays down until ``agent-up``;
- a loopback HTTP endpoint (``endpoints["control"]`` in stack.json) through which
  `pitstop local chaos` and `pitstop local status` in other processes reach the stack:
  ``POST /chaos`` ``{kind, arg, times, node, method}`` and ``POST /status``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from typing import Any, Protocol, TypedDict

from pitstop.local import chaos
from pitstop.local.json_http import serve_json
from pitstop.local.procs import Proc


class Stack(chaos.Stack, Protocol):
    """What supervision needs of the running stack (pitstop.local.stack.Stack is one)."""

    procs: dict[str, Proc]

    def refresh_pids(self) -> None: ...


class ControlStatus(TypedDict):
    """The controller's ``/status``: restarts by process, the Slurm agent, the armed flags."""

    restarts: dict[str, int]
    agent: str
    flags: dict[str, chaos.Flag]
    at: float


SUPERVISED = ("ingest", "actuate", "notify", "sweep", "scheduler")
CHECK_EVERY_S = 0.5


class Controller:
    def __init__(self, stack: Stack, port: int) -> None:
        self.stack, self.port = stack, port
        self.restarts: dict[str, int] = dict.fromkeys(SUPERVISED, 0)
        self.lock = threading.RLock()  # held while a process is restarted or a chaos request runs
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Controller:
        self._server = serve_json(self._dispatch, "pitstop-control", port=self.port)
        self._thread = threading.Thread(target=self._supervise, daemon=True, name="pitstop-supervisor")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- supervisor ------------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            for name in SUPERVISED:
                with self.lock:
                    if self._stop.is_set():
                        return
                    p = self.stack.procs.get(name)
                    if p is None or p.popen is None or p.alive():
                        continue
                    code = p.popen.returncode
                    with p.log_path.open("a") as log:
                        log.write(
                            json.dumps({"supervisor": f"{name} exited ({code}); starting it again"}) + "\n"
                        )
                    p.start()
                    self.restarts[name] += 1
                    self.stack.refresh_pids()

    # -- HTTP ------------------------------------------------------------------------

    def _dispatch(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return 400, {"error": "body is not JSON"}
        if method != "POST" or not isinstance(body, dict):
            return 405, {"error": "POST a JSON object"}
        if path == "/status":
            return 200, self.status()
        if path != "/chaos":
            return 404, {"error": f"no {path} here"}
        try:
            with self.lock:
                return 200, self.chaos(body)
        except (ValueError, TypeError) as exc:  # chaos.ChaosError is a ValueError
            return 400, {"error": str(exc)}

    def chaos(self, body: Mapping[str, object]) -> chaos.Done:
        arg, node, method = body.get("arg"), body.get("node"), body.get("method")
        times = body.get("times") or 1
        if not isinstance(times, int | float | str):
            raise TypeError("times must be a number")
        return chaos.apply(
            self.stack,
            str(body.get("kind")),
            None if arg is None else str(arg),
            int(times),
            None if node is None else str(node),
            None if method is None else str(method),
        )

    def status(self) -> ControlStatus:
        agent = self.stack.procs.get("slurm-agent")
        return {
            "restarts": dict(self.restarts),
            "agent": "up" if agent is not None and agent.alive() else "down",
            "flags": chaos.armed_flags(self.stack.chaos_dir),
            "at": time.time(),
        }
