"""`gcloud` for a process under test: sends its command line to a gcloud worker and answers as gcloud.

tests/tools/gcloud_batch.py puts it first on the PATH of a process it runs (``pitstop deploy``), as
``python -IS gcloud_shim.py SOCKET``: the standard library's socket and json only, so each command
costs a bare interpreter start-up (tens of milliseconds), not gcloud's (a second and more).
The wire: one command per connection, the request a JSON line ``{"argv": [...], "cwd": "..."}``,
the answer ``{"rc": N, "stdout": "...", "stderr": "..."}`` (tests/tools/gcloud_worker.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

TIMEOUT = 300.0  # one command's answer: a hang guard (the fake answers at once)


def request(path: str, argv: list[str], cwd: str) -> dict[str, Any]:
    """One command through the worker listening on `path`: its exit code and output."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect(path)
        conn.sendall(json.dumps({"argv": argv, "cwd": cwd}).encode() + b"\n")
        with conn.makefile("rb") as answer:
            out: dict[str, Any] = json.loads(answer.readline())
    return out


def main(args: list[str]) -> int:
    answer = request(args[0], args[1:], os.getcwd())
    sys.stdout.write(answer["stdout"])
    sys.stderr.write(answer["stderr"])
    return int(answer["rc"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
