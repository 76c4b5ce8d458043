"""Slurm as a scheduler: commands to the cluster's pitstop-slurm-agent over Pub/Sub, answers read
back from Firestore (core/slurm_wire.py is the protocol both sides share).

:class:`SlurmAgentClient` speaks the agent's own answers; :class:`SlurmScheduler` is the typed
contract of core/scheduling.py over it, which is what actuate holds.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    FenceAnswer,
    GangCheckStart,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    StepRef,
    UnfenceAnswer,
)
from pitstop.core.slurm_wire import (
    COMMAND_DEADLINE_S,
    COMMAND_ID,
    FINAL_STATES,
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_RUNNING,
    RESULT_TRANSIENT,
    STATE_ORDER,
    expand_hostlist,
    result_state,
    supersedes,
)

PULL_MAX = 100  # results merged per pull
PULL_TIMEOUT_S = 5.0


class ResultsMerger:
    """actuate's side of a cluster's results topic: pulls what its agent published and merges it
    into ``<prefix>_slurm_results`` (forward only, in a transaction), so every actuate instance
    reads every command's answer from Firestore, whichever instance pulled the message.

    Each merged record carries ``source`` (the subscription it came through): only the cluster's
    own agent may publish to its topic, so a record of another source is another agent's forgery.
    """

    def __init__(self, subscriber: Any, subscription: str, results: Any) -> None:
        self.subscriber, self.subscription, self.results = subscriber, subscription, results

    def pull(self) -> int:
        """Merge what is waiting now (up to PULL_MAX) and acknowledge it; how many messages came.

        Never waits for messages; Pub/Sub trouble is logged and the caller reads Firestore anyway.
        """
        try:
            with warnings.catch_warnings():  # return_immediately is deprecated, and exactly what is meant
                warnings.simplefilter("ignore", DeprecationWarning)
                resp = self.subscriber.pull(
                    request={
                        "subscription": self.subscription,
                        "max_messages": PULL_MAX,
                        "return_immediately": True,
                    },
                    timeout=PULL_TIMEOUT_S,
                )
        except Exception as exc:
            log.emit(
                "WARNING", "slurm results: pull failed", subscription=self.subscription, error=str(exc)[:300]
            )
            return 0
        acks = []
        for received in resp.received_messages:
            doc = self._parse(received.message)
            try:
                if doc is not None:
                    self._merge(doc)
            except Exception as exc:  # left unacknowledged: redelivered after its ack deadline
                log.emit("WARNING", "slurm results: merge failed", id=doc and doc["id"], error=str(exc)[:300])
                continue
            acks.append(received.ack_id)
        if acks:
            try:
                self.subscriber.acknowledge(request={"subscription": self.subscription, "ack_ids": acks})
            except Exception as exc:  # redelivered, merged again: harmless
                log.emit("WARNING", "slurm results: ack failed", error=str(exc)[:300])
        return len(resp.received_messages)

    def _parse(self, message: Any) -> dict[str, Any] | None:
        """A result message, checked: a JSON object whose ``id`` is a command id and matches its
        attribute, in a known state. Anything else is logged and dropped (acknowledged)."""
        try:
            doc = json.loads(message.data)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("id"), str)
            or COMMAND_ID.fullmatch(doc["id"]) is None
            or dict(message.attributes).get("id") != doc["id"]
            or result_state(doc) not in STATE_ORDER
        ):
            log.emit("ERROR", "slurm results: malformed result dropped", subscription=self.subscription)
            return None
        return {**doc, "source": self.subscription}

    def _merge(self, doc: dict[str, Any]) -> bool:
        """Write the result if it moves the record forward, atomically with reading the record."""
        from google.cloud import firestore

        ref = self.results.document(doc["id"])

        @firestore.transactional
        def forward(tx: Any) -> bool:
            snap = ref.get(transaction=tx)
            if not supersedes(doc, snap.to_dict() if snap.exists else None):
                return False
            tx.set(ref, doc)
            return True

        moved: bool = forward(self.results._client.transaction())  # the collection's own client
        return moved


class SlurmAgentClient:
    """Commands to the cluster's pitstop-slurm-agent over Pub/Sub; results read back from Firestore.

    The agent has no Firestore access: it publishes results to its cluster's results topic, and
    before every read ``merger`` (when given) pulls what is waiting there into Firestore.

    Command ids are deterministic per (context, operation, arguments), so a retried actuate
    call waits for the same command instead of sending another; read-only probes add a
    time bucket so each poll sees fresh state.

    The agent runs each command id once (it claims the result document before running it).
    What a call sees: ``done`` → the result; ``failed`` → a final ActuatorError (409: the
    workflow does not retry it; the same answer is replayed to every later call); no document,
    ``transient`` (the last attempt hit a passing Slurm hiccup) or ``running`` whose claim ran
    out (the agent died) → the command is published again (same id, fresh deadline) so an agent
    runs a new attempt; ``running`` → wait. Still unanswered after ``wait_s`` → a retryable 503.
    """

    def __init__(
        self,
        publisher: Any,
        topic: str,
        results: Any,
        wait_s: float = 20.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        merger: ResultsMerger | None = None,
    ) -> None:
        self.publisher, self.topic, self.results = publisher, topic, results
        self.wait_s, self.clock, self.sleep = wait_s, clock, sleep
        self.merger = merger

    def _read(self, ref: Any) -> dict[str, Any] | None:
        """The command's record after merging what its agent has published; None when there is none."""
        if self.merger is not None:
            self.merger.pull()
        snap = ref.get()
        res: dict[str, Any] | None = (snap.to_dict() or {}) if snap.exists else None
        source = res.get("source") if res is not None else None
        if source is not None and self.merger is not None and source != self.merger.subscription:
            # only this cluster's agent publishes to its topic: another cluster's agent made this up
            raise ActuatorError(409, f"slurm result {ref.id} came from another cluster ({source})", False)
        return res

    def _needs_attempt(self, res: Mapping[str, Any] | None) -> bool:
        """Whether an agent must be asked (again) to run the command."""
        if res is None:
            return True
        state = result_state(res)
        if state == RESULT_TRANSIENT:
            return True
        if state == RESULT_RUNNING:
            try:
                return float(res.get("claim_until", 0)) < self.clock()
            except (TypeError, ValueError):
                return True
        return False

    def _call(self, op: str, args: dict[str, Any], ref: StepRef, fresh: bool = False) -> Any:
        digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
        cid = f"{ref.key}-{op}-{digest}".lower().replace("_", "-")
        if fresh:
            cid += f"-{int(self.clock() // 2)}"
        doc = self.results.document(cid)
        res = self._read(doc)
        if self._needs_attempt(res):
            now = self.clock()
            cmd = {"id": cid, "op": op, "args": args, "issued_at": now, "deadline": now + COMMAND_DEADLINE_S}
            self.publisher.publish(self.topic, json.dumps(cmd).encode(), op=op).result(timeout=30)
        deadline = self.clock() + self.wait_s
        while res is None or result_state(res) not in FINAL_STATES:
            if self.clock() >= deadline:
                break
            self.sleep(0.2)
            res = self._read(doc)
        if res is None:
            raise ActuatorError(503, f"slurm agent has not answered {op} yet", True)
        state = result_state(res)
        if state == RESULT_DONE:
            return res.get("result")
        if state == RESULT_FAILED:
            why = "refused" if res.get("refused") else "failed"
            raise ActuatorError(409, f"slurm {op} {why}: {res.get('error')}", False)
        if state == RESULT_TRANSIENT:
            raise ActuatorError(
                503, f"slurm {op}: transient failure, will be tried again: {res.get('error')}", True
            )
        if state == RESULT_RUNNING:
            raise ActuatorError(503, f"slurm {op} is still running (attempt {res.get('attempt', 1)})", True)
        raise ActuatorError(409, f"slurm {op}: unknown result state {state!r}", False)

    def jobs_on(self, node: str, ref: StepRef) -> list[dict[str, Any]]:
        """The jobs on the node, each with its run (``restarts``, ``start_time``) as Slurm shows it."""
        jobs: list[dict[str, Any]] = self._call("jobs_on_node", {"node": node}, ref)
        return jobs

    def fence(self, node: str, ref: StepRef, action: str) -> dict[str, Any]:
        """Drain the node for this incident, unless someone else already took it out of service.

        The answer says what was there before: ``previous_state``, ``previous_reason`` and
        ``already_drained_by_other`` (then Pitstop left the node and its reason alone).
        """
        res: dict[str, Any] | None = self._call(
            "drain", {"node": node, "incident": ref.incident, "action": action}, ref
        )
        return res or {}

    def checkpoint(self, job: str, signal: str, ref: StepRef) -> None:
        self._call("signal", {"job": job, "signal": signal}, ref)

    def job_info(self, job: str, ref: StepRef) -> dict[str, Any]:
        """The job now: ``state``, ``restarts`` and ``start_time`` (``scontrol show job``), asked fresh."""
        info: dict[str, Any] = self._call("job_state", {"job": job}, ref, fresh=True)
        return info

    def job_state(self, job: str, ref: StepRef) -> str:
        return str(self.job_info(job, ref)["state"])

    def job_running(self, job: str, ref: StepRef) -> bool:
        return self.job_state(job, ref) in ("RUNNING", "COMPLETING", "SUSPENDED")

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        state = str(self._call("node_state", {"node": node}, ref, fresh=True)["state"])
        # "*" marks a node whose slurmd does not respond (e.g. IDLE*+DRAIN).
        return "*" not in state and not any(b in state for b in ("DOWN", "NOT_RESPONDING", "FAIL", "UNKNOWN"))

    def unfence(self, node: str, ref: StepRef) -> dict[str, Any]:
        """Resume the node only if the drain on it is Pitstop's own for this incident.

        A node drained for another reason stays drained; the answer then carries
        ``left_drained: <reason>``.
        """
        res: dict[str, Any] = self._call("resume", {"node": node, "incident": ref.incident}, ref)
        return res

    def requeue(self, job: str, ref: StepRef) -> dict[str, Any]:
        res: dict[str, Any] = self._call("requeue", {"job": job}, ref) or {}
        return res

    def capacity(self, job: str, node: str, ref: StepRef) -> dict[str, Any]:
        """Idle healthy unreserved nodes of the job's partition plus its own healthy nodes, against
        its node count (the agent's ``capacity``, asked fresh): ``enough``, ``need``, ``free``, ``why``."""
        res: dict[str, Any] = self._call("capacity", {"job": job, "node": node}, ref, fresh=True)
        return res

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> dict[str, Any]:
        """The agent reserves the node (and a peer) for itself, lifts the drain, starts a job pinned
        there that runs the tools as job steps, and afterwards drains the node again with the same
        reason and deletes the reservation. One command id per check, so a retry waits for the
        same start; the agent answers a start delivered again with what the first one began."""
        res: dict[str, Any] = self._call("start_check", {"node": node, **_check_args(check, start=True)}, ref)
        return res

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> dict[str, Any]:
        """A fresh probe: ``done`` only once the tools ran and the node is fenced again as before."""
        res: dict[str, Any] = self._call(
            "check_result", {"node": node, **_check_args(check, start=False)}, ref, fresh=True
        )
        return res

    def start_gang_check(self, check: Mapping[str, Any], ref: StepRef) -> dict[str, Any]:
        """Start a check on every node of a running job (steps of the job itself, nothing fenced)."""
        keys = ("name", "kind", "incident", "job", "pairs", "message_bytes", "gpus", "timeout_s")
        res: dict[str, Any] = self._call("start_gang_check", {k: check[k] for k in keys if k in check}, ref)
        return res

    def gang_check_result(self, check: Mapping[str, Any], ref: StepRef) -> dict[str, Any]:
        args = {"name": check["name"], "job": check["job"]}
        res: dict[str, Any] = self._call("gang_check_result", args, ref, fresh=True)
        return res


