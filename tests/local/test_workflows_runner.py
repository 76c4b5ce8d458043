"""Each Workflows construct the remediation workflow relies on, proven against the runner."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pitstop.local.wf_expr import WorkflowError
from pitstop.local.workflows_runner import ExecutionTrace, Workflow, WorkflowDefinitionError
from pitstop.services.actuate.registry import MUTATING_OPS, PROBE_OPS


def run(src: str, arg: Any = None, env: dict[str, str] | None = None) -> tuple[Any, ExecutionTrace]:
    trace = ExecutionTrace()
    out = Workflow(src, env, time_scale=0.0, sleep=lambda s: None).run(arg, trace)
    return out, trace


class Scripted:
    """An HTTP server answering from a script of (status, body) per call."""

    def __init__(self, script: list[tuple[int, Any]]) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"null")
                outer.calls.append({"body": body, "auth": self.headers.get("Authorization")})
                status, resp = outer.script.pop(0) if outer.script else (200, {"ok": True})
                data = json.dumps(resp).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/op"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def scripted() -> Iterator[type[Scripted]]:
    made: list[Scripted] = []

    class Factory(Scripted):
        def __init__(self, script: list[tuple[int, Any]]) -> None:
            super().__init__(script)
            made.append(self)

    yield Factory
    for s in made:
        s.server.shutdown()


def test_switch_runs_only_the_first_match() -> None:
    src = """
main:
  steps:
    - init: {assign: [{x: 5}, {hits: []}]}
    - pick:
        switch:
          - condition: ${x > 1}
            assign: [{hits: '${hits + ["first"]}'}]
          - condition: ${x > 2}
            assign: [{hits: '${hits + ["second"]}'}]
          - condition: true
            assign: [{hits: '${hits + ["default"]}'}]
    - done: {return: '${hits}'}
"""
    assert run(src)[0] == ["first"]


def test_switch_without_match_continues_and_next_end_returns_null() -> None:
    src = """
main:
  steps:
    - s:
        switch:
          - condition: ${false}
            return: "no"
    - after: {next: end}
    - never: {return: "unreachable"}
"""
    out, trace = run(src)
    assert out is None and "never" not in trace.steps


def test_expressions_precedence_and_types() -> None:
    src = """
