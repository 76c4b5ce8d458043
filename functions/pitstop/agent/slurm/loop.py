"""The agent's loop: parse a command, claim it through the step runner, run it, publish every state of it."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from pitstop.adapters import log
from pitstop.agent.slurm.commands import (
    SlurmCommands,
)
from pitstop.agent.slurm.ledger import Ledger, LedgerSteps, as_number, as_result
from pitstop.agent.slurm.text import (
    CLAIM_S,
    KEEP_S,
    PRUNE_EVERY_S,
    PUBLISH_TIMEOUT_S,
    CommandRefusedError,
    is_transient,
)
from pitstop.core.domain import JsonObject
from pitstop.core.slurm_wire import (
    COMMAND_ID,
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_TRANSIENT,
    Result,
    result_state,
)
from pitstop.core.steps import DONE, BusyError, Claim, ClaimLostError, Release, StepRunner, record_state

# A command as it came off the wire (core/slurm_wire.Command), only its id checked: each other field
# is checked where it is read (the deadline as a number, the op against the table, each argument by
# its op), so a malformed one is refused, never run.
Received = Mapping[str, object]


class Delivery(Protocol):
    """One Pub/Sub delivery of a command (google.cloud.pubsub_v1's subscriber Message): its body,
    acknowledged once answered, else nacked so Pub/Sub delivers it again."""

    @property
    def data(self) -> bytes: ...

    def ack(self) -> None: ...

    def nack(self) -> None: ...


class ResultSink(Protocol):
    """Where the agent answers (ResultsTopic; tests may record instead)."""

    def send(self, doc: Result) -> None: ...


class ResultsTopic:
    """The cluster's results topic: each command id is one ordered stream (``ordering_key``).

    ``send`` waits until Pub/Sub has the message and raises if it could not be published, so a
    caller can leave the command unacknowledged and answer again on its redelivery.
    """

    def __init__(self, topic: str, publisher: Any = None, credentials: Any = None) -> None:
        """``publisher``: a PublisherClient (untyped library); ``credentials``: google.auth's, or
        None for the default (agent/slurm/credentials.py)."""
        if publisher is None:
            from google.cloud.pubsub_v1 import PublisherClient
            from google.cloud.pubsub_v1.types import PublisherOptions

            options = PublisherOptions(enable_message_ordering=True)
            publisher = PublisherClient(publisher_options=options, credentials=credentials)
        self.topic, self.publisher = topic, publisher

    def send(self, doc: Result) -> None:
        cid, state = str(doc["id"]), result_state(doc)
        data = json.dumps(doc, default=str).encode()
        try:
            self.publisher.publish(self.topic, data, ordering_key=cid, id=cid, state=state).result(
                timeout=PUBLISH_TIMEOUT_S
            )
        except Exception:
            # A failed publish pauses its ordering key; resumed, the redelivery's answer can go out.
            with contextlib.suppress(Exception):
                self.publisher.resume_publish(self.topic, cid)
            raise


class Agent:
    """Claims, runs and answers commands; each command id is one step of core/steps.StepRunner
    over the SQLite ledger (LedgerSteps), so "running" is recorded before any Slurm call."""

    def __init__(
        self,
        commands: SlurmCommands,
        ledger: Ledger,
        results: ResultSink,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        claim_s: float = CLAIM_S,
    ) -> None:
        self.commands, self.ledger, self.results, self.clock = commands, ledger, results, clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.claim_s = claim_s
        self.steps = LedgerSteps(ledger, clock)
        self.runner: StepRunner[int] = StepRunner(self.steps, claim_s, clock, _warn)
        self.handled = 0

    @staticmethod
    def _parse(raw: bytes) -> tuple[str, Received] | None:
        """A Pub/Sub body as (its command id, the body): only the id is checked here."""
        try:
            cmd: object = json.loads(raw)
            cid = cmd.get("id") if isinstance(cmd, dict) else None
            if not isinstance(cmd, dict) or not isinstance(cid, str) or COMMAND_ID.fullmatch(cid) is None:
                raise CommandRefusedError("command without a valid id")
        except (json.JSONDecodeError, UnicodeDecodeError, CommandRefusedError) as exc:
            log.emit("ERROR", "slurm agent: malformed command dropped", reason=str(exc))
            return None
        return cid, cmd

    def handle(self, raw: bytes) -> Result | None:
        """One delivery of a command → the result document it recorded, or None when it ran nothing.

        None: malformed, already answered (the answer is published again), being run by another
        delivery, or an expired copy. Raises when a final answer could not be published (the
        caller nacks; the redelivery publishes it again from the ledger).
        """
        parsed = self._parse(raw)
        if parsed is None:
            return None
        cid, cmd = parsed
        now = self.clock()
        deadline = as_number(cmd.get("deadline", 0))
        if now > deadline:
            return self._refuse_expired(cid, cmd, now, deadline)
        doc = self._run(cid, cmd)
        if doc is None:
            return None
        self.results.send(doc)
        self.handled += 1
        log.emit(
            "INFO" if doc["ok"] else "WARNING",
            "slurm agent: command done",
            id=cid,
            op=cmd.get("op"),
            state=doc["state"],
            attempt=doc.get("attempt"),
            error=doc.get("error"),
        )
        return doc

    def _run(self, cid: str, cmd: Received) -> Result | None:
        """The command as one step: a known answer published again (None), a live claim of another
        delivery left to it (None), or claimed, run and recorded (its row)."""
        payload = {"op": cmd.get("op"), "id": cid, "args": cmd.get("args")}
        try:
            doc = self.runner.run(cid, payload, lambda claim: self._attempt(cmd, claim), self.owner)
        except ClaimLostError:
            row = self.steps.row(cid)
            log.emit("ERROR", "slurm agent: claim lost while running; result not recorded", id=cid,
                     owner=(row or {}).get("owner"), state=result_state(row) if row else None)  # fmt: skip
            return None
        except BusyError as exc:
            log.emit("INFO", "slurm agent: command is being run by another delivery; left to it",
                     id=cid, owner=exc.held.get("owner"))  # fmt: skip
            return None
        if doc.pop("replayed", False):
            self._replay(cid, as_result(doc))
            return None
        return as_result(doc)

    def _attempt(self, cmd: Received, claim: Claim) -> JsonObject | Release:
        """Inside the claim: announce it, run the command, and say what to record (a transient
        failure releases the claim, keeping its answer, so the next delivery runs it again). The
        answer is a Result, handed to the runner as the free-form JSON it keeps unread."""
        row: Result = self.steps.row(claim.key) or {}
        if claim.attempt > 1:
            log.emit("INFO", "slurm agent: command taken over for a new attempt", id=claim.key,
                     attempt=claim.attempt, previous_error=row.get("previous_error"))  # fmt: skip
        self._announce(row)
        doc: Result = {**row, **self._execute(cmd, claim.attempt)}
        if doc["state"] == RESULT_TRANSIENT:
            return Release(dict(doc), str(doc["error"]), keep=True)
        return dict(doc)

    def _replay(self, cid: str, doc: Result) -> None:
        """A known final answer, published again: the earlier message may have been lost."""
        log.emit("INFO", "slurm agent: command already answered; answer published again", id=cid)
        self.results.send(doc)

    def _announce(self, doc: Result) -> None:
        """Publish a claim (``running``); best effort: the final answer is what actuate waits for."""
        try:
            self.results.send(doc)
        except Exception as exc:
            log.emit("WARNING", "slurm agent: claim not published", id=doc.get("id"), error=str(exc)[:300])

    def _refuse_expired(self, cid: str, cmd: Received, now: float, deadline: float) -> Result | None:
        """An expired command never runs. Never seen: its refusal is recorded as its outcome by the
        step runner, as any command's; answered already: the answer again; known and not answered
        (a fresher copy carries its retry): this stale copy is left."""
        op = cmd.get("op")
        doc: Result = {
            "id": cid,
            "op": op if isinstance(op, str) or op is None else str(op),
            "state": RESULT_FAILED,
            "ok": False,
            "refused": True,
            "transient": False,
            "result": None,
            "error": f"command expired {int(now - deadline)} s ago; not replayed",
            "owner": self.owner,
            "attempt": 0,
            "done_at": now,
        }
        known = self.steps.read(cid)
        if known is not None and record_state(known.record) != DONE:  # a live command's stale copy
            log.emit("INFO", "slurm agent: expired copy of a known command ignored", id=cid)
            return None
        payload = {"op": cmd.get("op"), "id": cid, "args": cmd.get("args")}
        try:  # through the step runner, as every command: the refusal is this command's one outcome
            got = self.runner.run(cid, payload, lambda claim: cast(JsonObject, dict(doc)), self.owner)
        except (BusyError, ClaimLostError):  # another delivery holds it: it answers
            log.emit("INFO", "slurm agent: expired copy of a command another delivery holds", id=cid)
            return None
        if got.pop("replayed", False):  # seen before and answered: the answer, again
            self._replay(cid, as_result(got))
            return None
        self.results.send(doc)
        self.handled += 1
        log.emit("WARNING", "slurm agent: expired command refused", id=cid, op=op)
        return doc

    def _execute(self, cmd: Received, attempt: int) -> Result:
        """Run the op; its answer, or why it was refused or failed (transient or final)."""
        result: Result = {
            "state": RESULT_DONE,
            "ok": True,
            "refused": False,
            "transient": False,
            "result": None,
            "error": None,
        }
        try:
            result["result"] = self.commands.execute(str(cmd.get("op")), cmd.get("args") or {})
        except CommandRefusedError as exc:
            result.update({"state": RESULT_FAILED, "ok": False, "refused": True, "error": str(exc)})
        except Exception as exc:  # classified, recorded: never an endless redelivery
            transient = is_transient(exc)
            result.update(
                {
                    "state": RESULT_TRANSIENT if transient else RESULT_FAILED,
                    "ok": False,
                    "transient": transient,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
            )
        result.update({"done_at": self.clock(), "attempt": attempt})
        return result

    def prune(self) -> None:
        """Forget rows older than KEEP_S (the ledger stays bounded)."""
        gone = self.ledger.prune(self.clock() - KEEP_S)
        if gone:
            log.emit("INFO", "slurm agent: old ledger rows deleted", rows=gone)

    def serve(self, subscription: str, stop: threading.Event, credentials: Any = None) -> None:
        from google.cloud.pubsub_v1 import SubscriberClient

        sub = SubscriberClient(credentials=credentials)

        def callback(message: Delivery) -> None:
            try:
                self.handle(message.data)
                message.ack()
            except Exception as exc:  # an answer not published (or a ledger error): let Pub/Sub redeliver
                log.emit("ERROR", "slurm agent: command failed, will be redelivered", error=str(exc)[:300])
                message.nack()

        future = sub.subscribe(subscription, callback)
        self.prune()
        while not stop.wait(PRUNE_EVERY_S):
            self.prune()
        future.cancel()
        sub.close()


def _warn(message: str, fields: Mapping[str, str]) -> None:
    log.emit("WARNING", f"slurm agent: {message}", **fields)
