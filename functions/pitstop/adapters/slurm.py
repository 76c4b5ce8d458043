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
from typing import Any, cast

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.core import topology
from pitstop.core.domain import CheckSpec, GangCheckSpec, JsonObject, Place
from pitstop.core.localise import opted_in_comment
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
    CapacityAnswer,
    CheckProgress,
    CheckStarted,
    DrainAnswer,
    JobOnNode,
    JobStateAnswer,
    NodeStateAnswer,
    RequeueAnswer,
    Result,
    ResumeAnswer,
    expand_hostlist,
    result_state,
    supersedes,
)
from pitstop.core.topology import Seat

PULL_MAX = 100  # results merged per pull

# Slurm's job states (the long names squeue %T and scontrol show job JobState= print: squeue(1),
# "JOB STATE CODES", https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES) as the contract's
# JobState. A word of the contract's own meaning maps to it; every other documented state means
# something no JobState says (ended by a node's failure, a time limit or preemption; held; being
# requeued or resized) and is UNKNOWN, which remediation leaves to a person (no requeue, no
# localisation). A word not in the table (a newer Slurm's) is UNKNOWN too.
SLURM_JOB_STATES: Mapping[str, JobState] = {
    "PENDING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED,
    "COMPLETING": JobState.COMPLETING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    **dict.fromkeys(
        (
            "BOOT_FAIL",
            "CONFIGURING",
            "DEADLINE",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "PREEMPTED",
            "RESV_DEL_HOLD",
            "REQUEUE_FED",
            "REQUEUE_HOLD",
            "REQUEUED",
            "RESIZING",
            "REVOKED",
            "SIGNALING",
            "SPECIAL_EXIT",
            "STAGE_OUT",
            "STOPPED",
            "TIMEOUT",
        ),
        JobState.UNKNOWN,
    ),
}