main:
  params: [a]
  steps:
    - r:
        return:
          div: ${4 / 2}
          floor: ${7 // 2}
          prec: ${1 + 2 * 3}
          logic: ${not false and (a.n > 1 or a.n < 0)}
          inlist: ${"x" in a.tags}
          concat: ${"n=" + string(a.n)}
          get: ${map.get(a, "missing")}
          dflt: ${default(map.get(a, ["deep", "er"]), "d")}
"""
    out, _ = run(src, {"n": 3, "tags": ["x"]})
    assert out == {
        "div": 2.0,
        "floor": 3,
        "prec": 7,
        "logic": True,
        "inlist": True,
        "concat": "n=3",
        "get": None,
        "dflt": "d",
    }


@pytest.mark.parametrize(
    ("expr", "tag"),
    [
        ("${a.missing}", "KeyError"),
        ("${a.tags[5]}", "IndexError"),
        ("${1 / 0}", "ZeroDivisionError"),
        ('${"a" + 1}', "TypeError"),
        ("${1 and true}", "TypeError"),
    ],
)
def test_runtime_errors_are_tagged(expr: str, tag: str) -> None:
    src = f"""
main:
  params: [a]
  steps:
    - r: {{return: '{expr}'}}
"""
    with pytest.raises(WorkflowError) as ei:
        run(src, {"tags": []})
    assert ei.value.value["tags"] == [tag]


def test_retry_default_predicate_retries_503_then_succeeds(scripted: type[Scripted]) -> None:
    srv = scripted([(503, {"e": 1}), (503, {"e": 2}), (200, {"ok": 1})])
    src = f"""
main:
  steps:
    - call_it:
        try:
          call: http.post
          args: {{url: "{srv.url}", auth: {{type: OIDC}}, body: {{k: v}}}}
          result: r
        retry:
          predicate: ${{http.default_retry_predicate}}
          max_retries: 5
          backoff: {{initial_delay: 1, max_delay: 60, multiplier: 2}}
    - done: {{return: '${{r.body}}'}}
"""
    out, trace = run(src)
    assert out == {"ok": 1}
    assert trace.sleeps == [1.0, 2.0]
    assert len(srv.calls) == 3
    assert srv.calls[0]["auth"] is not None and srv.calls[0]["body"] == {"k": "v"}


def test_retry_gives_up_and_except_binds_the_http_error(scripted: type[Scripted]) -> None:
    srv = scripted([(429, {})] * 4)
    src = f"""
main:
  steps:
    - call_it:
        try:
          call: http.post
          args: {{url: "{srv.url}"}}
        retry: {{predicate: '${{http.default_retry_predicate}}', max_retries: 3,
                 backoff: {{initial_delay: 1, max_delay: 3, multiplier: 2}}}}
        except:
          as: e
          steps:
            - caught: {{return: {{code: '${{e.code}}', http: '${{"HttpError" in e.tags}}'}}}}
"""
    out, trace = run(src)
    assert out == {"code": 429, "http": True}
    assert trace.sleeps == [1.0, 2.0, 3.0]
    assert len(srv.calls) == 4


def test_permanent_4xx_is_not_retried(scripted: type[Scripted]) -> None:
    srv = scripted([(403, {"error": "forbidden"})])
    src = f"""
main:
  steps:
    - call_it:
        try:
          call: http.post
          args: {{url: "{srv.url}"}}
        retry: ${{http.default_retry}}
"""
    with pytest.raises(WorkflowError) as ei:
        run(src)
    assert ei.value.value["code"] == 403 and ei.value.value["body"] == {"error": "forbidden"}
    assert len(srv.calls) == 1


def test_connection_refused_is_connection_failed() -> None:
    src = """
main:
  steps:
    - c:
        try:
          call: http.post
          args: {url: "http://127.0.0.1:9/nothing"}
        except:
          as: e
          steps:
            - r: {return: '${e.tags}'}
"""
    assert run(src)[0] == ["ConnectionFailedError"]


def test_retry_reruns_the_whole_try_block_with_custom_predicate(scripted: type[Scripted]) -> None:
    srv = scripted([(500, {}), (200, {})])
    src = f"""
main:
  steps:
    - init: {{assign: [{{n: 0}}]}}
    - block:
        try:
          steps:
            - count: {{assign: [{{n: '${{n + 1}}'}}]}}
            - post: {{call: http.post, args: {{url: "{srv.url}"}}}}
        retry:
          predicate: ${{only_500}}
          max_retries: 2
          backoff: {{initial_delay: 1, max_delay: 1, multiplier: 1}}
    - done: {{return: '${{n}}'}}
only_500:
  params: [e]
  steps:
    - check: {{return: '${{e.code == 500}}'}}
"""
    assert run(src)[0] == 2


def test_subworkflow_params_defaults_and_raise_map() -> None:
    src = """
main:
  steps:
    - a: {call: add, args: {x: 2}, result: r}
    - b:
        try:
          call: boom
        except:
          as: e
          steps:
            - r2: {return: {sum: '${r}', code: '${e.code}'}}
add:
  params: [x, y: 40]
  steps:
    - s: {return: '${x + y}'}
boom:
  steps:
    - r: {raise: {code: 55, message: "custom"}}
"""
    assert run(src)[0] == {"sum": 42, "code": 55}


def test_except_can_jump_back_out_and_raise_a_map_from_a_nested_except(scripted: type[Scripted]) -> None:
    # the constructs remediate.yaml's mutate and record_failure use: a retry loop built from an
    # except block that jumps to an outer step, and a nested try whose except raises a new map
    srv = scripted([(502, {}), (502, {}), (200, {"ok": 1}), (500, {})])
    src = f"""
main:
  steps:
    - init: {{assign: [{{round: 1}}]}}
    - ask:
        try:
          call: http.post
          args: {{url: "{srv.url}"}}
          result: r
        except:
          as: e
          steps:
            - tags: {{assign: [{{code: '${{default(map.get(e, "code"), 0)}}'}}]}}
            - again:
                switch:
                  - condition: ${{round < 3 and code == 502}}
                    next: bump
            - out: {{raise: '${{e}}'}}
    - second:
        try:
          call: http.post
          args: {{url: "{srv.url}"}}
        except:
          as: first
          steps:
            - nested:
                try:
                  steps:
                    - boom: {{raise: {{code: 1}}}}
                except:
                  as: inner
                  steps:
                    - both: {{raise: {{tags: ["Both"], first: '${{first.code}}', inner: '${{inner.code}}',
                                       round: '${{round}}', ok: '${{r.body.ok}}'}}}}
    - bump: {{assign: [{{round: '${{round + 1}}'}}], next: ask}}
"""
    with pytest.raises(WorkflowError) as ei:
        run(src)
    assert ei.value.value == {"tags": ["Both"], "first": 500, "inner": 1, "round": 3, "ok": 1}
    assert len(srv.calls) == 4


def test_raised_string_is_the_error_value() -> None:
    with pytest.raises(WorkflowError) as ei:
        run('main:\n  steps:\n    - r: {raise: "Something went wrong."}\n')
    assert ei.value.value == "Something went wrong."


def test_for_loop_scope_and_next_jumps() -> None:
    src = """
main:
  steps:
    - init: {assign: [{total: 0}, {i: 0}]}
    - loop:
        for:
          value: v
          in: [1, 2, 3, 4]
          steps:
            - skip:
                switch:
                  - condition: ${v == 2}
                    next: continue
                  - condition: ${v == 4}
                    next: break
            - add: {assign: [{total: '${total + v}'}, {inner: true}]}
    - poll: {assign: [{i: '${i + 1}'}]}
    - again:
        switch:
          - condition: ${i < 3}
            next: poll
    - done: {return: {total: '${total}', i: '${i}'}}
"""
    out, _ = run(src)
    assert out == {"total": 4, "i": 3}


def test_loop_variables_do_not_outlive_the_loop() -> None:
    src = """
main:
  steps:
    - loop: {for: {value: v, in: [1], steps: [{a: {assign: [{made: 1}]}}]}}
    - r: {return: '${made}'}
"""
    with pytest.raises(WorkflowError) as ei:
        run(src)
    assert ei.value.value["tags"] == ["KeyError"]


def test_env_and_sleep_scaling() -> None:
    src = """
main:
  steps:
    - z: {call: sys.sleep, args: {seconds: 30}}
    - r: {return: '${sys.get_env("PITSTOP_ACTUATE_URL")}'}
"""
    out, trace = run(src, env={"PITSTOP_ACTUATE_URL": "http://x"})
    assert out == "http://x" and trace.sleeps == [30.0]


@pytest.mark.parametrize(
    "src",
    [
        "main:\n  steps:\n    - p: {parallel: {branches: []}}\n",
        "main:\n  steps:\n    - c: {call: googleapis.compute.v1.instances.reset, args: {}}\n",
        "main:\n  steps:\n    - c: {call: events.await_callback, args: {}}\n",
        "main:\n  steps:\n    - a: {assign: [{x: 'prefix ${1}'}]}\n",
        "main:\n  steps:\n    - a: {assign: [{x: '${1 +}'}]}\n",
        "main:\n  steps:\n    - a: {assign: [{x: 1}], bogus: 2}\n",
    ],
)
def test_unsupported_constructs_are_refused_at_load(src: str) -> None:
    with pytest.raises(WorkflowDefinitionError):
        Workflow(src)


# -- workflows/remediate.yaml against a scripted actuate --------------------------------------

REMEDIATE = Path(__file__).resolve().parents[2] / "workflows" / "remediate.yaml"
DEFAULT_ANSWERS: dict[str, Any] = {
    "claim": {"ours": True, "why": "", "plan": "remediate", "action": "REBOOT_NODE"},
    "act": {"operation": None, "method": "reset"},
    "verify": {"done": True},
    "corroborate": {"run": True},
    "corroboration": {"done": True},
    "judge_corroboration": {"confirmed": True, "why": "confirmed on the node"},
    "diagnose": {"run": False, "why": "a diagnostic runs only before REPLACE_NODE"},
    "validate": {"run": False, "why": "validation.enabled is false in policy"},
    "diagnosis": {"done": True},
    "validation": {"done": True},
    "revalidate": {
        "run": False,
        "why": "no busbw shortfall measured the fabric's way or corrupt data to check again",
    },
    "revalidation": {"done": True},
    "resumed": {"done": True},
    "escalate": {"outcome": "continue", "handed_over": False},
    "close": {"outcome": "resolved"},
    "fail": {"outcome": "failed"},
}
DROP = "drop"  # the request reached actuate, but the connection closed before any answer
# One step that needs no checkpoint, diagnostic or validation, each op asked once, in order.
STEP_OPS = [
    "claim",
    "fence",
    "corroborate",
    "corroboration",
    "judge_corroboration",
    "reschedule_early",
    "diagnose",
    "act",
    "verify",
    "validate",
    "escalate",
    "unfence",
    "reschedule",
    "resumed",
    "close",
]


class FakeActuate:
    """actuate over HTTP, answering each op from its script (then a default), counting every call."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = {op: list(answers) for op, answers in script.items()}
        self.calls: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"null")
                outer.calls.append(body)
                queue = outer.script.get(body["op"]) or []
                answer = queue.pop(0) if queue else (200, DEFAULT_ANSWERS.get(body["op"], {}))
                if answer == DROP:
                    self.close_connection = True
                    return
                status, resp = answer
                data = json.dumps(resp).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ops(self) -> list[str]:
        return [c["op"] for c in self.calls]


