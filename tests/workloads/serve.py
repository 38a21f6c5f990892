"""A tiny replica of a service: serves HTTP on $PORT. ``GET /healthz`` answers 503 until
``--ready-after`` seconds after the start, then 200; ``GET /`` answers the replica's id
($GPUSCHED_REPLICA) and its service ($GPUSCHED_SERVICE)."""
from __future__ import annotations

import argparse
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-after", type=float, default=0.0)
    ready_after = parser.parse_args().ready_after
    answer = f"{os.environ['GPUSCHED_REPLICA']} {os.environ['GPUSCHED_SERVICE']}".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                code, body = (200, b"ok") if time.monotonic() - STARTED >= ready_after else (503, b"starting")
            elif self.path == "/":
                code, body = 200, answer
            else:
                code, body = 404, b"no such path"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()


if __name__ == "__main__":
    main()
