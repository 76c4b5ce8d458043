"""Starting local processes: waiting for a server is not fooled by what answers before it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

from pitstop.local import procs


def _echo_then_serve(listener: socket.socket) -> None:
    """The first connection reads back its own request line (what a probe that connected to itself
    reads: TCP simultaneous open on a free port in the ephemeral range); the second is answered."""
    for n in range(2):
        conn, _ = listener.accept()
        with conn:
            request = conn.recv(4096)
            if n == 0:
                conn.sendall(request.split(b"\r\n", 1)[0] + b"\r\n\r\n")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def test_a_probe_that_reads_its_own_request_back_waits_for_the_server(tmp_path: Path) -> None:
    """A CI run's whole e2e module failed at setup with `BadStatusLine: GET / HTTP/1.1` (2026-11-26,
    PITSTOP_PORT_RANGE=30000-34999, inside the kernel's ephemeral ports): wait_http took what came
    back for the server's answer and raised, instead of probing again."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    serving = threading.Thread(target=_echo_then_serve, args=(listener,), daemon=True)
    serving.start()
    alive = procs.Proc("sleeper", ["sleep", "30"], tmp_path / "sleeper.log").start()
    try:
        procs.wait_http(f"http://127.0.0.1:{port}/", alive, timeout=20)
    finally:
        alive.stop()
        listener.close()
    serving.join(5)
    assert not serving.is_alive()  # both connections were made: the echo was probed past


def test_an_emulator_whose_port_was_taken_is_started_again_on_another(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A demo beside a CI run (PITSTOP_PORT_RANGE inside the ephemeral ports, 2026-11-28): another
    process's connection took the picked port before the Pub/Sub emulator bound it; its JVM logged
    the BindException and lived on, and the stack waited 60 s and gave up. The port is now given
    up at the emulator's word and another one tried."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = iter([taken.getsockname()[1]])
    real = procs.free_port
    monkeypatch.setattr(procs, "free_port", lambda: next(picks, None) or real())
    proc, host = procs.start_emulator("pubsub", tmp_path)
    try:
        assert host != f"127.0.0.1:{taken.getsockname()[1]}"
        assert procs.BIND_FAILED in (tmp_path / "pubsub-emulator.log").read_text()
    finally:
        proc.stop()
        taken.close()