def slurm_job_state(word: object) -> JobState:
    """The contract's state for a Slurm job state word, exactly as Slurm prints it."""
    return SLURM_JOB_STATES.get(word, JobState.UNKNOWN) if isinstance(word, str) else JobState.UNKNOWN


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

    def _parse(self, message: Any) -> Result | None:
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
        return cast(Result, {**doc, "source": self.subscription})  # its id and state checked above

    def _merge(self, doc: Result) -> bool:
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

    def _read(self, ref: Any) -> Result | None:
        """The command's record after merging what its agent has published; None when there is none."""
        if self.merger is not None:
            self.merger.pull()
        snap = ref.get()
        res: Result | None = cast(Result, snap.to_dict() or {}) if snap.exists else None
        source = res.get("source") if res is not None else None
        if source is not None and self.merger is not None and source != self.merger.subscription:
            # only this cluster's agent publishes to its topic: another cluster's agent made this up
            raise ActuatorError(409, f"slurm result {ref.id} came from another cluster ({source})", False)
        return res

    def _needs_attempt(self, res: Result | None) -> bool:
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

    def _call(self, op: str, args: JsonObject, ref: StepRef, fresh: bool = False) -> object:
        """The op's answer (the agent's, as core/slurm_wire types it: callers cast to their op's)."""
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

    def jobs_on(self, node: str, ref: StepRef) -> list[JobOnNode]:
        """The jobs on the node, each with its run (``restarts``, ``start_time``) as Slurm shows it."""
        return cast(list[JobOnNode], self._call("jobs_on_node", {"node": node}, ref) or [])

    def fence(self, node: str, ref: StepRef, action: str) -> DrainAnswer | None:
        """Drain the node for this incident, unless someone else already took it out of service.

        The answer says what was there before: ``previous_state``, ``previous_reason`` and
        ``already_drained_by_other`` (then Pitstop left the node and its reason alone).
        """
        res = self._call("drain", {"node": node, "incident": ref.incident, "action": action}, ref)
        return cast(DrainAnswer | None, res)

    def checkpoint(self, job: str, signal: str, ref: StepRef) -> None:
        self._call("signal", {"job": job, "signal": signal}, ref)

    def job_info(self, job: str, ref: StepRef) -> JobStateAnswer:
        """The job now: ``state``, ``restarts`` and ``start_time`` (``scontrol show job``), asked fresh."""
        return cast(JobStateAnswer, self._call("job_state", {"job": job}, ref, fresh=True))

    def job_state(self, job: str, ref: StepRef) -> str:
        return str(self.job_info(job, ref)["state"])

    def job_running(self, job: str, ref: StepRef) -> bool:
        return slurm_job_state(self.job_state(job, ref)).on_nodes

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        answer = cast(NodeStateAnswer, self._call("node_state", {"node": node}, ref, fresh=True))
        state = str(answer["state"])
        # "*" marks a node whose slurmd does not respond (e.g. IDLE*+DRAIN).
        return "*" not in state and not any(b in state for b in ("DOWN", "NOT_RESPONDING", "FAIL", "UNKNOWN"))

    def unfence(self, node: str, ref: StepRef) -> ResumeAnswer:
        """Resume the node only if the drain on it is Pitstop's own for this incident.

        A node drained for another reason stays drained; the answer then carries
        ``left_drained: <reason>``.
        """
        return cast(ResumeAnswer, self._call("resume", {"node": node, "incident": ref.incident}, ref))

    def requeue(self, job: str, ref: StepRef, onto: tuple[str, ...] = ()) -> RequeueAnswer:
        """Requeue the job; ``onto``: pin it to exactly these nodes while it is pending."""
        args: JsonObject = {"job": job, **({"onto": sorted(onto)} if onto else {})}
        return cast(RequeueAnswer, self._call("requeue", args, ref) or {})

    def capacity(self, job: str, node: str, ref: StepRef) -> CapacityAnswer:
        """Idle healthy unreserved nodes of the job's partition plus its own healthy nodes, against
        its node count (the agent's ``capacity``, asked fresh): ``enough``, ``need``, ``free``, ``why``."""
        return cast(CapacityAnswer, self._call("capacity", {"job": job, "node": node}, ref, fresh=True))

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStarted:
        """The agent reserves the node (and a peer) for itself, lifts the drain, starts a job pinned
        there that runs the tools as job steps, and afterwards drains the node again with the same
        reason and deletes the reservation. One command id per check, so a retry waits for the
        same start; the agent answers a start delivered again with what the first one began."""
        answer = self._call("start_check", {"node": node, **_check_args(check, start=True)}, ref)
        return cast(CheckStarted, answer)

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckProgress:
        """A fresh probe: ``done`` only once the tools ran and the node is fenced again as before."""
        args = {"node": node, **_check_args(check, start=False)}
        return cast(CheckProgress, self._call("check_result", args, ref, fresh=True))

    def start_gang_check(self, check: GangCheckSpec, ref: StepRef) -> CheckStarted:
        """Start a check on every node of a running job (steps of the job itself, nothing fenced)."""
        keys = ("name", "kind", "incident", "job", "pairs", "message_bytes", "gpus", "timeout_s")
        spec: Mapping[str, object] = check
        return cast(
            CheckStarted, self._call("start_gang_check", {k: spec[k] for k in keys if k in spec}, ref)
        )

    def gang_check_result(self, check: GangCheckSpec, ref: StepRef) -> CheckProgress:
        args: JsonObject = {"name": check["name"], "job": check["job"]}
        return cast(CheckProgress, self._call("gang_check_result", args, ref, fresh=True))


def _check_args(check: CheckSpec, start: bool) -> JsonObject:
    """What the agent takes of a check (it validates every value); the rest stays here."""
    keys: tuple[str, ...] = ("name", "kind", "incident")
    if start:
        keys += ("dcgm_level", "gpus", "message_bytes", "peer", "fabric", "exclude_peers")
    spec: Mapping[str, object] = check
    return {k: spec[k] for k in keys if k in spec}