class LateAnswers(Workflow):
    """The runner, with some answers arriving after the workflow's HTTP timeout (the effect happened)."""

    def __init__(
        self, source: str, env: dict[str, str], late: dict[str, int], refused: dict[str, int] | None = None
    ) -> None:
        super().__init__(source, env, time_scale=0.0, sleep=lambda s: None)
        self.late = dict(late)  # op -> how many of its answers come too late
        self.refused = dict(refused or {})  # op -> how many of its connections are refused (no instance)

    def _http(self, method: str, args: Any, trace: ExecutionTrace) -> Any:
        op = str((args.get("body") or {}).get("op"))
        if self.refused.get(op, 0) > 0:  # never reaches actuate, as the runner's own refusal
            self.refused[op] -= 1
            raise WorkflowError({"tags": ["ConnectionFailedError"], "message": "connection failed: refused"})
        out = super()._http(method, args, trace)
        if self.late.get(op, 0) > 0:
            self.late[op] -= 1
            raise WorkflowError({"tags": ["TimeoutError", "OSError"], "message": "request timed out"})
        return out


@pytest.fixture
def actuate() -> Iterator[type[FakeActuate]]:
    made: list[FakeActuate] = []

    class Factory(FakeActuate):
        def __init__(self, script: dict[str, list[Any]]) -> None:
            super().__init__(script)
            made.append(self)

    yield Factory
    for s in made:
        s.server.shutdown()


