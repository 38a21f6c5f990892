"""A stand-in for a model server, run as a service's replica by the tests: an HTTP server
on ``$PORT`` that answers with who it is and records what it served.

    python tests/workloads/model_server.py --version v1 [--ready-after 0.5] [--never-ready]
        [--records DIR]

* ``GET /``         ``<replica> <version>``: the replica's job id (``GPUSCHED_REPLICA``).
* ``GET /work?ms=N`` the same after N ms (requests in flight for the autoscaler).
* ``GET /healthz``  200 once ``--ready-after`` seconds passed (503 before; always with
  ``--never-ready``): the readiness check.
* ``GET /metrics``  Prometheus text: ``gpusched_requests_in_flight`` and
  ``gpusched_requests_total`` (the autoscaler's request metrics).

On SIGTERM it drains as servers meant for a load balancer do: it stops accepting (new
connections are refused, so the balancer tries another replica), finishes the requests
it has, then exits 0. With ``--records``, each answered request is one JSON line in
``DIR/<replica>.<pid>.jsonl`` (``{"replica", "version", "path", "t"}``), so a test checks
what was served against what the replicas themselves wrote.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", default="v1")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--records", default="")
    args = parser.parse_args()
    replica = os.environ.get("GPUSCHED_REPLICA", "replica")
    started = time.monotonic()
    lock = threading.Lock()
    counts = {"in_flight": 0, "total": 0}
    records = None
    if args.records:
        Path(args.records).mkdir(parents=True, exist_ok=True)
        records = open(Path(args.records) / f"{replica}.{os.getpid()}.jsonl", "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:   # quiet
            pass

        def _send(self, code: int, body: str, content_type: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/healthz":
                ready = not args.never_ready and time.monotonic() - started >= args.ready_after
                self._send(200 if ready else 503, "ok\n" if ready else "starting\n")
                return
            if url.path == "/metrics":
                with lock:
                    text = (f"gpusched_requests_in_flight {counts['in_flight']}\n"
                            f"gpusched_requests_total {counts['total']}\n")
                self._send(200, text, "text/plain; version=0.0.4")
                return
            with lock:
                counts["in_flight"] += 1
            try:
                if url.path == "/work":
                    time.sleep(int(parse_qs(url.query).get("ms", ["100"])[0]) / 1000)
                self._send(200, f"{replica} {args.version}\n")
                if records is not None:
                    records.write(json.dumps({"replica": replica, "version": args.version, "path": url.path,
                                              "t": time.time()}) + "\n")
            finally:
                with lock:
                    counts["in_flight"] -= 1
                    counts["total"] += 1

    ThreadingHTTPServer.request_queue_size = 128   # a listen backlog for a burst (the default is 5)
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler)
    server.daemon_threads = False          # drain: server_close joins the request threads
    server.block_on_close = True

    def drain(*_) -> None:
        # serve_forever returns (from a thread: shutdown waits for it), then server_close
        # closes the listener and joins the requests still open
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, drain)
    server.serve_forever(poll_interval=0.05)
    server.server_close()                  # closes the listener, joins the request threads
    if records is not None:
        records.close()


if __name__ == "__main__":
    main()
