"""The relay the local stack puts in front of Firestore, so `firestore-restart` is an outage that loses
nothing acknowledged (Firestore's documented behaviour: a committed write is durable; an outage shows as
UNAVAILABLE and the client retries — https://cloud.google.com/firestore/docs/understand-reads-writes-scale).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import firestore

from pitstop.local.procs import Proc, free_port, wait_http

ROOT = Path(__file__).resolve().parents[2]


def _relay(tmp_path: Path, port: int, target: str) -> Proc:
    argv = [sys.executable, "-m", "pitstop.local.relay", "--listen", str(port), "--to", target]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions")}
    p = Proc("relay", argv, tmp_path / "relay.log", env).start()
    wait_http(f"http://127.0.0.1:{port}/", p)
    return p


@pytest.fixture
def relayed(firestore_host: str, tmp_path: Path) -> Iterator[tuple[int, list[Proc]]]:
    port = free_port()
    procs = [_relay(tmp_path, port, firestore_host)]
    try:
        yield port, procs
    finally:
        for p in procs:
            p.stop()


def _client(port: int, monkeypatch: pytest.MonkeyPatch) -> firestore.Client:
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", f"127.0.0.1:{port}")
    return firestore.Client(project=f"relay-{uuid.uuid4().hex[:8]}")


@pytest.mark.emulator
def test_a_cut_relay_ends_open_connections_and_refuses_new_ones(
    relayed: tuple[int, list[Proc]], tmp_path: Path
) -> None:
    port, procs = relayed
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    held.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200" in held.recv(4096).split(b"\r\n", 1)[0]  # the emulator answered through the relay
    procs[0].stop()
    try:
        ended = held.recv(4096) == b""
    except ConnectionResetError:
        ended = True
    assert ended  # the open connection was cut, as an outage cuts it
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


@pytest.mark.emulator
def test_writes_acknowledged_before_the_cut_are_there_after_it(
    relayed: tuple[int, list[Proc]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, procs = relayed
    client = _client(port, monkeypatch)
    ref = client.collection("outage").document("one")
    ref.set({"n": 1})
    old = procs[0]
    old.stop()
    with pytest.raises((exceptions.ServiceUnavailable, exceptions.RetryError, exceptions.DeadlineExceeded)):
        ref.get(retry=None, timeout=3)
    procs.append(_relay(tmp_path, port, old.argv[-1]))  # back on the same port
    assert (ref.get(timeout=30).to_dict() or {}) == {"n": 1}
