"""A TCP relay in front of an emulator, so the stack can cut a service off and bring it back.

Stopping the relay closes every connection through it and refuses new ones: what a client sees when
the service is unreachable. The emulator behind it keeps running and keeps every write it
acknowledged, as Firestore does through an outage. (Killing the emulator itself would not do: it
keeps data only through an export, and a commit in flight while the export runs is acknowledged to
its writer yet missing from the export, a loss real Firestore never shows.)

``python -m pitstop.local.relay --listen PORT --to HOST:PORT``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until its end; pass the end on (a half-close stays a half-close)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _relay(target: tuple[str, int], down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(*target)
    except OSError:
        down_w.close()  # the emulator is not there: the client sees the connection end
        return
    try:
        await asyncio.gather(_pipe(down_r, up_w), _pipe(up_r, down_w))
    finally:
        for w in (up_w, down_w):
            w.close()


async def serve(port: int, target: tuple[str, int]) -> None:
    """Relay 127.0.0.1:port to target until the process is stopped."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _relay(target, r, w)

    server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pitstop.local.relay", description=__doc__)
    ap.add_argument("--listen", type=int, required=True, help="the loopback port clients connect to")
    ap.add_argument("--to", required=True, help="host:port of the service behind the relay")
    args = ap.parse_args(argv)
    host, _, port = str(args.to).rpartition(":")
    asyncio.run(serve(args.listen, (host, int(port))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