def remediate(
    fake: FakeActuate, late: dict[str, int] | None = None, refused: dict[str, int] | None = None
) -> tuple[Any, ExecutionTrace]:
    env = {
        "PITSTOP_ACTUATE_URL": fake.url,
        "PITSTOP_POLL_S": "1",
        "PITSTOP_OP_TIMEOUT_S": "10",
        "PITSTOP_VERIFY_TIMEOUT_S": "10",
        "PITSTOP_CHECK_TIMEOUT_S": "10",
        "PITSTOP_RESUME_WAIT_S": "4",
        "GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": "exec-1",
    }
    trace = ExecutionTrace()
    out = LateAnswers(REMEDIATE.read_text(), env, late or {}, refused).run(
        {"incident_id": "iabcdefgh2", "step": 1}, trace
    )
    return out, trace


def test_remediate_calls_each_op_in_order_once(actuate: type[FakeActuate]) -> None:
    fake = actuate({})
    out, _ = remediate(fake)
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "resolved"}
    assert fake.ops() == STEP_OPS
    assert {c["execution"] for c in fake.calls} == {"exec-1"}


def test_an_unconfirmed_fault_fails_the_step_before_any_disruption(actuate: type[FakeActuate]) -> None:
    """judge_corroboration's 409: the step fails at once (a page); nothing after the fence runs."""
    refused = (409, {"error": "corroboration: not confirmed on the node"})
    fake = actuate(
        {"corroboration": [(200, {"done": False}), (200, {"done": True})], "judge_corroboration": [refused]}
    )
    out, _ = remediate(fake)
    assert out["outcome"] == "failed" and out["stage"] == "corroborate"
    assert fake.ops() == [
        "claim",
        "fence",
        "corroborate",
        "corroboration",
        "corroboration",
        "judge_corroboration",
        "fail",
    ]


def test_no_corroboration_run_goes_straight_to_its_judge(actuate: type[FakeActuate]) -> None:
    fake = actuate({"corroborate": [(200, {"run": False, "why": "a record-only action"})]})
    out, _ = remediate(fake)
    assert out["outcome"] == "resolved"
    assert fake.ops()[1:4] == ["fence", "corroborate", "judge_corroboration"]


