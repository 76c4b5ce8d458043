"""One idempotent step runner: every effect Pitstop causes runs under a record claimed before it.

The shape is the one idempotency libraries use (AWS Lambda Powertools' idempotency utility, for
one): a single handler owns the record's state machine, and the effects only run inside it.

1. **Find.** A record already ``done`` answers with its saved result (a replay); a live
   ``in_progress`` claim of another attempt answers *busy* (ask again later).
2. **Claim.** ``create`` the record as ``in_progress`` with a token, the owner, the payload's hash
   and ``expires_at``; exactly one create of a key succeeds. A record whose claim expired (its
   attempt died) or was ``released`` (its attempt raised or did nothing) is taken over by a write
   conditioned on the version read; one taker wins. What an earlier attempt saved stays.
3. **Run.** The handler may ``save`` what it decided before its first effect (a retry reuses it,
   so a call made but not recorded is made again under the same request id, never a different
   call); a save fails once the claim passed to another attempt.
4. **Save or release.** The result is written ``done`` while the claim is still this attempt's; an
   attempt that raised, or that did nothing, releases its claim at once.

A record whose payload hash differs from the request's is refused: a key reused for another
request must not replay an answer that was never its own. A claim may carry a *guard*: the
precondition of the command the handler serves (for actuate: the incident's step, state and
owner), which the store checks on the record's parent document in the same atomic operation as
the claim, so nothing can change the incident between the check and the claim. The claim expiry
is derived from the deployed timeout of whoever runs the handler (``claim_seconds``): past it,
the attempt is dead.

The store is a small protocol (Firestore for actuate and notify, SQLite for the Slurm agent's
ledger in agent/slurm/ledger.py, a dict in tests), so the state machine is written, and tested, once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from pitstop.core.domain import JsonObject, StepRecord

IN_PROGRESS = "in_progress"  # claimed: an attempt runs the handler until ``expires_at``
DONE = "done"  # ``result`` holds the answer; replayed to every later call
RELEASED = "released"  # the attempt raised or did nothing; the next call runs the handler again

# How much longer than its runner's deployed timeout a claim holds: an attempt still holding it
# may be alive; past it, the platform has killed it.
CLAIM_MARGIN_S = 30.0


def claim_seconds(timeout_s: float, margin_s: float = CLAIM_MARGIN_S) -> float:
    """How long a claim holds, from the deployed timeout of the function (or agent) that runs it."""
    return float(timeout_s) + margin_s


# What identifies a request: any JSON object (the runner reads only its ``op``; the rest is hashed).
Payload = Mapping[str, object]


def payload_hash(payload: Payload) -> str:
    """A stable digest of what identifies a request (never volatile fields such as a timestamp)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def record_state(rec: StepRecord) -> str:
    """A record's state; records written before in-progress claims hold only ``result``."""
    state = rec.get("state")
    if isinstance(state, str) and state:
        return state
    return DONE if "result" in rec else RELEASED


def _expires(rec: StepRecord) -> float:
    try:
        return float(rec.get("expires_at") or 0)
    except (TypeError, ValueError):
        return 0.0


# -- the store -------------------------------------------------------------------------------------

V = TypeVar("V")


@dataclass(frozen=True)
class Stored(Generic[V]):
    """A record as read, with the version a conditioned write must find unchanged."""

    record: StepRecord
    version: V


@dataclass(frozen=True)
class Refusal:
    """Why a guard refuses a claim; ``superseded_by``: a newer step owns the parent (the caller
    winds down instead of failing); ``held``: the runtime control refused it, ``pause`` or
    ``silence`` (the caller holds the parent until the control lets it go on)."""

    why: str
    superseded_by: int | None = None
    held: str | None = None


# A claim's precondition, asked of the record's parent document (None: there is none) as the
# store reads it in the claim's own atomic operation.
Guard = Callable[[JsonObject | None], Refusal | None]


class StepStore(Protocol[V]):
    """Where records live. Each method is one atomic operation of the backing store."""

    def read(self, key: str) -> Stored[V] | None:
        """The record and its version; None when there is none."""
        ...

    def create(self, key: str, record: StepRecord, guard: Guard | None = None) -> bool:
        """Write the record unless one with this key exists (then False): one create of a key wins.
        With a guard: only if it accepts the parent document, read in the same atomic operation
        (else :class:`PreconditionError`)."""
        ...

    def replace(self, key: str, record: StepRecord, version: V, guard: Guard | None = None) -> bool:
        """Replace the record if it is still at ``version``; False when another write came first.
        With a guard, as :meth:`create`."""
        ...

    def update_held(self, key: str, token: str, fields: StepRecord) -> bool:
        """Merge ``fields`` into the record while it is in progress under ``token``; else False."""
        ...


