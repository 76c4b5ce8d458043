"""`gcloud` for a process under test: sends its command line to a gcloud worker and answers as gcloud.

tests/tools/gcloud_batch.py puts it first on the PATH of a process it runs (``pitstop deploy``), as
``python -IS gcloud_shim.py SOCKET``. It imports only what the interpreter has loaded anyway and
the C socket module (``socket`` itself costs five times the start-up, through ``enum``): ~10 ms of
CPU a command instead of gcloud's second, and `pitstop deploy` runs ~180 of them.

The wire (tests/tools/gcloud_worker.py), one command per connection: the request is the working
directory and the arguments, each followed by a NUL, then end of stream; the answer is
``b"<exit code> <stdout length>\\n"``, then stdout, then stderr, then end of stream.
"""

from __future__ import annotations

import _socket
import os
import sys

TIMEOUT = 300.0  # one command's answer: a hang guard (the fake answers at once)


def request(path: str, argv: list[str], cwd: str) -> tuple[int, bytes, bytes]:
    """One command through the worker listening on `path`: its exit code, stdout and stderr."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(TIMEOUT)
        conn.connect(path)
        conn.sendall(b"".join(os.fsencode(a) + b"\0" for a in [cwd, *argv]))
        conn.shutdown(_socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(1 << 16):
            chunks.append(chunk)
    finally:
        conn.close()
    head, _, body = b"".join(chunks).partition(b"\n")
    rc, size = (int(x) for x in head.split())
    return rc, body[:size], body[size:]


def main(args: list[str]) -> int:
    rc, out, err = request(args[0], args[1:], os.getcwd())
    sys.stdout.buffer.write(out)
    sys.stderr.buffer.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
