"""The scheduler side of a remediation, behind one interface (Slurm today; GKE can follow).

The workflow never knows which scheduler a cluster runs: actuate maps the incident's
cluster to an adapter with these operations. A GKE adapter would cordon (fence), evict
honouring PDBs (checkpoint), and restart the JobSet or Kueue workload (requeue).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError

COMMAND_DEADLINE_S = 300.0

# -- the results of Slurm commands (``<prefix>_slurm_results/<command id>``) -------------------------
# Shared with pitstop.agent.slurm, which imports these names. One record per command id, moved
# through these states: the agent claims it in its own ledger before it runs anything, publishes
# every state to its cluster's results topic, and actuate merges them into Firestore (ResultsMerger).
RESULT_RUNNING = "running"  # claimed: an agent is executing it until ``claim_until`` (epoch s)
RESULT_DONE = "done"  # executed; ``result`` holds the answer; replayed to every later call
RESULT_TRANSIENT = "transient"  # the last attempt hit a passing Slurm hiccup; a retry runs again
RESULT_FAILED = "failed"  # final: refused (``refused``) or a Slurm error a retry would repeat
FINAL_STATES = frozenset({RESULT_DONE, RESULT_FAILED})
# How far along a command's record is within one attempt; a later attempt is further still.
_STATE_ORDER = {RESULT_RUNNING: 0, RESULT_TRANSIENT: 1, RESULT_DONE: 2, RESULT_FAILED: 2}
_COMMAND_ID = re.compile(r"[-a-z0-9_]{1,128}")
PULL_MAX = 100  # results merged per pull
PULL_TIMEOUT_S = 5.0

# Every drain Pitstop sets carries this reason, so it can tell its own fences from other people's.
DRAIN_REASON_PREFIX = "pitstop "
_INCIDENT = re.compile(r"i[a-z2-7]{9}")


def drain_reason(incident: str, action: str) -> str:
    """The Slurm reason of Pitstop's drain for one incident (validated parts only)."""
    return f"{DRAIN_REASON_PREFIX}{incident} {action}"


def result_state(doc: Mapping[str, Any]) -> str:
    """A result document's state; documents from agents before the claim protocol have only ``ok``."""
    state = doc.get("state")
    if isinstance(state, str) and state:
        return state
    return RESULT_DONE if doc.get("ok") else RESULT_FAILED