def test_diagnose_and_validate_wait_for_their_runs_then_judge(actuate: type[FakeActuate]) -> None:
    running = (200, {"done": False})
    fake = actuate(
        {
            "diagnose": [(200, {"run": True})],
            "diagnosis": [running, running, (200, {"done": True})],
            "validate": [(200, {"run": True})],
            "validation": [running, (200, {"done": True})],
            "resumed": [running, running],
        }
    )
    out, _ = remediate(fake)
    assert out["outcome"] == "resolved"
    ops = fake.ops()
    assert ops[ops.index("diagnose") :][:5] == [
        "diagnose",
        "diagnosis",
        "diagnosis",
        "diagnosis",
        "judge_diagnosis",
    ]
    assert ops[ops.index("validate") :][:5] == [
        "validate",
        "validation",
        "validation",
        "revalidate",
        "judge_validation",
    ]
    assert ops.index("judge_diagnosis") < ops.index("act") and ops.index("judge_validation") < ops.index(
        "unfence"
    )
    assert ops.count("resumed") == 3 and ops[-1] == "close"


def test_a_shortfall_waits_for_the_second_peers_run_before_the_judge(actuate: type[FakeActuate]) -> None:
    running = (200, {"done": False})
    fake = actuate(
        {
            "validate": [(200, {"run": True})],
            "revalidate": [(200, {"run": True, "peer": "a3-node-010"})],
            "revalidation": [running, running, (200, {"done": True})],
        }
    )
    out, _ = remediate(fake)
    assert out["outcome"] == "resolved"
    ops = fake.ops()
    assert ops[ops.index("revalidate") :][:5] == [
        "revalidate",
        "revalidation",
        "revalidation",
        "revalidation",
        "judge_validation",
    ]


def test_checks_that_never_finish_are_judged_when_the_wait_runs_out(actuate: type[FakeActuate]) -> None:
    fake = actuate({"diagnose": [(200, {"run": True})], "diagnosis": [(200, {"done": False})] * 40})
    out, _ = remediate(fake)
    assert out["outcome"] == "resolved"  # judge_diagnosis decides (a step-down), the step goes on
    assert 10 <= fake.ops().count("diagnosis") <= 12 and "judge_diagnosis" in fake.ops()


def test_a_failed_validation_fails_the_step_before_the_node_returns(actuate: type[FakeActuate]) -> None:
    refusal = (409, {"error": "validation failed: DCGM diagnostic failed", "retryable": False})
    fake = actuate({"validate": [(200, {"run": True})], "judge_validation": [refusal]})
    out, _ = remediate(fake)
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "failed", "stage": "validate"}
    assert "unfence" not in fake.ops() and fake.ops()[-1] == "fail"


def test_remediate_asks_again_for_a_lost_answer_and_an_op_long_in_progress(
    actuate: type[FakeActuate],
) -> None:
    busy = (503, {"error": "act of step 1 is in progress", "retryable": True, "in_progress": True})
    # act: the connection drops after the request went out, then actuate says "in progress" for
    # longer than one round of retries (6), then answers; unfence's first answer comes too late
    fake = actuate({"act": [DROP, *[busy] * 8]})
    out, trace = remediate(fake, late={"unfence": 1})
    assert out["outcome"] == "resolved"
    assert fake.ops().count("act") == 10
    assert fake.ops().count("unfence") == 2
    assert "fail" not in fake.ops()
    assert trace.steps.count("next_round") == 3  # act took three rounds, unfence two


def test_actuate_refusing_connections_longer_than_a_retry_window_is_asked_again_in_rounds(
    actuate: type[FakeActuate],
) -> None:
    """actuate's instance crashed after an effect and is starting again (a cold start under load can
    outlast one retry window of 7 attempts): a connection never made is safe to ask again."""
    out, trace = remediate(fake := actuate({}), refused={"act": 9})
    assert out["outcome"] == "resolved"
    assert fake.ops().count("act") == 1  # the nine refused never reached it
    assert trace.steps.count("next_round") == 1 and "fail" not in fake.ops()


def test_remediate_does_not_ask_again_after_a_final_refusal(actuate: type[FakeActuate]) -> None:
    fake = actuate({"act": [(403, {"error": "forbidden", "retryable": False})]})
    out, _ = remediate(fake)
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "failed", "stage": "act"}
    assert fake.ops() == [*STEP_OPS[: STEP_OPS.index("act") + 1], "fail"]
    fail = fake.calls[-1]
    assert fail["extra"]["stage"] == "act" and fail["extra"]["error"]["code"] == 403