def _check_args(check: Mapping[str, Any], start: bool) -> dict[str, Any]:
    """What the agent takes of a check (it validates every value); the rest stays here."""
    keys: tuple[str, ...] = ("name", "kind", "incident")
    if start:
        keys += ("dcgm_level", "gpus", "message_bytes", "peer", "fabric", "exclude_peers")
    return {k: check[k] for k in keys if k in check}


class SlurmScheduler:
    """The typed scheduler contract (core/scheduling.Scheduler) for one Slurm cluster."""

    name = "slurm"

    def __init__(self, client: SlurmAgentClient, signal: str = "SIGUSR1") -> None:
        self.client, self.signal = client, signal

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [_job(j) for j in self.client.jobs_on(node, ref)]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        a = self.client.fence(node, ref, action) or {}
        return FenceAnswer(
            a.get("previous_state"),
            a.get("previous_reason"),
            bool(a.get("already_drained_by_other")),
            a.get("reason"),
        )

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        a = self.client.unfence(node, ref) or {}
        left = a.get("left_drained")
        return UnfenceAnswer(bool(a.get("resumed")), str(left)[:200] if left else None)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        self.client.checkpoint(job, self.signal, ref)
        return self.signal

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return _job(self.client.job_info(job, ref), job)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return self.client.node_healthy(node, ref)

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        a = self.client.requeue(job, ref)
        how = "already pending" if a.get("already_pending") else f"requeued {a.get('requeued') or job}"
        return RequeueOutcome(job, not a.get("already_pending"), how)

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        a = self.client.capacity(job, node, ref)
        return Capacity(a.get("enough") is True, str(a.get("why") or ""), a.get("need"), a.get("free"))

    def start_check(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckStart:
        a = self.client.start_check(node, check, ref)
        return CheckStart(str(a.get("started") or check.get("name")), a.get("peer"), a.get("note"))

    def check_result(self, node: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        a = self.client.check_result(node, check, ref)
        outputs = a.get("outputs") if isinstance(a.get("outputs"), Mapping) else {}
        return CheckResult(
            bool(a.get("done")), dict(outputs or {}), a.get("peer"), a.get("error"), a.get("note")
        )

    def start_gang_check(self, job: str, check: Mapping[str, Any], ref: StepRef) -> GangCheckStart:
        a = self.client.start_gang_check({**check, "job": job}, ref)
        nodes = a.get("nodes") if isinstance(a.get("nodes"), list) else []
        return GangCheckStart(str(a.get("started") or check.get("name")), tuple(str(n) for n in nodes or []))

    def gang_check_result(self, job: str, check: Mapping[str, Any], ref: StepRef) -> CheckResult:
        a = self.client.gang_check_result({**check, "job": job}, ref)
        outputs = a.get("outputs") if isinstance(a.get("outputs"), Mapping) else {}
        codes = a.get("exit_codes") if isinstance(a.get("exit_codes"), Mapping) else {}
        return CheckResult(
            bool(a.get("done")),
            dict(outputs or {}),
            None,
            a.get("error"),
            a.get("note"),
            {str(k): int(v) for k, v in (codes or {}).items() if isinstance(v, int)},
        )


def _job(doc: Mapping[str, Any], job: str | None = None) -> JobInfo:
    """A job as the agent describes it (``id`` or ``job``, ``state``, its run)."""
    name = str(job or doc.get("id") or doc.get("job"))
    return JobInfo(name, JobState.of(doc.get("state")), JobRun.of(doc), expand_hostlist(doc.get("nodelist")))