# -- what the runner answers -----------------------------------------------------------------------


class StepError(Exception):
    """Base of the runner's refusals (never a ValueError: callers treat those as store trouble)."""


class BusyError(StepError):
    """Another attempt holds a live claim on the record: ask again later."""

    def __init__(self, key: str, held: StepRecord) -> None:
        super().__init__(
            f"{key} is in progress (attempt {held.get('attempt', 1)} of {held.get('owner')}, "
            f"claimed until {held.get('expires_at')})"
        )
        self.key, self.held = key, held.copy()


class ClaimLostError(BusyError):
    """This attempt's claim passed to another (it ran past its expiry): it must stop."""


class PayloadMismatchError(StepError):
    """The key was claimed for another request: nothing is replayed or run."""


class PreconditionError(StepError):
    """The claim's guard refused: the command's precondition does not hold; nothing ran."""

    def __init__(self, key: str, refusal: Refusal) -> None:
        super().__init__(f"{key}: {refusal.why}")
        self.key, self.refusal = key, refusal


def checked(guard: Guard | None, key: str, parent: JsonObject | None) -> None:
    """Raise PreconditionError when the guard refuses the parent document (the stores' one rule)."""
    refusal = guard(parent) if guard is not None else None
    if refusal is not None:
        raise PreconditionError(key, refusal)


@dataclass
class Claim:
    """This attempt's hold on a record, and what earlier attempts saved in it."""

    key: str
    token: str
    attempt: int
    saved: JsonObject = field(default_factory=dict)  # each handler's own, kept unread by the runner
    owner: str = ""


@dataclass(frozen=True)
class Replay:
    """The record is done: its result, as first recorded."""

    result: JsonObject  # the handler's answer, replayed unread


@dataclass(frozen=True)
class Release:
    """What a handler returns when it did nothing (or nothing final): the next call runs it afresh,
    nothing is replayed. ``keep`` leaves ``answer`` on the released record as its ``result``, for
    whoever reads the record (the Slurm agent's transient answer); it is still never replayed."""

    answer: JsonObject  # the handler's answer, passed on unread
    why: str
    keep: bool = False


# A handler's answer is free-form to the runner: it records and replays it unread (each op, sink or
# agent command has its own shape: core/domain.Fenced, Unfenced, ...).
Handler = Callable[[Claim], "JsonObject | Release"]
Logger = Callable[[str, Mapping[str, str]], None]


def _quiet(message: str, fields: Mapping[str, str]) -> None:
    return None