class SlurmScheduler:
    """The typed scheduler contract (core/scheduling.Scheduler) for one Slurm cluster."""

    name = "slurm"

    def __init__(self, client: SlurmAgentClient, signal: str = "SIGUSR1") -> None:
        self.client, self.signal = client, signal

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [_job(j) for j in self.client.jobs_on(node, ref)]

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        a: Mapping[str, object] = self.client.fence(node, ref, action) or {}
        return FenceAnswer(
            _str(a.get("previous_state")),
            _str(a.get("previous_reason")),
            bool(a.get("already_drained_by_other")),
            _str(a.get("reason")),
        )

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        a: Mapping[str, object] = self.client.unfence(node, ref) or {}
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
        return self.requeue_onto(job, ref, run, ())

    def requeue_onto(self, job: str, ref: StepRef, run: JobRun, nodes: tuple[str, ...]) -> RequeueOutcome:
        """core/scheduling.Placer: requeue, pinned to ``nodes`` (none: Slurm places it)."""
        a: Mapping[str, object] = self.client.requeue(job, ref, nodes)
        how = "already pending" if a.get("already_pending") else f"requeued {a.get('requeued') or job}"
        placed = a.get("placed")
        if isinstance(placed, list) and placed:
            how += f" onto {','.join(str(n) for n in placed)}"
        return RequeueOutcome(job, not a.get("already_pending"), how)

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        a: Mapping[str, object] = self.client.capacity(job, node, ref)
        paths = a.get("paths") if isinstance(a.get("paths"), Mapping) else {}
        assert isinstance(paths, Mapping)

        def seats(names: object) -> tuple[Seat, ...]:
            listed = names if isinstance(names, list) else []
            return tuple(Seat(str(n), _place(paths.get(n))) for n in listed)

        native = a.get("native")
        own, listed = a.get("own"), a.get("nodes")
        usable = {str(n) for n in own} if isinstance(own, list) else set()
        members = [str(n) for n in listed] if isinstance(listed, list) else []
        return Capacity(
            a.get("enough") is True,
            str(a.get("why") or ""),
            _int(a.get("need")),
            _int(a.get("free")),
            gang=seats(a.get("nodes")),
            spares=seats(a.get("idle")),
            native=native if isinstance(native, str) else None,
            elastic=a.get("elastic") is True,
            unusable=tuple(n for n in members if n != node and n not in usable),
        )

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart:
        a: Mapping[str, object] = self.client.start_check(node, check, ref)
        return CheckStart(
            str(a.get("started") or check.get("name")), _str(a.get("peer")), _str(a.get("note"))
        )

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult:
        return _result(self.client.check_result(node, check, ref), peer=True)

    def start_gang_check(self, job: str, check: GangCheckSpec, ref: StepRef) -> GangCheckStart:
        a: Mapping[str, object] = self.client.start_gang_check({**check, "job": job}, ref)
        nodes = a.get("nodes")
        named = tuple(str(n) for n in nodes) if isinstance(nodes, list) else ()
        return GangCheckStart(str(a.get("started") or check.get("name")), named)

    def gang_check_result(self, job: str, check: GangCheckSpec, ref: StepRef) -> CheckResult:
        return _result(self.client.gang_check_result({**check, "job": job}, ref), peer=False)


def _place(path: object) -> Place | None:
    """A node's place from its switch path in Slurm's topology (crossed a topic: checked)."""
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        return None
    return topology.from_switches([str(p) for p in path][:8])


def _str(v: object) -> str | None:
    """A text field of the agent's answer (checked: the answer crossed a topic)."""
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _texts(v: object) -> dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, Mapping) else {}


def _result(answer: CheckProgress, peer: bool) -> CheckResult:
    """A check's progress as the contract reads it (a gang check names no single peer)."""
    a: Mapping[str, object] = answer
    codes = a.get("exit_codes")
    return CheckResult(
        bool(a.get("done")),
        _texts(a.get("outputs")),
        _str(a.get("peer")) if peer else None,
        _str(a.get("error")),
        _str(a.get("note")),
        {str(k): v for k, v in codes.items() if isinstance(v, int)} if isinstance(codes, Mapping) else {},
    )


def _job(doc: Mapping[str, object], job: str | None = None) -> JobInfo:
    """A job as the agent describes it (``id`` or ``job``, ``state``, its run)."""
    name = str(job or doc.get("id") or doc.get("job"))
    state = slurm_job_state(doc.get("state"))
    nodes = expand_hostlist(doc.get("nodelist"))
    return JobInfo(name, state, JobRun.of(doc), nodes, opted_in_comment(doc.get("comment")))