def _attempt(doc: Mapping[str, Any]) -> int:
    v = doc.get("attempt")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def supersedes(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether a result moves a command's record forward, so messages arriving late or twice
    never undo what is known: nothing replaces a final state (done, failed); a final state
    replaces any other; otherwise a later attempt wins, and within one attempt running <
    transient (a late ``running`` never hides the transient answer of its own attempt)."""
    if old is None:
        return True
    if result_state(old) in FINAL_STATES:
        return False
    if result_state(new) in FINAL_STATES:
        return True
    rank_new = (_attempt(new), _STATE_ORDER.get(result_state(new), -1))
    return rank_new > (_attempt(old), _STATE_ORDER.get(result_state(old), -1))


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
            or _COMMAND_ID.fullmatch(doc["id"]) is None
            or dict(message.attributes).get("id") != doc["id"]
            or result_state(doc) not in _STATE_ORDER
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


class Scheduler(Protocol):
    """What a remediation asks of a cluster's scheduler.

    ``jobs_on`` and ``job_info`` describe each job with its run: ``restarts`` (how often it was
    requeued) and ``start_time`` (as the scheduler prints it), None where unknown. A job is
    requeued for a fault only while it is still the run the fault hit (pitstop.core.ops.job_run).
    """

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]: ...
    def fence(self, node: str, incident: str, action: str, ctx: str) -> dict[str, Any] | None: ...
    def checkpoint(self, job: str, signal: str, ctx: str) -> None: ...
    def job_running(self, job: str, ctx: str) -> bool: ...
    def job_state(self, job: str, ctx: str) -> str: ...
    def job_info(self, job: str, ctx: str) -> dict[str, Any]: ...
    def node_healthy(self, node: str, ctx: str) -> bool: ...
    def unfence(self, node: str, ctx: str, incident: str | None = None) -> dict[str, Any] | None: ...
    def requeue(self, job: str, ctx: str, restarts: int | None = None) -> None: ...

    def capacity(self, job: str, node: str, ctx: str) -> dict[str, Any]:
        """Whether the job's gang can run again now without ``node`` (early requeue).

        ``{"enough": bool, "need": int | None, "free": int | None, "why": str}``: ``why`` is one
        line for the incident's timeline (what was counted, or what will place the gang).
        """
        ...

    def start_check(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """Start a diagnostic or validation run pinned to the fenced node, once per ``check["name"]``.

        ``check``: ``kind`` (``diagnose`` | ``validate``), ``name`` (``pitstop-<incident>-<step>-<kind>``,
        a DNS label), ``incident``, ``dcgm_level``, ``gpus``; validate adds ``message_bytes`` and
        ``peer: true`` (one healthy peer joins the NCCL all_gather). The node stays out of other
        jobs' reach throughout. Answers ``{"started": name, "peer": str | None, "note": str}``.
        """
        ...

    def check_result(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """The run's state: ``{"done": bool, "outputs": {...}, "peer": str | None, "error": str | None}``.

        ``outputs`` holds each tool's raw stdout, never interpreted here: ``nvidia_smi_q``
        (``nvidia-smi -q``), ``nvlink`` (``nvidia-smi nvlink --status``), ``dcgm`` (``dcgmi diag -r N
        -j``) for diagnose; ``dcgm`` and ``nccl`` (``all_gather_perf``) for validate (no ``nccl``
        when no healthy peer was free: ``peer`` None and ``note`` says why).
        """
        ...


class NoScheduler:
    """Nodes outside any scheduler: nothing to fence, no jobs, healthy when the VM is."""

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]:
        return []

    def fence(self, node: str, incident: str, action: str, ctx: str) -> dict[str, Any] | None:
        return None

    def checkpoint(self, job: str, signal: str, ctx: str) -> None:
        return None

    def job_running(self, job: str, ctx: str) -> bool:
        return False

    def job_state(self, job: str, ctx: str) -> str:
        return "UNKNOWN"

    def job_info(self, job: str, ctx: str) -> dict[str, Any]:
        return {"job": job, "state": "UNKNOWN", "restarts": None, "start_time": None}

    def node_healthy(self, node: str, ctx: str) -> bool:
        return True

    def unfence(self, node: str, ctx: str, incident: str | None = None) -> dict[str, Any] | None:
        return None

    def requeue(self, job: str, ctx: str, restarts: int | None = None) -> None:
        return None

    def capacity(self, job: str, node: str, ctx: str) -> dict[str, Any]:
        return {"enough": False, "need": None, "free": None, "why": "no scheduler: nothing to requeue"}

    def start_check(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        raise ActuatorError(409, "no scheduler to run a check on the node through", False)

    def check_result(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        raise ActuatorError(409, "no scheduler to run a check on the node through", False)


class SlurmScheduler:
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

    def _call(self, op: str, args: dict[str, Any], ctx: str, fresh: bool = False) -> Any:
        digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
        cid = f"{ctx}-{op}-{digest}".lower().replace("_", "-")
        if fresh:
            cid += f"-{int(self.clock() // 2)}"
        ref = self.results.document(cid)
        res = self._read(ref)
        if self._needs_attempt(res):
            now = self.clock()
            cmd = {"id": cid, "op": op, "args": args, "issued_at": now, "deadline": now + COMMAND_DEADLINE_S}
            self.publisher.publish(self.topic, json.dumps(cmd).encode(), op=op).result(timeout=30)
        deadline = self.clock() + self.wait_s
        while res is None or result_state(res) not in FINAL_STATES:
            if self.clock() >= deadline:
                break
            self.sleep(0.2)
            res = self._read(ref)
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

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]:
        """The jobs on the node, each with its run (``restarts``, ``start_time``) as Slurm shows it."""
        jobs: list[dict[str, Any]] = self._call("jobs_on_node", {"node": node}, ctx)
        return jobs

    def fence(self, node: str, incident: str, action: str, ctx: str) -> dict[str, Any] | None:
        """Drain the node for this incident, unless someone else already took it out of service.

        The answer says what was there before: ``previous_state``, ``previous_reason`` and
        ``already_drained_by_other`` (then Pitstop left the node and its reason alone).
        """
        res: dict[str, Any] | None = self._call(
            "drain", {"node": node, "incident": incident, "action": action}, ctx
        )
        return res

    def checkpoint(self, job: str, signal: str, ctx: str) -> None:
        self._call("signal", {"job": job, "signal": signal}, ctx)

    def job_info(self, job: str, ctx: str) -> dict[str, Any]:
        """The job now: ``state``, ``restarts`` and ``start_time`` (``scontrol show job``), asked fresh."""
        info: dict[str, Any] = self._call("job_state", {"job": job}, ctx, fresh=True)
        return info

    def job_state(self, job: str, ctx: str) -> str:
        return str(self.job_info(job, ctx)["state"])

    def job_running(self, job: str, ctx: str) -> bool:
        return self.job_state(job, ctx) in ("RUNNING", "COMPLETING", "SUSPENDED")

    def node_healthy(self, node: str, ctx: str) -> bool:
        state = str(self._call("node_state", {"node": node}, ctx, fresh=True)["state"])
        # "*" marks a node whose slurmd does not respond (e.g. IDLE*+DRAIN).
        return "*" not in state and not any(b in state for b in ("DOWN", "NOT_RESPONDING", "FAIL", "UNKNOWN"))

    def unfence(self, node: str, ctx: str, incident: str | None = None) -> dict[str, Any] | None:
        """Resume the node only if the drain on it is Pitstop's own for this incident.

        The incident is the one in ``ctx`` (``<incident>-<step>``) unless given. A node drained
        for another reason stays drained; the answer then carries ``left_drained: <reason>``.
        """
        iid = incident if incident is not None else ctx.rsplit("-", 1)[0]
        if _INCIDENT.fullmatch(iid) is None:
            raise ActuatorError(400, f"cannot tell which incident's drain to lift from {ctx!r}", False)
        res: dict[str, Any] | None = self._call("resume", {"node": node, "incident": iid}, ctx)
        return res

    def requeue(self, job: str, ctx: str, restarts: int | None = None) -> None:
        self._call("requeue", {"job": job}, ctx)

    def capacity(self, job: str, node: str, ctx: str) -> dict[str, Any]:
        """Idle healthy unreserved nodes of the job's partition plus its own healthy nodes, against
        its node count (the agent's ``capacity``, asked fresh): ``enough``, ``need``, ``free``, ``why``."""
        res: dict[str, Any] = self._call("capacity", {"job": job, "node": node}, ctx, fresh=True)
        return res

    def start_check(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """The agent reserves the node (and a peer) for itself, lifts the drain, starts a job pinned
        there that runs the tools as job steps, and afterwards drains the node again with the same
        reason and deletes the reservation. One command id per check, so a retry waits for the
        same start; the agent answers a start delivered again with what the first one began."""
        res: dict[str, Any] = self._call("start_check", {"node": node, **_check_args(check, start=True)}, ctx)
        return res

    def check_result(self, node: str, check: Mapping[str, Any], ctx: str) -> dict[str, Any]:
        """A fresh probe: ``done`` only once the tools ran and the node is fenced again as before."""
        res: dict[str, Any] = self._call(
            "check_result", {"node": node, **_check_args(check, start=False)}, ctx, fresh=True
        )
        return res


def _check_args(check: Mapping[str, Any], start: bool) -> dict[str, Any]:
    """What the agent takes of a check (it validates every value); the rest stays here."""
    keys = ("name", "kind", "incident") + (("dcgm_level", "gpus", "message_bytes", "peer") if start else ())
    return {k: check[k] for k in keys if k in check}
