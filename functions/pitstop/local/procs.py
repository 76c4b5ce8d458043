"""Starting and stopping the local background processes (emulators, servers) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

# Ports handed to child processes come from below the kernel's ephemeral range (32768-60999 by
# default), where every port-0 bind lands: a port picked, released and bound a moment later by
# the child cannot be taken in between by another server's port-0 bind. Each test process
# (pytest-xdist worker gwN) draws from a band of its own, so parallel stacks never pick alike.
PORT_BASE, PORT_BAND = 20000, 2500
_handed_out: set[int] = set()


def _band() -> range:
    """This process's band; ``PITSTOP_PORT_RANGE=lo-hi`` gives a whole checkout a range of its own
    (split four ways like the default), so test runs of several checkouts on one machine never meet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    n = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    base, band = PORT_BASE, PORT_BAND
    lo_hi = os.environ.get("PITSTOP_PORT_RANGE", "").split("-")
    if len(lo_hi) == 2 and all(x.isdigit() for x in lo_hi) and int(lo_hi[1]) - int(lo_hi[0]) >= 400:
        base, band = int(lo_hi[0]), (int(lo_hi[1]) - int(lo_hi[0])) // 4
    lo = base + (n % 4) * band
    return range(lo, lo + band)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, not handed out before by this process."""
    band = _band()
    for _ in range(500):
        port = random.choice(band)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {band.start}-{band.stop - 1}")


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Proc:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.popen = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """Signal the whole process group (functions-framework and gcloud wrappers have children)."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class PortTakenError(RuntimeError):
    """The child could not bind the port it was given: something took it after :func:`free_port`."""


BIND_FAILED = "Address already in use"  # the JVM's BindException (the emulators), Python's OSError


def wait_http(url: str, proc: Proc, timeout: float = 60.0, accept_errors: bool = False) -> None:
    """Until the server answers; with ``accept_errors`` any HTTP status counts as up. A child that
    says its port was taken fails at once (an emulator's JVM lives on after its BindException)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited early:\n{proc.tail()}")
        if BIND_FAILED in proc.tail():
            raise PortTakenError(f"{proc.name} could not bind its port:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback only
                return
        except urllib.error.HTTPError:
            if accept_errors:
                return
            time.sleep(0.2)
        except (OSError, http.client.HTTPException):
            # Not up yet. HTTPException: no server answered, something else did. A probe of a port
            # nothing listens on can connect to itself when the port lies in the kernel's ephemeral
            # range (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 here): it reads its own
            # request back ("BadStatusLine: GET / HTTP/1.1", seen with PITSTOP_PORT_RANGE=30000-34999).
            time.sleep(0.2)
    raise TimeoutError(f"{proc.name} not ready after {timeout}s:\n{proc.tail()}")


def start_emulator(kind: str, workdir: Path, project: str = "pitstop-local") -> tuple[Proc, str]:
    """Google's own emulator from the installed gcloud SDK, bound to a free loopback port; started
    again on another port (three tries) when the one picked was taken before the emulator bound it
    (a range given in PITSTOP_PORT_RANGE inside the kernel's ephemeral range can be, by any
    process's outgoing connection)."""
    for attempt in range(3):
        try:
            return _start_emulator(kind, workdir, project, attempt)
        except PortTakenError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _start_emulator(kind: str, workdir: Path, project: str, attempt: int) -> tuple[Proc, str]:
    port = free_port()
    host = f"127.0.0.1:{port}"
    if kind == "firestore":
        argv = ["gcloud", "emulators", "firestore", "start", f"--host-port={host}", "--quiet"]
    elif kind == "pubsub":
        data = tempfile.mkdtemp(prefix="pubsub-", dir=workdir)
        argv = [
            "gcloud",
            "beta",
            "emulators",
            "pubsub",
            "start",
            f"--host-port={host}",
            f"--project={project}",
            f"--data-dir={data}",
            "--quiet",
        ]
    else:
        raise ValueError(kind)
    # An emulator outlives whatever Slurm cluster the caller pointed at: it takes none of its settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["CLOUDSDK_CORE_DISABLE_PROMPTS"] = "1"
    log = workdir / (f"{kind}-emulator.log" if attempt == 0 else f"{kind}-emulator.{attempt}.log")
    proc = Proc(f"{kind}-emulator", argv, log, env).start()
    try:
        wait_http(f"http://{host}/", proc)
    except PortTakenError:
        proc.stop()
        raise
    return proc, host
