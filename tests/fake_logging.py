"""A local fake of Cloud Logging's entries.list (REST), paginated, recording what it was asked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeLogging:
    def __init__(self, entries: list[dict[str, Any]], page_size: int = 3) -> None:
        self.entries, self.page_size = entries, page_size
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.split("?")[0] != "/v2/entries:list":
                    self.send_error(404)
                    return
                fake.requests.append(body)
                start = int(body.get("pageToken") or 0)
                page = fake.entries[start : start + fake.page_size]
                resp: dict[str, Any] = {"entries": page}
                if start + fake.page_size < len(fake.entries):
                    resp["nextPageToken"] = str(start + fake.page_size)
                data = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