class StepRunner(Generic[V]):
    """Run handlers exactly once per key over a :class:`StepStore`."""

    def __init__(
        self,
        store: StepStore[V],
        claim_s: float,
        clock: Callable[[], float] = time.time,
        warn: Logger = _quiet,
    ) -> None:
        self.store, self.claim_s, self.clock, self.warn = store, claim_s, clock, warn

    # -- the whole state machine ---------------------------------------------------------------

    def run(
        self, key: str, payload: Payload, handler: Handler, owner: str = "unknown", guard: Guard | None = None
    ) -> JsonObject:
        """Replay, refuse (busy, or the guard's precondition), or claim, run, and save: the one path
        every effect takes. A done record is replayed whatever the guard says (its effect happened)."""
        begun = self.begin(key, payload, owner, guard)
        if isinstance(begun, Replay):
            return {**begun.result, "replayed": True}
        try:
            out = handler(begun)
            if isinstance(out, Release):
                self.release(begun, out.why, out.answer if out.keep else None)
                return out.answer
            self.finish(begun, out)
        except BaseException as exc:  # raised, or its result not written: the next call runs it again
            self.release(begun, f"{type(exc).__name__}: {exc}")
            raise
        return out

    def begin(
        self, key: str, payload: Payload, owner: str = "unknown", guard: Guard | None = None
    ) -> Claim | Replay:
        """Find the record or claim it: a Replay when done, a Claim when this attempt holds it.

        Raises BusyError while another attempt holds a live claim, PayloadMismatchError when the
        key belongs to another request, PreconditionError when the guard refuses the claim.
        """
        digest = payload_hash(payload)
        if guard is not None:  # a done record is replayed before any guard is asked: its effect happened
            done = self.store.read(key)
            if done is not None and record_state(done.record) == DONE:
                return self._over(key, done.record, digest) or Replay({})
        for _ in range(3):  # a record deleted between create and read is simply tried again
            fresh = self._fresh_claim(payload, digest, owner)
            if self.store.create(key, fresh, guard):
                return self._held(key, fresh, {})
            got = self.store.read(key)
            if got is None:
                continue
            verdict = self._over(key, got.record, digest)
            if verdict is not None:
                return verdict
            taken: StepRecord = {**fresh, "attempt": int(got.record.get("attempt") or 1) + 1}
            if got.record.get("saved"):
                taken["saved"] = dict(got.record.get("saved") or {})
            if self.store.replace(key, taken, got.version, guard):
                return self._held(key, taken, dict(got.record.get("saved") or {}))
        raise BusyError(key, {})

    def _fresh_claim(self, payload: Payload, digest: str, owner: str) -> StepRecord:
        now = self.clock()
        return {
            "state": IN_PROGRESS,
            "op": str(payload.get("op") or ""),
            "owner": owner or "unknown",
            "token": uuid.uuid4().hex,
            "payload_hash": digest,
            "attempt": 1,
            "claimed_at": now,
            "expires_at": now + self.claim_s,
        }

    @staticmethod
    def _held(key: str, rec: StepRecord, saved: JsonObject) -> Claim:
        return Claim(key, str(rec["token"]), int(rec.get("attempt") or 1), saved, str(rec.get("owner")))

    def _over(self, key: str, rec: StepRecord, digest: str) -> Replay | None:
        """What an existing record says before a take-over: replay it, refuse, or (None) take it."""
        known = rec.get("payload_hash")
        if known and known != digest:
            raise PayloadMismatchError(f"{key} was claimed for another request ({known} != {digest})")
        state = record_state(rec)
        if state == DONE:
            return Replay(dict(rec.get("result") or {}))
        if state == IN_PROGRESS and _expires(rec) > self.clock():
            raise BusyError(key, rec)
        return None

    # -- inside an attempt --------------------------------------------------------------------

    def save(self, claim: Claim, fields: Mapping[str, object]) -> None:
        """Keep what this attempt decided before its first effect; stop if its claim passed on."""
        saved = {**claim.saved, **fields}
        if not self.store.update_held(claim.key, claim.token, {"saved": saved}):
            raise ClaimLostError(claim.key, {"owner": "another attempt"})
        claim.saved = saved

    def finish(self, claim: Claim, result: Mapping[str, object]) -> None:
        """Record the result while the claim is still this attempt's; a lost claim raises."""
        done: StepRecord = {"state": DONE, "result": dict(result), "at": self.clock()}
        if not self.store.update_held(claim.key, claim.token, done):
            raise ClaimLostError(claim.key, {"owner": "another attempt"})

    def release(self, claim: Claim, why: str, result: Mapping[str, object] | None = None) -> None:
        """Give the claim up at once (what it saved stays, and ``result`` when given); best effort:
        else it expires."""
        fields: StepRecord = {"state": RELEASED, "error": why[:300], "released_at": self.clock()}
        if result is not None:
            fields["result"] = dict(result)
        try:
            self.store.update_held(claim.key, claim.token, fields)
        except Exception as again:
            self.warn(
                "step claim not released; it expires",
                {"record": claim.key, "error": f"{type(again).__name__}: {again}"[:300]},
            )


# -- a store in memory (unit tests, replay, the simulator) -----------------------------------------


class MemoryStepStore:
    """Records in a dict, versioned by a counter: the protocol's semantics with no backend.
    ``parent`` reads the document the records hang under (the memory store's incident), for a
    guard; ``lock`` is the lock that stands for the parent's transactions."""

    def __init__(
        self,
        parent: Callable[[], JsonObject | None] | None = None,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        self.records: dict[str, tuple[StepRecord, int]] = {}
        self._parent = parent or (lambda: None)
        self._lock = lock or contextlib.nullcontext()

    def read(self, key: str) -> Stored[int] | None:
        got = self.records.get(key)
        return None if got is None else Stored(StepRecord(**got[0]), got[1])

    def create(self, key: str, record: StepRecord, guard: Guard | None = None) -> bool:
        with self._lock:
            if key in self.records:
                return False
            checked(guard, key, self._parent())
            self.records[key] = (StepRecord(**record), 1)
            return True

    def replace(self, key: str, record: StepRecord, version: int, guard: Guard | None = None) -> bool:
        with self._lock:
            got = self.records.get(key)
            if got is None or got[1] != version:
                return False
            checked(guard, key, self._parent())
            self.records[key] = (StepRecord(**record), version + 1)
            return True

    def update_held(self, key: str, token: str, fields: StepRecord) -> bool:
        got = self.records.get(key)
        if got is None or got[0].get("token") != token or got[0].get("state") != IN_PROGRESS:
            return False
        self.records[key] = (StepRecord(**{**got[0], **fields}), got[1] + 1)
        return True
