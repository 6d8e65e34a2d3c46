#!/usr/bin/env python3
"""A tiny protected resource for the demo: a ledger that records every charge it receives.

POST /charges/<customer> appends a line to the ledger; GET /ledger shows it. It knows nothing of
fencing: fencegate in front of it is what keeps an old leader's writes out.
"""
import http.server
import json
import sys
import threading

ledger = []
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status, obj):
        body = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        entry = {"target": self.path, "body": body,
                 "token": self.headers.get("Fencing-Token"),
                 "leader": self.headers.get("Fencing-Leader")}
        with lock:
            ledger.append(entry)
        self._send(200, {"recorded": entry})

    def do_GET(self):
        with lock:
            self._send(200, {"ledger": list(ledger)})

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
