"""A fake payment service that counts refunds: a real process, HTTP on loopback.

    python -m benchmarks.durable.payments --ready PATH     # writes its URL to PATH

``POST /refunds`` with ``{"order", "cents", "key"}`` makes a refund every time it is called (as a
payment API without idempotency keys does: ``key`` is only stored, for lookups) and answers it.
``GET /refunds?key=K`` lists the refunds made with ``key`` (what a ``reconcile`` asks);
``GET /refunds?order=O`` those of an order. Nothing is kept across restarts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_refunds: list[dict[str, Any]] = []
_ids = itertools.count(1)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet: thousands of calls
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        if self.path != "/refunds":
            self._answer(404, {"error": "not found"})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with _lock:
            refund = {
                "id": f"re_{next(_ids)}",
                "order": str(body["order"]),
                "cents": int(body["cents"]),
                "key": body.get("key"),
            }
            _refunds.append(refund)
        self._answer(200, refund)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/refunds":
            self._answer(404, {"error": "not found"})
            return
        query = dict(urllib.parse.parse_qsl(url.query))
        with _lock:
            found = [r for r in _refunds if all(str(r.get(k)) == v for k, v in query.items())]
        self._answer(200, found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready", type=Path, required=True, help="file the URL is written to")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    tmp = args.ready.with_suffix(".tmp")
    tmp.write_text(url)
    tmp.replace(args.ready)
    server.serve_forever()


if __name__ == "__main__":
    main()