def test_remediate_gives_up_after_its_rounds(actuate: type[FakeActuate]) -> None:
    fake = actuate({"fence": [DROP] * 40})
    out, _ = remediate(fake)
    assert out["outcome"] == "failed" and out["stage"] == "fence"
    assert fake.ops().count("fence") == 4  # a dropped connection is not retried at once: one per round
    assert fake.calls[-1]["extra"]["error"]["tags"] == ["ConnectionError"]


def test_a_failing_claim_is_recorded_as_a_failure(actuate: type[FakeActuate]) -> None:
    fake = actuate({"claim": [(500, "Internal Server Error")]})
    out, _ = remediate(fake)
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "failed", "stage": "claim"}
    assert fake.ops() == ["claim", "fail"]


def test_an_unrecorded_failure_ends_the_execution_in_error(actuate: type[FakeActuate]) -> None:
    fake = actuate({"claim": [(500, "boom")], "fail": [(500, "still broken")]})
    with pytest.raises(WorkflowError) as ei:
        remediate(fake)
    err = ei.value.value
    assert err["tags"] == ["UnrecordedFailure"] and err["stage"] == "claim"
    assert err["error"]["code"] == 500 and err["record_error"]["code"] == 500
    assert fake.ops() == ["claim", "fail"]


def test_a_vertex_job_is_resubmitted_then_closed_and_a_lost_answer_asked_again(
    actuate: type[FakeActuate],
) -> None:
    """Plan ``resubmit`` (a Vertex AI job): claim, resubmit, close; nothing of a node is touched. The
    resubmission's answer lost after it landed is asked again (actuate's step record answers)."""
    claim = {"ours": True, "why": "", "plan": "resubmit", "action": "RESCHEDULE_JOB"}
    fake = actuate({"claim": [(200, claim)], "resubmit": [(200, {"outcome": "resubmitted"})] * 2})
    out, _ = remediate(fake, late={"resubmit": 1})
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "resolved"}
    assert fake.ops() == ["claim", "resubmit", "resubmit", "close"]


def test_a_stale_execution_stops_without_failing(actuate: type[FakeActuate]) -> None:
    fake = actuate({"claim": [(200, {"ours": False, "why": "superseded by step 2", "plan": "remediate"})]})
    out, _ = remediate(fake)
    assert out["outcome"] == "stale" and fake.ops() == ["claim"]


def test_an_escalation_hands_over_before_the_node_returns(actuate: type[FakeActuate]) -> None:
    answer = {"outcome": "escalated to REBOOT_NODE (step 2)", "handed_over": True}
    fake = actuate({"escalate": [(200, answer)]})
    out, _ = remediate(fake)
    assert out == {"incident": "iabcdefgh2", "step": 1, "outcome": "escalated to REBOOT_NODE (step 2)"}
    assert fake.ops() == STEP_OPS[: STEP_OPS.index("escalate") + 1]  # no unfence, no late requeue


def test_mutations_and_probes_use_their_retry_predicates() -> None:
    import yaml

    doc = yaml.safe_load(REMEDIATE.read_text())

    def calls(steps: Any) -> Iterator[dict[str, Any]]:
        for item in steps or []:
            for body in item.values():
                if isinstance(body, dict):
                    if "call" in body:
                        yield body
                    for key in ("steps",):
                        yield from calls(body.get(key))
                    if isinstance(body.get("try"), dict):
                        yield from calls(body["try"].get("steps") or [{"t": body["try"]}])
                    yield from calls((body.get("except") or {}).get("steps"))

    main = list(calls(doc["main"]["steps"]))
    posts = {c["call"] for c in main}
    assert "http.post" not in posts  # every actuate call goes through mutate or probe
    mutated = {c["args"]["op"] for c in main if c["call"] == "mutate"}
    polled = {c["args"]["op"] for c in main if c["call"] == "poll"}
    # every effect through mutate (asked again only where safe), every probe through poll
    assert mutated == {"claim", *(str(o) for o in MUTATING_OPS)}
    assert polled == {str(o) for o in PROBE_OPS}
    assert (
        doc["mutate"]["steps"][1]["ask"]["retry"]["predicate"]
        == "${http.default_retry_predicate_non_idempotent}"
    )
    assert doc["probe"]["steps"][0]["ask"]["retry"]["predicate"] == "${http.default_retry_predicate}"
