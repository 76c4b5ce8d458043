"""One gcloud interpreter that runs many gcloud commands, one after another (tests only).

Run by tests/tools/gcloud_batch.py with gcloud's own Python and environment: it loads the SDK as
lib/gcloud.py does, builds gcloud's CLI object once (googlecloudsdk.gcloud_main.CreateCLI) and
runs each command it is sent with ``cli.Execute(argv)``: the same argument parser, request building
and error handling as ``gcloud ARGV``, without a ~1 s interpreter start-up per command.

Wire: one command per connection on a Unix socket, as tests/tools/gcloud_shim.py describes it.
The SDK is reached only through importlib (mypy and this repository's Python never import it).
"""

from __future__ import annotations

import importlib
import io
import os
import socket
import sys
import traceback
from typing import Any


def load_cli(sdk_root: str) -> Any:
    """gcloud's CLI object, with sys.path set up as lib/gcloud.py sets it for `gcloud`."""
    lib = os.path.join(sdk_root, "lib")
    sys.path.insert(0, lib)
    entry = importlib.import_module("gcloud")  # lib/gcloud.py: puts third_party/ first on import
    sys.path = entry.reorder_sys_path(sys.path)
    entry._fix_google_module()
    return entry._import_gcloud_main().CreateCLI([])


def execute(cli: Any, argv: list[str], cwd: str) -> tuple[int, bytes, bytes]:
    """One command as `gcloud ARGV` would run it, its exit code and both streams captured."""
    log = importlib.import_module("googlecloudsdk.core.log")
    crash = importlib.import_module("googlecloudsdk.command_lib.crash_handling")
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in "oe")
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    log.Reset(out, err)
    rc = 0
    try:
        os.chdir(cwd)
        cli.Execute(argv, call_arg_complete=False)
    except SystemExit as e:  # gcloud's error handler exits with the command's code
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # what gcloud_main's CrashManager reports as a crash
        try:
            crash.HandleGcloudCrash(sys.exc_info()[1])
        except Exception:
            traceback.print_exc()
        rc = 1
    finally:
        sys.stdout, sys.stderr = saved
        log.Reset(*saved)
    return rc, _bytes(out), _bytes(err)


def _bytes(stream: io.TextIOWrapper) -> bytes:
    stream.flush()
    buf = stream.buffer
    assert isinstance(buf, io.BytesIO)
    return buf.getvalue()


def _received(conn: socket.socket) -> bytes:
    """Everything the client sent (it shuts its side down after the request)."""
    chunks = []
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def serve(cli: Any, path: str) -> None:
    """Answer commands, one at a time, until the parent kills the process."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    print("ready", flush=True)  # the parent waits for this line
    while True:
        conn, _ = srv.accept()
        with conn:
            cwd, *argv = (os.fsdecode(a) for a in _received(conn).split(b"\0")[:-1])
            rc, out, err = execute(cli, argv, cwd)
            conn.sendall(f"{rc} {len(out)}\n".encode() + out + err)


if __name__ == "__main__":
    serve(load_cli(sys.argv[1]), sys.argv[2])
