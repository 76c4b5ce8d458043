"""The runtime control as one function instance sees it: read at most once per ``store.control_cache_s``.

Decisions get the control document (core/control.py) inside the policy in force
(``Policy.with_control``). Reading it per line would add a Firestore read to every line of a
storm, so each instance keeps what it read for ``control_cache_s`` (30 s by default): a pause,
a mode or a silence takes effect everywhere within that long, with no redeploy. While one thread
reads it again the others go on with what was read before; only an instance that never read it
waits.

A read that fails keeps what was read before (the brake stays as it was; a log line says so);
an instance that has never read it raises, so its delivery is retried. A document that does not
match its schema pauses everything (fail closed: incidents are still recorded and paged) until
a person fixes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pitstop.adapters import log
from pitstop.core.control import Control, ControlStore
from pitstop.core.policy import Policy
from pitstop.core.resources import DataFileError


def unreadable(why: str, now: float) -> Control:
    """What a document that does not match its schema stands for: everything paused, saying why."""
    reason = f"the control document is not valid ({why[:300]}); fix it (pitstop resume) or delete it"
    return Control({"version": 0, "paused": {"by": "pitstop", "at": now, "reason": reason}})


class RuntimeControl:
    """The control document, cached per instance; :meth:`policy` is the policy in force."""

    def __init__(
        self, source: ControlStore, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source, self.ttl_s, self.clock = source, ttl_s, clock
        self.reads = 0  # documents read by this instance (``pitstop bench ingest``)
        self._control: Control | None = None
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._made: tuple[Policy, Control, Policy] | None = None  # (deployed, control, in force)

    def current(self) -> Control:
        """The control as last read, read again once it is older than the TTL."""
        if self._control is not None and self.clock() - self._read_at < self.ttl_s:
            return self._control
        if not self._lock.acquire(blocking=self._control is None):
            return self._control  # type: ignore[return-value]  # another thread reads it; this one goes on
        try:
            if self._control is None or self.clock() - self._read_at >= self.ttl_s:
                self._control = self._read(self._control)
                self._read_at = self.clock()
            return self._control
        finally:
            self._lock.release()

    def _read(self, before: Control | None) -> Control:
        try:
            raw = self.source.read_control()
            self.reads += 1
        except Exception as exc:
            if before is None:
                raise  # never read: the caller's request fails and is retried
            log.emit("WARNING", "control document unreadable, keeping the one read before",
                     error=repr(exc)[:300], version=before.version)  # fmt: skip
            return before
        try:
            got = Control.of(raw)
        except DataFileError as exc:
            log.emit("ERROR", "control document not valid: everything paused", error=str(exc)[:500])
            return unreadable(str(exc), time.time())
        if before is None or got.version != before.version:
            log.emit("INFO", "control document read", version=got.version, in_force=got.lines(time.time()))
        return got

    def policy(self, deployed: Policy) -> Policy:
        """The deployed policy with the control as this instance has it (the same object while
        neither changes, so a caller can tell a change by identity)."""
        control = self.current()
        made = self._made
        if made is not None and made[0] is deployed and made[1] is control:
            return made[2]
        in_force = deployed.with_control(control)
        self._made = (deployed, control, in_force)
        return in_force
