"""The one HTTP server the REST fakes share: a request in, a status and a JSON body out."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict


class ErrorDetail(TypedDict):
    code: int
    message: str
    status: str | None


class ErrorBody(TypedDict):
    """Google's error envelope of the REST APIs (``status``: the canonical code's name)."""

    error: ErrorDetail


# (method, path with query, raw body) -> (status, JSON-able body)
Dispatch = Callable[[str, str, bytes], tuple[int, Any]]


def serve_json(dispatch: Dispatch, name: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            code, resp = dispatch(self.command, self.path, self.rfile.read(length) if length else b"")
            data = json.dumps(resp).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle  # noqa: N815 (http.server names)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name=name).start()
    return server
