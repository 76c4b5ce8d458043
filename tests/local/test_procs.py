"""Starting local processes: waiting for a server is not fooled by what answers before it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

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
