"""The local stack's source for actuate: functions/main.py's own handler, with chaos hooks.

Run as ``functions-framework --source functions/pitstop/local/chaos_main.py --target actuate``.
The handler is main's, unchanged; before main first builds its Actuator, two of the classes it
builds it from are swapped in main's namespace:

- the Compute adapter: a mutating call made while ``actuate-crash-after-effect`` is armed (for
  its node and method, see pitstop.local.chaos) is performed, and then the whole instance dies
  (SIGKILL to its process group: the gunicorn master and its worker) before it answers;
- the Pub/Sub publisher: a notification published while ``publish-timeout`` is armed is not
  sent, and waiting for its message id times out (after at most ``PUBLISH_WAIT_S``, not the
  caller's full timeout, to keep rehearsals short).

Unarmed, both behave exactly as the shipped classes. The flags come from the directory in
PITSTOP_CHAOS_DIR, which the stack sets; without it nothing is swapped. Shipped code knows
nothing of this module.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.cloud.pubsub_v1 import PublisherClient

import main
from pitstop.adapters.compute import ComputeAdapter
from pitstop.local import chaos

PUBLISH_WAIT_S = 2.0
CRASH = "actuate-crash-after-effect"
TIMEOUT = "publish-timeout"


def _chaos_dir() -> Path:
    return Path(os.environ[chaos.CHAOS_DIR_ENV])


def _die(what: str) -> None:
    """End this function instance now, as a crash would: no answer, no cleanup."""
    line = {"severity": "WARNING", "message": f"chaos: actuate instance dies after {what}"}
    print(json.dumps(line), file=sys.stderr, flush=True)
    if os.getppid() == os.getpgrp():  # a gunicorn worker: its master leads this instance's group
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def _crash_after(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(call)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        node = sig.bind_partial(*args, **kwargs).arguments.get("instance")
        result = call(*args, **kwargs)  # the effect happens (or raises: then nothing happened)
        if chaos.take_flag(_chaos_dir(), CRASH, None if node is None else str(node), name):
            _die(f"{name} on {node}")
        return result

    return wrapped


class ChaosComputeAdapter(ComputeAdapter):
    """The shipped adapter whose mutating calls can be followed by the instance dying."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in chaos.MUTATING_METHODS:
            setattr(self, name, _crash_after(name, getattr(self, name)))


class _TimedOut(concurrent.futures.Future[str]):
    """A publish whose answer never comes."""

    def result(self, timeout: float | None = None) -> str:
        time.sleep(PUBLISH_WAIT_S if timeout is None else min(timeout, PUBLISH_WAIT_S))
        raise concurrent.futures.TimeoutError()


def _node_of(data: bytes) -> str | None:
    try:
        node = json.loads(data)["incident"]["node"]["instance"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(node)


class ChaosPublisher:
    """A PublisherClient (built the same way) whose notification publishes can time out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._real = PublisherClient(*args, **kwargs)
        self._notifications = "/topics/" + os.environ.get(
            "PITSTOP_NOTIFICATIONS_TOPIC", "pitstop-notifications"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def publish(self, topic: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
        if topic.endswith(self._notifications) and chaos.take_flag(_chaos_dir(), TIMEOUT, _node_of(data)):
            print(json.dumps({"severity": "WARNING", "message": "chaos: publish times out"}), file=sys.stderr)
            return _TimedOut()
        return self._real.publish(topic, data, *args, **kwargs)


if os.environ.get(chaos.CHAOS_DIR_ENV):
    vars(main)["_compute_adapter"] = ChaosComputeAdapter
    vars(main)["_publisher"] = ChaosPublisher

actuate = main.actuate
